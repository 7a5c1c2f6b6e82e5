"""Single adds held as segment slots behave exactly like the job objects they stand for.

``queue.add()`` sends a PUSH with a priority, a delay, a name, a group, a custom id, a tag and
an idempotency key; the engine holds such jobs (and PUSHB items like them) as slots of the
partition's last segment (waiting, prioritized, grouped or delayed) instead of one ``Job``
object each. Two engines get the same commands, except that the reference's adds carry
``ttr: None``, which keeps them on the per-job path: every reply and every snapshot (``digest``)
must stay equal after every step, through pulls (of the queue's turns, of one group, of jobs
without one), acks, fails, priority changes, promotions, delays coming due, drains and restores,
and so must each group's size and turn and the events' job ids.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shoal.cluster.codec import raw_of, unraw
from shoal.cluster.errors import CommandError
from shoal.node.partition.payload_files import FileSpace, PayloadFiles
from shoal.node.state import PartitionEngine, PushRun, SessionPull, Stored, event_dicts
from shoal.node.state._model import slot_job, slot_tuples
from shoal.node.state._segments import SEGMENT_SLOTS_MAX

QUEUES = ["a", "b"]
TTR_MS = 1_000
#: Queue "b" runs two jobs of a group at once and gives group g2 twice the turns of the others
#: (queue "a" keeps the default: one job of a group at a time).
QUEUE_OPTIONS = {"a": {"ttr": TTR_MS, "backoff": 0},
                 "b": {"ttr": TTR_MS, "backoff": 0, "groupConcurrency": 2, "groupWeights": {"g2": 2}}}


def apply_both(engine: PartitionEngine, reference: PartitionEngine, cmd: Any, now: int,
               ref_cmd: Any = None) -> Any:
    """The same reply or the same refusal from both engines, and equal snapshots after."""
    try:
        reply = engine.apply(cmd, now).result
    except CommandError as exc:
        with pytest.raises(CommandError) as ref_exc:
            reference.apply(ref_cmd or cmd, now)
        assert (ref_exc.value.code, str(ref_exc.value)) == (exc.code, str(exc))
        raise
    ref_reply = reference.apply(ref_cmd or cmd, now).result
    assert unraw(reply) == unraw(ref_reply), f"{cmd!r}: {reply} != {ref_reply}"
    assert engine.digest() == reference.digest(), f"snapshots differ after {cmd!r}"
    return reply


class SlotsVsPerJob(RuleBasedStateMachine):
    """The engine under test keeps its segments' data in payload files (tiny files and buffer, so
    appends, reads and releases cross every boundary); the reference keeps job objects."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads = PayloadFiles(Path(tempfile.mkdtemp(prefix="shoal-slots-")) / "payloads")
        self.engine = PartitionEngine(0, self._space())
        self.reference = PartitionEngine(0)
        self.now = 1_000
        self.seqs: list[int] = []              # every job added
        self.tokens: dict[str, str] = {}       # the latest token handed out per job, by its wire id
        for queue in QUEUES:
            self.both({"cmd": "CreateQueue", "queue": queue, "options": QUEUE_OPTIONS[queue]})

    def _space(self) -> FileSpace:
        space = self.payloads.new()
        space.file_bytes, space.buffer_bytes, space.read_ahead, space.compact_step = 160, 48, 40, 30
        return space

    def teardown(self) -> None:
        self.payloads.close()
        shutil.rmtree(self.payloads.root.parent, ignore_errors=True)

    def seq_of(self, queue: str, job_id: str) -> int:
        """The seq of the job ``job_id`` names: Shoal's own id, or a custom id of ``queue``."""
        if job_id.startswith("0-"):
            return int(job_id[2:])
        return self.engine.queues[queue].custom_ids[job_id]

    def both(self, cmd: Any, ref_cmd: Any = None) -> Any:
        return apply_both(self.engine, self.reference, cmd, self.now, ref_cmd)

    def attempt(self, cmd: Any) -> Any:
        try:
            return self.both(cmd)
        except CommandError:
            return None

    @rule(queue=st.sampled_from(QUEUES), prio=st.sampled_from([0, 0, 0, 1, 3, -2]),
          delay=st.sampled_from([0, 0, 0, 400, 1_500]), key=st.sampled_from([None, None, "k1", "k2", "k3"]),
          name=st.sampled_from([None, None, "mail"]), n=st.integers(1, 4),
          group=st.sampled_from([None, None, "g1", "g2", "g3"]),
          custom=st.sampled_from([None, None, None, "c1", "c2"]), tag=st.sampled_from([None, None, "t1"]))
    def add(self, queue: str, prio: int, delay: int, key: str | None, name: str | None, n: int,
            group: str | None, custom: str | None, tag: str | None) -> None:
        """``n`` adds in a row (one entry's worth), as ``queue.add()`` sends them; with a group,
        every other one in it; with a custom id, the last one (a repeat of one still held is a
        duplicate); with a tag, the first one."""
        for i in range(n):
            cmd: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": raw_of([queue, len(self.seqs), i])}
            if prio or i % 2:
                cmd["priority"] = prio
            if delay:
                cmd["delay"] = delay
            if key is not None:
                cmd["idempotencyKey"] = f"{key}-{i}"
            if name is not None:
                cmd["name"] = name
            if group is not None and i % 2 == 0:
                cmd["group"] = group
            if custom is not None and i == n - 1:
                cmd["customId"] = custom
            if tag is not None and i == 0:
                cmd["tag"] = tag
            reply = self.both(cmd, {**cmd, "ttr": None})
            seq = self.seq_of(queue, reply["id"])
            if seq not in self.seqs:
                self.seqs.append(seq)

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(2, 6))
    def add_bulk(self, queue: str, n: int) -> None:
        items = [{"data": raw_of(["bulk", len(self.seqs), i])} for i in range(n)]
        reply = self.both({"cmd": "PUSHB", "queue": queue, "jobs": items},
                          {"cmd": "PUSHB", "queue": queue, "jobs": [dict(it, priority=0) for it in items]})
        self.seqs.extend(int(i.split("-")[1]) for i in reply["ids"])

    @rule(queue=st.sampled_from(QUEUES), data=st.data(), n=st.integers(1, 6))
    def add_bulk_with_options(self, queue: str, data: st.DataObject, n: int) -> None:
        """A PUSHB whose items carry what single adds may (a priority, a delay, a group, a name,
        a key), some of them an option no slot holds (their own attempts)."""
        items = []
        for i in range(n):
            item: dict[str, Any] = {"data": raw_of(["bulk+", len(self.seqs), i])}
            for field, values in (("priority", [1, 4]), ("delay", [300, 900]), ("group", ["g1", "g2", "g3"]),
                                  ("name", ["mail"]), ("idempotencyKey", ["k1", "k4"]), ("attempts", [3]),
                                  ("customId", ["c3", "c4"]), ("tag", ["t2"])):
                if data.draw(st.integers(0, 3)) == 0:
                    item[field] = data.draw(st.sampled_from(values))
            items.append(item)
        try:
            reply = self.both({"cmd": "PUSHB", "queue": queue, "jobs": items},
                              {"cmd": "PUSHB", "queue": queue, "jobs": [dict(it, ttr=None) for it in items]})
        except CommandError:
            return
        for job_id in reply["ids"]:
            seq = self.seq_of(queue, job_id)
            if seq not in self.seqs:
                self.seqs.append(seq)

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 6), session=st.sampled_from([None, "s1"]),
          only=st.sampled_from([None, None, "g1", "g2", "ungrouped"]))
    def pull(self, queue: str, count: int, session: str | None, only: str | None) -> None:
        """A pull of the queue's turns, or limited to one group or to jobs without one."""
        cmd: dict[str, Any] = {"cmd": "PULLB", "queue": queue, "count": count}
        if only == "ungrouped":
            cmd["ungrouped"] = True
        elif only is not None:
            cmd["group"] = only
        reply = self.both(SessionPull(cmd, session, 0) if session else cmd)
        for job, token in zip(reply["jobs"], reply["tokens"]):
            self.tokens[job["id"]] = token

    @rule(queue=st.sampled_from(QUEUES), custom=st.sampled_from(["c1", "c2", "c3", "c4"]))
    def read_custom(self, queue: str, custom: str) -> None:
        """A job found by its custom id reads the same, whether it is a slot or a job object."""
        self.both({"cmd": "GetJobByCustomId", "queue": queue, "customId": custom})
        self.both({"cmd": "Locate", "id": custom})
        self.attempt({"cmd": "GetJob", "id": custom})

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 4))
    def pull_published(self, queue: str, count: int) -> None:
        """The job events a pull records name each job by its wire id (a custom id where it has one)."""
        cmd = {"cmd": "PULLB", "queue": queue, "count": count}
        got = self.engine.apply(cmd, self.now, events=True)
        want = self.reference.apply(cmd, self.now, events=True)
        assert unraw(got.result) == unraw(want.result)
        assert event_dicts(0, got.events, self.engine) == event_dicts(0, want.events, self.reference)
        for job, token in zip(got.result["jobs"], got.result["tokens"]):
            self.tokens[job["id"]] = token

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), action=st.sampled_from(["ACK", "FAIL", "Release"]))
    def settle(self, data: st.DataObject, action: str) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.tokens)))
        self.attempt({"cmd": action, "id": job_id, "token": self.tokens.pop(job_id)})

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), prio=st.sampled_from([0, 2, 7]))
    def change_priority(self, data: st.DataObject, prio: int) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.attempt({"cmd": "ChangePriority", "id": f"0-{seq}", "priority": prio})

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), action=st.sampled_from(["Promote", "MoveToDelayed", "GetJob", "Cancel"]))
    def touch_one(self, data: st.DataObject, action: str) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        cmd: dict[str, Any] = {"cmd": action, "id": f"0-{seq}"}
        if action == "MoveToDelayed":
            cmd["delay"] = 700
        self.attempt(cmd)

    @rule(queue=st.sampled_from(QUEUES), count=st.sampled_from([None, 1, 3]))
    def promote_jobs(self, queue: str, count: int | None) -> None:
        cmd: dict[str, Any] = {"cmd": "PromoteJobs", "queue": queue}
        if count is not None:
            cmd["count"] = count
        self.both(cmd)

    @rule(queue=st.sampled_from(QUEUES), state=st.sampled_from(["waiting", "prioritized", "delayed", "active"]))
    def list_jobs(self, queue: str, state: str) -> None:
        self.both({"cmd": "GetJobs", "queue": queue, "state": state, "limit": 5})

    @rule(queue=st.sampled_from(QUEUES), state=st.sampled_from([None, "waiting", "prioritized", "delayed",
                                                                "active", "completed"]),
          limit=st.integers(1, 4))
    def list_by_cursor(self, queue: str, state: str | None, limit: int) -> None:
        """Pages after a seq (afterSeq) list what one page from offset 0 does, in order."""
        frame: dict[str, Any] = {"cmd": "GetJobs", "queue": queue, "limit": 1000}
        if state is not None:
            frame["state"] = state
        whole = unraw(self.engine.apply(frame, self.now).result["jobs"])
        got: list[Any] = []
        after = 0
        for _ in range(len(whole) + 2):
            reply = self.engine.apply({**frame, "limit": limit, "afterSeq": after}, self.now).result
            got += unraw(reply["jobs"])
            assert reply["lastSeq"] >= after
            after = reply["lastSeq"]
            if len(reply["jobs"]) < limit:
                break
        assert got == whole

    @rule(queue=st.sampled_from(QUEUES))
    def obliterate(self, queue: str) -> None:
        """The queue's segments go at once; the reference removes its jobs one by one. The
        same events too, in seq order."""
        got = self.engine.apply({"cmd": "Obliterate", "queue": queue}, self.now, events=True).events
        want = self.reference.apply({"cmd": "Obliterate", "queue": queue}, self.now, events=True).events
        assert got == want
        assert self.engine.digest() == self.reference.digest()
        self.both({"cmd": "CreateQueue", "queue": queue, "options": QUEUE_OPTIONS[queue]})

    @rule()
    def release_session(self) -> None:
        self.both({"cmd": "_ReleaseSession", "session": "s1"})

    @rule(queue=st.sampled_from(QUEUES))
    def drain(self, queue: str) -> None:
        """Waiting and delayed slots go a run at a time; the reference removes its jobs one by
        one: the same count, state and events."""
        got = self.engine.apply({"cmd": "Drain", "queue": queue}, self.now, events=True)
        want = self.reference.apply({"cmd": "Drain", "queue": queue}, self.now, events=True)
        assert (got.result, got.events) == (want.result, want.events)
        assert self.engine.digest() == self.reference.digest()

    @rule(queue=st.sampled_from(QUEUES))
    def truncate(self, queue: str) -> None:
        """tarantool's truncate: waiting, delayed and completed slots go a run at a time."""
        got = self.engine.apply({"cmd": "Truncate", "queue": queue}, self.now, events=True)
        want = self.reference.apply({"cmd": "Truncate", "queue": queue}, self.now, events=True)
        assert (got.result, got.events) == (want.result, want.events)
        assert self.engine.digest() == self.reference.digest()

    @rule(queue=st.sampled_from(QUEUES), state=st.sampled_from(["completed", "waiting", "delayed", "failed"]),
          grace=st.sampled_from([0, 700, 10_000]), limit=st.sampled_from([None, 1, 3]))
    def clean(self, queue: str, state: str, grace: int, limit: int | None) -> None:
        """Only the slots in the cleaned state are looked at; the same jobs go, oldest first."""
        cmd = {"cmd": "Clean", "queue": queue, "state": state, "grace": grace, "limit": limit}
        got = self.engine.apply(cmd, self.now, events=True)
        want = self.reference.apply(cmd, self.now, events=True)
        assert (got.result, got.events) == (want.result, want.events)
        assert self.engine.digest() == self.reference.digest()

    @rule(dt=st.sampled_from([200, 500, 1_200]))
    def advance(self, dt: int) -> None:
        self.now += dt
        self.both({"cmd": "_Tick"})
        self.payloads.collect()
        self.payloads.compact()

    @rule()
    def restart(self) -> None:
        """The engine under test restored from its snapshot (as a restarted node is)."""
        old = self.engine
        self.engine = PartitionEngine.restore_chunks((old.snapshot(),), self._space())
        self.payloads.discard(old.segments.space)
        assert self.engine.digest() == self.reference.digest()

    @invariant()
    def payload_bytes_are_those_of_held_slots(self) -> None:
        """The data bytes of every held slot and job object are live in the space and nothing
        else is: no leak, no double release."""
        engine = self.engine
        held = sum(seg.data_len(i) for seg in engine.segments for i, code in enumerate(seg.states) if code)
        held += sum(len(job.data) for job in engine.jobs.values() if type(job.data) is Stored)
        assert engine.segments.space.stats()["liveBytes"] == held
    @invariant()
    def slot_tuples_are_those_of_the_slots_jobs(self) -> None:
        """What a snapshot writes of a segment's slots is what their job objects would give."""
        for seg in self.engine.segments:
            held = [i for i, code in enumerate(seg.states) if code]
            if held:
                i, j = held[0], held[-1] + 1
                if all(seg.states[i:j]):
                    assert slot_tuples(seg, i, j, 0) == [slot_job(seg, k, 0).to_tuple() for k in range(i, j)]
                assert slot_tuples(seg, i, i + 1, 0) == [slot_job(seg, i, 0).to_tuple()]

    @invariant()
    def counts_agree(self) -> None:
        for queue in QUEUES:
            for read in ({"cmd": "GetJobCounts", "queue": queue}, {"cmd": "GetCountsPerPriority", "queue": queue}):
                assert self.engine.apply(read, self.now).result == self.reference.apply(read, self.now).result

    @invariant()
    def groups_agree(self) -> None:
        """Each group's size, running jobs and turn, and whether a pull would find work, are the
        same whether its waiting jobs are slots or job objects."""
        for queue in QUEUES:
            q, ref = self.engine.queues.get(queue), self.reference.queues.get(queue)
            if q is None or ref is None:
                assert q is ref
                continue
            # A restore restarts the virtual clock at 0: turns compare relative to it.
            turns = {g: t - q.group_vtime for g, t in q.group_tags.items()}
            ref_turns = {g: t - ref.group_vtime for g, t in ref.group_tags.items()}
            assert (q.group_sizes, q.group_active, turns) == (ref.group_sizes, ref.group_active, ref_turns)
            for only in (None, "g1", "g2", "g3"):
                assert self.engine.has_ready(queue, only) == self.reference.has_ready(queue, only)


