"""Owns a study on a Ray cluster (`--cluster=auto` or `--cluster=HEAD:6379`): this process is the
driver; one long-lived `Host` actor per accelerator host (cluster/host.py) owns that host's device
and takes (member, batch size) groups from the driver's queue, each run to the end of its
learning-rate protocol.

What Ray does and the package no longer does itself: placing one actor per host (its TPU chips,
a GPU, or the node's CPUs as its resources), noticing a host that died or was preempted,
restarting its actor (`max_restarts`), and fencing it (Ray kills an actor it declared lost). The
driver re-queues the group a lost host was running; its trials resume from their checkpoints.

The driver holds nothing the workdir does not: the open groups are read from the records
(WORKDIR/results/, written whole and once by the host that ran the trial), so a driver killed and
started again on the same workdir resumes where the records stand. One driver per workdir: the
driver holds a named actor derived from the workdir in the cluster's `wide_tf` namespace (Ray
creates a name once; a second driver is refused in one line), which dies with its driver, so a
restarted driver takes it again. The workdir must be one every node reaches (gs://, or a file
system shared by the nodes)."""

from __future__ import annotations

import collections
import os
import time
import uuid

from wide_tf.checks import validate
from wide_tf.engine import backend
from wide_tf.store import workdir as wd
from wide_tf.study import progress, trials
from wide_tf.study.workers import Outcome

NAMESPACE = "wide_tf"
# How often a lost host's actor is restarted by Ray (a preempted VM that comes back, a node
# replaced by the autoscaler) before the study goes on without it.
HOST_RESTARTS = 3
# How long a driver waits for the name of a driver that has just died to be freed.
OWNER_WAIT_S = 30.0
PROGRESS_EVERY_S = 60.0
# How often the driver looks for nodes that have left the cluster.
NODE_CHECK_S = 5.0


class ClusterProblem(validate.RuntimeProblem):
    """The study cannot run on the cluster; the message is the one line to show (exit 1)."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterProblem(
            "--cluster needs Ray: pip install 'wide_tf[ray]' on the driver and on every node"
        ) from None
    return ray


def connect(address: str):
    """Ray, connected to the cluster at `address` ("auto": the one this machine belongs to)."""
    ray = _ray()
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ClusterProblem(
            f"no Ray cluster at --cluster={address} ({first[:200]}); start one with "
            "`ray start --head` (and `ray start --address=HEAD:6379` on the other hosts), or give "
            "its address"
        ) from None
    return ray


class Owner:
    """The one driver of a workdir, as a named actor of the cluster (no resources)."""

    def __init__(self, holder: str):
        self.holder = holder

    def who(self) -> str:
        return self.holder


def owner_name(workdir: str) -> str:
    where = workdir if "://" in workdir else os.path.abspath(workdir)
    return "owner-" + uuid.uuid5(uuid.NAMESPACE_URL, where).hex[:16]


def hold_workdir(ray, workdir: str, wait_s: float = OWNER_WAIT_S):
    """The workdir's owner actor, created by this driver; ClusterProblem when a live driver holds
    it. A name whose driver has died is waited for (Ray frees it when it reaps that driver)."""
    name = owner_name(workdir)
    me = f"{os.uname().nodename}:{os.getpid()}"
    actor = ray.remote(num_cpus=0)(Owner)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            handle = actor.options(name=name, namespace=NAMESPACE).remote(me)
            ray.get(handle.who.remote())
            return handle
        except ValueError:  # the name is taken: by a live driver, or one Ray is reaping
            pass
        try:
            other = ray.get(ray.get_actor(name, namespace=NAMESPACE).who.remote(), timeout=10)
        except Exception:  # gone or dying: its name is about to be free
            other = None
        if other is not None:
            raise ClusterProblem(
                f"another driver ({other}) is running the study in {workdir} on this Ray "
                "cluster; wait for it to finish (or stop it), then run the same command again"
            )
        if time.monotonic() > deadline:
            raise ClusterProblem(
                f"the workdir {workdir} is still held by a driver that stopped answering "
                f"{wait_s:g}s ago; run the same command again once Ray has reaped it"
            )
        time.sleep(1.0)


def host_options(ray) -> list[dict]:
    """One actor's options per accelerator host of the cluster: a TPU host's chips, one GPU, or
    (a CPU cluster) a node's CPUs (the smallest node's count, so a restart fits any node)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    tpu = [n["Resources"]["TPU"] for n in nodes if n["Resources"].get("TPU")]
    if tpu:
        return [{"num_cpus": 0, "resources": {"TPU": chips}} for chips in tpu]
    gpus = int(sum(n["Resources"].get("GPU", 0) for n in nodes))
    if gpus:
        return [{"num_cpus": 0, "num_gpus": 1} for _ in range(gpus)]
    cpus = [n["Resources"].get("CPU", 0) for n in nodes if n["Resources"].get("CPU", 0) >= 1]
    if not cpus:
        raise ClusterProblem("the Ray cluster has no node with a CPU, GPU or TPU to run on")
    return [{"num_cpus": min(cpus)} for _ in cpus]


