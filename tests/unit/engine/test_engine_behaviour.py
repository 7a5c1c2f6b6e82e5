"""Determinism, snapshots, the job state diagram, fencing, and the queue presets."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shoal.cluster.codec import raw_bytes, raw_of, unraw
from shoal.cluster.errors import CommandError
from shoal.node.state import Command, PartitionEngine, PushRun, SessionPull
from shoal.node.state import _store as _store_module


def copied(cmd: Command) -> Command:
    """A fresh copy of a command dict for each engine (a typed command is immutable: shared)."""
    return dict(cmd) if type(cmd) is dict else cmd


def run(engine: PartitionEngine, cmd: Command, now: int = 1_000) -> dict[str, Any]:
    return engine.apply(cmd, now).result


def random_commands(seed: int, count: int) -> list[tuple[Command, int]]:
    """A reproducible mix of every kind of write, with time advancing."""
    rng = random.Random(seed)
    now, out, pushed = 1_000, [], 0
    for _ in range(count):
        now += rng.choice([0, 0, 5, 300, 2_000])
        kind = rng.random()
        queue = rng.choice(["a", "b", "u"])
        if kind < 0.08:
            # plain items (data, maybe a key): stored as one segment, materialized job by job
            items = [{"data": raw_of(pushed + i)} | ({"idempotencyKey": f"k{rng.randint(0, 20)}"}
                                                     if rng.random() < 0.3 else {})
                     for i in range(rng.randint(1, 4))]
            out.append(({"cmd": "PUSHB", "queue": queue, "jobs": items}, now))
            pushed += len(items)
        elif kind < 0.35:
            out.append(({"cmd": "PUSH", "queue": queue, "data": raw_of(pushed), "priority": rng.randint(-2, 2),
                         "delay": rng.choice([0, 0, 1_000]), "group": rng.choice([None, "g1", "g2"]),
                         "idempotencyKey": rng.choice([None, f"k{rng.randint(0, 20)}"])}, now))
            pushed += 1
        elif kind < 0.55:
            out.append((SessionPull({"cmd": "PULLB", "queue": queue, "count": rng.randint(1, 3), "ttr": 1_500},
                                    rng.choice(["s1", "s2"])), now))
        elif kind < 0.7:
            out.append(({"cmd": rng.choice(["ACK", "FAIL", "Release"]), "id": f"0-{rng.randint(1, pushed + 1)}"}, now))
        elif kind < 0.8:
            out.append(({"cmd": "_Tick"}, now))
        elif kind < 0.85:
            out.append(({"cmd": "_ReleaseSession", "session": rng.choice(["s1", "s2"])}, now))
        elif kind < 0.9:
            out.append(({"cmd": "Kick", "queue": queue, "count": 5}, now))
        else:
            out.append(({"cmd": "Cancel", "id": f"0-{rng.randint(1, pushed + 1)}"}, now))
    return out


def feed(engine: PartitionEngine, commands: list[tuple[dict[str, Any], int]]) -> list[Any]:
    replies: list[Any] = []
    for cmd, now in commands:
        try:
            replies.append(unraw(engine.apply(copied(cmd), now).result))
        except CommandError as exc:
            replies.append(exc.code.value)
    return replies


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_two_engines_fed_the_same_commands_agree(seed: int) -> None:
    commands = random_commands(seed, 300)
    a, b = PartitionEngine(0), PartitionEngine(0)
    assert feed(a, commands) == feed(b, commands)
    assert a.snapshot() == b.snapshot()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_a_restored_engine_answers_like_the_original(seed: int) -> None:
    commands = random_commands(seed, 300)
    original = PartitionEngine(0)
    feed(original, commands[:200])
    restored = PartitionEngine.restore(original.snapshot())
    assert restored.digest() == original.digest()
    queries = [{"cmd": c, "queue": q} for c in ("GetJobCounts", "GetCountsPerPriority", "Dlq", "GetJobs")
               for q in "abu"]
    assert feed(restored, [(q, 9_000) for q in queries]) == feed(original, [(q, 9_000) for q in queries])
    # ...and keeps behaving the same afterwards.
    assert feed(restored, commands[200:]) == feed(original, commands[200:])
    assert restored.digest() == original.digest()


def test_reads_never_change_state() -> None:
    e = PartitionEngine(0)
    feed(e, random_commands(7, 200))
    before = e.digest()
    for cmd in ({"cmd": "GetJobCounts", "queue": "a"}, {"cmd": "GetJobs", "queue": "a", "state": "waiting"},
                {"cmd": "Stats"}, {"cmd": "Dlq", "queue": "b"}, {"cmd": "GetJob", "id": "0-3"},
                {"cmd": "ListQueues"}, {"cmd": "CronList"}, {"cmd": "IsPaused", "queue": "u"}):
        run(e, cmd, 99_999)
    assert e.digest() == before


# --- the job state diagram, transition by transition ------------------------------------

def fresh(**opts: Any) -> tuple[PartitionEngine, str]:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "q", "options": {"backoff": 0, **opts}})
    return e, run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "attempts": 2})["id"]


def state(e: PartitionEngine, job_id: str) -> str:
    return run(e, {"cmd": "GetState", "id": job_id})["state"]


def test_ready_to_taken_to_done() -> None:
    e, j = fresh()
    assert state(e, j) == "waiting"
    token = run(e, {"cmd": "PULL", "queue": "q"})["token"]
    assert state(e, j) == "active"
    run(e, {"cmd": "ACK", "id": j, "token": token, "result": raw_of("ok")})
    assert state(e, j) == "completed" and unraw(run(e, {"cmd": "GetResult", "id": j}))["result"] == "ok"


def test_taken_release_back_to_ready_and_release_with_delay() -> None:
    e, j = fresh()
    t = run(e, {"cmd": "PULL", "queue": "q"})["token"]
    run(e, {"cmd": "Release", "id": j, "token": t})
    assert state(e, j) == "waiting"
    t = run(e, {"cmd": "PULL", "queue": "q"})["token"]
    run(e, {"cmd": "Release", "id": j, "token": t, "delay": 500})
    assert state(e, j) == "delayed"
    assert run(e, {"cmd": "PULL", "queue": "q"}, 1_400)["job"] is None
    assert run(e, {"cmd": "PULL", "queue": "q"}, 1_500)["job"]["id"] == j


def test_fail_retries_then_dead_letters_with_the_last_error() -> None:
    e, j = fresh()
    t = run(e, {"cmd": "PULL", "queue": "q"})["token"]
    assert run(e, {"cmd": "FAIL", "id": j, "token": t, "error": "first"})["state"] == "waiting"
    t = run(e, {"cmd": "PULL", "queue": "q"})["token"]
    assert run(e, {"cmd": "FAIL", "id": j, "token": t, "error": "second"})["state"] == "failed"
    dlq = run(e, {"cmd": "Dlq", "queue": "q"})["jobs"]
    assert [d["id"] for d in dlq] == [j] and dlq[0]["error"] == "second"


def test_fail_backoff_is_exponential() -> None:
    e = PartitionEngine(0)
    j = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "attempts": 5, "backoff": 100})["id"]
    now = 1_000
    for expected_delay in (100, 200, 400):
        t = run(e, {"cmd": "PULL", "queue": "q"}, now)["token"]
        run(e, {"cmd": "FAIL", "id": j, "token": t}, now)
        assert run(e, {"cmd": "GetJob", "id": j}, now)["job"]["runAt"] == now + expected_delay
        now += expected_delay


def test_bury_kick_and_delayed_promote() -> None:
    e, j = fresh()
    run(e, {"cmd": "Bury", "id": j})
    assert state(e, j) == "failed"
    assert run(e, {"cmd": "Kick", "queue": "q", "count": 10})["count"] == 1
    assert state(e, j) == "waiting"
    run(e, {"cmd": "MoveToDelayed", "id": j, "delay": 10_000})
    assert state(e, j) == "delayed"
    run(e, {"cmd": "Promote", "id": j})
    assert state(e, j) == "waiting"


def test_lease_lapse_reclaims_then_dead_letters_after_max_deliveries() -> None:
    e, j = fresh(ttr=100, maxDeliveries=2)
    run(e, {"cmd": "PULL", "queue": "q"}, 1_000)
    run(e, {"cmd": "_Tick"}, 1_100)
    assert state(e, j) == "waiting"
    run(e, {"cmd": "PULL", "queue": "q"}, 1_200)
    run(e, {"cmd": "_Tick"}, 1_300)
    assert state(e, j) == "failed"
    assert run(e, {"cmd": "Metrics", "queue": "q"})["metrics"]["totals"]["reclaimed"] == 2


# --- fencing --------------------------------------------------------------------------------------

def test_a_stale_token_never_acks_fails_or_extends_a_reclaimed_job() -> None:
    e, j = fresh(ttr=100)
    stale = run(e, {"cmd": "PULL", "queue": "q"}, 1_000)["token"]
    run(e, {"cmd": "_Tick"}, 1_100)                       # lease lapses
    fresh_token = run(e, {"cmd": "PULL", "queue": "q"}, 1_200)["token"]
    assert fresh_token != stale
    for cmd in ({"cmd": "ACK", "id": j, "token": stale}, {"cmd": "FAIL", "id": j, "token": stale},
                {"cmd": "Touch", "id": j, "token": stale, "ttr": 5_000},
                {"cmd": "Release", "id": j, "token": stale}):
        before = e.digest()
        with pytest.raises(CommandError) as info:
            run(e, cmd, 1_250)
        assert info.value.code.value == "LEASE_MISMATCH"
        assert e.digest() == before
    assert run(e, {"cmd": "Touch", "id": j, "token": fresh_token, "ttr": 5_000}, 1_250)["deadline"] == 6_250


def test_ackb_is_atomic() -> None:
    e = PartitionEngine(0)
    ids = run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(3)]})["ids"]
    r = run(e, {"cmd": "PULLB", "queue": "q", "count": 3})
    before = e.digest()
    with pytest.raises(CommandError):
        run(e, {"cmd": "ACKB", "ids": ids, "tokens": [r["tokens"][0], "bogus", r["tokens"][2]]})
    assert e.digest() == before


# --- sessions, idempotency, capacity, groups, log queues -----------------------------------------

def test_released_session_returns_its_leases_only() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(2)]})
    a = run(e, SessionPull({"cmd": "PULL", "queue": "q"}, "s1"))["job"]["id"]
    b = run(e, SessionPull({"cmd": "PULL", "queue": "q"}, "s2"))["job"]["id"]
    run(e, {"cmd": "_ReleaseSession", "session": "s1"})
    assert state(e, a) == "waiting" and state(e, b) == "active"


def test_idempotency_key_within_the_window_and_after_it() -> None:
    e = PartitionEngine(0)
    first = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "idempotencyKey": "k"}, 1_000)
    again = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "idempotencyKey": "k"}, 60_000)
    assert again == {"id": first["id"], "duplicate": True}
    run(e, {"cmd": "_Tick"}, 200_000)
    later = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "idempotencyKey": "k"}, 200_000)
    assert later["id"] != first["id"]


def test_custom_id_dedupes() -> None:
    e = PartitionEngine(0)
    a = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "customId": "order-7"})["id"]
    assert run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(2), "customId": "order-7"})["id"] == a
    assert run(e, {"cmd": "GetJobByCustomId", "queue": "q", "customId": "order-7"})["job"]["id"] == a


def test_limfifottl_capacity_rejects_and_never_drops() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "lim", "type": "limfifottl", "options": {"capacity": 2}})
    for i in range(2):
        run(e, {"cmd": "PUSH", "queue": "lim", "data": raw_of(i)})
    with pytest.raises(CommandError) as info:
        run(e, {"cmd": "PUSH", "queue": "lim", "data": raw_of(3)})
    assert info.value.code.value == "QUEUE_FULL"
    assert run(e, {"cmd": "Count", "queue": "lim"})["count"] == 2


def test_plain_batches_behave_like_single_pushes() -> None:
    """A segment (plain PUSHB) and the same jobs pushed one by one answer every command alike."""
    batched, single = PartitionEngine(0), PartitionEngine(0)
    for e in (batched, single):
        run(e, {"cmd": "CreateQueue", "queue": "q", "options": {"ttr": 500}})
    keys = [None, "a", None, "a", "b", None, None, "b"]  # repeats inside the batch are duplicates
    items = [{"data": raw_of(i)} | ({"idempotencyKey": k} if k else {}) for i, k in enumerate(keys)]
    ids_b = run(batched, {"cmd": "PUSHB", "queue": "q", "jobs": items})["ids"]
    ids_s = [run(single, {"cmd": "PUSH", "queue": "q", **item})["id"] for item in items]
    assert ids_b == ids_s == ["0-1", "0-2", "0-3", "0-2", "0-4", "0-5", "0-6", "0-4"]
    script: list[Command] = [
        {"cmd": "GetJob", "id": "0-4"},                       # a read from the middle of the segment
        {"cmd": "Cancel", "id": "0-3"},
        SessionPull({"cmd": "PULLB", "queue": "q", "count": 2}, "s"),
        {"cmd": "GetJobs", "queue": "q", "state": "waiting"},
        {"cmd": "Clean", "queue": "q", "state": "waiting", "grace": 0, "limit": 1},
        {"cmd": "PULL", "queue": "q"},
        {"cmd": "GetJobCounts", "queue": "q"},
    ]
    for cmd in script:
        assert unraw(run(batched, copied(cmd))) == unraw(run(single, copied(cmd))), cmd
    for e in (batched, single):  # leases lapse; the reclaimed jobs come back first
        run(e, {"cmd": "_Tick"}, 2_000)
    for _ in range(4):
        cmd = {"cmd": "PULL", "queue": "q"}
        assert unraw(run(batched, copied(cmd), 2_000))["job"] == unraw(run(single, copied(cmd), 2_000))["job"]


@pytest.mark.parametrize("qtype,options", [("limfifottl", {"capacity": 4}), ("standard", {}),
                                            ("fifottl", {"ttl": 1_000}), ("log", {})])
def test_push_many_answers_each_push_as_if_alone(qtype: str, options: dict[str, Any]) -> None:
    """Group commit's ``PushRun`` (coalesced plain PUSHes) against the same PUSHes one by one."""
    many, single = PartitionEngine(0), PartitionEngine(0)
    keys = [None, "a", "a", None, "b", None, "b", None]
    for e in (many, single):
        run(e, {"cmd": "CreateQueue", "queue": "q", "type": qtype, "options": options})
        run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of("first"), "idempotencyKey": "b"})
    got = run(many, PushRun("q", [raw_of(i).packed for i in range(len(keys))], keys))["results"]
    expected: list[Any] = []
    for i, key in enumerate(keys):
        cmd = {"cmd": "PUSH", "queue": "q", "data": raw_of(i)} | ({"idempotencyKey": key} if key else {})
        try:
            expected.append(run(single, cmd))
        except CommandError as exc:
            expected.append(exc.code.value)
    assert [r.code.value if isinstance(r, CommandError) else r for r in got] == expected
    if qtype == "limfifottl":
        assert "QUEUE_FULL" in expected
    listing = {"cmd": "GetJobs", "queue": "q"}
    assert unraw(run(many, listing)) == unraw(run(single, listing))
    assert run(many, {"cmd": "Metrics", "queue": "q"}) == run(single, {"cmd": "Metrics", "queue": "q"})