TestSlotsVsPerJob = SlotsVsPerJob.TestCase
TestSlotsVsPerJob.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def test_single_adds_to_one_queue_hold_no_job_objects_before_or_after_a_restore() -> None:
    """What ``bench/bench_backlog.py``'s single phase adds: one entry of adds at a time,
    priorities 0..6 and every other job delayed, each with an idempotency key."""
    e = PartitionEngine(0)
    for k in range(2_000):
        cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(k), "priority": k % 7,
                               "idempotencyKey": f"key-{k}"}
        if k % 2:
            cmd["delay"] = 3_600_000
        e.apply(cmd, 1_000 + k // 10)
    assert len(e.jobs) == 0 and e.segments.jobs == 2_000
    counts = e.apply({"cmd": "GetJobCounts", "queue": "q"}, 5_000).result["counts"]
    assert (counts["waiting"], counts["prioritized"], counts["delayed"]) == (143, 857, 1_000)
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    assert len(restored.jobs) == 0 and restored.segments.jobs == 2_000
    first = restored.apply({"cmd": "PULLB", "queue": "q", "count": 3, "ttr": 9_000_000}, 6_000).result["jobs"]
    assert [j["priority"] for j in first] == [6, 6, 6]
    due = restored.apply({"cmd": "_Tick"}, 1_000 + 3_600_000 + 200).result
    assert due is not None
    counts = restored.apply({"cmd": "GetJobCounts", "queue": "q"}, 3_700_000).result["counts"]
    assert counts["delayed"] == 0 and counts["waiting"] + counts["prioritized"] == 1_997


def test_grouped_single_adds_hold_no_job_objects_before_or_after_a_restore() -> None:
    """Adds in 50 groups (every fifth with a priority, every third delayed) wait as slots; a pull
    makes job objects of what it takes, one per group under groupConcurrency 1, in turns."""
    e = PartitionEngine(0)
    for k in range(3_000):
        cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(k), "group": f"tenant-{k % 50}",
                               "idempotencyKey": f"key-{k}"}
        if k % 5 == 0:
            cmd["priority"] = 2
        if k % 3 == 1:
            cmd["delay"] = 3_600_000
        e.apply(cmd, 1_000 + k // 10)
    assert len(e.jobs) == 0 and e.segments.jobs == 3_000
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    assert len(restored.jobs) == 0 and restored.segments.jobs == 3_000
    for engine in (e, restored):
        taken = engine.apply({"cmd": "PULLB", "queue": "q", "count": 100, "ttr": 9_000_000}, 6_000).result["jobs"]
        assert len(taken) == 50 and len({job["group"] for job in taken}) == 50
        assert len(engine.jobs) == 50  # the taken ones, active
    assert restored.digest() == e.digest()
    due = 1_000 + 300 + 3_600_000
    for engine in (e, restored):
        engine.apply({"cmd": "_Tick"}, due)
        assert engine.apply({"cmd": "GetJobCounts", "queue": "q"}, due).result["counts"]["delayed"] == 0
        assert len(engine.jobs) == 50  # the delayed slots came due in place
    assert restored.digest() == e.digest()


def test_one_string_per_group_and_name_however_many_jobs_hold_it() -> None:
    """Each add's frame decodes its own copy of the group and the name; waiting jobs share one."""
    e = PartitionEngine(0)
    for k in range(100):
        e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(k), "group": "".join(["tenant-", "7"]),
                 "name": "".join(["send-", "mail"])}, 1_000)
    seg = next(iter(e.segments))
    assert seg.groups is not None and seg.names is not None
    assert len({id(g) for g in seg.groups}) == 1 and len({id(n) for n in seg.names}) == 1


