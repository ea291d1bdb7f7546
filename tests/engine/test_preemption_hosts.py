"""Preemption across hosts, with two JAX processes on this machine standing in for the hosts of
a slice (jax.distributed on localhost, CPU): SIGTERM reaches one host only, and both stop at the
same step (engine/preemption.py's agreement through a process_allgather). Without the agreement
the host that got no signal runs on (the control case: where a real slice hangs in a collective).
The Compute Engine notice is read from a metadata server stand-in on localhost."""

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
from helpers import REPO

from wide_tf.engine import preemption

HOST = os.path.join(REPO, "tests", "preemption_host.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _hosts(mode: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "WIDE_TF"))}
    env.update(
        PYTHONPATH=str(REPO),
        JAX_COORDINATOR_ADDRESS=f"localhost:{_free_port()}",
        JAX_NUM_PROCESSES="2",
        JAX_PLATFORMS="cpu",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, HOST, mode],
            cwd=REPO,
            env=dict(env, JAX_PROCESS_ID=str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        line = "-"
        while line and line.strip() != "ready":  # past JAX's own lines (Gloo's connection)
            line = p.stdout.readline()
        assert line.strip() == "ready"
    procs[1].send_signal(signal.SIGTERM)  # one host gets the notice
    outs = [p.communicate(timeout=120)[0] for p in procs]
    ends = [
        [ln for ln in out.splitlines() if ln.startswith(("stopped", "finished"))] for out in outs
    ]
    assert all(ends), outs
    return [e[-1] for e in ends]


def test_two_hosts_stop_at_the_same_step_when_one_gets_sigterm():
    pytest.importorskip("jax")  # the hosts are JAX processes (the TF 2.19.1 CI job has none)
    first, second = _hosts("agree")
    assert first.startswith("stopped at ") and first == second


def test_without_the_agreement_the_other_host_runs_on():
    pytest.importorskip("jax")  # the hosts are JAX processes (the TF 2.19.1 CI job has none)
    first, second = _hosts("alone")
    assert second.startswith("stopped at ") and first == "finished at 4000"


class _Metadata(http.server.BaseHTTPRequestHandler):
    answers = {"preempted": "FALSE", "maintenance-event": "NONE"}
    changed = threading.Event()

    def do_GET(self):  # noqa: N802  (http.server's name)
        key = self.path.split("/instance/", 1)[1].split("?")[0]
        if "wait_for_change" in self.path:
            self.changed.wait(10)
        ok = self.headers.get("Metadata-Flavor") == "Google"
        body = self.answers.get(key, "") if ok else "missing header"
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_):
        pass


@pytest.mark.parametrize(
    ("key", "value"),
    [("preempted", "TRUE"), ("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")],
)
def test_a_compute_engine_notice_sets_the_stop_flag(monkeypatch, key, value):
    monkeypatch.setattr(preemption, "_requested", threading.Event())
    monkeypatch.setattr(preemption, "_watching", threading.Event())
    _Metadata.answers = {"preempted": "FALSE", "maintenance-event": "NONE"}
    _Metadata.changed = threading.Event()
    server = http.server.ThreadingHTTPServer(("localhost", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"localhost:{server.server_address[1]}"
        assert preemption.watch_gce_notice(host)
        assert not preemption._requested.wait(0.5)  # FALSE / NONE: no stop
        _Metadata.answers[key] = value
        _Metadata.changed.set()
        assert preemption._requested.wait(10)
        assert preemption.stop_agreed(100)  # one host: its own flag
    finally:
        server.shutdown()


def test_a_migration_does_not_stop_and_no_server_means_no_watch(monkeypatch):
    assert not preemption.NOTICE_KEYS["maintenance-event"]("MIGRATE_ON_HOST_MAINTENANCE")
    assert preemption.NOTICE_KEYS["maintenance-event"]("TERMINATE_ON_HOST_MAINTENANCE")
    monkeypatch.setattr(preemption, "_watching", threading.Event())
    assert not preemption.watch_gce_notice(f"localhost:{_free_port()}", probe_s=0.5)
    monkeypatch.setattr(preemption, "on_gce", lambda: False)
    assert not preemption.watch_gce_notice()  # off Compute Engine: nothing is asked
