"""The cluster-wide move rate governs a move while it runs (``PUT /admin/settings moveRateBytesPerS``).

Real node processes: a 3-node cluster whose journals are compacted (so a new replica is built
from a snapshot stream), a fourth node added with the move rate at its minimum. The snapshot
streams to it stop at the rate's burst and stay there; raising the rate while they wait
finishes the moves. Nothing here depends on timing: a stream cannot pass its rate, and the end
is waited for with a deadline.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client
from shoal.cluster.admin_client import AdminClient, ClusterShape
from shoal.cluster.config import NodeSpec
from shoal.cluster.launcher import LocalCluster, free_base_port, write_cluster_file
from shoal.cluster.registry import MOVE_RATE_BYTES_PER_S
from shoal.node.raft.install import WINDOW_BYTES

from conftest import NODE_COMMAND
from waiting import eventually

pytestmark = pytest.mark.integration

PARTITIONS = 2
QUEUES = ["rate-a", "rate-b", "rate-c", "rate-d"]
#: 6 MiB of jobs per partition: more than a stream's burst (install.WINDOW_BYTES, 4 MiB).
JOBS, DATA = 12_000, b"r" * 1000
SLOW = 1024          # the lowest rate the registry takes: a node's share is 256 B/s
WAIT_S = 120.0


def _streams(shape: ClusterShape) -> list[dict[str, Any]]:
    return [m for m in shape.moves if m.get("to") == "n4" and "bytesTotal" in m]


def test_a_move_rate_changed_while_moves_run_takes_effect(tmp_path: Path) -> None:
    base = free_base_port(4, PARTITIONS)
    env = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "20"}  # compacted journals: a learner needs a snapshot
    with LocalCluster(nodes=3, partitions=PARTITIONS, data_dir=tmp_path / "c", base_port=base, extra_env=env,
                      node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        with Client(cluster.addresses) as client:
            for q in QUEUES:
                client.queue(q).add_bulk([DATA] * (JOBS // len(QUEUES)), batch_size=100)
        admin = AdminClient(f"http://127.0.0.1:{cluster.config.node('n1').http_port}")
        assert admin.registry().settings.move_rate_bytes_per_s == MOVE_RATE_BYTES_PER_S
        admin.settings(moveRateBytesPerS=SLOW)
        # Every node applies the setting (gossip) before the moves begin.
        for n in cluster.node_ids:
            peer = AdminClient(f"http://127.0.0.1:{cluster.config.node(n).http_port}")
            peer.wait(lambda s: s.registry.settings.move_rate_bytes_per_s == SLOW, WAIT_S)
        # Each leader compacted its journal behind a snapshot.
        eventually(lambda: all(r["raft"].get("snapshot") for r in _local_replicas(cluster).values()),
                   "a snapshot on every leader", WAIT_S, poll_s=0.2)

        n4 = NodeSpec("n4", "127.0.0.1", base + 6, base + 7, base + 103)
        cluster.config = replace(cluster.config, nodes=cluster.config.nodes + (n4,), bootstrap_nodes=("n1", "n2", "n3"))
        write_cluster_file(cluster.config_path, cluster.config)
        admin.add_node("n4", n4.host, n4.port, n4.http_port, n4.raft_port)
        cluster.start_node("n4")

        # The streams to n4 start, then wait on the rate: none gets near its end.
        shape = admin.wait(lambda s: bool(_streams(s)) and all(m["bytesSent"] > 0 for m in _streams(s)), WAIT_S)
        first = {m["partition"]: m["bytesSent"] for m in _streams(shape)}
        time.sleep(3.0)  # at 256 B/s a stream moves under 1 KiB in this time, whatever the machine's load
        held = _streams(admin.shape())
        assert held, "the throttled moves finished: the rate did not hold them"
        for m in held:
            assert m["bytesSent"] < m["bytesTotal"], m
            if m["partition"] in first:
                assert m["bytesSent"] - first[m["partition"]] <= 1024 * 1024, f"more than the rate allows: {m}"
            else:  # a stream that began after the first look: its burst at most
                assert m["bytesSent"] <= WINDOW_BYTES, f"more than the rate's burst: {m}"

        # Raised while they wait: they finish, and n4 takes its replicas.
        admin.settings(moveRateBytesPerS=256 * 1024 * 1024)
        shape = admin.wait(lambda s: s.settled() and any("n4" in s.replicas(p) for p in range(PARTITIONS)), WAIT_S)
        assert shape.registry.settings.move_rate_bytes_per_s == 256 * 1024 * 1024
        with Client(cluster.addresses) as client:
            assert sum(client.queue(q).counts()["waiting"] for q in QUEUES) == JOBS


def _local_replicas(cluster: LocalCluster) -> dict[str, Any]:
    """Every leader's local view of the partitions it leads."""
    from rawproto import RawConn

    out: dict[str, Any] = {}
    for n in cluster.node_ids:
        conn = RawConn(cluster.address_of(n))
        try:
            reply = conn.call({"cmd": "Stats", "local": True})
        finally:
            conn.close()
        out.update({p: r for p, r in reply.get("replicas", {}).items() if r.get("isLeader")})
    return out


def test_a_throttled_move_finishes_while_the_leader_keeps_compacting(tmp_path: Path) -> None:
    """A learner's snapshot stream outlasts the leader's next snapshots (steady writes, compaction
    every few entries): once it arrives, the learner catches up from the journal instead of being
    sent a newer snapshot, again and again, that the journal has moved past too."""
    import threading

    base = free_base_port(4, 1)
    env = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "20"}
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=base, extra_env=env,
                      node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        with Client(cluster.addresses) as client:
            client.queue("chase").add_bulk([DATA] * 6_000, batch_size=100)  # ~6 MiB snapshot
        admin = AdminClient(f"http://127.0.0.1:{cluster.config.node('n1').http_port}")
        # A node's share (rate / 4 active nodes): 1 MiB/s, so the stream takes seconds.
        admin.settings(moveRateBytesPerS=4 * 1024 * 1024)
        stop = threading.Event()
        pushed = [0]

        def writes() -> None:
            with Client(cluster.addresses) as client:
                q = client.queue("chase-load")
                for _ in range(200_000):
                    if stop.is_set():
                        break
                    q.add(b"w" * 100)
                    pushed[0] += 1

        writer = threading.Thread(target=writes, daemon=True)
        writer.start()
        try:
            n4 = NodeSpec("n4", "127.0.0.1", base + 6, base + 7, base + 103)
            cluster.config = replace(cluster.config, nodes=cluster.config.nodes + (n4,),
                                     bootstrap_nodes=("n1", "n2", "n3"))
            write_cluster_file(cluster.config_path, cluster.config)
            admin.add_node("n4", n4.host, n4.port, n4.http_port, n4.raft_port)
            cluster.start_node("n4")
            admin.wait(lambda s: s.settled() and "n4" in s.replicas(0), WAIT_S)
        finally:
            stop.set()
            writer.join(30)
        assert pushed[0] > 0
        sends = [line for n in ("n1", "n2", "n3") for line in cluster.log_file(n).read_text().splitlines()
                 if "sending snapshot" in line and line.endswith("to n4")]
        assert 1 <= len(sends) <= 2, sends  # one stream (a retry at most), no chase of newer snapshots
