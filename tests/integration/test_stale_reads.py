"""A leader cut off from its followers never answers a read that misses a write acknowledged elsewhere.

Real nodes behind the chaos harness's proxies: the partition's leader keeps its client link
but loses every Raft link; the other two elect a new leader, which acknowledges a PUSH. Until
the old leader notices it lost its majority (check quorum: 2 to 4 s), it still believes it
leads. A read it answers must reflect the write (a read lease expires before another leader
can be elected, and without one a read waits for a majority to confirm the leadership), so it
is refused, or routed to the new leader, never answered "not found".
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from waiting import eventually
from rawproto import RawConn, leader_seen_by

from shoal.chaos.proxied_cluster import ProxiedCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

QUEUE = "stale-reads"
READS = 20


def test_an_isolated_leader_never_answers_a_read_that_misses_a_newer_write(tmp_path: Path) -> None:
    with ProxiedCluster(tmp_path / "cluster", nodes=3, partitions=1) as cluster:
        old = cluster.leader_of(0)
        addresses = dict(zip(cluster.node_ids, cluster.addresses))
        with RawConn(addresses[old]) as conn:
            assert conn.call({"cmd": "PUSH", "queue": QUEUE, "data": "before"})["ok"]
        cluster.isolate(old)
        others = [n for n in cluster.node_ids if n != old]
        new = eventually(lambda: next((n for n in others if leader_seen_by(addresses[n]) == n), None),
                         "a new leader among the others")
        with RawConn(addresses[new]) as conn:
            pushed = conn.call({"cmd": "PUSH", "queue": QUEUE, "data": "after"})
        assert pushed["ok"], pushed
        acked_at = time.monotonic()
        answers = []
        with RawConn(addresses[old], timeout_s=10.0) as conn:
            for _ in range(READS):  # bounded: the old leader steps down within a few seconds
                reply = conn.call({"cmd": "GetJob", "id": pushed["id"]}, timeout_s=10.0)
                answers.append(reply)
                assert not (reply.get("ok") and reply.get("job") is None), (
                    f"{old} answered a stale read {time.monotonic() - acked_at:.2f} s after {new} acknowledged "
                    f"the write: {reply}")
                if reply.get("ok") or time.monotonic() - acked_at > 5.0:
                    break
        assert answers
