"""The answer suite: the paper's question asked so a referee can read the answer. The same local
protocol (8x8 digits, a x2 learning-rate grid per batch size on 2 tuning seeds, 5 seeds at the
chosen rate, three targets from the same runs) on the fixed-budget family under plain SGD and under
momentum 0.9, and on the width-only and depth-only families that separate width from depth; the
suite's report (WORKDIR/answer.md) gives one table protocol x family x target and the two-factor
fit that splits the budget family's slope into its width and depth parts.

  python -m wide_tf.main --suite=configs/answer.py --workdir=runs/answer

Variants (after the colon):
  local   the four studies of configs/mlp.py: local, local_momentum, local_width, local_depth
          (about four times the main study's time on 2 cores; each study resumes on its own).
  smoke   the same shape on the smoke study (seconds per study): the suite's test.
"""

from wide_tf.study.suite import Entry

SGD, MOMENTUM = "plain SGD", "momentum 0.9"


def get_suite(arg=None):
    variant = arg or "local"
    if variant == "local":
        return [
            Entry("budget_sgd", "configs/mlp.py:local", SGD, "budget"),
            Entry("budget_momentum", "configs/mlp.py:local_momentum", MOMENTUM, "budget"),
            Entry("width_sgd", "configs/mlp.py:local_width", SGD, "width"),
            Entry("depth_sgd", "configs/mlp.py:local_depth", SGD, "depth"),
        ]
    if variant == "smoke":
        return [
            Entry("budget_sgd", "configs/mlp.py:smoke_sgd", SGD, "budget"),
            Entry("budget_momentum", "configs/mlp.py:smoke", MOMENTUM, "budget"),
            Entry("width_momentum", "configs/mlp.py:smoke_width", MOMENTUM, "width"),
            Entry("depth_momentum", "configs/mlp.py:smoke_depth", MOMENTUM, "depth"),
        ]
    raise ValueError(f"unknown variant {variant!r} of configs/answer.py: local or smoke")