def test_pullb_from_a_segment_stops_at_the_reply_budget_and_keeps_order() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of("x" * 1000)} for _ in range(10)]})
    run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of("late")})
    before = e.digest()
    got: list[str] = []
    for _ in range(20):
        # room for the reply overhead and about three 1 KB jobs per PULLB
        r = run(e, SessionPull({"cmd": "PULLB", "queue": "q", "count": 100}, None, 1024 + 3 * 1600))
        if not r["jobs"]:
            break
        assert len(r["jobs"]) <= 3
        got += [j["id"] for j in r["jobs"]]
    assert got == [f"0-{i}" for i in range(1, 12)]
    assert e.digest() != before


def test_a_plain_batch_over_capacity_leaves_no_trace() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "lim", "type": "limfifottl", "options": {"capacity": 3}})
    before = e.digest()
    with pytest.raises(CommandError) as info:
        run(e, {"cmd": "PUSHB", "queue": "lim", "jobs": [{"data": raw_of(i)} for i in range(4)]})
    assert info.value.code.value == "QUEUE_FULL"
    assert e.digest() == before
    assert len(run(e, {"cmd": "PUSHB", "queue": "lim", "jobs": [{"data": raw_of(i)} for i in range(3)]})["ids"]) == 3


def test_a_plain_batch_into_a_ttl_queue_still_expires() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "t", "type": "fifottl", "options": {"ttl": 1_000}})
    run(e, {"cmd": "PUSHB", "queue": "t", "jobs": [{"data": raw_of(i)} for i in range(3)]})
    run(e, {"cmd": "_Tick"}, 2_500)
    assert run(e, {"cmd": "Count", "queue": "t"}, 2_500)["count"] == 0


