"""bunqueue's own client, unmodified, against real Shoal clusters through one address.

Scripts written with the client (``scripts/*.ts``, run by Bun) connect to one node; on the
3-node cluster it is a node that leads none of the queues the script uses, so every
command goes through forwarding (:mod:`shoal.node.relay`). Each script prints one line per
check and exits non-zero if any failed.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

pytestmark = pytest.mark.integration

SCRIPT_TIMEOUT_S = 240.0
DONE_WHEN_ROLES = ("basic", "w0", "w1", "w2", "w3", "w4", "w5", "retry", "events", "flow-parent", "flow-child")
API_ROLES = ("order", "lists", "control", "sched", "dlq", "limits", "nolocks", "manual", "custom")


def entry_node(cluster: LocalCluster) -> str:
    """The node to connect to: the one that leads the fewest partitions."""
    topo = cluster.topology()
    led = {n: 0 for n in cluster.node_ids}
    for p in range(cluster.config.partitions):
        leader = topo.partition_map[p].leader
        if leader in led:
            led[leader] += 1
    return min(led, key=lambda n: (led[n], n))


def queues_away_from(cluster: LocalCluster, node: str, roles: tuple[str, ...], tag: str) -> dict[str, str]:
    """A queue name per role whose partition ``node`` does not lead (any name on one node)."""
    topo = cluster.topology()
    names = {}
    for role in roles:
        for i in itertools.count():
            name = f"bq-{tag}-{role}-{i}"
            p = partition_for(name, cluster.config.partitions)
            if len(cluster.node_ids) == 1 or topo.partition_map[p].leader not in (node, None):
                names[role] = name
                break
    return names


def run_script(client: object, cluster: LocalCluster, script: str, roles: tuple[str, ...], workdir: Path) -> str:
    node = entry_node(cluster)
    queues = queues_away_from(cluster, node, roles, script.split(".")[0].replace("_", ""))
    host, port = cluster.address_of(node).rsplit(":", 1)
    done = client.run(script, {"BQ_HOST": host, "BQ_PORT": port, "BQ_QUEUES": json.dumps(queues)},  # type: ignore[attr-defined]
                      workdir, SCRIPT_TIMEOUT_S)
    report = f"{script} through {node} ({cluster.address_of(node)}):\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, report
    assert "all checks passed" in done.stdout, report
    return done.stdout


def test_the_done_when_script(bunqueue_client: object, shoal_cluster: LocalCluster, tmp_path: Path) -> None:
    """add/addBulk, a Worker completing 100 jobs on each of six queues, a job failing twice and
    completing on its third attempt, getJob, a QueueEvents 'completed' event, a flow."""
    out = run_script(bunqueue_client, shoal_cluster, "done_when.ts", DONE_WHEN_ROLES, tmp_path)
    assert out.count("PASS ") == 6, out


def test_the_rest_of_the_documented_calls(bunqueue_client: object, shoal_cluster: LocalCluster, tmp_path: Path) -> None:
    """Priorities, listings and counts, queue control, job schedulers, the DLQ, global limits,
    a Worker without locks (progress, logs, retries), moving jobs by hand, custom ids."""
    out = run_script(bunqueue_client, shoal_cluster, "api.ts", API_ROLES, tmp_path)
    assert out.count("PASS ") == 9, out