def test_a_restored_engine_holds_no_more_than_the_one_that_wrote_the_snapshot() -> None:
    """Memory the Python allocator counts (tracemalloc): slots come back as slots, with their
    groups and custom ids (one string each, shared with the queue's index)."""
    payload = b"x" * 1_000
    e = PartitionEngine(0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(5_000):
            cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": payload + str(k).encode(),
                                   "priority": k % 7, "idempotencyKey": f"key-{k}"}
            if k % 2:
                cmd["delay"] = 3_600_000
            if k % 3 == 0:
                cmd["group"] = f"tenant-{k % 40}"
            if k % 5 == 0:
                cmd["customId"] = f"order-{k:09d}"
            e.apply(cmd, 1_000 + k // 100)
        held = tracemalloc.get_traced_memory()[0] - before
        snapshot = e.snapshot()
        before = tracemalloc.get_traced_memory()[0]
        restored = PartitionEngine.restore(snapshot)
        gc.collect()
        restored_held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert restored.digest() == e.digest() and len(restored.jobs) == 0
    assert restored_held <= held * 1.02


def test_promote_jobs_takes_the_same_jobs_on_a_replica_restored_from_a_snapshot() -> None:
    """Job objects only: a delay moved leaves a stale delayed-heap entry that a restored replica
    does not have; ``PromoteJobs`` with a count must not let it decide which job comes first."""
    live = PartitionEngine(0)
    for k in range(2):
        live.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(k), "delay": 400, "ttr": None}, 1_000)
    live.apply({"cmd": "MoveToDelayed", "id": "0-1", "delay": 700}, 1_000)
    restored = PartitionEngine.restore(live.snapshot())
    for engine in (live, restored):
        assert engine.apply({"cmd": "PromoteJobs", "queue": "q", "count": 1}, 1_000).result == {"count": 1}
    assert live.digest() == restored.digest()
    state = live.apply({"cmd": "GetJob", "id": "0-2"}, 1_000).result["job"]["state"]
    assert state == "waiting"  # due at 1,400: before job 1, moved to 1,700


def test_plain_adds_one_per_entry_fill_one_segment_up_to_its_size_limit() -> None:
    """``queue.add(data)`` one at a time: each arrives as a PushRun of one (the node's fast path),
    and each extends the last segment instead of making a segment of one."""
    e = PartitionEngine(0)
    n = SEGMENT_SLOTS_MAX + 5
    for k in range(n):
        e.apply(PushRun("q", [raw_of(k).packed], [f"key-{k}"], None), 1_000 + k)
    segments = list(e.segments)
    assert len(e.jobs) == 0 and [len(s.states) for s in segments] == [SEGMENT_SLOTS_MAX, 5]
    e.apply(PushRun("other", [raw_of("o").packed], None, None), 30_000)
    e.apply(PushRun("q", [raw_of("q").packed], None, None), 30_000)
    assert len(list(e.segments)) == 4  # another queue's add in between starts new segments
    reply = e.apply({"cmd": "PULLB", "queue": "q", "count": 3}, 40_000).result
    assert [j["id"] for j in reply["jobs"]] == ["0-1", "0-2", "0-3"]
    assert [j["createdAt"] for j in reply["jobs"]] == [1_000.0, 1_001.0, 1_002.0]
