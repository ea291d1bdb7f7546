"""The Ray tests' cluster: three simulated nodes of one CPU each on this machine
(ray.cluster_utils.Cluster), one CPU standing in for one accelerator host; started once per test
process (about 15 s) and shared by the tests of tests/cluster/."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))


def pytest_configure(config):
    config.addinivalue_line("markers", "ray: a study on a simulated Ray cluster (about a minute)")


@pytest.fixture(scope="session")
def cluster():
    ray_utils = pytest.importorskip("ray.cluster_utils")
    # The nodes' processes (and so the hosts' actors) inherit this environment: this checkout's
    # package, quiet TensorFlow, no GPU.
    os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["RAY_DEDUP_LOGS"] = "0"  # every host's lines reach the driver's output
    c = ray_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(2):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()
