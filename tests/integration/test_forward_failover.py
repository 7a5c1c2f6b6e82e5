"""A forwarding node follows a failover of a leader that froze with its links up (``shoal.node.relay``).

A client that does not route (``Hello`` without the ``routing`` capability, as bunqueue's
client connects) pushes through a node that does not lead the queue's partition, one push
every 20 ms, while that partition's leader is paused (SIGSTOP) for 12 s. The paused leader's
links stay up, so nothing tells the forwarding node it is gone; the forwarding node sees a new
leader elected and sends the pushes waiting at the frozen one there, under the idempotency key
it attached, so none is answered late and none is added twice.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

from waiting import eventually
from rawproto import RawConn

pytestmark = pytest.mark.integration

PUSH_EVERY_S = 0.02
BEFORE_PAUSE_S = 1.0
PAUSE_S = 12.0
AFTER_RESUME_S = 2.0
LATENCY_MAX_S = 5.0
PUSHES_MAX = 2_000  # the loop's bound in count: (1 + 12 + 2) s of one push per 20 ms is 750


class _Pushes:
    """Pipelined PUSHes on one connection: when each was sent and when its answer came."""

    def __init__(self, conn: RawConn, queue: str) -> None:
        self.conn = conn
        self.queue = queue
        self.sent: dict[int, tuple[str, float]] = {}  # reqId -> (data, sent at)
        self.answers: dict[int, tuple[dict[str, Any], float]] = {}  # reqId -> (reply, answered at)

    def push(self) -> None:
        data = f"job-{len(self.sent)}"
        req_id = self.conn.send({"cmd": "PUSH", "queue": self.queue, "data": data})
        self.sent[req_id] = (data, time.monotonic())

    def read_until(self, deadline: float) -> None:
        """Take the answers that arrive before ``deadline`` (monotonic)."""
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = self.conn.read_frame(timeout_s=left)
            except TimeoutError:
                return
            req_id = frame.get("reqId")
            if req_id in self.sent and req_id not in self.answers:
                self.answers[req_id] = (frame, time.monotonic())

    def all_answered(self) -> bool:
        self.read_until(time.monotonic() + 0.2)
        return len(self.answers) == len(self.sent)


def test_pushes_through_a_follower_survive_a_frozen_leader(fresh_cluster: LocalCluster) -> None:
    queue = "ff-frozen"
    p = partition_for(queue, fresh_cluster.config.partitions)
    leader = eventually(lambda: fresh_cluster.leader_of(p), f"a leader of partition {p}")
    entry = next(n for n in fresh_cluster.node_ids if n != leader)
    with RawConn(fresh_cluster.address_of(entry), hello=False) as conn:
        hello = conn.call({"cmd": "Hello", "protocolVersion": 2, "capabilities": ["pipelining"]})
        assert hello["ok"], hello
        pushes = _Pushes(conn, queue)
        started = time.monotonic()
        pause_at, resume_at = started + BEFORE_PAUSE_S, started + BEFORE_PAUSE_S + PAUSE_S
        stop_at = resume_at + AFTER_RESUME_S
        paused = False
        try:
            next_push = started
            while len(pushes.sent) < PUSHES_MAX and (now := time.monotonic()) < stop_at:
                if not paused and pause_at <= now < resume_at:
                    fresh_cluster.pause(leader)
                    paused = True
                elif paused and now >= resume_at:
                    fresh_cluster.resume(leader)
                    paused = False
                pushes.push()
                next_push += PUSH_EVERY_S
                pushes.read_until(next_push)
        finally:
            if paused:
                fresh_cluster.resume(leader)
        eventually(pushes.all_answered, "an answer to every push", timeout_s=45)

    late = []
    for req_id, (data, sent_at) in pushes.sent.items():
        reply, answered_at = pushes.answers[req_id]
        assert reply["ok"], (data, reply)
        if answered_at - sent_at >= LATENCY_MAX_S:
            late.append((data, round(answered_at - sent_at, 1)))
    assert not late, f"{len(late)} of {len(pushes.sent)} pushes waited {LATENCY_MAX_S:g} s or more: {late[:5]}"

    def jobs_by_data() -> Counter[Any] | None:
        with RawConn(fresh_cluster.address_of(entry), hello=False) as reader:
            got = reader.call({"cmd": "GetJobs", "queue": queue, "state": "waiting", "limit": 10_000}, timeout_s=10)
        return Counter(job["data"] for job in got["jobs"]) if got.get("ok") else None

    counts = eventually(jobs_by_data, "the queue's jobs listed", timeout_s=20)
    sent = Counter(data for data, _ in pushes.sent.values())
    assert counts == sent, (f"{sum(counts.values())} jobs for {len(sent)} pushes; twice: "
                            f"{[d for d, n in counts.items() if n > 1][:5]}, missing: {list(sent - counts)[:5]}")
