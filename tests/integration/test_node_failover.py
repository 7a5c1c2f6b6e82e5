"""Faults against real node processes: leader SIGKILL and SIGSTOP during a push
stream, and SIGKILL of every node then restart. Nothing acknowledged is lost."""

from __future__ import annotations

import signal
import time

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

from conftest import replica_views
from rawproto import Router

pytestmark = pytest.mark.integration

QUEUE = "failover"
PUSHES_MAX = 4000
STREAM_S_MAX = 25.0


def push_stream(router: Router, count: int, fault_at: int, fault) -> tuple[list[str], float | None]:
    """Push ``count`` jobs with retries; inject ``fault`` before push ``fault_at``.

    Each push carries an idempotency key, so a retry after an unknown outcome
    never enqueues twice. Returns the acknowledged ids and the seconds from
    the fault to the first acknowledged write after it.
    """
    acked: list[str] = []
    fault_t: float | None = None
    recovered: float | None = None
    deadline = time.monotonic() + STREAM_S_MAX
    for i in range(count):
        if time.monotonic() > deadline:
            break
        if i == fault_at:
            fault()
            fault_t = time.monotonic()
        reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": i, "idempotencyKey": f"k{i}"}, timeout_s=20)
        assert reply["ok"], reply
        acked.append(reply["id"])
        if fault_t is not None and recovered is None:
            recovered = time.monotonic() - fault_t
    return acked, recovered


def drain(router: Router, expected: int, timeout_s: float = 30) -> list[dict]:
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        r = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 500, "timeout": 200}, timeout_s=20)
        if r["jobs"]:
            ack = router.call({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]},
                              timeout_s=20)
            assert ack["ok"], ack
            got.extend(r["jobs"])
    return got


def assert_nothing_lost(router: Router, acked: list[str]) -> None:
    assert len(set(acked)) == len(acked), "an idempotent retry enqueued twice"
    got = drain(router, len(acked))
    got_ids = [j["id"] for j in got]
    assert set(acked) <= set(got_ids), f"lost {len(set(acked) - set(got_ids))} acknowledged pushes"
    assert len(got_ids) == len(set(got_ids)), "a job was delivered twice without a lease lapse"


def test_leader_sigkill_during_push_stream(fresh_cluster: LocalCluster) -> None:
    router = Router(fresh_cluster.addresses)
    p = partition_for(QUEUE, fresh_cluster.config.partitions)
    victim = fresh_cluster.leader_of(p)
    assert victim
    acked, recovered = push_stream(router, 600, 300, lambda: fresh_cluster.kill(victim))
    print(f"\nleader SIGKILL: writes back after {recovered:.2f}s")
    assert len(acked) == 600
    new_leader = fresh_cluster.leader_of(p)
    assert new_leader and new_leader != victim
    assert_nothing_lost(router, acked)
    fresh_cluster.start_node(victim)  # rejoins and catches up
    fresh_cluster.wait_ready(30)
    router.close()


def test_leader_sigstop_then_sigcont(fresh_cluster: LocalCluster) -> None:
    router = Router(fresh_cluster.addresses)
    p = partition_for(QUEUE, fresh_cluster.config.partitions)
    victim = fresh_cluster.leader_of(p)
    assert victim
    acked, recovered = push_stream(router, 400, 200, lambda: fresh_cluster.pause(victim))
    print(f"\nleader SIGSTOP: writes back after {recovered:.2f}s")
    fresh_cluster.resume(victim)
    assert len(acked) == 400
    assert_nothing_lost(router, acked)
    router.close()


def test_sigkill_every_node_then_restart_loses_nothing(fresh_cluster: LocalCluster) -> None:
    router = Router(fresh_cluster.addresses)
    acked, _ = push_stream(router, 500, -1, lambda: None)
    # Take some leases and complete some jobs too: they must survive as completed.
    r = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 100})
    # One long attempt: a retry on a new connection would come after the old one's session gave
    # the leases back (a loaded machine can take over a second to answer).
    acked_b = router.call({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]},
                          attempt_s=15.0)
    assert acked_b.get("ok"), acked_b
    done = {j["id"] for j in r["jobs"]}
    router.close()
    for node_id in fresh_cluster.node_ids:
        fresh_cluster.signal(node_id, signal.SIGKILL)
    for node_id in fresh_cluster.node_ids:
        fresh_cluster.procs[node_id].wait(10)
    fresh_cluster.start(wait=True, timeout_s=60)
    router = Router(fresh_cluster.addresses)
    for job_id in list(done)[:20]:
        assert router.call({"cmd": "GetState", "id": job_id})["state"] == "completed"
    remaining = [i for i in acked if i not in done]
    got = drain(router, len(remaining))
    assert {j["id"] for j in got} == set(remaining)
    router.close()


def test_sigterm_hands_leadership_over_and_exits_zero(fresh_cluster: LocalCluster) -> None:
    router = Router(fresh_cluster.addresses)
    acked, _ = push_stream(router, 50, -1, lambda: None)
    p = partition_for(QUEUE, fresh_cluster.config.partitions)
    leader = fresh_cluster.leader_of(p)
    assert leader
    t0 = time.monotonic()
    assert fresh_cluster.stop_node(leader) == 0
    print(f"\ngraceful stop of the leader took {time.monotonic() - t0:.2f}s")
    reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": "after", "idempotencyKey": "after"}, timeout_s=10)
    assert reply["ok"]
    assert_nothing_lost(router, acked + [reply["id"]])
    router.close()


def test_follower_sigstop_during_push_stream_then_replicas_agree(fresh_cluster: LocalCluster) -> None:
    # A leader sends a new entry to one follower at once and to the other a little later
    # (replica._fast_follower): pausing either follower must not stop the writes, and the
    # paused one catches up after SIGCONT.
    router = Router(fresh_cluster.addresses)
    p = partition_for(QUEUE, fresh_cluster.config.partitions)
    leader = fresh_cluster.leader_of(p)
    assert leader
    followers = [n for n in fresh_cluster.config.placement()[p] if n != leader]
    acked: list[str] = []
    for round_, follower in enumerate(followers):
        paused = False
        slowest = 0.0
        try:
            for i in range(300):
                if i == 100:
                    fresh_cluster.pause(follower)
                    paused = True
                t0 = time.monotonic()
                key = f"f{round_}-{i}"
                reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": i, "idempotencyKey": key}, timeout_s=20)
                assert reply["ok"], reply
                acked.append(reply["id"])
                if paused:
                    slowest = max(slowest, time.monotonic() - t0)
        finally:
            if paused:
                fresh_cluster.resume(follower)
        print(f"\nfollower {follower} SIGSTOP: slowest push while paused {slowest * 1000:.0f} ms")
    assert fresh_cluster.leader_of(p) == leader
    views = replica_views(fresh_cluster, QUEUE, 30)
    assert len({v["appliedIndex"] for v in views}) == 1, views
    assert len({v["digest"] for v in views}) == 1, views
    assert_nothing_lost(router, acked)
    router.close()
