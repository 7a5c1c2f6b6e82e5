"""Where a partition's jobs live: the engine's fields, job lookup, materializing segment jobs, listings."""

from __future__ import annotations

import functools
import heapq
import re
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from ._commands import AckRun, Command, command_queue
from ._due_heap import DueHeap
from ._key_table import KeyWindow
from ._payloads import MemorySpace, PayloadSpace, Stored, data_ref
from ._model import SEQ_BITS, SLOT_CODES, Event, Job, Queue, due_key, ready_key, seq_of, slot_job, slot_tuples
from ._segments import SLOT_ACTIVE, SLOT_DELAYED, SLOT_HELD, SLOT_READY, SLOT_WAITING, Segment, SegmentStore
from ._session_leases import Run, SessionLeases, add_lease
from ._transitions import ACTIVE, CANCELLED, COMPLETED, DELAYED, FAILED, NEW, WAITING, check_transition

#: The wire's job name when none was given (bunqueue's default).
DEFAULT_NAME = "default"


def shoal_seq(job_id: str, partition: int) -> int | None:
    """The seq of ``job_id`` when it is Shoal's own id of a job of ``partition``, else None."""
    head, sep, tail = job_id.partition("-")
    if sep and head.isdigit() and tail.isdigit() and head.isascii() and tail.isascii() and len(job_id) <= 40:
        return int(tail) if int(head) == partition else -1
    return None


def wire_state(job: Job) -> str:
    """A job's state as bunqueue names it: a waiting job with a priority is ``prioritized``."""
    state = job.state
    if state == WAITING and job.priority:
        return "prioritized"
    return state

__all__ = ["Store", "TUPLE_RUN_MAX", "slot_runs"]

#: Slots a snapshot makes tuples of (and reads the data of) at once: 1 MiB of 1 KiB jobs.
TUPLE_RUN_MAX = 1024


@functools.cache
def slot_runs(states: tuple[str, ...] | None) -> re.Pattern[bytes] | None:
    """A pattern matching runs of the slot codes of ``states`` (every held code: None); None
    when no slot holds a job in any of them (failed, cancelled, waiting for children)."""
    codes = sorted(SLOT_HELD if states is None else {c for s in states for c in SLOT_CODES.get(s, ())})
    return re.compile(b"[" + b"".join(b"\\x%02x" % c for c in codes) + b"]+") if codes else None


