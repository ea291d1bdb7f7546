"""The fake `gcloud` of the launcher's tests: it records every call and answers from files in one
folder. `answer` is the fake itself; a launcher run in the test's process calls it directly
(tests/launch_harness.py), one run as a process finds it as a script on PATH (`main`, started with
`python -SE`: the standard library alone, so a call costs a bare interpreter's start).

The folder: calls.jsonl (every call's arguments, appended), vm-NAME.json (a VM: state, spot,
queued, started) and qr-NAME.json (a queued request: its state), which create, delete and start
change; the queues `states`, `checks` and `qr_states` (JSON lists) give the next answers of
`describe` (sticky: it becomes the VM's state), of the run check and of an existing queued
request's describe. A queued VM that goes missing leaves its request SUSPENDED (a spot preemption:
Google deletes the node, the request stays). The environment: FAKE_HANG=install,tpucheck,start,check
makes those ssh steps hang, FAKE_DESCRIBE_ERROR a describe fail with that message, FAKE_CREATE_EXIT
a create fail after making its node, FAKE_VERSIONS the images `versions list` offers,
FAKE_TPU_CHECK_EXIT the exit of --check's TPU stage."""

import json
import os
import shutil
import sys
import time

POD_IMAGES = ["tpu-vm-tf-2.18.0-pod-pjrt", "tpu-vm-tf-2.19.1-pod-pjrt", "tpu-vm-tf-2.20.0-pod-pjrt"]


class _Folder:
    def __init__(self, path):
        self.path = path

    def load(self, name, default):
        p = os.path.join(self.path, name)
        if not os.path.exists(p):
            return default
        with open(p) as f:
            return json.load(f)

    def save(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            json.dump(value, f)

    def pop(self, name):
        q = self.load(name, [])
        if not q:
            return None
        self.save(name, q[1:])
        return q[0]


def ssh_step(command: str) -> str:
    """Which remote step an ssh --command= is: install, tpucheck, start, check (the run check),
    or '' (anything else: a tail, Ray's start)."""
    if "vm_setup.sh" in command:
        return "install"
    if "vm.tpu_check" in command or "vm.jax_check" in command:
        return "tpucheck"
    if "nohup" in command:
        return "start"
    if "wide_tf.pid 2>/dev/null" in command:
        return "check"
    return ""


def answer(args: list[str], folder: str, environ) -> tuple[int, str, str, bool]:
    """`gcloud ARGS` as (exit status, stdout, stderr, whether it hangs: it never answers, and the
    launcher's limit must stop it)."""
    d = _Folder(folder)
    with open(os.path.join(folder, "calls.jsonl"), "a") as f:
        f.write(json.dumps(args) + "\n")
    out, err = [], []
    queued = args[2] == "queued-resources"
    verb = args[3]
    vm_file = "vm-" + args[4] + ".json"  # one per VM name (--shards starts several)
    qr_file = "qr-" + args[4] + ".json"
    vm = d.load(vm_file, {"state": ""})
    qr = d.load(qr_file, None)
    if verb == "describe" and queued:
        if qr is None:
            err.append(
                "ERROR: (gcloud.compute.tpus.queued-resources.describe) NOT_FOUND: no such request"
            )
            return 1, "", "\n".join(err) + "\n", False
        out.append(d.pop("qr_states") or qr["state"])
    elif verb == "create" and queued:
        d.save(vm_file, {"state": "READY", "spot": "--spot" in args, "queued": True})
        d.save(qr_file, {"state": "ACTIVE"})
    elif verb == "delete" and queued:
        d.save(vm_file, {"state": ""})
        os.remove(os.path.join(folder, qr_file))
    elif verb == "describe" and "--format=value(networkEndpoints[0].ipAddress)" in args:
        out.append("10.0.0." + args[4].rsplit("-", 1)[-1])  # worker 0's internal address
    elif verb == "describe":
        if environ.get("FAKE_DESCRIBE_ERROR"):
            return 1, "", environ["FAKE_DESCRIBE_ERROR"] + "\n", False
        nxt = d.pop("states")
        if nxt is not None:
            if nxt == "" and vm.get("queued") and qr is not None:
                d.save(qr_file, {"state": "SUSPENDED"})
            vm["state"] = nxt
            d.save(vm_file, vm)
        if not vm["state"]:
            err.append("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: no such node")
            return 1, "", "\n".join(err) + "\n", False
        fields = [vm["state"], "True" if vm.get("spot") else "", ""]
        if vm.get("queued"):
            fields.append("projects/p/locations/z/queuedResources/" + args[4])
        out.append("\t".join(fields))
    elif verb == "create":
        d.save(vm_file, {"state": "READY", "spot": "--spot" in args, "queued": False})
        if environ.get("FAKE_CREATE_EXIT"):  # a create that fails after making a node
            err.append("ERROR: (gcloud.compute.tpus.tpu-vm.create) operation failed")
            return int(environ["FAKE_CREATE_EXIT"]), "", "\n".join(err) + "\n", False
    elif verb == "delete":
        d.save(vm_file, {"state": ""})
    elif verb == "start":
        vm["state"] = "READY"
        d.save(vm_file, vm)
    elif verb == "versions":
        out.append(environ.get("FAKE_VERSIONS", "\n".join(POD_IMAGES)))
    elif verb == "scp":  # keep what would be copied, for the test to open
        shutil.copy(args[args.index("scp") + 1], os.path.join(folder, "copied.tar.gz"))
    elif verb == "ssh":
        cmd = next(a for a in args if a.startswith("--command="))
        step = ssh_step(cmd)
        if step and step in environ.get("FAKE_HANG", "").split(","):
            return 0, "", "", True
        if step == "check":
            reply = d.pop("checks")
            if reply is None:
                reply = "running 4242" if vm.get("started") else "no run active"
            out.append("wide_tf: " + reply)
        elif step == "tpucheck":
            expected = cmd.split("--replicas=")[1].split()[0]
            if "vm.jax_check" in cmd:  # --backend=jax: wide_tf/launch/vm/jax_check.py's lines
                out.append(
                    "wide_tf check: runtime JAX 0.10.2 on tpu (PJRT), libtpu 0.0.42.1; process 0 "
                    "of 1"
                )
                out.append(f"wide_tf check: JAX sees {expected} replica(s) (expected {expected})")
            else:
                out.append(
                    "wide_tf check: runtime PJRT (pluggable device /v/libtpu.so); tensorflow 2.19.1"
                )
                out.append(
                    f"wide_tf check: the TPU system has {expected} replicas (expected {expected})"
                )
            code = int(environ.get("FAKE_TPU_CHECK_EXIT", "0"))
            return code, "\n".join(out) + "\n", "", False
        elif step == "start":
            vm["started"] = True
            d.save(vm_file, vm)
    return 0, "".join(line + "\n" for line in out), "", False


def main() -> int:
    """The script on PATH: the answer on stdout and stderr; a hung step sleeps for a minute."""
    code, out, err, hangs = answer(sys.argv[1:], os.environ["FAKE_DIR"], os.environ)
    if hangs:
        time.sleep(60)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code