def test_utube_one_active_job_per_group_in_fifo_order() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "u", "type": "utube"})
    for group, n in (("a", 1), ("a", 2), ("b", 3), ("a", 4)):
        run(e, {"cmd": "PUSH", "queue": "u", "data": raw_of(n), "group": group})
    r = run(e, {"cmd": "PULLB", "queue": "u", "count": 10})
    assert [unraw(j["data"]) for j in r["jobs"]] == [1, 3]
    run(e, {"cmd": "ACK", "id": r["jobs"][0]["id"], "token": r["tokens"][0]})
    nxt = run(e, {"cmd": "PULL", "queue": "u"})
    assert unraw(nxt["job"]["data"]) == 2


def test_fifo_ignores_priority_and_ttl_expires_jobs() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "f", "type": "fifo"})
    run(e, {"cmd": "PUSH", "queue": "f", "data": raw_of("first"), "priority": 5})
    run(e, {"cmd": "PUSH", "queue": "f", "data": raw_of("second"), "priority": -5})
    assert unraw(run(e, {"cmd": "PULL", "queue": "f"})["job"]["data"]) == "first"
    j = run(e, {"cmd": "PUSH", "queue": "t", "data": raw_of(1), "ttl": 500}, 1_000)["id"]
    run(e, {"cmd": "_Tick"}, 1_500)
    assert run(e, {"cmd": "GetJob", "id": j}, 1_500)["job"] is None


