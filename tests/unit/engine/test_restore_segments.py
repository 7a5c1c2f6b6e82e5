"""A restored engine keeps runs of plain waiting jobs as segments, and answers as the original does."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings, strategies as st

from shoal.cluster.codec import Raw, raw_of, unraw
from shoal.cluster.commands import normalize, validate
from shoal.cluster.errors import CommandError
from shoal.node.partition.pushes import replicated_form
from shoal.node.state import PartitionEngine


def push_batch(e: PartitionEngine, queue: str, n: int, now: int, start: int = 0) -> None:
    cmd = {"cmd": "PUSHB", "queue": queue, "jobs": [{"data": Raw(msgpack.packb(start + i))} for i in range(n)]}
    (replicated,), _ = replicated_form([cmd], e.partition)  # plain batches become segments, as on a replica
    e.apply(replicated, now)


def answers(e: PartitionEngine, commands: list[dict[str, Any]], now: int) -> list[Any]:
    out: list[Any] = []
    for cmd in commands:
        cmd = dict(cmd)
        normalize(cmd)  # as the node checks and normalizes a command before it is replicated
        validate(cmd, internal=True)
        try:
            out.append(unraw(e.apply(cmd, now).result))
        except CommandError as exc:
            out.append(exc.code.value)
    return out


def test_plain_waiting_runs_come_back_as_segments_holding_no_job_objects() -> None:
    e = PartitionEngine(0)
    for k in range(4):
        push_batch(e, "q", 500, 1_000 + k, start=500 * k)
    for k in range(3):  # one-by-one pushes in one entry share their creation time: a run too
        e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(k)}, 2_000)
    e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of("urgent"), "priority": 5}, 2_000)
    e.apply({"cmd": "PULLB", "queue": "q", "count": 30, "ttr": 60_000}, 3_000)
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    # the leased and the prioritized job are jobs; every waiting plain job is in a segment
    assert len(restored.jobs) <= 31
    assert restored.segments.jobs == 2_003 - 30 + 1
    assert answers(restored, [{"cmd": "GetJobCounts", "queue": "q"}], 4_000) == \
        answers(e, [{"cmd": "GetJobCounts", "queue": "q"}], 4_000)


def test_a_restored_segment_behaves_like_the_jobs_it_replaced() -> None:
    e = PartitionEngine(0)
    push_batch(e, "q", 200, 1_000)
    push_batch(e, "r", 50, 1_000, start=200)
    restored = PartitionEngine.restore(e.snapshot())
    pulled = answers(e, [{"cmd": "PULLB", "queue": "q", "count": 10, "ttr": 5_000}], 2_000)
    assert answers(restored, [{"cmd": "PULLB", "queue": "q", "count": 10, "ttr": 5_000}], 2_000) == pulled
    jobs = pulled[0]["jobs"]
    ack = {"cmd": "ACKB", "ids": [j["id"] for j in jobs], "tokens": pulled[0]["tokens"]}
    commands = [ack, {"cmd": "GetJob", "id": "0-150"}, {"cmd": "Cancel", "id": "0-151"},
                {"cmd": "PUSH", "queue": "q", "data": raw_of("late"), "priority": 3},
                {"cmd": "PULLB", "queue": "q", "count": 100, "ttr": 5_000},
                {"cmd": "GetJobs", "queue": "r", "state": "waiting"}, {"cmd": "Drain", "queue": "r"}]
    assert answers(restored, commands, 3_000) == answers(e, commands, 3_000)
    assert restored.digest() == e.digest()
    tick = [{"cmd": "_Tick"}, {"cmd": "GetJobCounts", "queue": "q"}]  # the leases lapse alike
    assert answers(restored, tick, 60_000) == answers(e, tick, 60_000)
    assert restored.digest() == e.digest()


def test_log_queue_records_and_jobs_named_by_flows_stay_jobs_and_dedupe_jobs_wait_as_slots() -> None:
    e = PartitionEngine(0)
    e.apply({"cmd": "CreateQueue", "queue": "log", "type": "log"}, 1_000)
    e.apply({"cmd": "PUSHB", "queue": "log", "jobs": [{"data": raw_of(i)} for i in range(5)]}, 1_000)
    child = {"cmd": "_FlowPush", "queue": "c", "_items": [
        {"data": raw_of(i), "_parent": "1-1", "_onFailure": "fail"} for i in range(3)]}
    answers(e, [child], 1_000)
    e.apply({"cmd": "PUSHB", "queue": "d", "jobs": [
        {"data": raw_of(i), "dedupe": {"id": f"x{i}", "ttlMs": 60_000}} for i in range(3)]}, 1_000)
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    commands = [{"cmd": "PULL", "queue": "c"}, {"cmd": "ACK", "id": "0-6"},
                {"cmd": "PUSH", "queue": "d", "data": raw_of("new"), "dedupe": {"id": "x1", "ttlMs": 1, "replace": True}},
                {"cmd": "GetJob", "id": "0-10"}]
    assert answers(restored, commands, 2_000) == answers(e, commands, 2_000)
    assert restored.digest() == e.digest()
    assert restored.flow_outbox == e.flow_outbox
    again = PartitionEngine.restore(e.snapshot())
    assert [(seg.queue, seg.held) for seg in again.segments] == [("d", 3)]  # x1's job, its data replaced, too
    assert not any(job.queue == "d" for job in again.jobs.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["q", "r"]), st.integers(1, 40), st.sampled_from([0, 0, 1, 700])),
                min_size=1, max_size=12),
       st.lists(st.tuples(st.sampled_from(["PULLB", "ACKB", "Cancel", "_Tick", "GetJob", "Clean"]),
                          st.integers(1, 30)), max_size=25))
def test_restore_then_commands_agree_with_the_original(batches: list[tuple[str, int, int]],
                                                       ops: list[tuple[str, int]]) -> None:
    e = PartitionEngine(0)
    now, start = 1_000, 0
    for queue, n, dt in batches:
        now += dt
        push_batch(e, queue, n, now, start)
        start += n
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    held: list[tuple[list[str], list[str]]] = []
    for op, k in ops:
        now += 100
        if op == "PULLB":
            cmd: dict[str, Any] = {"cmd": "PULLB", "queue": "q" if k % 2 else "r", "count": k, "ttr": 1_000}
        elif op == "ACKB" and held:
            ids, tokens = held.pop()
            cmd = {"cmd": "ACKB", "ids": ids, "tokens": tokens}
        elif op == "Cancel":
            cmd = {"cmd": "Cancel", "id": f"0-{k * 7}"}
        elif op == "GetJob":
            cmd = {"cmd": "GetJob", "id": f"0-{k * 3}"}
        elif op == "Clean":
            cmd = {"cmd": "Clean", "queue": "q", "grace": 0, "state": "completed", "limit": k}
        else:
            cmd = {"cmd": "_Tick"}
            now += 1_000
        got, want = answers(restored, [cmd], now), answers(e, [cmd], now)
        assert got == want
        if cmd["cmd"] == "PULLB" and isinstance(want[0], dict) and want[0].get("jobs"):
            held.append(([j["id"] for j in want[0]["jobs"]], want[0]["tokens"]))
        assert restored.digest() == e.digest()


def test_a_debounced_job_waits_as_a_slot_and_its_burst_moves_it_alike_after_a_restore() -> None:
    e = PartitionEngine(0)
    burst = {"cmd": "PUSH", "queue": "b", "debounce": {"id": "k", "delayMs": 5_000, "maxWaitMs": 8_000}}
    for i in range(3):  # three bursts' first adds, one after another: slots of one segment
        e.apply({**burst, "data": raw_of(i), "debounce": {**burst["debounce"], "id": f"k{i}"}}, 1_000)
    assert not e.jobs and e.segments.jobs == 3
    restored = PartitionEngine.restore(e.snapshot())
    assert not restored.jobs
    later = [{**burst, "data": raw_of("later"), "debounce": {**burst["debounce"], "id": "k1"}},
             {"cmd": "GetJob", "id": "0-2"}, {"cmd": "GetJobCounts", "queue": "b"}]
    assert answers(restored, later, 4_000) == answers(e, later, 4_000)
    job = answers(e, [{"cmd": "GetJob", "id": "0-2"}], 4_000)[0]["job"]
    assert job["runAt"] == 9_000 and job["data"] == "later"  # 4,000 + 5,000, within maxWait of 1,000 + 8,000
    assert restored.digest() == e.digest()
    due = [{"cmd": "_Tick"}, {"cmd": "PULLB", "queue": "b", "count": 5, "ttr": 1_000}]
    assert answers(restored, due, 9_000) == answers(e, due, 9_000)
    assert restored.digest() == e.digest()
