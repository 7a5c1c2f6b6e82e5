"""bunqueue's event frames for the node's job events (``node.bunqueue.events_of``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from shoal.cluster.codec import Raw
from shoal.node.bunqueue import events_of


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