class Store:
    """The fields every part of the engine works on, and how jobs are found."""

    def __init__(self, partition: int, space: PayloadSpace | None = None) -> None:
        self.partition = partition
        self.seq = 0
        self.lease_seq = 0
        self.now_ms = 0
        self.jobs: dict[int, Job] = {}
        # plain jobs not materialized yet, their data in ``space`` (process memory when none is given)
        self.segments = SegmentStore(space if space is not None else MemorySpace())
        self._jobs_unordered = False    # a materialized job was inserted behind later seqs
        # The job object the latest add made that a segment's slot could hold (``_push_slot``):
        # how the representation is chosen, never state (a restored engine starts with none).
        self._slot_hint = 0
        self.queues: dict[str, Queue] = {}
        self.delayed = DueHeap()                          # due_key(run_at_ms, seq)
        # (deadline_ms, seq, token, 0) per lease, or (deadline_ms, first seq, its token, last seq) per
        # run of segment jobs leased by one pull (see _expire_run)
        self.leases: list[tuple[int, int, str, int]] = []
        self.ttls: list[tuple[int, int]] = []             # (deadline_ms, seq)
        self.sessions = SessionLeases(self._live_runs)    # session -> the jobs it holds leased
        self.idem = KeyWindow()  # the idempotency window (``_idempotency``)
        self.crons: dict[str, dict[str, Any]] = {}
        # Flows (``_flows``): parents waiting here, children living here, unacknowledged reports.
        self.flow_parents: dict[int, Any] = {}
        self.flow_children: dict[int, list[Any]] = {}
        self.flow_outbox: dict[int, tuple[Any, ...]] = {}
        # Per-call options of the command being applied (set by ``apply`` only, never state):
        # ``_replies`` False skips building reply contents nobody reads (a follower's); the
        # command's events go to ``_events``, or nowhere when it is None.
        self._replies = True
        self._events: list[Event] | None = None
        #: A pull's reply keeps runs of a segment's jobs as one record each, written by the frame
        #: encoder (:mod:`._pulled`); off, every job is a map at once (tests and tools).
        self.pulled_runs = False

    def _keep(self, data: Any) -> Any:
        """Data as a job object holds it: bytes (or a Raw's) go to the payload space and the job
        keeps a :class:`~._payloads.Stored` reference; other values (tools, tests) stay."""
        if type(data) is Raw:
            data = data.packed
        if type(data) is not bytes:
            return data
        space = self.segments.space
        start = space.append(data)
        return Stored(space, start, start + len(data))

    @staticmethod
    def _let_go(data: Any) -> None:
        """A job object's data is no longer held (the job removed, or its data replaced)."""
        if type(data) is Stored:
            data.space.release(data.start, data.end)

    def _replace_data(self, job: Job, data: Any) -> None:
        """``job``'s data becomes ``data`` (a Raw, or a value tools and tests give)."""
        self._let_go(job.data)
        job.data = self._keep(data)

    def _queue(self, name: str, create: bool = False) -> Queue:
        q = self.queues.get(name)
        if q is None:
            if not create:
                raise CommandError(ErrorCode.NOT_FOUND, f"queue {name!r} does not exist")
            q = self.queues[name] = Queue(name, custom_of=self._custom_of)
        return q

    def _job(self, job_id: str) -> Job:
        """The job named ``job_id``: Shoal's own ``"{partition}-{seq}"``, or a custom id."""
        seq = shoal_seq(job_id, self.partition)
        if seq is None:
            seq = self._custom_seq(job_id)
        job = self._get(seq) if seq is not None and seq > 0 else None
        if job is None:
            raise CommandError(ErrorCode.NOT_FOUND, f"job {job_id} does not exist")
        return job

    def _custom_seq(self, custom_id: str) -> int | None:
        """The seq of the job whose custom id (its id on the wire) is ``custom_id``, in the first
        queue of this partition that has one."""
        for q in self.queues.values():
            seq = q.custom_ids.get(custom_id)
            if seq is not None and self._holds(seq):
                return seq
        return None

    def _holds(self, seq: int) -> bool:
        """True while job ``seq`` is held, as a job object or a segment's slot."""
        return seq in self.jobs or (bool(self.segments) and self.segments.find(seq) is not None)

    def _custom_of(self, seq: int) -> str | None:
        """Job ``seq``'s custom id (a job object's, or a slot's), if it has one and is held."""
        job = self.jobs.get(seq)
        if job is not None:
            return job.custom_id
        seg = self.segments.find(seq) if self.segments.custom_ids else None
        return seg.custom_id(seq - seg.first) if seg is not None else None

    def wire_id_of_seq(self, seq: int) -> str:
        """Job ``seq``'s id on the wire: its custom id if it has one, else Shoal's own id (also
        for a job no longer held)."""
        custom = self._custom_of(seq)
        return custom if custom is not None else f"{self.partition}-{seq}"

    def _peek(self, seq: int) -> Job | None:
        """Job ``seq`` for a read: the object, or a detached copy of its slot (not stored)."""
        job = self.jobs.get(seq)
        if job is None and self.segments:
            seg = self.segments.find(seq)
            if seg is not None:
                job = slot_job(seg, seq - seg.first, self.partition)
        return job

    def disk_class(self, cmd: Command) -> bool:
        """True when every queue ``cmd`` writes to exists and is of the disk class (``durable:
        false``): the queue it names, or the queues of the jobs it names by Shoal's own id (an
        ACK, ACKB, FAIL, ...). False at the first one of the fsync class, or one not known
        without applying the command (a job named by a custom id or gone; a command naming
        neither, as the timer tick). Reads only."""
        name = command_queue(cmd)
        if name is not None:
            return self._lazy_queue(name)
        if type(cmd) is AckRun:
            first, last = cmd.first, cmd.first + cmd.count - 1
            seg = self.segments.find(first) if self.segments else None
            if seg is not None and last < seg.end:
                return self._lazy_queue(seg.queue)  # one pull's run: one segment
            seqs: Iterable[int | None] = range(first, last + 1)
        elif type(cmd) is dict and ("ids" in cmd or "id" in cmd):
            ids = cmd["ids"] if "ids" in cmd else [cmd["id"]]
            if type(ids) is not list:
                return False
            partition = self.partition
            seqs = (shoal_seq(i, partition) if type(i) is str else None for i in ids)
        else:
            return False
        jobs, segments = self.jobs, self.segments
        checked = None
        for seq in seqs:
            if seq is None or seq <= 0:
                return False
            job = jobs.get(seq)
            if job is not None:
                name = job.queue
            else:
                seg = segments.find(seq) if segments else None
                if seg is None:
                    return False
                name = seg.queue
            if name != checked:
                if not self._lazy_queue(name):
                    return False
                checked = name
        return True

    def _lazy_queue(self, name: str) -> bool:
        q = self.queues.get(name)
        return q is not None and not q.opts.get("durable", True)

    def _hold_segment(self, q: Queue, seg: Segment) -> None:
        """Take ``seg``'s waiting and delayed jobs into ``q``: one ready-heap entry at its lowest
        priority-0 waiting slot, one per priority of its other waiting slots without a group (the
        cursors), one per grouped waiting slot (in its group's heap) and per delayed slot, the
        counts and group sizes."""
        self.segments.add(seg)
        states = seg.states
        plain = seg.left
        if plain:
            heapq.heappush(q.ready, seg.low)  # priority 0: the key is the seq
            q.prio_counts[0] = q.prio_counts.get(0, 0) + plain
        prio_counts = q.prio_counts
        groups = seg.groups
        waiting = plain
        i = states.find(SLOT_READY)
        while i >= 0:
            prio = seg.priority(i)
            group = groups[i] if groups is not None else None
            seq = seg.first + i
            if group is None:
                self._ready_slot(q, seg, prio, seq)
            else:
                self._group_moved(q, group, NEW, WAITING)  # type: ignore[attr-defined]  # ReadyIndex
                self._enqueue_group(q, group, ready_key(prio, seq))  # type: ignore[attr-defined]
            prio_counts[prio] = prio_counts.get(prio, 0) + 1
            waiting += 1
            i = states.find(SLOT_READY, i + 1)
        q.counts[WAITING] += waiting
        i = states.find(SLOT_DELAYED)
        while i >= 0:
            self.delayed.push(due_key(seg.run_at(i), seg.first + i))
            q.counts[DELAYED] += 1
            if groups is not None and groups[i] is not None:
                self._group_moved(q, groups[i], NEW, DELAYED)  # type: ignore[attr-defined]  # ReadyIndex
            i = states.find(SLOT_DELAYED, i + 1)

    def _live_runs(self, session: str, first: int, k: int, lease_no: int) -> list[Run]:
        """The parts of the run of slots ``first .. first+k-1`` leased to ``session`` under lease
        numbers from ``lease_no`` whose slots it still holds
        (:class:`~._session_leases.SessionLeases`: a slot made a job object left the run)."""
        seg = self.segments.covering(first)
        if seg is None or first + k > seg.first + len(seg.states):  # a run lies in one segment
            return []
        i = first - seg.first
        end = i + k
        states = seg.states
        active = states.count(SLOT_ACTIVE, i, end)
        if not active:
            return []
        sessions, lease_nos = seg.sessions, seg.lease_nos
        if active == k and sessions[i:end].count(session) == k \
                and lease_nos[i:end] == list(range(lease_no, lease_no + k)):
            return [(first, k, lease_no)]
        live: list[Run] = []
        j = states.find(SLOT_ACTIVE, i, end)  # active slots only: a long run may have few left
        while j >= 0:
            n = lease_no + j - i
            if sessions[j] == session and lease_nos[j] == n:
                add_lease(live, seg.first + j, n)
            j = states.find(SLOT_ACTIVE, j + 1, end)
        return live

    def _leases_of(self, session: str, seqs: list[int]) -> tuple[dict[int, int], list[Run]]:
        """Jobs ``seqs`` that ``session`` holds, as its job objects' lease numbers and runs of
        consecutive slots and lease numbers (a restored session's,
        :meth:`~._session_leases.SessionLeases.load`)."""
        jobs: dict[int, int] = {}
        runs: list[Run] = []
        token_prefix = f"{self.partition}."
        for seq in seqs:
            job = self.jobs.get(seq)
            if job is not None:
                if job.state == ACTIVE and job.session == session and job.token is not None \
                        and job.token.startswith(token_prefix):
                    jobs[seq] = int(job.token[len(token_prefix):])
                continue
            seg = self.segments.find(seq)
            if seg is None or seg.states[seq - seg.first] != SLOT_ACTIVE:
                continue
            add_lease(runs, seq, seg.lease_nos[seq - seg.first])
        return jobs, runs

    def job_count(self) -> int:
        """Jobs held in every state, materialized or not."""
        return len(self.jobs) + self.segments.jobs

    def _get(self, seq: int) -> Job | None:
        """Job ``seq`` as an object (materialized from its segment if need be); None if gone."""
        job = self.jobs.get(seq)
        if job is None and self.segments:
            job = self._materialize(seq)
        return job

    def _materialize(self, seq: int, waiting_only: bool = False) -> Job | None:
        """Turn a segment's job ``seq`` into a ``Job`` in the same state; None if no segment holds it.

        Keeps the invariant that every waiting job has exactly one ready-heap entry: for a
        ``SLOT_WAITING`` slot the segment's entry (at its lowest such seq) passes to the job
        when that is the one taken, and the segment gets a new entry at its next seq; any
        other such slot's job gets its own. A ``SLOT_READY`` or ``SLOT_DELAYED`` slot's own
        heap entry passes to the job. A leased job keeps no heap entry of its own: its run's
        lease entry covers it (``_expire_run``). ``waiting_only``: leave a job that is not
        waiting where it is.
        """
        segments = self.segments
        seg = segments.find(seq)
        if seg is None:
            return None
        i = seq - seg.first
        code = seg.states[i]
        if waiting_only and code != SLOT_WAITING and code != SLOT_READY:
            return None
        job = slot_job(seg, i, self.partition)
        if code == SLOT_ACTIVE and job.session is not None:
            self.sessions.slot_to_job(job.session, seq, seg.lease_nos[i])
        was_low = seq == seg.low
        segments.take(seg, seq)
        self.jobs[seq] = job
        self._jobs_unordered = True
        if code == SLOT_WAITING:
            ready = self.queues[seg.queue].ready
            if not was_low:
                heapq.heappush(ready, seq)  # priority 0: the key is the seq
            elif seg.left:
                heapq.heappush(ready, seg.low)
        elif code == SLOT_READY and job.group is None:
            ready = self.queues[seg.queue].ready
            cursors = seg.cursors
            prio = job.priority
            if cursors is not None and cursors.get(prio) == seq:
                nxt = self._next_cursor(seg, prio, i)  # the cursor's entry passes to the job
                if nxt is not None:
                    heapq.heappush(ready, nxt)
            else:
                heapq.heappush(ready, ready_key(prio, seq))  # the cursor had not reached it yet
        return job

    @staticmethod
    def _ready_slot(q: Queue, seg: Segment, prio: int, seq: int) -> None:
        """Slot ``seq`` of ``seg``, of priority ``prio`` and without a group, waits now
        (``SLOT_READY``): the segment's cursor of ``prio`` covers it, moved back to it (a new
        ready-heap entry) when it is past it or there is none."""
        cursors = seg.cursors
        if cursors is None:
            seg.cursors = {prio: seq}
        else:
            at = cursors.get(prio)
            if at is not None and at <= seq:
                return  # the cursor comes to it
            cursors[prio] = seq  # an entry further on is stale now
        heapq.heappush(q.ready, ready_key(prio, seq))

    @staticmethod
    def _next_cursor(seg: Segment, prio: int, i: int) -> int | None:
        """Move ``seg``'s cursor of ``prio`` on from slot ``i``, which it named: the ready key of the
        next ``SLOT_READY`` slot of that priority without a group, which it names now; None when
        there is none (the segment has no such cursor then)."""
        states, groups, prios = seg.states, seg.groups, seg.priorities
        j = i
        if prio:
            assert prios is not None, "a slot of a priority in a segment that keeps none"
            index = prios.index  # in C: over the slots of other priorities
            while True:
                try:
                    j = index(prio, j + 1)
                except ValueError:
                    j = -1
                    break
                if states[j] == SLOT_READY and (groups is None or groups[j] is None):
                    break
        else:
            find = states.find
            j = find(SLOT_READY, j + 1)
            while j >= 0 and ((prios is not None and prios[j]) or (groups is not None and groups[j] is not None)):
                j = find(SLOT_READY, j + 1)
        cursors = seg.cursors
        assert cursors is not None and cursors.get(prio) == seg.first + i, "a cursor moved from a slot it did not name"
        if j < 0:
            del cursors[prio]
            if not cursors:
                seg.cursors = None
            return None
        seq = seg.first + j
        cursors[prio] = seq
        return ready_key(prio, seq)

    def _cursor_entry(self, ready: list[int], key: int, seg: Segment, i: int) -> bool:
        """``key``, the top of ``ready``, names slot ``i`` of ``seg``, not the segment's ``low``:
        True when it is the segment's live cursor and the slot waits (the caller takes it);
        else the entry is done with here (a stale one popped, a cursor whose slot no longer
        waits moved on) and False."""
        cursors = seg.cursors
        seq = seg.first + i
        prio = -(key >> SEQ_BITS)
        if cursors is None or cursors.get(prio) != seq:
            heapq.heappop(ready)  # stale: the cursor moved back past it, or away
            return False
        if seg.states[i] == SLOT_READY:
            return True
        self._top_cursor_moves_on(ready, seg, prio, i)
        return False

    def _top_cursor_moves_on(self, ready: list[int], seg: Segment, prio: int, i: int) -> None:
        """The top of ``ready`` is ``seg``'s cursor of ``prio``, at slot ``i``, which is taken or no
        longer waits: the entry names the cursor's next slot now, or goes if there is none."""
        nxt = self._next_cursor(seg, prio, i)
        if nxt is None:
            heapq.heappop(ready)
        else:
            heapq.heapreplace(ready, nxt)

    def _slot_due(self, seq: int, run_at: int) -> None:
        """A delayed-heap entry ``(run_at, seq)`` came due: when it is a segment's delayed slot's,
        the job waits now, in place (what ``_set_state`` and ``_enqueue_ready`` do to an object)."""
        seg = self.segments.find(seq)
        if seg is None:
            return
        i = seq - seg.first
        if seg.states[i] != SLOT_DELAYED or seg.run_at(i) != run_at:
            return  # stale: the slot was let go or moved
        check_transition(DELAYED, WAITING)
        q = self.queues[seg.queue]
        seg.states[i] = SLOT_READY
        prio = seg.priority(i)
        counts = q.counts
        counts[DELAYED] -= 1
        counts[WAITING] += 1
        q.prio_counts[prio] = q.prio_counts.get(prio, 0) + 1
        if self._events is not None:
            self._events.append((q.name, seq, WAITING, DELAYED))
        group = seg.groups[i] if seg.groups is not None else None
        if group is None:
            self._ready_slot(q, seg, prio, seq)
        else:
            self._enqueue_group(q, group, ready_key(prio, seq))  # type: ignore[attr-defined]  # ReadyIndex

    def _delayed_job(self, seq: int, detached: bool = False) -> Job | None:
        """Job ``seq`` when it is held as an object or in a segment's delayed slot (materialized,
        or with ``detached`` a copy that is not stored: for reads); None otherwise."""
        job = self.jobs.get(seq)
        if job is not None or not self.segments:
            return job
        seg = self.segments.find(seq)
        if seg is None or seg.states[seq - seg.first] != SLOT_DELAYED:
            return None
        return slot_job(seg, seq - seg.first, self.partition) if detached else self._materialize(seq)

    def _materialize_active(self, q: Queue) -> None:
        """Materialize every leased segment job of ``q`` (before a scan of ``self.jobs``)."""
        for seg in self.segments:
            if seg.queue == q.name:
                states = seg.states
                i = states.find(SLOT_ACTIVE)
                while i >= 0:
                    self._materialize(seg.first + i)
                    i = states.find(SLOT_ACTIVE, i + 1)

    def _all_jobs(self) -> list[Job]:
        """Every job in seq order; a segment's jobs as detached copies (not stored)."""
        if self._jobs_unordered:
            self.jobs = dict(sorted(self.jobs.items()))
            self._jobs_unordered = False
        jobs = list(self.jobs.values())
        if self.segments:
            p = self.partition
            for seg in self.segments:
                jobs.extend(slot_job(seg, i, p) for i, code in enumerate(seg.states) if code)  # not SLOT_GONE
            jobs.sort(key=seq_of)  # two sorted runs: timsort merges them in linear time
        return jobs

    def _all_tuples_iter(self, refs: bool = False) -> Iterator[tuple[Any, ...]]:
        """Every job's :meth:`~._model.Job.to_tuple` in seq order, as a snapshot writes them: a
        segment's made from its slots without a job object each (:func:`~._model.slot_tuples`),
        :data:`TUPLE_RUN_MAX` at a time. With ``refs``, data held in the payload space is
        written as where it is (:func:`~._payloads.data_ref`), not read."""
        if self._jobs_unordered:
            self.jobs = dict(sorted(self.jobs.items()))
            self._jobs_unordered = False
        space = self.segments.space
        own = (_ref_tuple(job, space) if refs else job.to_tuple() for job in list(self.jobs.values()))
        if not self.segments:
            return own
        held, p = slot_runs(None), self.partition

        def slots() -> Iterator[tuple[Any, ...]]:
            for seg in self.segments:
                for run in held.finditer(seg.states):  # type: ignore[union-attr]
                    i, j = run.span()
                    for k in range(i, j, TUPLE_RUN_MAX):
                        yield from slot_tuples(seg, k, min(j, k + TUPLE_RUN_MAX), p, refs)

        return heapq.merge(own, slots(), key=itemgetter(0))

    def _queue_jobs(self, queue: str, state: str | None, after: int = 0) -> Iterator[Job]:
        """Jobs of ``queue`` (in ``state``, if given) numbered above ``after``, in seq order; a
        segment's as detached copies made only when reached: listing the first page of a large
        batch-pushed queue does not build a job per slot the way :meth:`_all_jobs` does, and a
        page after a given seq starts at its segment (job objects are still all looked at)."""
        return self._queue_jobs_in(queue, (state,) if state is not None else None, after)

    def _queue_jobs_in(self, queue: str, states: tuple[str, ...] | None, after: int = 0) -> Iterator[Job]:
        """:meth:`_queue_jobs` of jobs in any of ``states`` (every state: None). A segment's
        slots in other states are passed over by a scan of its state bytes in C, never made
        jobs: cleaning a queue's few completed jobs costs them, not its waiting millions."""
        if self._jobs_unordered:
            self.jobs = dict(sorted(self.jobs.items()))
            self._jobs_unordered = False
        own = (j for j in self.jobs.values()
               if j.queue == queue and (states is None or j.state in states) and j.seq > after)
        runs = slot_runs(states)
        if runs is None or not self.segments:
            return own
        p = self.partition

        def slots() -> Iterator[Job]:
            for seg in self.segments.since(after + 1):
                if seg.queue != queue:
                    continue
                for run in runs.finditer(seg.states, max(0, after + 1 - seg.first)):
                    for i in range(*run.span()):
                        yield slot_job(seg, i, p)

        return heapq.merge(own, slots(), key=seq_of)

    def _id(self, job: Job) -> str:
        """Shoal's own id of ``job`` (what flows, idempotency entries and routing use)."""
        return f"{self.partition}-{job.seq}"

    def event_job(self, job_id: str) -> tuple[str, bytes | None, str | None] | None:
        """What an event of the job ``job_id`` tells (its wire id, result and error), if the job is
        still here and held as an object (a segment's plain jobs have no result or error)."""
        seq = shoal_seq(job_id, self.partition)
        if seq is None:
            seq = self._custom_seq(job_id)
        return self.event_job_at(seq) if seq is not None and seq > 0 else None

    def event_job_at(self, seq: int) -> tuple[str, bytes | None, str | None] | None:
        """:meth:`event_job` of the job numbered ``seq`` (None when it is a segment's plain job,
        named by Shoal's own id, without result or error, or gone)."""
        job = self.jobs.get(seq)
        if job is None:
            return None
        return self._wire_id(job), job.result, job.error

    def event_jobs_plain(self, first: int, count: int) -> bool:
        """True when no job numbered ``first`` .. ``first + count - 1`` is held as an object
        (:meth:`event_job_at` is None for each)."""
        return self.jobs.keys().isdisjoint(range(first, first + count))

    def _wire_id(self, job: Job) -> str:
        """``job``'s id on the wire: its custom id when it has one (bunqueue's ``jobId``, a
        flow's own ids), else Shoal's own id."""
        custom = job.custom_id
        return custom if custom is not None else f"{self.partition}-{job.seq}"

    def _count(self, q: Queue, cmd: str) -> None:
        q.calls[cmd] = q.calls.get(cmd, 0) + 1

    def _check_token(self, job: Job, cmd: dict[str, Any]) -> None:
        token = cmd.get("token")
        if token is not None and (job.state != ACTIVE or str(token) != job.token):
            if job.state == CANCELLED and str(token) == job.token:
                raise CommandError(ErrorCode.CANCELLED, f"job {self._id(job)} was cancelled ({job.error})")
            raise CommandError(ErrorCode.LEASE_MISMATCH,
                               f"job {self._id(job)}: token does not match the current lease")

    def _flow_child_done(self, job: Job, failed: bool, error: str | None = None) -> None:
        raise NotImplementedError  # ``_flows.FlowOps``

    def _flow_forget(self, job: Job) -> None:
        raise NotImplementedError  # ``_flows.FlowOps``

    def flow_wire(self, job: Job, out: dict[str, Any]) -> None:
        raise NotImplementedError  # ``_flows.FlowOps``

    def _require_active(self, job: Job, cmd: dict[str, Any]) -> None:
        self._check_token(job, cmd)
        if job.state == CANCELLED:
            raise CommandError(ErrorCode.CANCELLED, f"job {self._id(job)} was cancelled ({job.error})")
        if job.state != ACTIVE:
            raise CommandError(ErrorCode.INVALID_STATE, f"job {self._id(job)} is {job.state}, not active")

    def pulled_job(self, job: Job) -> dict[str, Any]:
        """A job just leased, as a pull's reply shows it: what a worker reads of the record
        (``_lease_run`` builds the same for a segment's jobs). Leased now: ``startedAt`` is now."""
        out: dict[str, Any] = {
            "id": self._wire_id(job), "queue": job.queue, "name": job.name or DEFAULT_NAME,
            "data": job.data if type(job.data) is Stored else Raw(job.data), "priority": job.priority, "state": ACTIVE, "attempts": job.attempts - 1,
            "maxAttempts": job.max_attempts, "backoff": job.backoff_ms, "createdAt": float(job.created_ms),
            "runAt": float(job.run_at_ms), "startedAt": float(self.now_ms), "progress": job.progress,
            "leaseDeadline": float(job.lease_deadline_ms),
        }
        if job.group is not None:
            out["group"] = out["groupId"] = job.group
        if job.custom_id is not None:
            out["customId"] = job.custom_id
        if job.tag is not None:
            out["tag"] = job.tag
        if job.error is not None:
            out["error"] = job.error
        if job.meta is not None:
            if job.meta.get("removeOnComplete"):
                out["removeOnComplete"] = True
            if "stacktrace" in job.meta:
                out["stacktrace"] = job.meta["stacktrace"]
            if "traceContext" in job.meta:
                out["traceContext"] = job.meta["traceContext"]
        if self.flow_children or self.flow_parents:
            self.flow_wire(job, out)
        return out

    def wire_job(self, job: Job) -> dict[str, Any]:
        """The job as the protocol shows it (data spliced raw): bunqueue's job record.

        Times are float milliseconds (bunqueue's numbers); ``attempts`` counts the attempts
        made before the current one (failures so far), as bunqueue's ``attemptsMade``.
        """
        state = job.state
        meta = job.meta
        started = None
        if state == ACTIVE:
            started = float(job.lease_deadline_ms - (job.ttr_ms or 0))
        if meta is not None and "startedAt" in meta:
            started = float(meta["startedAt"])
        attempts = job.attempts
        if state == ACTIVE or state == COMPLETED or state == CANCELLED:
            attempts = max(0, attempts - 1)  # the current (or last, successful) attempt is not a failure
        finished = float(job.finished_ms) if job.finished_ms else None
        error = job.error
        out: dict[str, Any] = {
            "id": self._wire_id(job), "queue": job.queue, "name": job.name or DEFAULT_NAME,
            "data": job.data if type(job.data) is Stored else Raw(job.data), "priority": job.priority,
            "state": wire_state(job), "attempts": attempts,
            "maxAttempts": job.max_attempts, "backoff": job.backoff_ms,
            "backoffConfig": {"type": meta["backoffType"], "delay": job.backoff_ms}
            if meta is not None and "backoffType" in meta else None,
            "createdAt": float(job.created_ms), "runAt": float(job.run_at_ms), "startedAt": started,
            "completedAt": finished if state == COMPLETED else None, "progress": job.progress,
            "progressMessage": job.message, "stacktrace": meta.get("stacktrace") if meta is not None else None,
            "stallCount": 0, "customId": job.custom_id, "uniqueKey": None, "groupId": job.group,
            "tags": [job.tag] if job.tag is not None else [], "ttl": None, "timeout": job.ttr_ms or None,
            "removeOnComplete": bool(meta and meta.get("removeOnComplete")),
            "removeOnFail": bool(meta and meta.get("removeOnFail")), "lifo": False,
            "dependsOn": [], "childrenIds": [], "childrenCompleted": 0, "parentId": None, "timeline": [],
            "returnvalue": Raw(job.result) if job.result is not None else None,
            "failedReason": error if state == FAILED or (error is not None and state in (WAITING, DELAYED))
            else None,
        }
        # Shoal's own names beside bunqueue's
        if job.group is not None:
            out["group"] = job.group
        if job.tag is not None:
            out["tag"] = job.tag
        if job.result is not None:
            out["result"] = out["returnvalue"]
        if error is not None:
            out["error"] = error
        if state == ACTIVE:
            out["leaseDeadline"] = float(job.lease_deadline_ms)
        if finished is not None:
            out["finishedAt"] = finished
        if meta is not None and "traceContext" in meta:
            out["traceContext"] = meta["traceContext"]
        if self.flow_children or self.flow_parents:
            self.flow_wire(job, out)
        return out


def _ref_tuple(job: Job, space: PayloadSpace) -> tuple[Any, ...]:
    """``job.to_tuple()`` with data held in ``space`` as where it is (no read)."""
    t = job.to_tuple(stored=True)
    data = t[2]
    if type(data) is Stored:
        if data.space is space:
            return (t[0], t[1], data_ref(data.start, data.end), *t[3:])
        return (t[0], t[1], data.packed, *t[3:])
    return t
