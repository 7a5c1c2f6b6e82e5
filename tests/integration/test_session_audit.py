"""Leases of a session whose connection went away while its partition's leader was down come back
after the grace, not at their ttr (``shoal.node.audits``).

Two clients that do not route pull through a node that does not lead the queue's partition, so
their sessions live on that node and their leases on the leader. The leader is killed (SIGKILL);
one client goes away while it is down, so the message that would end its session at the leader
has nowhere to go; the leader is restarted. Whichever node leads the partition then audits the
sessions holding leases there and, once every node answered, releases the gone one's: its jobs
are pullable again long before their 60 s ttr, while the client still connected keeps its
leases and acks its jobs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

from waiting import eventually
from rawproto import RawConn

pytestmark = pytest.mark.integration

TTR_MS = 60_000
BACK_WITHIN_S = 15.0


def non_routing(address: str) -> RawConn:
    """A connection that says Hello without ``routing`` (as bunqueue's client): its node forwards."""
    conn = RawConn(address, hello=False)
    assert conn.call({"cmd": "Hello", "protocolVersion": 2, "capabilities": ["pipelining"]})["ok"]
    return conn


def counts(address: str, queue: str) -> dict[str, int] | None:
    try:
        with RawConn(address, hello=False, timeout_s=5) as c:
            reply = c.call({"cmd": "GetJobCounts", "queue": queue}, timeout_s=5)
    except (OSError, TimeoutError):
        return None
    return reply["counts"] if reply.get("ok") else None


def test_leases_of_a_session_gone_during_a_leader_restart_come_back_after_the_grace(fresh_cluster: LocalCluster) -> None:
    queue = "audit-q"
    p = partition_for(queue, fresh_cluster.config.partitions)
    leader = eventually(lambda: fresh_cluster.leader_of(p), f"a leader of partition {p}")
    entry = fresh_cluster.address_of(next(n for n in fresh_cluster.node_ids if n != leader))
    with non_routing(entry) as stays:
        replies = [stays.call({"cmd": "PUSH", "queue": queue, "data": f"job-{i}"}) for i in range(20)]
        assert all(r["ok"] for r in replies), replies
        gone = non_routing(entry)
        try:
            taken_gone: dict[str, Any] = gone.call({"cmd": "PULLB", "queue": queue, "count": 5, "ttr": TTR_MS})
            taken_stays: dict[str, Any] = stays.call({"cmd": "PULLB", "queue": queue, "count": 5, "ttr": TTR_MS})
            assert len(taken_gone["jobs"]) == len(taken_stays["jobs"]) == 5, (taken_gone, taken_stays)
            before = counts(entry, queue)
            assert before is not None and (before["waiting"], before["active"]) == (10, 10), before
            fresh_cluster.kill(leader)
        finally:
            gone.close()  # while the leader is down: its session's end reaches no leader
        closed_at = time.monotonic()
        fresh_cluster.restart(leader)
        fresh_cluster.wait_ready()  # a release waits for every node's answer, the restarted one's too

        def back() -> dict[str, int] | None:
            now = counts(entry, queue)
            return now if now is not None and now["waiting"] == 15 else None

        after = eventually(back, "the gone session's jobs waiting again", timeout_s=BACK_WITHIN_S)
        assert time.monotonic() - closed_at < TTR_MS / 1000 / 2
        assert after["active"] == 5  # the connected client's leases are kept

        with non_routing(entry) as other:
            again = other.call({"cmd": "PULLB", "queue": queue, "count": 20, "ttr": TTR_MS})
        again_ids = {job["id"] for job in again["jobs"]}
        assert {job["id"] for job in taken_gone["jobs"]} <= again_ids
        assert not again_ids & {job["id"] for job in taken_stays["jobs"]}
        acked = stays.call({"cmd": "ACKB", "ids": [job["id"] for job in taken_stays["jobs"]],
                            "tokens": taken_stays["tokens"]}, timeout_s=20)
        assert acked["ok"], acked