def test_log_queue_append_read_and_truncate() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "l", "type": "log"})
    for i in range(5):
        run(e, {"cmd": "PUSH", "queue": "l", "data": raw_of(i), "tag": "odd" if i % 2 else "even"})
    r = unraw(run(e, {"cmd": "Read", "queue": "l", "fromSeq": 2, "limit": 2}))
    assert [x["seq"] for x in r["records"]] == [2, 3] and r["next"] == 4
    assert run(e, {"cmd": "Truncate", "queue": "l", "tag": "odd"})["count"] == 2
    assert run(e, {"cmd": "Truncate", "queue": "l", "beforeSeq": 3})["count"] == 1
    assert [x["seq"] for x in run(e, {"cmd": "Read", "queue": "l", "fromSeq": 0})["records"]] == [3, 5]


def test_cron_fires_on_tick_and_respects_its_limit() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "Cron", "name": "every", "queue": "c", "repeatEvery": 1_000, "data": raw_of("tick"),
            "limit": 2}, 0)
    assert e.next_due_ms() == 1_000
    for now in (1_000, 2_000, 3_000):
        run(e, {"cmd": "_Tick"}, now)
    assert run(e, {"cmd": "Count", "queue": "c"})["count"] == 2
    assert run(e, {"cmd": "CronList"})["crons"] == []
    with pytest.raises(CommandError):
        run(e, {"cmd": "Cron", "name": "bad", "queue": "c"})


