"""A cluster of release a0861d3 restarted on this release keeps every job and its state.

The upgrade ``docs/formats.md`` describes: every node stopped, then started on this release
over the same data directories. The release's nodes run from ``git archive a0861d3`` (the
commit must be in this repository); their journals hold pickled data entries and a
snapshot, which this release reads, and then writes format-1 entries after them.
"""

from __future__ import annotations

import glob
import shutil
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.node.partition.log_format import FORMAT_VERSION, LEGACY_PICKLE, payload_version
from shoal.node.raft._io import RealIO
from shoal.node.raft.handshake import MAGIC
from shoal.node.raft.journal import Journal
from shoal.node.raft.messages import ENTRY_DATA

from conftest import replica_views
from rawproto import RawConn, Router
from releases import release_tree
from waiting import eventually

RELEASE = "a0861d3"
QUEUE = "upgrade"
#: A snapshot follows a few dozen entries, so the release leaves a snapshot and a journal after it.
SNAPSHOT_ENV = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "20", "SHOAL_SNAPSHOT_INTERVAL_S": "3600"}
pytestmark = pytest.mark.timeout(300)


def call(router: Router, frame: dict[str, Any]) -> dict[str, Any]:
    reply = router.call(frame, timeout_s=20)
    assert reply.get("ok"), (frame.get("cmd"), reply)
    return reply


def pipelined_pushes(cluster: LocalCluster, leader: str, datas: list[Any]) -> list[str]:
    """Plain PUSHes sent back to back on one connection (the leader groups them into one run)."""
    with RawConn(cluster.address_of(leader)) as conn:
        req_ids = [conn.send({"cmd": "PUSH", "queue": QUEUE, "data": d}) for d in datas]
        replies = [conn.wait_reply(r, timeout_s=20) for r in req_ids]
    assert all(r.get("ok") for r in replies), replies
    return [r["id"] for r in replies]


def state(router: Router, ids: list[str]) -> dict[str, Any]:
    """What a client sees of the queue: counts, and each job's state and data."""
    jobs = {}
    for job_id in ids:
        job = call(router, {"cmd": "GetJob", "id": job_id})["job"]
        jobs[job_id] = (job["state"], job["data"], job.get("priority"), job.get("result"))
    return {"counts": call(router, {"cmd": "GetJobCounts", "queue": QUEUE})["counts"], "jobs": jobs}


def payload_versions(data_dir: Path, partition: int) -> set[int]:
    """The format versions of the data entries in every node's journal of ``partition`` (read from copies)."""
    versions: set[int] = set()
    for k, directory in enumerate(sorted(glob.glob(str(data_dir / "**" / f"p{partition}.raft"), recursive=True))):
        copy = data_dir.parent / f"journal-copy-{k}"
        shutil.copytree(directory, copy)
        journal = Journal(RealIO(disk_free_min_bytes=0), str(copy))
        try:
            versions |= {payload_version(p) for p, _, _ in journal.entries(journal.first_index, journal.last_index + 1)
                         if p[0] == ENTRY_DATA}
        finally:
            journal.close()
            shutil.rmtree(copy)
    return versions


