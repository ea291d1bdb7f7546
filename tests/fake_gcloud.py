"""The fake `gcloud` of the launcher's tests (tests/test_launch.py, tests/test_launch_watch.py): a
script on PATH that records every call and answers `describe` with a chosen VM state, the pid
check with a chosen answer and queued requests from a file; the fixture that runs the launcher
(wide_tf.launch.command.main, in this process) against it, and helpers that name the calls."""

import dataclasses
import io
import json
import sys

from helpers import REPO

from wide_tf.launch import command as cli

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
# (a spot preemption: Google deletes the node, the request stays). FAKE_HANG=install,tpucheck,...
# makes those ssh steps hang (a minute) so the launcher's limits can be tested.
FAKE_GCLOUD = f"""#!{sys.executable} -SE
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
elif verb == "describe" and "--format=value(networkEndpoints[0].ipAddress)" in args:
    print("10.0.0." + args[4].rsplit("-", 1)[-1])  # worker 0's internal address
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
    if os.environ.get("FAKE_CREATE_EXIT"):  # a create that fails after making a node
        print("ERROR: (gcloud.compute.tpus.tpu-vm.create) operation failed", file=sys.stderr)
        sys.exit(int(os.environ["FAKE_CREATE_EXIT"]))
elif verb == "delete":
    save(vm_file, {{"state": ""}})
elif verb == "start":
    vm["state"] = "READY"
    save(vm_file, vm)
elif verb == "versions":
    pods = ["tpu-vm-tf-2.18.0-pod-pjrt", "tpu-vm-tf-2.19.1-pod-pjrt", "tpu-vm-tf-2.20.0-pod-pjrt"]
    print(os.environ.get("FAKE_VERSIONS", "\\n".join(pods)))
elif verb == "scp":  # keep what would be copied, for the test to open
    shutil.copy(args[args.index("scp") + 1], os.path.join(d, "copied.tar.gz"))
elif verb == "ssh":
    cmd = next(a for a in args if a.startswith("--command="))
    tpucheck = "vm.tpu_check" in cmd or "vm.jax_check" in cmd
    step = ("install" if "vm_setup.sh" in cmd else "tpucheck" if tpucheck
            else "start" if "nohup" in cmd else "check" if "wide_tf.pid 2>/dev/null" in cmd else "")
    if step and step in os.environ.get("FAKE_HANG", "").split(","):
        import time
        time.sleep(60)  # a step that never answers: the launcher's limit must stop it
    if "wide_tf.pid 2>/dev/null" in cmd:
        answer = pop("checks")
        if answer is None:
            answer = "running 4242" if vm.get("started") else "no run active"
        print("wide_tf: " + answer)
    elif "vm.jax_check" in cmd:  # --backend=jax: wide_tf/launch/vm/jax_check.py's lines
        expected = cmd.split("--replicas=")[1].split()[0]
        print("wide_tf check: runtime JAX 0.10.2 on tpu (PJRT), libtpu 0.0.42.1; process 0 of 1")
        print(f"wide_tf check: JAX sees {{expected}} replica(s) (expected {{expected}})")
        sys.exit(int(os.environ.get("FAKE_TPU_CHECK_EXIT", "0")))
    elif "vm.tpu_check" in cmd:
        expected = cmd.split("--replicas=")[1].split()[0]
        print("wide_tf check: runtime PJRT (pluggable device /v/libtpu.so); tensorflow 2.19.1")
        print(f"wide_tf check: the TPU system has {{expected}} replicas (expected {{expected}})")
        sys.exit(int(os.environ.get("FAKE_TPU_CHECK_EXIT", "0")))
    elif "nohup" in cmd:
        vm["started"] = True
        save(vm_file, vm)
"""

# The launcher checks the config with `python -m wide_tf.main --dry_run` (no TensorFlow): this
# interpreter has the package's requirements; no waiting between polls in the tests.
BASE_ENV = {"PYTHON": sys.executable, "WIDE_TF_POLL_S": "0", "WIDE_TF_ALIVE_WAIT_S": "0"}


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_launcher(*args, env) -> Result:
    """The launcher in this process (`python -m wide_tf.launch ARGS`), its output captured; the
    processes it starts (gcloud, the checks here) get `env` alone."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), env=env, out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())


def _launch(*args, env=None):
    """--dry_run and argument errors: no gcloud on PATH at all (they must not call it), unless
    `env` says otherwise."""
    return run_launcher(*args, env=env or {"PATH": "/usr/bin:/bin", **BASE_ENV})


def make_fake(tmp_path):
    """The `fake` fixture of the launcher's tests: runs the launcher with the fake gcloud and
    returns (result, the recorded calls), each call without 'compute tpus tpu-vm' (queued-resources
    calls as 'qr-VERB ...')."""
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
        validate=False,
    ):
        # The config check here (a `wide_tf.main --dry_run` process) only where a test is about
        # it (fake.validated): the gcloud calls do not depend on it, and it is most of a launch's
        # time here.
        if not validate and "--no_validate" not in args:
            args = ("--no_validate", *args)
        log.write_text("")
        vm = {"state": state, "spot": spot, "queued": queued, "started": running}
        for old in [*tmp_path.glob("vm-*.json"), *tmp_path.glob("qr-*.json")]:
            old.unlink()
        (tmp_path / "vm-wide-v4.json").write_text(json.dumps(vm))
        if request or (queued and state):  # a request of that name (a queued VM has one)
            (tmp_path / "qr-wide-v4.json").write_text(json.dumps({"state": request or "ACTIVE"}))
        (tmp_path / "states").write_text(json.dumps(list(states)))
        (tmp_path / "checks").write_text(json.dumps(list(checks)))
        p = run_launcher(*args, env=fake_env(tmp_path, env))
        return p, calls_of(log)

    def validated(*args, **kwargs):
        return launch(*args, validate=True, **kwargs)

    launch.tmp_path = tmp_path
    launch.validated = validated
    return launch


def fake_env(tmp_path, extra=None) -> dict:
    return {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "FAKE_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "WIDE_TF_STATE_DIR": str(tmp_path / "state"),
        **BASE_ENV,
        **(extra or {}),
    }


def calls_of(log) -> list[list[str]]:
    calls = []
    for line in log.read_text().splitlines():
        c = json.loads(line)
        assert c[:2] == ["compute", "tpus"] and c[2] in ("tpu-vm", "queued-resources"), c
        calls.append(c[3:] if c[2] == "tpu-vm" else ["qr-" + c[3], *c[4:]])
    return calls


def _verbs(calls):
    """(verb, --worker=...) of every call; the run check is 'check', --check's is 'tpucheck',
    Ray's start 'ray'."""
    out = []
    for c in calls:
        verb = c[0]
        if verb == "ssh":
            cmd = _command(c)
            if "wide_tf.pid 2>/dev/null" in cmd:
                verb = "check"
            elif "vm_setup.sh" in cmd:
                verb = "install"
            elif "vm.tpu_check" in cmd or "vm.jax_check" in cmd:
                verb = "tpucheck"
            elif "nohup" in cmd:
                verb = "start"
            elif "/bin/ray start" in cmd:
                verb = "ray"
            else:
                verb = "tail"
        worker = next((a for a in c if a.startswith("--worker=")), None)
        out.append((verb, worker))
    return out


def _command(call):
    return next(a for a in call if a.startswith("--command="))
