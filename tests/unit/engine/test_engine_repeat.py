"""A schedule's first job at once (``immediately``), runs that wait for the last job to complete
(``afterCompletion``: bunqueue's legacy ``repeat``), and a flow parent's name."""

from __future__ import annotations

from typing import Any

from shoal.cluster.codec import raw_of, unraw
from shoal.cluster.commands import validate
from shoal.node.state import PartitionEngine


def run(engine: PartitionEngine, cmd: dict[str, Any], now: int = 1_000) -> dict[str, Any]:
    validate(cmd, internal=True)
    return engine.apply(dict(cmd), now).result


def repeat(name: str = "repeat:r1", limit: int | None = None, **more: Any) -> dict[str, Any]:
    """The Cron an add with bunqueue's ``repeat: {every: 1000, limit}`` becomes."""
    cmd = {"cmd": "Cron", "name": name, "queue": "r", "repeatEvery": 1_000, "data": raw_of({"n": 1}),
           "jobName": "tick", "immediately": True, "afterCompletion": True, **more}
    if limit is not None:
        cmd["limit"] = limit
    return cmd


def work(engine: PartitionEngine, now: int, fail: bool = False) -> str:
    job = run(engine, {"cmd": "PULL", "queue": "r"}, now)["job"]
    if fail:
        run(engine, {"cmd": "FAIL", "id": job["id"], "error": "no"}, now)
    else:
        run(engine, {"cmd": "ACK", "id": job["id"]}, now)
    return str(job["id"])


def counts(engine: PartitionEngine) -> dict[str, int]:
    c = run(engine, {"cmd": "GetJobCounts", "queue": "r"}, 0)["counts"]
    return {k: v for k, v in c.items() if v}


def test_immediately_makes_the_first_job_now_and_answers_its_id() -> None:
    e = PartitionEngine(2)
    reply = run(e, repeat(limit=3), 1_000)
    job = run(e, {"cmd": "GetJob", "id": reply["id"]})["job"]
    assert job["name"] == "tick" and unraw(job["data"]) == {"n": 1} and job["state"] == "waiting"
    assert reply["cron"]["count"] == 1 and reply["nextRunAt"] == 2_000


def test_the_same_cron_sent_again_adds_no_job_and_answers_the_first_id() -> None:
    e = PartitionEngine(0)
    first = run(e, repeat(limit=3), 1_000)["id"]
    again = run(e, repeat(limit=3), 1_050)
    assert again["id"] == first and again["cron"]["count"] == 1
    assert counts(e) == {"waiting": 1}


def test_a_schedule_without_immediately_still_waits_for_its_first_time() -> None:
    e = PartitionEngine(0)
    reply = run(e, {"cmd": "Cron", "name": "c", "queue": "r", "repeatEvery": 1_000, "data": raw_of(1)}, 1_000)
    assert "id" not in reply and counts(e) == {}


def test_limit_one_ends_the_schedule_with_its_first_job() -> None:
    e = PartitionEngine(0)
    run(e, repeat(limit=1), 1_000)
    assert run(e, {"cmd": "CronList"})["crons"] == [] and counts(e) == {"waiting": 1}


def test_runs_wait_for_the_last_job_to_complete() -> None:
    e = PartitionEngine(0)
    run(e, repeat(limit=4), 1_000)
    for now in (2_000, 3_000, 4_000):  # nobody works: the first job waits, no second one is made
        run(e, {"cmd": "_Tick"}, now)
    assert counts(e) == {"waiting": 1}
    work(e, 4_100)
    run(e, {"cmd": "_Tick"}, 5_000)  # the first time of the schedule after the completion
    assert counts(e)["waiting"] == 1 and counts(e)["completed"] == 1
    for now in (5_100, 6_000, 6_100, 7_000, 7_100, 8_000):
        if now % 1_000:
            work(e, now)
        else:
            run(e, {"cmd": "_Tick"}, now)
    assert counts(e) == {"completed": 4}  # the limit: four jobs in all
    assert run(e, {"cmd": "CronList"})["crons"] == []


def test_a_failed_job_ends_the_repeat() -> None:
    e = PartitionEngine(0)
    run(e, repeat(), 1_000)
    work(e, 1_100, fail=True)
    run(e, {"cmd": "_Tick"}, 2_000)
    assert run(e, {"cmd": "CronList"})["crons"] == []
    assert counts(e) == {"failed": 1}


def test_a_repeating_schedule_survives_a_snapshot() -> None:
    e = PartitionEngine(0)
    run(e, repeat(limit=5), 1_000)
    work(e, 1_100)
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    for engine in (e, restored):
        run(engine, {"cmd": "_Tick"}, 2_000)
    assert counts(restored) == counts(e) == {"waiting": 1, "completed": 1}
    assert restored.snapshot() == e.snapshot()


def test_a_flow_parent_keeps_its_name() -> None:
    e = PartitionEngine(0)
    [pid] = run(e, {"cmd": "_FlowPush", "queue": "p", "_items": [
        {"data": raw_of({"order": 7}), "name": "assemble", "_expect": 2}]})["ids"]
    job = run(e, {"cmd": "GetJob", "id": pid})["job"]
    assert job["name"] == "assemble" and job["state"] == "waiting-children"
