"""A lone replica (a 1-node cluster) keeps both durability classes: an fsync-class write is
synced before it is answered, a disk-class write (``durable: false``) waits for the lazy sync."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from shoal.cluster.launcher import LocalCluster, free_base_port

from rawproto import RawConn
from waiting import eventually

PUSHES = 40
WAIT_S_MAX = 20.0


def storage(cluster: LocalCluster) -> dict[str, Any]:
    n = cluster.config.node(cluster.node_ids[0])
    with urllib.request.urlopen(f"http://{n.host}:{n.http_port}/health", timeout=10) as r:
        return json.loads(r.read())["storage"]  # type: ignore[no-any-return]


def push_one_by_one(conn: RawConn, queue: str) -> None:
    """Each push waits for its answer, so each is an entry of its own."""
    for i in range(PUSHES):
        assert conn.call({"cmd": "PUSH", "queue": queue, "data": {"n": i}})["ok"] is True


def test_a_lone_replica_syncs_fsync_class_writes_and_leaves_disk_class_ones_to_the_timer(tmp_path: Path) -> None:
    with LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(1, 1),
                      extra_env={"SHOAL_SYNC_INTERVAL_MS": "200"}) as cluster:
        with RawConn(cluster.address_of(cluster.node_ids[0])) as conn:
            assert conn.call({"cmd": "CreateQueue", "queue": "lazy", "options": {"durable": False}})["ok"] is True
            assert conn.call({"cmd": "CreateQueue", "queue": "safe"})["ok"] is True

            before = storage(cluster)["barrierSyncs"]
            push_one_by_one(conn, "safe")
            assert storage(cluster)["barrierSyncs"] - before >= PUSHES

            before = storage(cluster)
            push_one_by_one(conn, "lazy")
            after = storage(cluster)
            assert after["barrierSyncs"] - before["barrierSyncs"] < PUSHES // 4
            # The lazy timer syncs them (or a sync of the node's own fsync-class housekeeping
            # covers them first: the partition has one journal).
            eventually(lambda: not storage(cluster)["unsyncedJournals"], "the disk-class writes synced", WAIT_S_MAX)

            counts = conn.call({"cmd": "GetJobCounts", "queue": "lazy"})
            assert counts["ok"] is True and counts["counts"]["waiting"] == PUSHES