def test_pause_drain_clean_obliterate() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(4)]})
    run(e, {"cmd": "Pause", "queue": "q"})
    assert run(e, {"cmd": "PULL", "queue": "q"})["job"] is None and run(e, {"cmd": "IsPaused", "queue": "q"})["paused"]
    run(e, {"cmd": "Resume", "queue": "q"})
    r = run(e, {"cmd": "PULL", "queue": "q"})
    run(e, {"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]})
    assert run(e, {"cmd": "Clean", "queue": "q", "grace": 0}, 2_000)["count"] == 1
    assert run(e, {"cmd": "Drain", "queue": "q"})["count"] == 3
    run(e, {"cmd": "Obliterate", "queue": "q"})
    assert run(e, {"cmd": "ListQueues"})["queues"] == []


def test_pull_from_a_queue_with_100k_groups_is_cheap() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "u", "type": "utube"})
    for start in range(0, 100_000, 10_000):
        run(e, {"cmd": "PUSHB", "queue": "u", "jobs": [{"data": b"\x01", "group": f"g{i}"}
                                                        for i in range(start, start + 10_000)]})
    calls = []
    import heapq as _heapq
    original = _heapq.heappop

    def counting(heap: list[Any]) -> Any:
        calls.append(1)
        return original(heap)

    _heapq.heappop = counting
    try:
        r = run(e, {"cmd": "PULL", "queue": "u"})
    finally:
        _heapq.heappop = original
    assert r["job"] is not None and len(calls) < 10   # a heap pop, not a scan of 100,000 groups


