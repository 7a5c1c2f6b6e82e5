"""bunqueue's Python SDK (PyPI ``bunqueue-client``), unmodified, against real Shoal clusters
through one address.

The SDK connects to one node; on the 3-node cluster it is a node that leads none of the
queues used, so every command goes through forwarding (:mod:`shoal.node.relay`). The SDK
sends a job's name inside its data (``{"name": ..., **data}``); Shoal reads it as
bunqueue's server does: the name is the job's, the rest of the map its data.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from compat_places import entry_node, queues_away_from
from waiting import eventually

from shoal.cluster.launcher import LocalCluster

pytestmark = pytest.mark.integration

ROLES = ("adds", "bulk", "work", "retry", "repeat", "sched")
#: A worker's long poll: short, so that closing it does not wait long.
POLL_MS = 200


@pytest.fixture(scope="module")
def place(shoal_cluster: LocalCluster) -> tuple[str, int, dict[str, str]]:
    """The host and port to connect to, and a queue per role that node does not lead."""
    node = entry_node(shoal_cluster)
    host, port = shoal_cluster.address_of(node).rsplit(":", 1)
    return host, int(port), queues_away_from(shoal_cluster, node, ROLES, "py")


@pytest.fixture
def open_queue(bunqueue_sdk: Any, place: tuple[str, int, dict[str, str]]) -> Iterator[Any]:
    """Opens the ``bunqueue.Queue`` of a role, emptied first; closed after the test."""
    host, port, queues = place
    opened: list[Any] = []

    def open_(role: str) -> Any:
        q = bunqueue_sdk.Queue(queues[role], host=host, port=port)
        opened.append(q)
        q.obliterate()
        return q

    yield open_
    for q in opened:
        q.close()


def worker(sdk: Any, q: Any, processor: Any, **options: Any) -> Any:
    host, port = q.connection.host, q.connection.port
    return sdk.Worker(q.name, processor, host=host, port=port, poll_timeout_ms=POLL_MS, **options)


def counts(q: Any) -> dict[str, int]:
    return {k: v for k, v in q.get_job_counts().items() if v}


def test_add_and_get_job_return_the_data_as_added(open_queue: Any) -> None:
    queue = open_queue("adds")
    job = queue.add("send", {"to": "a"})
    got = queue.get_job(job.id)
    assert got.data == {"to": "a"} and got.raw["name"] == "send" and got.state == "waiting"
    # What bunqueue's server keeps of data that is not a map: the SDK's envelope without the name.
    assert queue.get_job(queue.add("plain", 5).id).data == {"payload": 5}
    assert queue.get_job(queue.add("nothing").id).data == {}
    assert queue.get_job("no-such-job") is None
    assert counts(queue) == {"waiting": 3}


def test_bulk_adds(open_queue: Any) -> None:
    queue = open_queue("bulk")
    ids = queue.add_bulk([{"name": "one", "data": {"n": 1}}, {"name": "two", "data": {"n": 2}, "priority": 5},
                          {"name": "three", "data": {"n": 3}, "job_id": "third"}])
    assert ids[2] == "third"
    jobs = [queue.get_job(i) for i in ids]
    assert [(j.raw["name"], j.data) for j in jobs] == [("one", {"n": 1}), ("two", {"n": 2}), ("three", {"n": 3})]
    assert counts(queue) == {"waiting": 2, "prioritized": 1}


def test_a_worker_completes_every_job(bunqueue_sdk: Any, open_queue: Any) -> None:
    queue = open_queue("work")
    queue.add_bulk([{"name": "n", "data": {"i": i}} for i in range(60)])
    seen: list[Any] = []
    lock = threading.Lock()

    def process(job: Any) -> Any:
        with lock:
            seen.append(job.data["i"])
        return {"double": job.data["i"] * 2}

    w = worker(bunqueue_sdk, queue, process, concurrency=4, batch_size=10, ack_batch={"max_size": 10})
    try:
        eventually(lambda: counts(queue) == {"completed": 60}, "60 completed jobs", timeout_s=60)
    finally:
        assert w.close(timeout=30)
    assert sorted(seen) == list(range(60))


def test_retries_then_the_dead_letter_queue(bunqueue_sdk: Any, open_queue: Any) -> None:
    queue = open_queue("retry")
    flaky = queue.add("flaky", {"k": 1}, attempts=3, backoff=10)
    doomed = queue.add("doomed", {"k": 2}, attempts=2, backoff=10)
    runs: dict[str, int] = {}

    def process(job: Any) -> Any:
        runs[job.id] = runs.get(job.id, 0) + 1
        if job.id == doomed.id or job.attempts < 2:
            raise RuntimeError(f"attempt {job.attempts}")
        return "made it"

    w = worker(bunqueue_sdk, queue, process, concurrency=1)
    try:
        eventually(lambda: counts(queue) == {"completed": 1, "failed": 1}, "one completed and one failed job")
    finally:
        assert w.close(timeout=30)
    assert runs == {flaky.id: 3, doomed.id: 2}
    done = queue.get_job(flaky.id)
    assert done.raw["returnvalue"] == "made it" and done.data == {"k": 1}
    assert queue.get_job(doomed.id).raw["failedReason"] == "attempt 1"


def test_legacy_repeat(bunqueue_sdk: Any, open_queue: Any) -> None:
    """``repeat: {every, limit}``: the job now, then ``limit`` more, each the given time after the
    one before completed; without a worker only the first waits."""
    queue = open_queue("repeat")
    first = queue.add("tick", {"t": 1}, repeat={"every": 200, "limit": 2})
    assert queue.get_job(first.id).data == {"t": 1}
    [schedule] = queue.get_job_schedulers()
    # A run came due while the first job waited: it was skipped, not added beside it.
    eventually(lambda: queue.get_job_schedulers()[0]["nextRun"] > schedule["nextRun"], "a skipped run")
    assert counts(queue) == {"waiting": 1}
    runs: list[Any] = []
    w = worker(bunqueue_sdk, queue, lambda job: runs.append(job.data), concurrency=1)
    try:
        eventually(lambda: counts(queue) == {"completed": 3} and not queue.get_job_schedulers(),
                   "three runs, then no schedule")
    finally:
        assert w.close(timeout=30)
    assert runs == [{"t": 1}] * 3


def test_a_job_scheduler_names_its_jobs(open_queue: Any) -> None:
    """The SDK's scheduler template travels as the data's ``name``, as its adds do."""
    queue = open_queue("sched")
    queue.upsert_job_scheduler("hourly", {"every": 3_600_000, "immediately": True}, {"name": "tick", "data": {"a": 1}})
    try:
        [job] = eventually(lambda: queue.get_jobs(state="waiting"), "the scheduler's first job")
        assert (job.raw["name"], job.data) == ("tick", {"a": 1})
    finally:
        queue.remove_job_scheduler("hourly")
