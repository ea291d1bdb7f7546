"""The answer suite: the paper's question asked so a referee can read the answer. The same local
protocol (8x8 digits, a x2 learning-rate grid per batch size on 2 tuning seeds, 5 seeds at the
chosen rate, three targets from the same runs) on the fixed-budget family under plain SGD and under
momentum 0.9, and on the width-only and depth-only families that separate width from depth; the
suite's report (WORKDIR/answer.md) gives one table protocol x family x target and the two-factor
fit that splits the budget family's slope into its width and depth parts.

  python -m wide_tf.main --suite=configs/answer.py --workdir=runs/answer

Variants (after the colon):
  local   the five studies of configs/mlp.py: local, local_replicate (read together with local),
          local_momentum, local_width, local_depth (about four times the main study's time on 2
          cores; each study resumes on its own).
  smoke   the same shape on the smoke study (seconds per study): the suite's test.
"""

from wide_tf.study.suite import Entry

SGD, MOMENTUM = "plain SGD", "momentum 0.9"


# (study, configs/mlp.py variant, protocol, family[, the study it replicates]) per suite variant.
_STUDIES = {
    "local": [
        ("budget_sgd", "local", SGD, "budget"),
        ("budget_sgd_replicate", "local_replicate", SGD, "budget", "budget_sgd"),
        ("budget_momentum", "local_momentum", MOMENTUM, "budget"),
        ("width_sgd", "local_width", SGD, "width"),
        ("depth_sgd", "local_depth", SGD, "depth"),
    ],
    "smoke": [  # (the smoke study itself runs momentum 0.9; smoke_sgd plain SGD)
        ("budget_sgd", "smoke_sgd", SGD, "budget"),
        ("budget_momentum", "smoke", MOMENTUM, "budget"),
        ("width_momentum", "smoke_width", MOMENTUM, "width"),
        ("depth_momentum", "smoke_depth", MOMENTUM, "depth"),
    ],
}


def get_suite(arg=None):
    variant = arg or "local"
    if variant not in _STUDIES:
        raise ValueError(f"unknown variant {variant!r} of configs/answer.py: local or smoke")
    return [Entry(n, f"configs/mlp.py:{v}", *rest) for n, v, *rest in _STUDIES[variant]]