def test_pull_while_a_million_jobs_are_delayed_is_cheap() -> None:
    e = PartitionEngine(0)
    for _ in range(1_000):
        run(e, {"cmd": "PUSHB", "queue": "d", "jobs": [{"data": b"\x01", "delay": 3_600_000}] * 1_000})
    run(e, {"cmd": "PUSH", "queue": "d", "data": b"\x02"})
    import heapq as _heapq
    calls = []
    original_pop, original_push = _heapq.heappop, _heapq.heappush

    def pop(heap: list[Any]) -> Any:
        calls.append("pop")
        return original_pop(heap)

    def push(heap: list[Any], item: Any) -> None:
        calls.append("push")
        original_push(heap, item)

    _heapq.heappop, _heapq.heappush = pop, push
    try:
        r = run(e, {"cmd": "PULL", "queue": "d"}, 2_000)
    finally:
        _heapq.heappop, _heapq.heappush = original_pop, original_push
    assert r["job"] is not None and raw_bytes(r["job"]["data"]) == b"\x02"
    assert len(calls) < 10   # O(log n) heap work, no scan of the 1,000,000 delayed jobs
    assert run(e, {"cmd": "GetJobCounts", "queue": "d"}, 2_000)["counts"]["delayed"] == 1_000_000


def test_getjobs_filters_by_tag_and_counts_the_matches() -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(3)]})  # a segment, no tags
    for i in range(7):
        run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(i), "tag": "even" if i % 2 == 0 else "odd"})
    before = e.digest()
    page = run(e, {"cmd": "GetJobs", "queue": "q", "tag": "even", "offset": 1, "limit": 2})
    assert page["total"] == 4
    assert [unraw(j["data"]) for j in page["jobs"]] == [2, 4]
    assert all(j["tag"] == "even" for j in page["jobs"])
    assert run(e, {"cmd": "GetJobs", "queue": "q", "tag": "none"}) == {"jobs": [], "total": 0}
    untagged = run(e, {"cmd": "GetJobs", "queue": "q", "offset": 8, "limit": 5})
    assert untagged["total"] == 10 and len(untagged["jobs"]) == 2
    assert e.digest() == before  # a query changes nothing


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), offset=st.integers(0, 12), limit=st.integers(1, 9))
def test_getjobs_pages_match_a_full_listing(seed: int, offset: int, limit: int) -> None:
    """The lazily merged listing (materialized jobs and segment slots) equals filtering every job
    (``waiting`` lists the waiting jobs of priority 0, ``prioritized`` the others, as bunqueue)."""
    e = PartitionEngine(0)
    for cmd, now in random_commands(seed, 120):
        try:
            e.apply(cmd, now)
        except CommandError:
            pass

    def listed(j: Any, state: str | None) -> bool:
        if state == "waiting":
            return j.state == "waiting" and not j.priority
        if state == "prioritized":
            return j.state == "waiting" and bool(j.priority)
        return state is None or j.state == state

    for queue in ("a", "b", "u"):
        for state in (None, "waiting", "prioritized", "delayed", "active", "completed", "failed"):
            cmd: dict[str, Any] = {"cmd": "GetJobs", "queue": queue, "offset": offset, "limit": limit}
            if state:
                cmd["state"] = state
            got = e.apply(cmd, 10**9).result
            every = [j for j in e._all_jobs() if j.queue == queue and listed(j, state)]
            assert [j["id"] for j in got["jobs"]] == [f"0-{j.seq}" for j in every[offset:offset + limit]]
            assert unraw(got["jobs"]) == unraw([e.wire_job(j) for j in every[offset:offset + limit]])


def test_get_jobs_after_a_seq_pages_deep_queues_at_the_cost_of_the_page() -> None:
    """``afterSeq`` starts a page at the segment that holds the seq: the last page of a
    100,000-job queue is listed without walking the jobs before it."""
    e = PartitionEngine(0)
    for k in range(20):
        run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(k * 5_000, (k + 1) * 5_000)]},
            1_000 + k)
    made = []
    original = _store_module.slot_job

    def counting(*args: Any) -> Any:
        made.append(1)
        return original(*args)

    _store_module.slot_job = counting
    try:
        r = run(e, {"cmd": "GetJobs", "queue": "q", "afterSeq": 99_990, "limit": 50}, 2_000)
    finally:
        _store_module.slot_job = original
    assert [unraw(j["data"]) for j in r["jobs"]] == list(range(99_990, 100_000))
    assert r["lastSeq"] == 100_000 and r["total"] == 100_000 and len(made) == 10
    assert run(e, {"cmd": "GetJobs", "queue": "q", "afterSeq": 100_000}, 2_000)["jobs"] == []
    assert run(e, {"cmd": "GetJobs", "queue": "none", "afterSeq": 7}, 2_000) == {"jobs": [], "total": 0, "lastSeq": 7}
    with pytest.raises(CommandError, match="afterSeq pages in ascending order"):
        run(e, {"cmd": "GetJobs", "queue": "q", "afterSeq": 5, "asc": False}, 2_000)
