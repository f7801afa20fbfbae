"""A local Ray cluster started by the project is its own, even when another process on the machine
runs one: with no address Ray joins the newest local cluster it finds and then refuses ``num_cpus``
("When connecting to an existing cluster, num_cpus and num_gpus must not be provided"), which is how
two test processes starting Ray at once failed a CI run."""

from __future__ import annotations

import select
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

OTHER = """
import sys
from ray.cluster_utils import Cluster
# a cluster as tests/trainers/test_ray_node_loss.py starts one: it records itself as this machine's
# current cluster, which a ray.init() without an address then joins
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
print("up", flush=True)
sys.stdin.readline()  # until the test is done
cluster.shutdown()
"""


@pytest.mark.timeout(240)
def test_init_ray_starts_its_own_cluster_beside_another_process_cluster():
    from agent_gym.integrations.rllib import init_ray

    other = subprocess.Popen([sys.executable, "-c", OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([other.stdout], [], [], 150)  # a deadline on the child's "up"
        line = other.stdout.readline() if ready else ""  # a line, or EOF ("") when the child died
        assert line.strip() == "up", "the other process's Ray cluster did not start within 150 s"
        assert init_ray(num_cpus=3)  # before the fix: ValueError (joined the other cluster)
        try:
            assert ray.cluster_resources().get("CPU") == 3  # ours, not the other's 1 CPU
        finally:
            ray.shutdown()
    finally:
        try:
            other.communicate("\n", timeout=60)
        except subprocess.TimeoutExpired:
            other.kill()
            other.communicate(timeout=10)