def test_a_release_cluster_restarted_on_this_release_keeps_its_jobs(tmp_path: Path) -> None:
    release = release_tree(tmp_path / "release", RELEASE)
    data_dir = tmp_path / "c"
    with LocalCluster(nodes=3, partitions=1, data_dir=data_dir, base_port=free_base_port(3, 1),
                      extra_env={**SNAPSHOT_ENV, "PYTHONPATH": str(release)}) as old:
        old.wait_balanced()
        leader = old.leader_of(0)
        assert leader is not None
        router = Router(old.addresses)
        try:
            call(router, {"cmd": "CreateQueue", "queue": QUEUE, "options": {"attempts": 3}})
            ids = pipelined_pushes(old, leader, [{"n": i, "blob": bytes([i]) * 8} for i in range(30)])
            ids += call(router, {"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": f"b{i}"} for i in range(20)]})["ids"]
            ids += [call(router, {"cmd": "PUSH", "queue": QUEUE, "data": i, "idempotencyKey": f"k{i}"})["id"]
                    for i in range(25)]
            eventually(lambda: all(v["snapshots"]["written"] for v in replica_views(old, QUEUE, 60)),
                       "a snapshot on every node of the release", 60)
            # The rest stays in the journals only, after the snapshots.
            ids.append(call(router, {"cmd": "PUSH", "queue": QUEUE, "data": [1.5, None, True], "priority": 7,
                                     "delay": 3_600_000})["id"])
            pulled = call(router, {"cmd": "PULLB", "queue": QUEUE, "count": 10, "ttr": 600_000, "detach": True})
            call(router, {"cmd": "ACKB", "ids": [j["id"] for j in pulled["jobs"][:5]],
                          "tokens": pulled["tokens"][:5]})
            call(router, {"cmd": "ACK", "id": pulled["jobs"][5]["id"], "token": pulled["tokens"][5],
                          "result": {"done": True, "took": 12.5}})
            before = state(router, ids)
            views = replica_views(old, QUEUE, 60)
            assert len({v["digest"] for v in views}) == 1, views
        finally:
            router.close()
    assert glob.glob(str(data_dir / "**" / "p0.snap"), recursive=True)
    assert payload_versions(data_dir, 0) == {LEGACY_PICKLE}

    with LocalCluster(nodes=3, partitions=1, data_dir=data_dir, extra_env=SNAPSHOT_ENV) as new:
        new.wait_ready()
        router = Router(new.addresses)
        try:
            assert state(router, ids) == before
            views = replica_views(new, QUEUE, 60)
            assert len({v["digest"] for v in views}) == 1, views
            # This release goes on from there: leases taken by the release are honoured, new writes
            # are format 1, and every replica applies both kinds alike.
            rest = pulled["jobs"][6:]
            call(router, {"cmd": "ACKB", "ids": [j["id"] for j in rest], "tokens": pulled["tokens"][6:]})
            ids += call(router, {"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": f"c{i}"} for i in range(5)]})["ids"]
            after = state(router, ids)
            views = replica_views(new, QUEUE, 60)
            assert len({v["digest"] for v in views}) == 1, views
        finally:
            router.close()
        new.stop()  # the journal now holds both formats; a restart reads them again
        assert payload_versions(data_dir, 0) == {LEGACY_PICKLE, FORMAT_VERSION}
        new.start()
        router = Router(new.addresses)
        try:
            eventually(lambda: state(router, ids) == after, "the state after a restart on the mixed journal", 60,
                       ignoring=(AssertionError, OSError, KeyError))
        finally:
            router.close()


def push_until_committed(cluster: LocalCluster, data: Any, key: str) -> str:
    """A PUSH retried (same idempotency key) until a majority of one link version commits it."""
    def attempt() -> str | None:
        router = Router(cluster.addresses)
        try:
            reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": data, "idempotencyKey": key}, timeout_s=5)
        finally:
            router.close()
        return reply["id"] if reply.get("ok") else None
    return eventually(attempt, f"PUSH {key} committed", 90, poll_s=0.2, ignoring=(OSError, TimeoutError, KeyError))


def test_a_rolling_upgrade_node_by_node_keeps_every_write_and_never_mixes_formats(tmp_path: Path) -> None:
    """Nodes of the two releases refuse each other's Raft links (link versions 4 and 5), so a
    release node never receives a format-1 entry: while it is refused, the group goes on where a
    majority of one version is, and writes keep committing at every step."""
    release = release_tree(tmp_path / "release", RELEASE)
    data_dir = tmp_path / "c"
    with LocalCluster(nodes=3, partitions=1, data_dir=data_dir, base_port=free_base_port(3, 1),
                      extra_env={**SNAPSHOT_ENV, "PYTHONPATH": str(release)}) as cluster:
        cluster.wait_balanced()
        ids = {f"a{i}": push_until_committed(cluster, {"a": i}, f"a{i}") for i in range(25)}
        eventually(lambda: any(v["snapshots"]["written"] for v in replica_views(cluster, QUEUE, 60)),
                   "a snapshot written by the release", 60)
        for step, node in enumerate(cluster.node_ids):
            cluster.stop_node(node)
            cluster.extra_env = dict(SNAPSHOT_ENV)  # this release from now on
            cluster.start_node(node)
            for i in range(5):
                ids[f"{node}-{i}"] = push_until_committed(cluster, {"step": step, "i": i}, f"{node}-{i}")
        cluster.wait_ready()
        views = replica_views(cluster, QUEUE, 60)
        assert len({v["digest"] for v in views}) == 1, views
        router = Router(cluster.addresses)
        try:
            for key, job_id in ids.items():
                job = call(router, {"cmd": "GetJob", "id": job_id})["job"]
                if key.startswith("a"):
                    want = {"a": int(key[1:])}
                else:
                    node, i = key.split("-")
                    want = {"step": cluster.node_ids.index(node), "i": int(i)}
                assert (job["state"], job["data"]) == ("waiting", want), key
            assert call(router, {"cmd": "GetJobCounts", "queue": QUEUE})["counts"]["waiting"] == len(ids) == 40
        finally:
            router.close()
        logs = {node: cluster.log_file(node).read_text() for node in cluster.node_ids}
    assert all("UnpicklingError" not in text for text in logs.values()), "a release node was sent a format-1 entry"
    ours = MAGIC[3:].decode()
    assert any(f"Raft link version '4', this node '{ours}'" in text or f"Raft link version '{ours}', this node '4'"
               in text for text in logs.values())
    assert FORMAT_VERSION in payload_versions(data_dir, 0)
