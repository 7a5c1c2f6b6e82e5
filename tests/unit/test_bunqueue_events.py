"""bunqueue's event frames for the node's job events (``node.bunqueue.events_of``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from shoal.cluster.codec import Raw, decode_response
from shoal.node.bunqueue import EventFrames, encode_event, events_of


class Jobs:
    """What a partition's view tells of a job for an event: wire id, result, error."""

    def __init__(self, jobs: dict[str, tuple[str, Any, Any]]) -> None:
        self.jobs = jobs
        self.lookups = 0

    def event_job(self, job_id: str) -> tuple[str, Any, Any] | None:
        self.lookups += 1
        return self.jobs.get(job_id)


def frames(ev: dict[str, Any], jobs: Jobs) -> list[dict[str, Any]]:
    return [f["event"] for f in events_of({"event": "job", "queue": "q", "partition": 0, **ev},
                                          {0: SimpleNamespace(view=jobs)}, 1_000)]


def test_a_pull_names_the_job_without_looking_it_up() -> None:
    jobs = Jobs({})
    assert frames({"id": "order-7", "state": "active", "prev": "waiting"}, jobs) == [
        {"queue": "q", "jobId": "order-7", "timestamp": 1000.0, "eventType": "pulled"}]
    assert frames({"id": "0-3", "state": "waiting", "prev": None}, jobs)[0]["eventType"] == "pushed"
    assert jobs.lookups == 0


def test_a_completion_carries_the_result_and_a_retry_the_error() -> None:
    jobs = Jobs({"0-1": ("0-1", b"\x2a", None), "0-2": ("0-2", None, "boom")})
    done = frames({"id": "0-1", "state": "completed", "prev": "active"}, jobs)
    assert done == [{"queue": "q", "jobId": "0-1", "timestamp": 1000.0, "eventType": "completed",
                     "data": Raw(b"\x2a")}]
    retried = frames({"id": "0-2", "state": "waiting", "prev": "active"}, jobs)
    assert [f["eventType"] for f in retried] == ["failed", "retried"] and retried[0]["error"] == "boom"
    gone = frames({"id": "0-9", "state": "completed", "prev": "active"}, jobs)  # a segment's plain job
    assert gone == [{"queue": "q", "jobId": "0-9", "timestamp": 1000.0, "eventType": "completed", "data": None}]


def test_only_a_job_removed_before_it_ended_is_announced() -> None:
    jobs = Jobs({})
    assert frames({"id": "0-4", "state": "removed", "prev": "waiting"}, jobs) == [
        {"queue": "q", "jobId": "0-4", "timestamp": 1000.0, "eventType": "removed", "prev": "waiting"}]
    for ended in ("completed", "failed", "cancelled"):  # history trimmed or cleaned
        assert frames({"id": "0-5", "state": "removed", "prev": ended}, jobs) == []
    assert jobs.lookups == 0


def test_a_batchs_frames_are_the_bytes_of_the_event_dicts() -> None:
    jobs = Jobs({"0-1": ("0-1", b"\x2a", None), "0-2": ("0-2", None, "boom"), "0-3": ("invoice-3", None, None)})
    replicas = {0: SimpleNamespace(view=jobs)}
    batch = EventFrames(replicas, 1_000)
    events = [{"id": "0-7", "state": "active", "prev": "waiting"},   # templated
              {"id": "0-8", "state": "active", "prev": "delayed", "queue": "other"},
              {"id": "0-3", "state": "completed", "prev": "active"},  # templated, by its wire id
              {"id": "0-9", "state": "completed", "prev": "active"},  # templated, not found
              {"id": "0-1", "state": "completed", "prev": "active"},  # with a result
              {"id": "0-2", "state": "waiting", "prev": "active"},
              {"id": "0-4", "state": "waiting", "prev": None},
              {"id": "0-5", "state": "removed", "prev": "completed"},
              {"id": "0-6", "state": "active", "prev": "waiting", "partition": "0"}]
    for ev in events:
        ev = {"event": "job", "queue": "q", "partition": 0, **ev}
        expected = [encode_event(f) for f in events_of(ev, replicas, 1_000)]
        got = batch.of(ev)
        assert got == expected or [decode_response(b[4:]) for b in got] == [decode_response(b[4:]) for b in expected], ev
        assert all(int.from_bytes(b[:4], "big") == len(b) - 4 for b in got)
    long_id = "x" * 300  # a custom id past msgpack's short strings
    ev = {"event": "job", "queue": "q", "partition": 0, "id": long_id, "state": "active", "prev": "waiting"}
    assert decode_response(batch.of(ev)[0][4:])["event"]["jobId"] == long_id
