"""A pull's reply with runs kept for the frame encoder (``PartitionEngine.pulled_runs``, as a
node's engine replies) is the reply the engine builds job by job: equal as values, and encoded
byte for byte alike, whatever the runs' ids, times and data."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from shoal.cluster.codec import encode_body, unraw
from shoal.node.state import MemorySpace, PartitionEngine, PulledJobs, SessionPull, loose_jobs
from shoal.node.state._pulled import JobRun

NOW = 1_700_000_000_000


def pair() -> tuple[PartitionEngine, PartitionEngine]:
    """An engine that builds every job's map, and one that keeps runs."""
    maps, runs = PartitionEngine(7, MemorySpace()), PartitionEngine(7, MemorySpace())
    runs.pulled_runs = True
    return maps, runs


def both(engines: tuple[PartitionEngine, PartitionEngine], cmd: Any, now: int) -> tuple[Any, Any]:
    maps, runs = engines
    return maps.apply(cmd, now).result, runs.apply(cmd, now).result


batch_st = st.tuples(st.integers(1, 40),                      # jobs
                     st.integers(0, 2),                       # ms after the previous batch
                     st.sampled_from([0, 1, 90, 700]),        # data padding
                     st.sampled_from([None, None, None, 5_000]))  # delay of the batch's last job


@settings(max_examples=60, deadline=None)
@given(start=st.sampled_from([0, 985, 9_990, 99_950]), batches=st.lists(batch_st, min_size=1, max_size=6),
       pulls=st.lists(st.tuples(st.integers(1, 70), st.sampled_from([None, "s"]), st.booleans()),
                      min_size=1, max_size=6))
def test_a_reply_with_runs_equals_and_encodes_as_the_reply_of_maps(
        start: int, batches: list[tuple[int, int, int, int | None]],
        pulls: list[tuple[int, str | None, bool]]) -> None:
    engines = pair()
    if start:  # ids from near a thousand's boundary on
        both(engines, {"cmd": "PUSHB", "queue": "pad", "jobs": [{"data": b"\x01"}] * start}, NOW)
    now = NOW
    for n, gap, pad, delay in batches:
        now += gap
        jobs: list[dict[str, Any]] = [{"data": msgpack.packb({"i": i, "p": "x" * pad})} for i in range(n)]
        if delay is not None:
            jobs[-1]["delay"] = delay
        a, b = both(engines, {"cmd": "PUSHB", "queue": "q", "jobs": jobs}, now)
        assert a == b
    for count, session, ack in pulls:
        a, b = both(engines, SessionPull({"cmd": "PULLB", "queue": "q", "count": count}, session), now + 1)
        assert b == a and a == b
        assert encode_body(b) == encode_body(a)
        assert len(b["jobs"]) == len(a["jobs"])
        if ack and a["jobs"]:
            ids = [job["id"] for job in b["jobs"]]
            assert both(engines, {"cmd": "ACKB", "ids": ids, "tokens": b["tokens"]}, now + 2) == ({"count": len(ids)},) * 2
    assert engines[0].digest() == engines[1].digest()


def test_a_bulk_add_pulled_whole_is_one_run_written_by_the_encoder() -> None:
    engines = pair()
    jobs = [{"data": msgpack.packb(i)} for i in range(100)]
    both(engines, {"cmd": "PUSHB", "queue": "q", "jobs": jobs}, NOW)
    a, b = both(engines, SessionPull({"cmd": "PULLB", "queue": "q", "count": 100}, "s"), NOW)
    pulled = b["jobs"]
    assert type(pulled) is PulledJobs and len(pulled.parts) == 1 and type(pulled.parts[0]) is JobRun
    assert len(pulled) == 100 and pulled[0] == a["jobs"][0] and pulled[-2:] == a["jobs"][-2:]
    assert list(pulled) == a["jobs"] and pulled == a["jobs"] and pulled != a["jobs"][:99]
    assert loose_jobs(pulled) == [] and loose_jobs(a["jobs"]) == a["jobs"]
    decoded = msgpack.unpackb(encode_body(b))
    assert [job["data"] for job in decoded["jobs"]] == list(range(100))
    assert unraw(b) == unraw(a)


def test_a_short_run_and_a_job_object_stay_maps_beside_a_run() -> None:
    engines = pair()
    both(engines, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": msgpack.packb(i)} for i in range(3)]}, NOW)
    both(engines, {"cmd": "PUSH", "queue": "q", "data": msgpack.packb("one"), "customId": "c1"}, NOW)
    both(engines, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": msgpack.packb(i)} for i in range(30)]}, NOW)
    a, b = both(engines, SessionPull({"cmd": "PULLB", "queue": "q", "count": 50}, None), NOW)
    parts = b["jobs"].parts
    assert [type(p).__name__ for p in parts] == ["dict"] * 4 + ["JobRun"]
    assert [job.get("customId") for job in loose_jobs(b["jobs"])] == [None, None, None, "c1"]
    assert encode_body(b) == encode_body(a) and b == a


@pytest.mark.parametrize("runs", [False, True])
def test_an_engine_of_tests_and_tools_builds_maps(runs: bool) -> None:
    engine = PartitionEngine(0, MemorySpace())
    engine.pulled_runs = runs
    engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": b"\x01"}] * 20}, NOW)
    reply = engine.apply({"cmd": "PULLB", "queue": "q", "count": 20}, NOW).result
    assert (type(reply["jobs"]) is PulledJobs) == runs
