"""Job data in payload files on real node processes: every replica writes them, a follower that
installs a snapshot is sent the leader's files beside it and adopts them, a restart adopts its
snapshot's, and every job's data reads back the same; removed jobs give their bytes back, and
files mostly released are compacted."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from shoal.cluster.launcher import LocalCluster, free_base_port

from conftest import NODE_COMMAND, replica_views
from damage import flip_byte
from rawproto import RawConn, Router
from waiting import eventually

QUEUE = "payloads"
SNAPSHOT_ENV = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "20", "SHOAL_SNAPSHOT_INTERVAL_S": "3600",
                "SHOAL_DIGEST_INLINE_JOBS_MAX": "50"}


def data_of(i: int) -> dict[str, Any]:
    return {"i": i, "pad": f"{i:06d}" * 150}  # ~900 bytes, distinct per job


def local_payloads(cluster: LocalCluster, node_id: str) -> dict[str, int]:
    with RawConn(cluster.address_of(node_id)) as c:
        return c.call({"cmd": "Stats", "local": True, "partition": 0})["replicas"]["0"]["payloads"]


def push(router: Router, first: int, count: int) -> dict[str, int]:
    """``count`` jobs from ``first`` on: half in one PUSHB, half single PUSHes with priorities."""
    ids: dict[str, int] = {}
    half = count // 2
    reply = router.call({"cmd": "PUSHB", "queue": QUEUE,
                         "jobs": [{"data": data_of(i)} for i in range(first, first + half)]}, timeout_s=20)
    assert reply["ok"], reply
    ids.update(zip(reply["ids"], range(first, first + half)))
    for i in range(first + half, first + count):
        reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": data_of(i), "priority": i % 4,
                             "idempotencyKey": f"k-{i}"}, timeout_s=20)
        assert reply["ok"], reply
        ids[reply["id"]] = i
    return ids


def assert_data(router: Router, ids: dict[str, int]) -> None:
    for job_id, i in ids.items():
        reply = router.call({"cmd": "GetJob", "id": job_id}, timeout_s=20)
        assert reply["ok"] and reply["job"]["data"] == data_of(i), (job_id, reply)


def test_payload_files_on_every_replica_through_a_snapshot_install_and_a_restart(tmp_path: Path) -> None:
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=SNAPSHOT_ENV, node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        leader = cluster.leader_of(0)
        assert leader is not None
        lagging = next(n for n in cluster.node_ids if n != leader)
        cluster.stop_node(lagging)
        router = Router([cluster.address_of(n) for n in cluster.node_ids if n != lagging])
        try:
            ids = push(router, 0, 200)
            eventually(lambda: local_payloads(cluster, leader)["liveBytes"] > 100 * 900, "job data in payload files")
            files = cluster.config.node_data_dir(leader) / "payloads" / "p0"
            eventually(lambda: any(f.stat().st_size for f in files.glob("g*/*.pay")),
                       "the leader's buffered appends written to a payload file")
            cluster.start_node(lagging)  # catches up by installing the leader's snapshot
            cluster.wait_ready()
            ids |= push(router, 200, 40)
            views = replica_views(cluster, QUEUE, 60)
            assert len({v["digest"] for v in views}) == 1, views
            # Offsets are each replica's own; the bytes each holds are the same.
            assert len({v["payloads"]["liveBytes"] for v in views}) == 1, views
            assert "loaded snapshot" in cluster.log_file(lagging).read_text()
            # The leader's own snapshots refer to its payload files, which it sent beside the one
            # the lagging node installed; that node adopted them as its own.
            sent = cluster.log_file(leader).read_text()
            assert re.search(rf"sending snapshot \d+ \(\d+ bytes, [1-9]\d* files beside it\) to {lagging}", sent), sent
            assert "carries them" not in sent
            received = cluster.config.node_data_dir(lagging)
            assert not list(received.glob("**/p0.snap.recv*")), "a temp file or directory left behind"
            assert_data(router, ids)
            with RawConn(cluster.address_of(lagging)) as c:
                text = c.call({"cmd": "Prometheus"})["text"]
            live = views[0]["payloads"]["liveBytes"]
            assert f'shoal_payload_bytes{{partition="0"}} {float(live)}' in text, text
        finally:
            router.close()

        for node in cluster.node_ids:  # snapshots of their own: each refers to its node's files
            eventually(lambda node=node: list(cluster.config.node_data_dir(node).glob("**/p0.snap.files.*/*.pay")),
                       f"{node}: a snapshot that refers to its payload files")
        cluster.stop()  # the snapshots' files are adopted, the journals after them replayed
        cluster.start()
        router = Router(cluster.addresses)
        try:
            for node in cluster.node_ids:
                adopted = [f for f in (cluster.config.node_data_dir(node) / "payloads" / "p0").glob("g*/*.pay")
                           if f.stat().st_nlink > 1]
                assert adopted, f"{node}: no payload file shared with its snapshot"
            assert_data(router, ids)
            reply = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 300}, timeout_s=20)
            assert reply["ok"] and {j["id"]: j["data"] for j in reply["jobs"]} == {
                job_id: data_of(i) for job_id, i in ids.items()}
            reply = router.call({"cmd": "Obliterate", "queue": QUEUE}, timeout_s=20)
            assert reply["ok"], reply
            for node in cluster.node_ids:
                eventually(lambda node=node: local_payloads(cluster, node)["liveBytes"] == 0,
                           f"{node} released every job's bytes")
        finally:
            router.close()


def test_mostly_released_payload_files_are_compacted_on_every_replica(tmp_path: Path) -> None:
    """1 MiB payload files; every tenth job delayed, the rest pulled and acked (and removed, not
    kept as history): each replica copies the delayed jobs' bytes out of the drained files,
    and they read back the same."""
    env = {"SHOAL_PAYLOAD_FILE_MIB": "1"}
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=env, node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        router = Router(cluster.addresses)
        try:
            kept: dict[str, int] = {}
            for first in range(0, 4000, 500):  # ~3.6 MB: files 0..3
                reply = router.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": [
                    {"data": data_of(i), **({"delay": 3_600_000} if i % 10 == 0 else {})}
                    for i in range(first, first + 500)]}, timeout_s=20)
                assert reply["ok"], reply
                kept.update((job_id, i) for job_id, i in zip(reply["ids"], range(first, first + 500))
                            if i % 10 == 0)
            acked = 0
            for _ in range(100):  # bounded: 3,600 ready jobs, 100 a pull
                reply = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 100}, timeout_s=20)
                assert reply["ok"], reply
                if not reply["jobs"]:
                    break
                done = router.call({"cmd": "ACKB", "ids": [j["id"] for j in reply["jobs"]],
                                    "tokens": reply["tokens"],
                                    "removeOnCompletes": [True] * len(reply["jobs"])},
                                   timeout_s=20)
                assert done["ok"], done
                acked += len(reply["jobs"])
            assert acked == 3600
            for node in cluster.node_ids:
                eventually(lambda node=node: local_payloads(cluster, node)["compactions"] >= 1,
                           f"{node} compacted a drained payload file")
            for node in cluster.node_ids:
                stats = local_payloads(cluster, node)
                assert stats["copiedBytes"] < stats["end"] // 2, stats
                assert stats["diskBytes"] < stats["end"], stats
            assert_data(router, kept)
            with RawConn(cluster.address_of(cluster.node_ids[0])) as c:
                text = c.call({"cmd": "Prometheus"})["text"]
            assert 'shoal_payload_copied_bytes_total{partition="0"}' in text, text
            reply = router.call({"cmd": "PromoteJobs", "queue": QUEUE, "count": 1000}, timeout_s=20)
            assert reply["ok"], reply
            reply = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 1000}, timeout_s=20)
            assert reply["ok"] and {j["id"]: j["data"] for j in reply["jobs"]} == {
                job_id: data_of(i) for job_id, i in kept.items()}
        finally:
            router.close()


def _written_file(cluster: LocalCluster, node: str, size_min: int) -> Path:
    """The node's first payload file of partition 0, once ``size_min`` bytes are written to it."""
    root = cluster.config.node_data_dir(node) / "payloads" / "p0"

    def written() -> Path | None:
        files = [f for f in root.glob("g*/00000000.pay") if f.stat().st_size >= size_min]
        return files[0] if files else None

    return eventually(written, f"{node}: job data written to a payload file")


