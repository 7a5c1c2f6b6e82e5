"""The dashboard's node-side parts that need no network: the counters sampler (history, rates),
the leader's job timelines, the simulation's parameter checks. The sampler reads a real
:class:`PartitionEngine` through a stand-in for the replica wrapper."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shoal.cluster.codec import raw_of
from shoal.cluster.errors import CommandError
from shoal.node.http.dashboard import TIMELINE_ENTRIES_MAX, TIMELINE_WATCHED_MAX, QueueSampler, Timelines, trace_id_of
from shoal.node.partition import Partition, PartitionView
from shoal.node.simulation import SimulationParams
from shoal.node.state import PartitionEngine


class Replica:
    """What the sampler uses of a replica: its application's read-only view of a real engine."""

    def __init__(self, partition: int) -> None:
        self.engine = PartitionEngine(partition)
        self.broken = False
        self.application = SimpleNamespace(view=PartitionView(self._engine))

    def _engine(self) -> PartitionEngine:
        if self.broken:
            raise RuntimeError("restoring")
        return self.engine


class Node:
    def __init__(self) -> None:
        self.now = 1_000_000
        self.replicas = {0: Replica(0), 1: Replica(1)}
        # The sampler only reads: the partitions need no group commit.
        self.partitions = {p: Partition(p, r, None) for p, r in self.replicas.items()}  # type: ignore[arg-type]
        self.event_listeners: list[Any] = []
        self.wanted = 0

    def now_ms(self) -> int:
        return self.now

    def events_wanted(self) -> None:
        self.wanted += 1


def test_sampler_history_rates_and_a_zero_baseline_for_new_queues() -> None:
    node = Node()
    sampler = QueueSampler(node)  # type: ignore[arg-type]
    engine = node.replicas[0].engine
    sampler.sample()  # partition 0 sampled once, with no queue yet
    engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(10)]}, node.now)
    for step in range(1, 6):
        node.now += 1_000
        if step == 2:
            for _ in range(4):
                job = engine.apply({"cmd": "PULL", "queue": "q"}, node.now).result["job"]
                engine.apply({"cmd": "ACK", "id": job["id"]}, node.now)
        sampler.sample()
    h = sampler.history("q")
    assert h["t"] == [1_001_000 + 1_000 * i for i in range(5)]
    assert h["waiting"] == [10, 6, 6, 6, 6] and h["completed"] == [0, 4, 4, 4, 4]
    assert h["enqueuedRate"] == [10.0, 0, 0, 0, 0]  # the baseline: the queue was born in between
    assert h["completedRate"] == [0, 4.0, 0, 0, 0]
    assert sampler.rates("q") == {"enqueued": 2.0, "completed": 0.8, "failed": 0.0}  # over 5 s
    view = sampler.views(spark=2, limit=10)["q"]
    assert view["partition"] == 0 and view["counts"]["waiting"] == 6 and len(view["history"]["t"]) == 2
    # counts are read live: a push shows before the next sample
    engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(1)}, node.now)
    assert sampler.views(spark=2, limit=10)["q"]["counts"]["waiting"] == 7


def test_sampler_keeps_history_while_a_replica_cannot_be_read_and_drops_deleted_queues() -> None:
    node = Node()
    sampler = QueueSampler(node)  # type: ignore[arg-type]
    node.replicas[1].engine.apply({"cmd": "PUSH", "queue": "b", "data": raw_of(1)}, node.now)
    sampler.sample()
    node.replicas[1].broken = True
    node.now += 1_000
    sampler.sample()
    assert "b" in sampler.samples
    node.replicas[1].broken = False
    node.replicas[1].engine.apply({"cmd": "Obliterate", "queue": "b"}, node.now)
    sampler.sample()
    assert "b" not in sampler.samples
    assert sampler.history("nope")["t"] == [] and sampler.rates("nope")["completed"] == 0.0


def test_timelines_record_only_watched_jobs_and_stay_bounded() -> None:
    node = Node()
    tl = Timelines(node)  # type: ignore[arg-type]
    tl.touch("0-1")
    assert node.event_listeners == [tl.on_events] and node.wanted == 1
    tl.touch("0-1")
    assert len(node.event_listeners) == 1
    for i in range(TIMELINE_ENTRIES_MAX + 5):
        node.now += 10
        tl.on_events([{"event": "job", "id": "0-1", "state": "active" if i % 2 else "waiting"},
                      {"event": "job", "id": "0-2", "state": "active"},  # nobody looks at 0-2
                      {"event": "progress", "id": "0-1", "progress": 5}])
    assert len(tl.jobs["0-1"]) == TIMELINE_ENTRIES_MAX and "0-2" not in tl.jobs
    job = {"id": "0-1", "createdAt": 5, "runAt": 5, "state": "completed", "finishedAt": node.now + 1}
    timeline = tl.of(job)
    assert timeline[0] == {"time": 5, "state": "created", "source": "job"}
    assert timeline[-1]["state"] == "completed" and [e["time"] for e in timeline] == sorted(e["time"] for e in timeline)
    for i in range(TIMELINE_WATCHED_MAX + 10):
        tl.touch(f"1-{i}")
    assert len(tl.watched) == TIMELINE_WATCHED_MAX and "0-1" not in tl.watched
    tl.expire()
    assert tl.listening
    for job_id in tl.watched:
        tl.watched[job_id] = 0.0
    tl.expire()
    assert node.event_listeners == [] and not tl.listening and not tl.watched


@pytest.mark.parametrize("body, field", [
    ({"jobs": 0}, "jobs"), ({"workers": 201}, "workers"), ({"hangRate": -0.1}, "hangRate"),
    ({"failRate": "x"}, "failRate"), ({"failRate": 0.7, "hangRate": 0.5}, "failRate + hangRate"),
    ({"ttrMs": 10}, "ttrMs"), ({"queue": "no spaces"}, "queue"), ({"bogus": 1}, "bogus"),
    ({"jobs": True}, "jobs"), ({"seed": 1.5}, "seed"),
])
def test_simulation_parameters_are_checked(body: dict[str, Any], field: str) -> None:
    with pytest.raises(CommandError) as err:
        SimulationParams.from_body(body)
    assert err.value.code.value == "INVALID" and field in str(err.value)


def test_simulation_parameter_defaults() -> None:
    p = SimulationParams.from_body({"queue": "demo.q:1", "jobs": 10, "hangRate": 0.1, "failRate": 0})
    assert (p.queue, p.jobs, p.workers, p.hang_rate, p.ttr_ms, p.attempts) == ("demo.q:1", 10, 8, 0.1, 2_000, 3)


@pytest.mark.parametrize("traceparent, trace_id", [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-later", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None),  # version 00 has 4 parts
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None),  # W3C: lower-case hex only
    ("00-4bf92f35-00f067aa0ba902b7-01", None),
    (7, None),
])
def test_a_jobs_trace_id_comes_from_its_w3c_traceparent(traceparent: Any, trace_id: str | None) -> None:
    assert trace_id_of({"id": "0-1", "traceContext": {"traceparent": traceparent}}) == trace_id
    assert trace_id_of({"id": "0-1"}) is None and trace_id_of({"traceContext": "x"}) is None