def start_hosts(ray, config, workdir: str, verbose: bool) -> list:
    from wide_tf.cluster import host

    actor = ray.remote(host.Host)
    frozen = config.to_dict()
    return [
        actor.options(
            max_restarts=HOST_RESTARTS, max_task_retries=0, scheduling_strategy="SPREAD", **o
        ).remote(frozen, workdir, verbose)
        for o in host_options(ray)
    ]


def open_groups(config, workdir: str) -> list[tuple[str, int]]:
    """The groups whose protocol is not finished by the workdir's records, longest first."""
    everything = trials.list_trials(config)
    initial = trials.group_trials(everything)
    results = {r["trial_id"]: r for r in wd.read_results(workdir, whole=True)}
    return [
        g
        for g in trials.claim_order(everything)
        if trials.expand_group(config, initial[g], results)[1]
    ]


def run(config, workdir: str, address: str, verbose: bool = False, log=print) -> Outcome:
    """Runs the study `config` (checked by the caller) in `workdir` on the cluster at `address`;
    returns an `Outcome` (the report is main's to write)."""
    trials.check_workdir(config, workdir)  # the "same study" check, before the cluster
    backend.select(config)
    ray = connect(address)
    try:
        owner = hold_workdir(ray, workdir)  # kept: Ray ends an actor when no handle is left
        hosts = start_hosts(ray, config, workdir, verbose)
        log(f"Study on the Ray cluster: {len(hosts)} hosts.")
        start = time.time()
        before = None
        while groups := open_groups(config, workdir):
            if groups == before:  # every one was run to its end, and the records say otherwise
                raise ClusterProblem(
                    f"{len(groups)} groups are still open after their hosts ran them (first: "
                    f"{groups[0][0]}, batch {groups[0][1]}); see the hosts' lines above"
                )
            drive(ray, hosts, groups, config, workdir, log)
            before = groups
        log(f"Study done on the cluster in {progress.fmt_time(time.time() - start)}.")
        del owner
    finally:
        ray.shutdown()  # the hosts and the owner die with this driver
    return Outcome(report_due=True)


def drive(ray, hosts: list, groups: list, config, workdir: str, log) -> None:
    """Hands `groups` to ready hosts until every one has been run. A host is ready once it has
    answered where it runs (its node); a group whose host was lost (its actor died, or its node
    left the cluster) goes back to the front of the queue, and the host is asked again: it is
    ready again once Ray has restarted it."""
    queue, ready_hosts = collections.deque(groups), []
    busy: dict = {}  # a run_group call -> (its host, its group)
    asking = {h.where.remote(): h for h in hosts}  # a `where` call -> its host
    node_of: dict = {}  # host -> its node, once it has answered
    last = time.monotonic()
    while queue or busy:
        while ready_hosts and queue:
            h, g = ready_hosts.pop(0), queue.popleft()
            busy[h.run_group.remote(*g)] = (h, g)
        if not busy and not asking:
            raise ClusterProblem(
                f"every host of the cluster is lost and {len(queue)} groups are left; the "
                "records are kept: run the same command again once hosts are back"
            )
        done, _ = ray.wait(list(busy) + list(asking), num_returns=1, timeout=NODE_CHECK_S)
        if time.monotonic() - last > PROGRESS_EVERY_S:
            log(f"progress: {_describe(config, workdir)}, {len(busy)} groups running")
            last = time.monotonic()
        for ref in done:
            if ref in asking:
                h = asking.pop(ref)
                try:
                    node_of[h] = ray.get(ref)["node"]
                    ready_hosts.append(h)
                except ray.exceptions.RayActorError:  # its restarts are used up
                    pass
                continue
            h, g = busy.pop(ref)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                _lost(h, g, _first(e), queue, asking, log)
                continue
            except ray.exceptions.RayTaskError as e:
                raise ClusterProblem(
                    f"group {g[0]} (batch {g[1]}) failed: {_first(e.cause or e)}; finished "
                    "trials are kept: fix the cause and run the same command again"
                ) from None
            log(f"group {g[0]} (batch {g[1]}) done on {out['host']}: {out['ran']} trials run")
            ready_hosts.append(h)
        _drop_dead_nodes(ray, busy, node_of, queue, asking, log)


def _lost(h, g, why: str, queue, asking, log) -> None:
    log(f"host lost while running group {g[0]} (batch {g[1]}): {why}; the group is re-queued")
    queue.appendleft(g)
    asking[h.where.remote()] = h  # answered once Ray has restarted it


def _drop_dead_nodes(ray, busy: dict, node_of: dict, queue, asking, log) -> None:
    """Groups running on a node that has left the cluster are re-queued at once: a call to an
    actor whose restart cannot be placed (no free host) would otherwise wait for ever."""
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    for ref, (h, g) in list(busy.items()):
        if node_of.get(h) is not None and node_of[h] not in alive:
            busy.pop(ref)
            node_of.pop(h)
            _lost(h, g, "its node left the cluster", queue, asking, log)


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[-1] if text else type(e).__name__)[:300]


def _describe(config, workdir: str) -> str:
    everything = trials.list_trials(config)
    initial = trials.group_trials(everything)
    results = {r["trial_id"]: r for r in wd.read_results(workdir, whole=True)}
    return progress.estimate_progress(config, initial, results).describe()
