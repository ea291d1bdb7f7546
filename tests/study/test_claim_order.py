"""The order in which a process claims groups: longest first (smallest batch, then the deepest
member), except that the next open group of the member it just ran comes first, so the member's
build (engine/tf/reuse.py) is kept and only the step is traced again."""

from types import SimpleNamespace

from wide_tf.study import scheduler, trials


def test_longest_first_then_the_same_member_first():
    members = {"d1": SimpleNamespace(name="d1", depth=1), "d4": SimpleNamespace(name="d4", depth=4)}
    groups = [("d1", 64), ("d4", 8), ("d1", 8), ("d4", 64), ("d4", 16)]
    order = trials.claim_order(
        [SimpleNamespace(member=members[m], group=(m, b)) for m, b in groups]
    )
    assert order == [("d4", 8), ("d1", 8), ("d4", 16), ("d4", 64), ("d1", 64)]
    assert scheduler._same_member_first(order, None) == order
    assert scheduler._same_member_first(order, "d1") == [
        ("d1", 8),
        ("d1", 64),
        ("d4", 8),
        ("d4", 16),
        ("d4", 64),
    ]
    assert scheduler._same_member_first(order, "gone") == order
