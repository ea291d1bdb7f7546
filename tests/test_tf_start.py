"""TensorFlow's quiet import: which captured start-up lines are noise at a log level."""

from wide_tf import tf_start

CPP = (
    "I0000 00:00:1796693867.243265   21112 port.cc:153] oneDNN custom operations are on.",
    "E0000 00:00:1796693873.172814   21112 cuda_platform.cc:52] failed call to cuInit",
)
# This process's own absl line, written while another thread imports TensorFlow.
PYTHON = "I1208 01:46:48.287478 139808422722432 main.py:122] progress: 4/4 trials (expected)"


def test_cpp_start_up_lines_are_noise_below_the_level():
    assert tf_start.tf_noise(CPP[0], 3) and tf_start.tf_noise(CPP[1], 3)
    assert tf_start.tf_noise(CPP[0], 1) and not tf_start.tf_noise(CPP[1], 1)
    assert not tf_start.tf_noise(CPP[0], 0)
    assert tf_start.tf_noise("WARNING: All log messages before absl::InitializeLog() ...", 1)


def test_a_python_log_line_is_never_noise():
    assert not tf_start.tf_noise(PYTHON, 3)
    assert not tf_start.tf_noise(PYTHON.replace("I1208", "W1208"), 3)
