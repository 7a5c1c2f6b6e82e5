"""Snapshots on real node processes: taken by a forked child while writes continue, installed by a
lagging follower, loaded at restart; a failed snapshot is logged, retried and drops no journal."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.cluster.launcher import LocalCluster, free_base_port

from conftest import NODE_COMMAND, replica_views
from rawproto import RawConn, Router
from waiting import eventually

QUEUE = "snap"
#: Small thresholds so a snapshot follows a few dozen entries; digests of more than 50 jobs are
#: computed in a forked child, as a large partition's would be.
SNAPSHOT_ENV = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "30", "SHOAL_SNAPSHOT_INTERVAL_S": "3600",
                "SHOAL_DIGEST_INLINE_JOBS_MAX": "50"}


def push(router: Router, count: int, tag: str) -> list[str]:
    ids = []
    for i in range(count):
        reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": i, "idempotencyKey": f"{tag}-{i}"},
                            timeout_s=20)
        assert reply["ok"], reply
        ids.append(reply["id"])
    return ids


def local_view(cluster: LocalCluster, node_id: str) -> dict:
    with RawConn(cluster.address_of(node_id)) as c:
        return c.call({"cmd": "Stats", "local": True, "partition": 0})["replicas"]["0"]


def queue_size(router: Router) -> int:
    reply = router.call({"cmd": "GetJobCounts", "queue": QUEUE}, timeout_s=20)
    assert reply["ok"], reply
    return sum(reply["counts"].values())


def assert_replicas_agree(cluster: LocalCluster) -> list[dict]:
    views = replica_views(cluster, QUEUE, 60)
    assert len({v["appliedIndex"] for v in views}) == 1, views
    assert all(v["digestIndex"] == v["appliedIndex"] for v in views), views
    assert len({v["digest"] for v in views}) == 1, views
    return views


def test_snapshot_under_writes_installed_by_a_lagging_follower_and_loaded_at_restart(tmp_path: Path) -> None:
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=SNAPSHOT_ENV, node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        leader = cluster.leader_of(0)
        assert leader is not None
        lagging = next(n for n in cluster.node_ids if n != leader)
        cluster.stop_node(lagging)
        router = Router([cluster.address_of(n) for n in cluster.node_ids if n != lagging])
        try:
            acked = push(router, 150, "a")
            # Writes go on while the leader's children write snapshots.
            acked += push(router, 150, "b")
            eventually(lambda: local_view(cluster, leader)["snapshots"]["written"] >= 2, "two snapshots on the leader")

            cluster.start_node(lagging)  # its log ends before the leader's journal now starts
            cluster.wait_ready()
            acked += push(router, 50, "c")
            assert_replicas_agree(cluster)
            log_text = cluster.log_file(lagging).read_text()
            assert "loaded snapshot" in log_text, "the lagging follower replayed instead of installing"
            assert queue_size(router) == len(acked) == 350
        finally:
            router.close()

        cluster.stop()  # every node restarts from its snapshot and the journal after it
        cluster.start()
        router = Router(cluster.addresses)
        try:
            assert queue_size(router) == 350
            assert_replicas_agree(cluster)
        finally:
            router.close()


def test_failed_snapshot_is_logged_retried_and_keeps_the_journal(tmp_path: Path) -> None:
    with LocalCluster(nodes=1, partitions=1, replication=1, data_dir=tmp_path / "c",
                      base_port=free_base_port(1, 1), extra_env=SNAPSHOT_ENV, node_command=NODE_COMMAND) as cluster:
        node = cluster.node_ids[0]
        # A snapshot is written beside the current one (p0.snap.next) before it replaces it.
        blocker = cluster.config.node_data_dir(node) / "p0.snap.next.tmp"
        cluster.wait_ready()
        os.mkdir(blocker)  # the child cannot create its temp file: every snapshot write fails
        router = Router(cluster.addresses)
        try:
            push(router, 120, "a")
            eventually(lambda: cluster.log_file(node).read_text().count("journal prefix kept") >= 2,
                       "a failed snapshot and its retry in the node's log")
            snapshots = local_view(cluster, node)["snapshots"]
            assert snapshots["written"] == 0 and snapshots["failed"] >= 2
        finally:
            router.close()

        cluster.kill(node)  # no clean shutdown: what survives is the journal
        cluster.start()
        router = Router(cluster.addresses)
        try:
            assert queue_size(router) == 120, "the failed snapshot dropped part of the journal"
            os.rmdir(blocker)
            push(router, 40, "b")
            eventually(lambda: local_view(cluster, node)["snapshots"]["written"] >= 1, "a snapshot once the disk works")
        finally:
            router.close()
        cluster.kill(node)
        cluster.start()
        router = Router(cluster.addresses)
        try:
            assert queue_size(router) == 160
            assert "loaded snapshot" in cluster.log_file(node).read_text()
        finally:
            router.close()
