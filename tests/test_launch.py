"""launch_tpu.sh: argument checks and the gcloud commands of --dry_run (the only part that can
run here: there is no TPU and no gcloud on this machine)."""

import shutil
import subprocess

import pytest

from helpers import REPO

SCRIPT = REPO / "launch_tpu.sh"
REQUIRED = ["--name=wide-v4", "--config=configs/wrn.py", "--workdir=gs://bucket/wrn"]


def _launch(*args):
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    # PATH without gcloud would not matter for --dry_run, which must not call it at all.
    return subprocess.run(["bash", str(SCRIPT), *args], cwd="/", capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin"})


def _commands(stdout):
    return [line for line in stdout.splitlines() if line.startswith("gcloud ")]


def test_dry_run_prints_the_gcloud_commands():
    p = _launch(*REQUIRED, "--dry_run", "--", "--shard=0/2", "--config.train.seed=1")
    assert p.returncode == 0, p.stderr
    create, scp, install, start = _commands(p.stdout)
    assert create == ("gcloud compute tpus tpu-vm create wide-v4 --zone=us-central2-b "
                      "--accelerator-type=v4-8 --version=tpu-ubuntu2204-base")
    assert scp.startswith("gcloud compute tpus tpu-vm scp ") and "wide-v4:" in scp
    assert scp.endswith("--zone=us-central2-b --worker=all")
    assert install.startswith("gcloud compute tpus tpu-vm ssh wide-v4 --zone=us-central2-b --worker=all")
    # TensorFlow's TPU build first, then the package without its tensorflow pin.
    assert install.index('"tensorflow-tpu==2.20.0"') < install.index("--no-deps -e .")
    assert '"keras==3.15.*"' in install and '"tensorflow==' not in install
    assert start.startswith("gcloud compute tpus tpu-vm ssh wide-v4 --zone=us-central2-b --worker=all")
    assert ("nohup python3 -m wide_tf.main --config=configs/wrn.py --workdir=gs://bucket/wrn "
            "--config.runtime.strategy=tpu --config.runtime.tpu=local --shard=0/2 "
            "--config.train.seed=1 > ~/wide_tf_wide-v4.log 2>&1") in start
    assert "tail -f ~/wide_tf_wide-v4.log" in p.stdout
    assert "tensorboard --logdir=gs://bucket/wrn" in p.stdout


def test_dry_run_options_reach_the_commands():
    p = _launch(*REQUIRED, "--zone=europe-west4-a", "--accelerator=v4-32", "--project=proj",
                "--version=tpu-vm-tf-2.16.1-pod-pjrt", "--tf_tpu=image", "--dry_run")
    assert p.returncode == 0, p.stderr
    create, scp, install, start = _commands(p.stdout)
    assert "--zone=europe-west4-a --project=proj --accelerator-type=v4-32 " \
           "--version=tpu-vm-tf-2.16.1-pod-pjrt" in create
    assert all("--zone=europe-west4-a --project=proj" in c for c in (scp, install, start))
    assert "tensorflow-tpu" not in install  # the image's TensorFlow is kept
    # A multi-host slice: one driver process on worker 0 that names the TPU.
    assert "--worker=0 " in start and "--config.runtime.tpu=wide-v4" in start
    assert "TPU_NAME=wide-v4" in start


@pytest.mark.parametrize("missing", range(3))
def test_a_missing_flag_is_a_one_line_error(missing):
    args = [a for i, a in enumerate(REQUIRED) if i != missing]
    p = _launch(*args, "--dry_run")
    assert p.returncode == 2
    flag = REQUIRED[missing].split("=")[0]
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{flag} is required" in errors[0], p.stderr
    assert "usage:" in p.stderr and p.stdout == ""


@pytest.mark.parametrize("args, needle", [
    (["--name=wide-v4", "--config=configs/wrn.py", "--workdir=/tmp/wrn"], "must be a gs:// path"),
    (["--name=wide-v4", "--config=configs/nope.py", "--workdir=gs://b/w"], "no file configs/nope.py"),
    (["--name=Wide_V4", "--config=configs/wrn.py", "--workdir=gs://b/w"], "not a valid TPU name"),
    ([*REQUIRED, "--accelerator=v4"], "expected TYPE-CORES"),
    ([*REQUIRED, "--tf_tpu=image"], "needs a TensorFlow runtime image"),
    ([*REQUIRED, "--bogus=1"], "unknown argument '--bogus=1'"),
])
def test_bad_arguments_are_refused(args, needle):
    p = _launch(*args, "--dry_run")
    assert p.returncode == 2 and needle in p.stderr.splitlines()[0], p.stderr
    assert p.stdout == ""
