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
  data_sets  the budget family under plain SGD on each data set the package reads offline: the 8x8
          digits (configs/mlp.py:local), the embedded MNIST pooled to 7x7 (configs/mlp.py:mnist7),
          Fashion-MNIST pooled to 7x7 (configs/mlp.py:fashion7, its seed replicate, the width-only
          and depth-only families and momentum 0.9; needs Debian's dataset-fashion-mnist) and the
          ResNets on the 7x7 MNIST and the 7x7 Fashion-MNIST (configs/wrn.py:mnist7 and
          :fashion7, the latter on an 8,000-image subset, with its seed replicate): the data set
          x architecture rows of docs/results/data_sets.md (about 4.5 hours on 2 idle cores in all).
  wrn_fashion7  the ResNets on Fashion-MNIST and their seed replicate (configs/wrn.py:fashion7
          and :fashion7_replicate), read together: the ResNet pair (about 1-2 hours on 2 cores).
  fashion14  the frozen MLP pair on Fashion-MNIST pooled to 14x14 (configs/mlp.py:fashion14 and
          :fashion14_replicate, each checked against its file in configs/frozen/), read together
          with the equivalence margin their design froze (about an hour on 2 cores).
  smoke   the same shape on the smoke study (seconds per study): the suite's test.
"""

from wide_tf.study.suite_runner import Entry

SGD, MOMENTUM = "plain SGD", "momentum 0.9"


# The ResNets on Fashion-MNIST and their seed replicate: a suite of their own and two rows of
# data_sets.
_WRN_FASHION7_PAIR = [
    ("fashion7_wrn", "configs/wrn.py:fashion7", SGD, "budget"),
    ("fashion7_wrn_replicate", "configs/wrn.py:fashion7_replicate", SGD, "budget", "fashion7_wrn"),
]

# (study, config (configs/mlp.py where no file is named), protocol, family[, the study it
# replicates]) per suite variant. The report keeps data sets and architectures apart (its rows
# name each study's data set; a two-factor fit never mixes them).
_STUDIES = {
    "local": [
        ("budget_sgd", "local", SGD, "budget"),
        ("budget_sgd_replicate", "local_replicate", SGD, "budget", "budget_sgd"),
        ("budget_momentum", "local_momentum", MOMENTUM, "budget"),
        ("width_sgd", "local_width", SGD, "width"),
        ("depth_sgd", "local_depth", SGD, "depth"),
    ],
    "data_sets": [
        ("digits_mlp", "local", SGD, "budget"),
        ("mnist7_mlp", "mnist7", SGD, "budget"),
        ("fashion7_mlp", "fashion7", SGD, "budget"),
        ("fashion7_mlp_replicate", "fashion7_replicate", SGD, "budget", "fashion7_mlp"),
        ("fashion7_mlp_width", "fashion7_width", SGD, "width"),
        ("fashion7_mlp_depth", "fashion7_depth", SGD, "depth"),
        ("fashion7_mlp_momentum", "fashion7_momentum", MOMENTUM, "budget"),
        ("mnist7_wrn", "configs/wrn.py:mnist7", SGD, "budget"),
        *_WRN_FASHION7_PAIR,
    ],
    "wrn_fashion7": _WRN_FASHION7_PAIR,
    "fashion14": [
        ("fashion14_mlp", "fashion14", SGD, "budget"),
        ("fashion14_mlp_replicate", "fashion14_replicate", SGD, "budget", "fashion14_mlp"),
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
        raise ValueError(
            f"unknown variant {variant!r} of configs/answer.py: local, data_sets, wrn_fashion7, "
            "fashion14 or smoke"
        )
    return [
        Entry(n, v if ":" in v else f"configs/mlp.py:{v}", *rest)
        for n, v, *rest in _STUDIES[variant]
    ]
