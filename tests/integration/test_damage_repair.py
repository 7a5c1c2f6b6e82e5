"""Damaged replica files on real nodes: named and refused, or repaired from the leader — never run on.

A byte flipped in the middle of a follower's completed snapshot, then a restart:
- with ``repair_damaged`` off the node exits non-zero, its log naming the file and the offset;
- with it on (the default) the node names the file, moves it aside, and catches up from the
  leader: its applied index reaches the others' and its state digest equals theirs.
"""

from __future__ import annotations

from pathlib import Path

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.node.raft.journal import RECORD_HEADER_BYTES

from conftest import NODE_COMMAND, replica_views
from journal_layout import layout
from rawproto import Router
from waiting import eventually

QUEUE = "dmg"
SNAPSHOT_ENV = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "30", "SHOAL_SNAPSHOT_INTERVAL_S": "3600"}


def flip_middle_byte(path: Path) -> int:
    data = bytearray(path.read_bytes())
    offset = len(data) // 2
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    return offset


def flip_middle_entry(path: Path) -> int:
    """Flip a byte in the payload of the journal entry nearest the middle of a segment (the
    middle byte itself may lie in a batch's copy, which only restores the newest batch)."""
    data = bytearray(path.read_bytes())
    entries = [offset for kind, offset, _ in layout(bytes(data)) if kind == "entry"]
    offset = min(entries, key=lambda o: abs(o - len(data) // 2)) + RECORD_HEADER_BYTES
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    return offset


def push(router: Router, count: int, tag: str) -> None:
    for i in range(count):
        reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": f"{tag}-{i}" * 20, "idempotencyKey": f"{tag}-{i}"},
                            timeout_s=30)
        assert reply["ok"], reply


def test_a_damaged_snapshot_is_refused_by_name_or_repaired_from_the_leader(tmp_path: Path) -> None:
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=SNAPSHOT_ENV, node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        router = Router(cluster.addresses)
        try:
            push(router, 150, "a")
            leader = cluster.leader_of(0)
            follower = next(n for n in cluster.node_ids if n != leader)
            snap = cluster.config.node_data_dir(follower) / "p0.snap"
            eventually(snap.exists, "a snapshot on the follower", timeout_s=60.0)
            cluster.stop_node(follower)
            flip_middle_byte(snap)

            cluster.extra_env["SHOAL_REPAIR_DAMAGED"] = "0"
            try:
                cluster.start_node(follower)
                proc = cluster.procs[follower]
                code = proc.wait(timeout=60)
            finally:
                del cluster.extra_env["SHOAL_REPAIR_DAMAGED"]
            assert code != 0
            log_text = cluster.log_file(follower).read_text()
            assert "refuses to start" in log_text and str(snap.name) in log_text and "offset" in log_text, log_text[-2000:]

            push(router, 50, "b")  # the cluster goes on meanwhile
            cluster.start_node(follower)  # repair on: the default
            eventually(lambda: "moving the damaged files aside" in cluster.log_file(follower).read_text(),
                       "the repair logged", timeout_s=60.0)
            cluster.wait_ready()
            views = replica_views(cluster, QUEUE, 60)
            assert len({v["appliedIndex"] for v in views}) == 1, views
            assert len({v["digest"] for v in views}) == 1, views
            assert any(p.name.startswith("p0.snap.damaged") for p in snap.parent.iterdir())
            counts = router.call({"cmd": "GetJobCounts", "queue": QUEUE}, timeout_s=30)["counts"]
            assert sum(counts.values()) == 200
        finally:
            router.close()


def test_a_byte_flipped_in_synced_journal_records_is_named_and_repaired(tmp_path: Path) -> None:
    never = {"SHOAL_SNAPSHOT_ENTRIES_MIN": str(10**9), "SHOAL_SNAPSHOT_INTERVAL_S": str(10**9)}
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=never, node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        router = Router(cluster.addresses)
        try:
            push(router, 100, "a")
            leader = cluster.leader_of(0)
            follower = next(n for n in cluster.node_ids if n != leader)
            cluster.stop_node(follower)  # a clean stop: every record it holds is synced
            segment = max((cluster.config.node_data_dir(follower) / "p0.raft").glob("*.wal"))
            flip_middle_entry(segment)
            push(router, 20, "b")
            cluster.start_node(follower)
            eventually(lambda: "moving the damaged files aside" in cluster.log_file(follower).read_text(),
                       "the repair logged", timeout_s=60.0)
            log_text = cluster.log_file(follower).read_text()
            assert segment.name in log_text and "offset" in log_text, log_text[-2000:]
            cluster.wait_ready()
            views = replica_views(cluster, QUEUE, 60)
            assert len({v["appliedIndex"] for v in views}) == 1, views
            assert len({v["digest"] for v in views}) == 1, views
            counts = router.call({"cmd": "GetJobCounts", "queue": QUEUE}, timeout_s=30)["counts"]
            assert sum(counts.values()) == 120
        finally:
            router.close()
