"""bunqueue's own client, unmodified, against real Shoal clusters through one address.

Scripts written with the client (``scripts/*.ts``, run by Bun) connect to one node; on the
3-node cluster it is a node that leads none of the queues the script uses, so every
command goes through forwarding (:mod:`shoal.node.relay`). Each script prints one line per
check and exits non-zero if any failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from compat_places import entry_node, queues_away_from

from shoal.client import Client
from shoal.cluster.launcher import LocalCluster

pytestmark = pytest.mark.integration

SCRIPT_TIMEOUT_S = 240.0
DONE_WHEN_ROLES = ("basic", "w0", "w1", "w2", "w3", "w4", "w5", "retry", "events", "flow-parent", "flow-child")
API_ROLES = ("order", "lists", "control", "sched", "dlq", "limits", "nolocks", "manual", "custom", "repeat", "batch")


def run_script(client: object, cluster: LocalCluster, script: str, roles: tuple[str, ...], workdir: Path,
               setup: Callable[[dict[str, str]], None] | None = None) -> str:
    """Run ``script`` through the entry node; ``setup`` first gets the queue of each role."""
    node = entry_node(cluster)
    queues = queues_away_from(cluster, node, roles, script.split(".")[0].replace("_", ""))
    if setup is not None:
        setup(queues)
    host, port = cluster.address_of(node).rsplit(":", 1)
    done = client.run(script, {"BQ_HOST": host, "BQ_PORT": port, "BQ_QUEUES": json.dumps(queues)},  # type: ignore[attr-defined]
                      workdir, SCRIPT_TIMEOUT_S)
    report = f"{script} through {node} ({cluster.address_of(node)}):\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, report
    assert "all checks passed" in done.stdout, report
    return done.stdout


def test_the_done_when_script(bunqueue_client: object, shoal_cluster: LocalCluster, tmp_path: Path) -> None:
    """add/addBulk, a Worker completing 100 jobs on each of six queues, a job failing twice and
    completing on its third attempt, getJob, a QueueEvents 'completed' event, a flow whose
    parent runs after its children under its own name."""
    out = run_script(bunqueue_client, shoal_cluster, "done_when.ts", DONE_WHEN_ROLES, tmp_path)
    assert out.count("PASS ") == 6, out


def test_the_rest_of_the_documented_calls(bunqueue_client: object, shoal_cluster: LocalCluster, tmp_path: Path) -> None:
    """Priorities, listings and counts, queue control, job schedulers, the DLQ, global limits,
    a Worker without locks (progress, logs, retries), moving jobs by hand, custom ids, an add
    with the legacy repeat option, a batch Worker."""
    out = run_script(bunqueue_client, shoal_cluster, "api.ts", API_ROLES, tmp_path)
    assert out.count("PASS ") == 11, out


def test_a_batch_worker_with_group_affinity(bunqueue_client: object, shoal_cluster: LocalCluster,
                                            tmp_path: Path) -> None:
    """A Worker with ``batch: {size: 5, minSize: 5, groupAffinity: true}`` drains three groups
    and jobs without a group: each job once, each batch of one group and full (its pulls name
    the batch's group: ``PULLB`` ``group: {affinity}``)."""
    def setup(queues: dict[str, str]) -> None:
        with Client(shoal_cluster.addresses) as client:
            queue = client.queue(queues["affinity"])
            queue.obliterate()
            queue.create(group_concurrency=0)  # a group's five jobs run together

    out = run_script(bunqueue_client, shoal_cluster, "group_affinity.ts", ("affinity",), tmp_path, setup)
    assert out.count("PASS ") == 1, out