def _rebuilt(cluster: LocalCluster, node: str, times: int = 1) -> bool:
    return cluster.log_file(node).read_text().count("replica reopened from its snapshot and journal") >= times


def test_a_cut_payload_file_is_named_in_the_refusal_and_a_lone_replica_rebuilt(tmp_path: Path) -> None:
    with LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(1, 1),
                      node_command=NODE_COMMAND) as cluster:
        cluster.wait_ready()
        router = Router(cluster.addresses)
        try:
            reply = router.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": data_of(i)} for i in range(200)]},
                                timeout_s=20)
            assert reply["ok"], reply
            ids = dict(zip(reply["ids"], range(200)))
            node = cluster.node_ids[0]
            first = _written_file(cluster, node, 100 * 900)
            os.truncate(first, 1000)  # damage: most of the jobs' data gone
            reply = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 50}, timeout_s=20)
            assert not reply["ok"] and reply["code"] == "INTERNAL", reply
            assert "job data could not be read" in reply["error"] and "00000000.pay" in reply["error"], reply
            eventually(lambda: _rebuilt(cluster, node), "the replica rebuilt from its snapshot and journal")
            # The pull was applied whole (its jobs stay active until their lease ends), and every
            # job's data reads back from the files written afresh.
            counts = router.call({"cmd": "GetJobCounts", "queue": QUEUE}, timeout_s=20)["counts"]
            assert counts["active"] == 50 and counts["waiting"] == 150, counts
            assert_data(router, ids)
            with RawConn(cluster.address_of(node)) as c:
                text = c.call({"cmd": "Prometheus"})["text"]
            assert "shoal_payload_rebuilds_total 1.0" in text, text
        finally:
            router.close()
        assert "a read failed" in cluster.log_file(node).read_text()


