"""The metrics the alert rules (deploy/prometheus/alerts.yml) stand on, read from real nodes: every
one is declared on /prometheus, a paused follower shows as silent and lagging on its leader, and a
move whose new replica cannot catch up shows its idle time (a move held for a rebalance does not)."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.client import Client
from shoal.cluster import operator
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

from waiting import eventually
from _deploy import alert_metric_names, exposition_names

pytestmark = pytest.mark.integration

PARTITIONS = 2
WAIT_S = 30.0
MOVES_S = 60.0
NODE_COMMAND = os.environ.get("SHOAL_TEST_NODE_COMMAND", "").split() or None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes; ports left free beside them for a fourth. Every node of its directory is stopped
    afterwards, the one a test adds included."""
    cl = LocalCluster(nodes=3, partitions=PARTITIONS, data_dir=tmp_path_factory.mktemp("alerts"),
                      base_port=free_base_port(5, PARTITIONS), node_command=NODE_COMMAND)
    try:
        cl.start()
        cl.wait_balanced()
        yield cl
    finally:
        cl.stop_all()


def scrape(cluster: LocalCluster, node_id: str) -> str:
    n = cluster.config.node(node_id)
    with urllib.request.urlopen(f"http://{n.host}:{n.http_port}/prometheus", timeout=5) as r:
        return str(r.read().decode())


def samples(cluster: LocalCluster, node_id: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample ``name`` of the node's /prometheus."""
    return [(s.labels, s.value) for family in text_string_to_metric_families(scrape(cluster, node_id))
            for s in family.samples if s.name == name]


def everywhere(cluster: LocalCluster, name: str) -> list[tuple[str, dict[str, str], float]]:
    """(node, labels, value) of every sample ``name`` on every running node."""
    return [(node, labels, value) for node in cluster.pids for labels, value in samples(cluster, node, name)]


def test_a_node_declares_every_metric_the_alerts_use(cluster: LocalCluster) -> None:
    declared = exposition_names(scrape(cluster, "n1"))
    assert alert_metric_names() <= declared, sorted(alert_metric_names() - declared)
    assert samples(cluster, "n1", "shoal_disk_free_bytes")[0][1] > 0


def test_a_paused_follower_is_silent_and_lagging_on_its_leader(cluster: LocalCluster) -> None:
    leader = cluster.leader_of(0)
    assert leader is not None
    follower = next(n for n in cluster.node_ids if n != leader)
    queue = next(q for q in (f"alerts-{i}" for i in range(100)) if partition_for(q, PARTITIONS) == 0)
    mine = {"partition": "0", "follower": follower}

    def on_leader(name: str) -> float:
        return next(v for labels, v in samples(cluster, leader, name) if labels == mine)

    assert on_leader("shoal_raft_follower_silence_seconds") < 5.0
    cluster.pause(follower)
    try:
        with Client([cluster.address_of(leader)]) as client:
            for k in range(5):
                client.queue(queue).add({"k": k})
        eventually(lambda: on_leader("shoal_raft_follower_lag_entries") >= 5
                   and on_leader("shoal_raft_follower_silence_seconds") > 1.0,
                   f"{leader} to see {follower} silent and behind", WAIT_S, poll_s=0.1)
    finally:
        cluster.resume(follower)

    def caught_up() -> bool:
        lags = [v for _node, labels, v in everywhere(cluster, "shoal_raft_follower_lag_entries")
                if labels["partition"] == "0"]
        return bool(lags) and max(lags) == 0

    eventually(caught_up, f"{follower} caught up again", WAIT_S, poll_s=0.1)


def test_a_move_whose_new_replica_cannot_catch_up_shows_its_idle_time(cluster: LocalCluster) -> None:
    where = operator.connect(str(cluster.data_dir), None)
    where.admin.settings(rebalanceAuto=False)
    operator.add_node(where, None, None, None, None, None, wait=False, deadline=time.monotonic() + MOVES_S,
                      say=print)
    pid = int(Path(cluster.data_dir / "n4.pid").read_text())
    held = eventually(lambda: everywhere(cluster, "shoal_moves_in_progress"), "moves waiting for a rebalance",
                      WAIT_S, poll_s=0.1)
    assert {labels["state"] for _node, labels, _v in held} == {"pending rebalance"}
    assert everywhere(cluster, "shoal_move_idle_seconds") == [], "a held move is not a stalled one"

    os.kill(pid, signal.SIGSTOP)  # n4 can take no snapshot and no entry: its moves cannot progress
    try:
        where.admin.rebalance()
        idle = eventually(lambda: [v for _n, _l, v in everywhere(cluster, "shoal_move_idle_seconds") if v >= 2.0],
                          "a move idle for 2 s", WAIT_S, poll_s=0.2)
        assert idle
    finally:
        os.kill(pid, signal.SIGCONT)

    def done() -> bool:
        running = [v for _n, _l, v in everywhere(cluster, "shoal_moves_in_progress") if v]
        return not running and not everywhere(cluster, "shoal_move_idle_seconds")

    eventually(done, "every move finished once n4 runs again", MOVES_S, poll_s=0.2)
