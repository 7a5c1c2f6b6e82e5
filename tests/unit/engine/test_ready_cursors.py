"""Waiting slots taken one at a time (a priority, a custom id, a tag, a delay that came due)
share one ready-heap entry per priority of their segment, its cursor: pulls still come in the
queue's order, and the heap holds no int per such job.

The state machine pushes single jobs of a few priorities (some with a custom id or a tag, some
delayed), pulls batches, reads jobs (which makes slots job objects), cancels, changes
priorities, promotes, lets delays come due and restores the engine from its snapshot, and
checks every pull against the order a plain model gives: the highest priority first, then the
oldest.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shoal.cluster.codec import raw_of
from shoal.node.state import PartitionEngine

DELAY_MS = 300


class ReadyCursorsVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.engine = PartitionEngine(0)
        self.engine.apply({"cmd": "CreateQueue", "queue": "q", "options": {"ttr": 10_000_000}}, self.now)
        self.jobs: dict[int, dict[str, Any]] = {}  # seq -> {"prio", "state": waiting | delayed, "run_at"}
        self.seqs: dict[str, int] = {}  # a job's wire id (its custom id, if it has one) -> its seq
        self.custom = 0

    def apply(self, cmd: dict[str, Any]) -> Any:
        return self.engine.apply(cmd, self.now).result

    def _due(self) -> None:
        self.apply({"cmd": "_Tick"})
        for job in self.jobs.values():
            if job["state"] == "delayed" and job["run_at"] <= self.now:
                job["state"] = "waiting"

    @rule(prio=st.sampled_from([0, 0, 1, 2, 5]), kind=st.sampled_from(["plain", "plain", "customId", "tag"]),
          delays=st.lists(st.booleans(), min_size=1, max_size=5))
    def push(self, prio: int, kind: str, delays: list[bool]) -> None:
        for delayed in delays:
            cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(prio), "priority": prio}
            if delayed:
                cmd["delay"] = DELAY_MS
            if kind == "customId":
                self.custom += 1
                cmd["customId"] = f"c{self.custom}"
            elif kind == "tag":
                cmd["tag"] = "t"
            wire_id = self.apply(cmd)["id"]
            seq = self.engine.seq
            self.seqs[wire_id] = seq
            self.jobs[seq] = {"prio": prio, "state": "delayed" if delayed else "waiting",
                              "run_at": self.now + (DELAY_MS if delayed else 0)}

    @rule(count=st.integers(1, 5))
    def pull(self, count: int) -> None:
        self._due()
        waiting = sorted((-j["prio"], seq) for seq, j in self.jobs.items() if j["state"] == "waiting")
        expected = [seq for _, seq in waiting[:count]]
        r = self.apply({"cmd": "PULLB", "queue": "q", "count": count})
        got = [self.seqs[job["id"]] for job in r["jobs"]]
        assert got == expected
        for job, token in zip(r["jobs"], r["tokens"]):
            self.apply({"cmd": "ACK", "id": job["id"], "token": token})
            del self.jobs[self.seqs.pop(job["id"])]

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.jobs)))
        assert self.apply({"cmd": "GetJob", "id": f"0-{seq}"})["job"] is not None

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.jobs)))
        self.apply({"cmd": "Cancel", "id": f"0-{seq}", "by": "model"})
        del self.jobs[seq]
        self.seqs = {w: s for w, s in self.seqs.items() if s != seq}

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), prio=st.sampled_from([0, 1, 2, 5]))
    def change_priority(self, data: st.DataObject, prio: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.jobs)))
        self.apply({"cmd": "ChangePriority", "id": f"0-{seq}", "priority": prio})
        self.jobs[seq]["prio"] = prio

    @precondition(lambda self: any(j["state"] == "delayed" for j in self.jobs.values()))
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(s for s, j in self.jobs.items() if j["state"] == "delayed")))
        self.apply({"cmd": "Promote", "id": f"0-{seq}"})
        self.jobs[seq]["state"] = "waiting"

    @rule(dt=st.sampled_from([100, 200, 400]))
    def advance(self, dt: int) -> None:
        self.now += dt
        self._due()

    @rule()
    def restart(self) -> None:
        self.engine = PartitionEngine.restore(self.engine.snapshot())

    @invariant()
    def counts_agree(self) -> None:
        counts = self.apply({"cmd": "GetJobCounts", "queue": "q"})["counts"]
        waiting = sum(1 for j in self.jobs.values() if j["state"] == "waiting")
        delayed = sum(1 for j in self.jobs.values() if j["state"] == "delayed")
        assert counts["waiting"] + counts.get("prioritized", 0) == waiting
        assert counts["delayed"] == delayed


def _seq(job: dict[str, Any]) -> int:
    return int(job["id"].split("-")[1])


TestReadyCursors = ReadyCursorsVsModel.TestCase
TestReadyCursors.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


def test_waiting_jobs_with_priorities_hold_no_heap_entry_each() -> None:
    """10,000 single adds over 7 priorities: the ready heap holds one entry per priority of the
    segment they share, not one per job; they come out in the queue's order."""
    engine = PartitionEngine(0)
    engine.apply({"cmd": "CreateQueue", "queue": "q", "options": {}}, 0)
    for i in range(10_000):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(i), "priority": i % 7}, i)
    assert len(engine.queues["q"].ready) <= 7
    restored = PartitionEngine.restore(engine.snapshot())
    assert len(restored.queues["q"].ready) <= 7
    pulled = []
    for _ in range(100):
        r = restored.apply({"cmd": "PULLB", "queue": "q", "count": 1_000}, 20_000).result
        if not r["jobs"]:
            break
        pulled += [_seq(job) for job in r["jobs"]]
    assert pulled == sorted(range(1, 10_001), key=lambda seq: (-((seq - 1) % 7), seq))
    assert restored.queues["q"].ready == []


def _pulled(engine: PartitionEngine, now: int) -> list[int]:
    return [_seq(job) for job in engine.apply({"cmd": "PULLB", "queue": "q", "count": 100}, now).result["jobs"]]


def test_a_delayed_slot_that_comes_due_behind_the_cursor_moves_it_back() -> None:
    """Slot 1 comes due after the cursor of its priority went on to slot 2: the cursor moves
    back to it, and the entry left at slot 2 is taken for stale once the cursor has passed it."""
    engine = PartitionEngine(0)
    engine.apply({"cmd": "CreateQueue", "queue": "q", "options": {}}, 0)
    engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(0), "priority": 1, "delay": DELAY_MS}, 0)
    for i in range(3):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(i), "priority": 1}, 0)
    engine.apply({"cmd": "_Tick"}, DELAY_MS)
    assert _pulled(engine, DELAY_MS) == [1, 2, 3, 4]
    assert engine.queues["q"].ready == []


def test_a_cursor_whose_slot_was_let_go_moves_on() -> None:
    """The slot the cursor names is cancelled and another made a job object by a read: the
    pull moves the cursor on past them."""
    engine = PartitionEngine(0)
    engine.apply({"cmd": "CreateQueue", "queue": "q", "options": {}}, 0)
    for i in range(5):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(i), "priority": 2, "tag": "t"}, 0)
    engine.apply({"cmd": "Cancel", "id": "0-1", "by": "test"}, 1)
    assert engine.apply({"cmd": "GetJob", "id": "0-3"}, 1).result["job"] is not None
    assert _pulled(engine, 2) == [2, 3, 4, 5]
    assert engine.queues["q"].ready == []
