"""The Ray path's parts that need no cluster: --cluster with flags for one machine refused in one
line, and one host actor per accelerator host (a TPU node's chips, a GPU, a CPU node's cores)."""

from types import SimpleNamespace

import pytest

from wide_tf.checks import validate
from wide_tf.cluster import ray_study


@pytest.mark.parametrize("flag", ["workers", "shard", "trial"])
def test_flags_for_one_machine_are_refused_with_cluster(flag):
    given = {"workers": None, "shard": None, "trial": None, flag: "2"}
    with pytest.raises(validate.UsageError, match=f"--{flag} runs on one machine") as e:
        validate.check_cluster("auto", **given)
    assert "\n" not in str(e.value)
    validate.check_cluster(None, **given)  # without --cluster they are main's as before
    with pytest.raises(validate.UsageError, match="--cluster is empty"):
        validate.check_cluster(" ", None, None, None)


def _ray(*resources, dead=()):
    nodes = [{"Alive": True, "Resources": r} for r in resources]
    nodes += [{"Alive": False, "Resources": r} for r in dead]
    return SimpleNamespace(nodes=lambda: nodes)


def test_one_host_actor_per_accelerator_host():
    tpu = _ray({"CPU": 96, "TPU": 4}, {"CPU": 96, "TPU": 4}, {"CPU": 8})  # + a CPU-only head
    assert ray_study.host_options(tpu) == [{"num_cpus": 0, "resources": {"TPU": 4}}] * 2
    gpu = _ray({"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 1})
    assert ray_study.host_options(gpu) == [{"num_cpus": 0, "num_gpus": 1}] * 3
    cpu = _ray({"CPU": 4}, {"CPU": 2}, dead=[{"CPU": 64}])  # a dead node counts for nothing
    assert ray_study.host_options(cpu) == [{"num_cpus": 2}] * 2
    with pytest.raises(ray_study.ClusterProblem, match="no node"):
        ray_study.host_options(_ray({"memory": 1}))


def test_the_owner_name_is_the_workdirs_own():
    a, b = ray_study.owner_name("runs/a"), ray_study.owner_name("gs://bucket/a")
    assert a != b and a == ray_study.owner_name("./runs/a")
    assert b == ray_study.owner_name("gs://bucket/a")