def test_a_damaged_block_on_a_leader_or_a_follower_is_found_and_its_replica_rebuilt(tmp_path: Path) -> None:
    """A changed byte fails its block's checksum: on the leader, a read names it, leadership moves
    and the replica is rebuilt; on a follower, its snapshot child finds it and the same follows.
    Every job's data then reads back, and the replicas agree."""
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=SNAPSHOT_ENV, node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        router = Router(cluster.addresses)
        try:
            reply = router.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": data_of(i)} for i in range(300)]},
                                timeout_s=20)
            assert reply["ok"], reply
            ids = dict(zip(reply["ids"], range(300)))
            leader = cluster.leader_of(0)
            assert leader is not None
            damaged = _written_file(cluster, leader, 200 * 900)
            flip_byte(damaged, 100_000)
            with RawConn(cluster.address_of(leader)) as c:
                for job_id in list(ids)[90:130]:  # bounded: the jobs around offset 100,000
                    # A read ahead may meet the block first: the job's own bytes still read back.
                    got = c.call({"cmd": "GetJob", "id": job_id})
                    if not got["ok"]:  # the damaged block itself, or the partition moving
                        break
                    assert got["job"]["data"] == data_of(ids[job_id]), got
            eventually(lambda: _rebuilt(cluster, leader), f"{leader}: the replica rebuilt", 30)
            assert f"{damaged}: the 16384 bytes at offset 98304 fail their checksum" in \
                cluster.log_file(leader).read_text()
            assert_data(router, ids)

            now_leading = eventually(lambda: cluster.leader_of(0), "a leader of partition 0")
            follower = next(n for n in cluster.node_ids if n not in (leader, now_leading))
            flip_byte(_written_file(cluster, follower, 200 * 900), 50_000)
            for i in range(300, 330):  # past SHOAL_SNAPSHOT_ENTRIES_MIN: every replica snapshots
                ids[router.call({"cmd": "PUSH", "queue": QUEUE, "data": data_of(i)}, timeout_s=20)["id"]] = i
            eventually(lambda: _rebuilt(cluster, follower), f"{follower}: the replica rebuilt", 30)
            assert "PayloadDamaged" in cluster.log_file(follower).read_text()
            views = replica_views(cluster, QUEUE, 30)
            assert len({v["digest"] for v in views}) == 1, views
            assert_data(router, ids)
        finally:
            router.close()
