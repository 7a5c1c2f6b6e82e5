"""Large log entries travel whole between real nodes: sizes just above a multiple of 8 MiB (where
entries once sent in pieces were lost), a batch larger than one entry split into several, and
every replica agreeing on the result."""

from __future__ import annotations

from pathlib import Path


from shoal.cluster.launcher import LocalCluster, free_base_port

from conftest import NODE_COMMAND, replica_views
from rawproto import Router

QUEUE = "big"
MIB = 1024 * 1024


def test_entries_just_above_multiples_of_8_mib_reach_every_replica(tmp_path: Path) -> None:
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      node_command=NODE_COMMAND) as cluster:
        cluster.wait_balanced()
        router = Router(cluster.addresses)
        try:
            sizes = [8 * MIB + 1, 8 * MIB + 37]
            ids = []
            for k, size in enumerate(sizes):
                reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": b"x" * (size - 16),
                                     "idempotencyKey": f"big-{k}"}, timeout_s=60)
                assert reply["ok"], reply
                ids.append(reply["id"])
            # A PUSHB of ~20 MiB: one command, one entry.
            batch = [{"data": b"y" * (2 * MIB)} for _ in range(10)]
            reply = router.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": batch}, timeout_s=60)
            assert reply["ok"] and len(reply["ids"]) == 10, reply
            views = replica_views(cluster, QUEUE, 60)
            assert len({v["appliedIndex"] for v in views}) == 1, views
            assert len({v["digest"] for v in views}) == 1, views
            leader = cluster.leader_of(0)
            assert leader is not None
            cluster.kill(leader)  # the new leader serves the big jobs from its own replica
            for job_id, size in zip(ids, sizes):
                reply = router.call({"cmd": "GetJob", "id": job_id}, timeout_s=60)
                assert reply["ok"] and len(reply["job"]["data"]) == size - 16
        finally:
            router.close()
