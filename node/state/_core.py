"""The partition engine: every queue model of Shoal on one deterministic state machine.

Theory of operation
-------------------
A :class:`PartitionEngine` holds every queue of one partition. It is driven
only by :meth:`PartitionEngine.apply` with a validated command dict and the
leader's clock stamp ``now_ms``; it never reads a clock, draws a random number
or does I/O, so replicas that apply the same commands hold identical state.

Jobs are ``__slots__`` objects (raw MessagePack data bytes, no dict per job)
indexed by their partition sequence number. A job's state is one of
``waiting`` (tarantool ``r``), ``delayed`` (``~``), ``active`` (``t``, leased),
``completed`` (``-``) and ``failed`` (``!``, buried / dead-lettered); every
move between them goes through :mod:`._transitions`' table.

Per-operation costs stay O(log n) with heaps and lazy deletion: a queue keeps a
ready heap of ``(priority, seq)`` for jobs without a group and, for groups
(utube), one seq-heap per group plus a heap of eligible group heads, so a pull
from a queue with 100,000 groups is a heap pop. The partition keeps heaps of
delayed run times, lease deadlines and TTL deadlines; stale heap entries are
skipped when they surface. Expiry happens lazily when a pull applies and in
the leader's periodic ``_Tick`` command.

Bulk ingest: a ``PUSHB`` whose items carry only ``data`` is stored as one
:class:`~._segments.Segment` (a list of data bytes) with one ready-heap entry
pointing at its lowest untaken job; a segment's job becomes a ``Job`` object
("materialized") when a pull reaches it or a command names it. Materializing
changes the representation, never the state: snapshots, digests and listings
see every job in seq order either way.

Every command is atomic: it checks everything that can fail before it
changes anything, so a refused command (``CommandError``) leaves no trace.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from itertools import islice
from datetime import datetime, timezone
from collections.abc import Iterator
from typing import Any

import msgpack
from croniter import croniter

from shoal.cluster.codec import Raw
from shoal.cluster.commands import READ_COMMANDS
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.jobid import format_job_id, parse_job_id

from ._decimal import decimal_run
from ._segments import (SLOT_ACTIVE, SLOT_COMPLETED, SLOT_GONE, SLOT_WAITING, Segment, SegmentStore, ack_run_of,
                        split_plain)
from ._transitions import ACTIVE, COMPLETED, DELAYED, FAILED, STATES, WAITING, check_transition

__all__ = ["PartitionEngine", "QUEUE_PRESETS", "DEFAULTS"]

#: Defaults for a queue created by its first PUSH ("standard") and for presets.
DEFAULTS: dict[str, Any] = {
    "ttr": 30_000, "ttl": 0, "capacity": 0, "maxDeliveries": 10, "attempts": 1, "backoff": 1_000,
    "historyMax": 10_000, "historyAgeMs": 24 * 3600 * 1000,
    "durable": True,  # True: the fsync durability class; False: the disk class (seed 004)
}
#: tarantool's queue types as presets: which job options each honours.
QUEUE_PRESETS: dict[str, dict[str, bool]] = {
    "standard":   {"priority": True,  "delay": True,  "ttl": True,  "ttr": True,  "group": True,  "capacity": True},
    "fifo":       {"priority": False, "delay": False, "ttl": False, "ttr": False, "group": False, "capacity": True},
    "fifottl":    {"priority": True,  "delay": True,  "ttl": True,  "ttr": True,  "group": False, "capacity": True},
    "limfifottl": {"priority": True,  "delay": True,  "ttl": True,  "ttr": True,  "group": False, "capacity": True},
    "utube":      {"priority": False, "delay": False, "ttl": False, "ttr": False, "group": True,  "capacity": True},
    "utubettl":   {"priority": True,  "delay": True,  "ttl": True,  "ttr": True,  "group": True,  "capacity": True},
    "log":        {"priority": False, "delay": False, "ttl": False, "ttr": False, "group": False, "capacity": True},
}
IDEMPOTENCY_WINDOW_MS = 120_000
JOB_LOGS_MAX = 100
EVENTS_MAX = 10_000
PAGE_DEFAULT = 100
PAGE_LIMIT_MAX = 10_000  # ListQueues/CronList page (cluster.limits.page_limit_max)
_SNAPSHOT_VERSION = 1


# Upper bounds of a PULLB reply's bytes beside job data and strings: the reply's own
# fields, and each job's fixed wire fields, id and lease token.
REPLY_BYTES_OVERHEAD = 1024
JOB_WIRE_BYTES_OVERHEAD = 512


def wire_bytes_max(job: "Job") -> int:
    """An upper bound of ``job``'s size in a reply (a str char packs to at most 4 bytes)."""
    size = len(job.data) + JOB_WIRE_BYTES_OVERHEAD + 4 * len(job.queue)
    for text in (job.group, job.custom_id, job.tag, job.error):
        if text is not None:
            size += 4 * len(text)
    if job.result is not None:
        size += len(job.result)
    return size


class Job:
    """One job; data stays the raw MessagePack bytes the client sent."""

    __slots__ = ("seq", "queue", "data", "priority", "state", "attempts", "max_attempts", "backoff_ms",
                 "created_ms", "run_at_ms", "ttl_deadline_ms", "ttr_ms", "token", "session",
                 "lease_deadline_ms", "group", "custom_id", "tag", "result", "error", "progress",
                 "message", "logs", "finished_ms")

    def __init__(self, seq: int, queue: str, data: bytes, priority: int, created_ms: int,
                 max_attempts: int = 1, backoff_ms: int = 0, ttr_ms: int = 0) -> None:
        self.seq = seq
        self.queue = queue
        self.data = data
        self.priority = priority
        self.state = WAITING
        self.attempts = 0
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.created_ms = created_ms
        self.run_at_ms = created_ms
        self.ttl_deadline_ms = 0
        self.ttr_ms = ttr_ms
        self.token: str | None = None
        self.session: str | None = None
        self.lease_deadline_ms = 0
        self.group: str | None = None
        self.custom_id: str | None = None
        self.tag: str | None = None
        self.result: bytes | None = None
        self.error: str | None = None
        self.progress = 0
        self.message: str | None = None
        self.logs: list[tuple[int, str]] | None = None
        self.finished_ms = 0

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, s) for s in Job.__slots__)

    @classmethod
    def from_tuple(cls, t: tuple[Any, ...]) -> "Job":
        job = cls.__new__(cls)
        for name, value in zip(Job.__slots__, t):
            setattr(job, name, value)
        return job


class Queue:
    """Settings, indexes and counters of one queue."""

    __slots__ = ("name", "type", "opts", "paused", "ready", "group_fifo", "group_active", "group_heads",
                 "counts", "prio_counts", "history", "dlq", "custom_ids", "calls", "totals", "log",
                 "log_next")

    def __init__(self, name: str, qtype: str = "standard", opts: dict[str, Any] | None = None) -> None:
        self.name = name
        self.type = qtype
        self.opts = {**DEFAULTS, **(opts or {})}
        self.paused = False
        self.ready: list[tuple[int, int]] = []              # (priority, seq), jobs without a group
        self.group_fifo: dict[str, list[int]] = {}          # group -> seq heap of waiting jobs
        self.group_active: dict[str, int] = {}              # group -> seq of its active job
        self.group_heads: list[tuple[int, int, str]] = []   # (priority, seq, group) of eligible heads
        self.counts = {s: 0 for s in STATES}
        self.prio_counts: dict[int, int] = {}               # waiting jobs per priority
        self.history: deque[int] = deque()                  # completed seqs, oldest first
        self.dlq: dict[int, None] = {}                      # failed seqs in order
        self.custom_ids: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.totals = {"enqueued": 0, "completed": 0, "failed": 0, "reclaimed": 0, "expired": 0, "retried": 0}
        self.log: dict[int, tuple[bytes, str | None, int]] = {}  # log queues: lseq -> (data, tag, createdAt)
        self.log_next = 1

    @property
    def preset(self) -> dict[str, bool]:
        return QUEUE_PRESETS[self.type]

    def settings(self) -> tuple[Any, ...]:
        return (self.name, self.type, dict(sorted(self.opts.items())), self.paused, dict(self.custom_ids),
                dict(self.calls), dict(self.totals), dict(self.log), self.log_next, list(self.history),
                list(self.dlq))


class PartitionEngine:
    """All queues of one partition; see the module docstring."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.seq = 0
        self.lease_seq = 0
        self.now_ms = 0
        self.jobs: dict[int, Job] = {}
        self.segments = SegmentStore()  # plain PUSHB jobs not materialized yet
        self._jobs_unordered = False    # a materialized job was inserted behind later seqs
        self.queues: dict[str, Queue] = {}
        self.delayed: list[tuple[int, int]] = []          # (run_at_ms, seq)
        # (deadline_ms, seq, token, 0) per lease, or (deadline_ms, first seq, its token, last seq) per
        # run of segment jobs leased by one pull (see _expire_run)
        self.leases: list[tuple[int, int, str, int]] = []
        self.ttls: list[tuple[int, int]] = []             # (deadline_ms, seq)
        self.sessions: dict[str, dict[int, None]] = {}    # session -> seqs leased
        self.idempotency: dict[tuple[str, str], tuple[str, int]] = {}
        self.idempotency_order: deque[tuple[int, tuple[str, str]]] = deque()
        self.crons: dict[str, dict[str, Any]] = {}
        # (queue, seq, state, prev) tuples; dicts are built only when the node drains them.
        self.events: deque[tuple[str, int, str, Any]] = deque(maxlen=EVENTS_MAX)
        # Followers set this False: nobody reads their replies, so pulls skip building the
        # wire form of each job. Only reply contents depend on it, never the state.
        self.replies = True
        # The node sets this False where nobody listens to job events: the hot paths (batch
        # push, pull and ack, history trimming) then skip their event tuples. Not state either.
        self.record_events = True
        self._handlers = {name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}

    # ------------------------------------------------------------------------------------------
    # public interface

    def apply(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """Apply one validated command; return the reply fields or raise ``CommandError``.

        The partition clock only moves when a write succeeds: reads are served by the
        leader alone and a refused command must leave no trace, or replicas would differ.
        """
        name = cmd["cmd"]
        handler = self._handlers.get(name.lstrip("_") if name[0] == "_" else name)
        if handler is None:
            raise CommandError(ErrorCode.UNKNOWN_COMMAND, f"the engine does not handle {name!r}")
        before = self.now_ms
        if now_ms > before:
            self.now_ms = now_ms
        try:
            reply = handler(cmd)
        except BaseException:
            self.now_ms = before
            raise
        if name in READ_COMMANDS:
            self.now_ms = before
        return reply

    def has_ready(self, queue: str) -> bool:
        """True when a pull on ``queue`` would get a job now."""
        q = self.queues.get(queue)
        if q is None or q.paused or q.type == "log":
            return False
        if self.delayed and self.delayed[0][0] <= self.now_ms:
            return True  # a due delayed job may belong to it; the pull promotes it
        return self._peek_ready(q) is not None

    def next_due_ms(self) -> int | None:
        """Earliest time a delayed job, lease, TTL or cron becomes due."""
        due = [h[0][0] for h in (self.delayed, self.leases, self.ttls) if h]
        due += [c["nextRunAt"] for c in self.crons.values()]
        if self.idempotency_order:
            due.append(self.idempotency_order[0][0])
        return min(due) if due else None

    def drain_events(self) -> list[dict[str, Any]]:
        """Job events since the last drain (bounded; not part of the replicated state)."""
        p = self.partition
        out = []
        for queue, seq, state, prev in self.events:
            if state == "progress":
                out.append({"event": "progress", "queue": queue, "id": f"{p}-{seq}", "progress": prev})
            else:
                out.append({"event": "job", "queue": queue, "id": f"{p}-{seq}", "state": state, "prev": prev})
        self.events.clear()
        return out

    def queue_names(self) -> list[str]:
        return sorted(self.queues)

    # ------------------------------------------------------------------------------------------
    # snapshots

    def snapshot(self) -> bytes:
        """Compact, canonical bytes of the whole replicated state (job data stays raw).

        MessagePack, not pickle: pickle encodes object *identity* (memo references), which
        differs between replicas holding equal state, so its bytes could not be a digest.
        """
        state = (
            _SNAPSHOT_VERSION, self.partition, self.seq, self.lease_seq, self.now_ms,
            [j.to_tuple() for j in self._all_jobs()],
            [q.settings() for q in self.queues.values()],
            {s: list(seqs) for s, seqs in self.sessions.items()},
            [(t, list(k)) for t, k in self.idempotency_order],
            [(*k, *v) for k, v in self.idempotency.items()],
            {n: dict(c) for n, c in self.crons.items()},
        )
        return msgpack.packb(state, use_bin_type=True)

    @classmethod
    def restore(cls, data: bytes) -> "PartitionEngine":
        (version, partition, seq, lease_seq, now_ms, jobs, queues, sessions, idem_order, idem,
         crons) = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if version != _SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {version}")
        eng = cls(partition)
        eng.seq, eng.lease_seq, eng.now_ms = seq, lease_seq, now_ms
        for name, qtype, opts, paused, custom_ids, calls, totals, log, log_next, history, dlq in queues:
            q = eng.queues[name] = Queue(name, qtype, opts)
            q.paused, q.custom_ids, q.calls, q.totals, q.log_next = paused, custom_ids, calls, totals, log_next
            q.log = {lseq: (rec[0], rec[1], rec[2]) for lseq, rec in log.items()}
            # Completion and dead-letter order matter (trimming, Kick), so they are kept as they were.
            q.history = deque(history)
            q.dlq = dict.fromkeys(dlq)
        for t in jobs:
            job = Job.from_tuple(t)
            if job.logs is not None:
                job.logs = [(stamp, line) for stamp, line in job.logs]
            eng.jobs[job.seq] = job
            eng._index(job)
        eng.sessions = {s: dict.fromkeys(seqs) for s, seqs in sessions.items()}
        eng.idempotency_order = deque((t, (k[0], k[1])) for t, k in idem_order)
        eng.idempotency = {(q, k): (job_id, expires) for q, k, job_id, expires in idem}
        eng.crons = crons
        return eng

    def _index(self, job: Job) -> None:
        """Rebuild a restored job's place in the indexes."""
        q = self.queues[job.queue]
        q.counts[job.state] += 1
        if job.state == WAITING:
            q.prio_counts[job.priority] = q.prio_counts.get(job.priority, 0) + 1
            self._enqueue_ready(q, job)
        elif job.state == DELAYED:
            heapq.heappush(self.delayed, (job.run_at_ms, job.seq))
        elif job.state == ACTIVE:
            heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, job.token or "", 0))
            if job.group is not None:
                q.group_active[job.group] = job.seq
        if job.ttl_deadline_ms and job.state in (WAITING, DELAYED):
            heapq.heappush(self.ttls, (job.ttl_deadline_ms, job.seq))

    def digest(self) -> str:
        """SHA-256 of the snapshot: equal on replicas that applied the same commands."""
        return hashlib.sha256(self.snapshot()).hexdigest()

    # ------------------------------------------------------------------------------------------
    # helpers

    def _queue(self, name: str, create: bool = False) -> Queue:
        q = self.queues.get(name)
        if q is None:
            if not create:
                raise CommandError(ErrorCode.NOT_FOUND, f"queue {name!r} does not exist")
            q = self.queues[name] = Queue(name)
        return q

    def _job(self, job_id: str) -> Job:
        partition, seq = parse_job_id(job_id)
        if partition != self.partition:
            raise CommandError(ErrorCode.NOT_FOUND, f"job {job_id} does not exist")
        job = self._get(seq)
        if job is None:
            raise CommandError(ErrorCode.NOT_FOUND, f"job {job_id} does not exist")
        return job

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

        Keeps the invariant that every waiting job has exactly one ready-heap entry: the
        segment's entry (at its lowest waiting seq) passes to the job when that is the one
        taken, and the segment gets a new entry at its next seq; any other job gets its own.
        A leased job keeps no heap entry of its own: its run's lease entry covers it
        (``_expire_run``). ``waiting_only``: leave a leased or completed job where it is.
        """
        segments = self.segments
        seg = segments.find(seq)
        if seg is None:
            return None
        i = seq - seg.first
        waiting = seg.states[i] == SLOT_WAITING
        if not waiting and waiting_only:
            return None
        job = _slot_job(seg, i, self.partition)
        was_low = seq == seg.low
        segments.take(seg, seq)
        self.jobs[seq] = job
        self._jobs_unordered = True
        if waiting:
            ready = self.queues[seg.queue].ready
            if not was_low:
                heapq.heappush(ready, (0, seq))
            elif seg.left:
                heapq.heappush(ready, (0, seg.low))
        return job

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
                jobs.extend(_slot_job(seg, i, p) for i, d in enumerate(seg.datas) if d is not None)
            jobs.sort(key=_seq_of)  # two sorted runs: timsort merges them in linear time
        return jobs

    def _queue_jobs(self, queue: str, state: str | None) -> Iterator[Job]:
        """Jobs of ``queue`` (in ``state``, if given) in seq order, a segment's as detached copies
        made only when reached: listing the first page of a large batch-pushed queue does not
        build a job per slot the way :meth:`_all_jobs` does."""
        if self._jobs_unordered:
            self.jobs = dict(sorted(self.jobs.items()))
            self._jobs_unordered = False
        own = (j for j in self.jobs.values() if j.queue == queue and (state is None or j.state == state))
        codes = _SLOT_CODES.get(state) if state is not None else (SLOT_WAITING, SLOT_ACTIVE, SLOT_COMPLETED)
        if not codes or not self.segments:
            return own
        p = self.partition

        def slots() -> Iterator[Job]:
            for seg in self.segments:
                if seg.queue != queue:
                    continue
                states, datas = seg.states, seg.datas
                for i in range(len(datas)):
                    if states[i] in codes and datas[i] is not None:
                        yield _slot_job(seg, i, p)

        return heapq.merge(own, slots(), key=_seq_of)

    def _id(self, job: Job) -> str:
        return f"{self.partition}-{job.seq}"

    def _count(self, q: Queue, cmd: str) -> None:
        q.calls[cmd] = q.calls.get(cmd, 0) + 1

    def _set_state(self, q: Queue, job: Job, state: str) -> None:
        prev = job.state
        check_transition(prev, state)
        q.counts[prev] -= 1
        q.counts[state] += 1
        if prev == WAITING:
            self._drop_prio(q, job.priority)
        if state == WAITING:
            q.prio_counts[job.priority] = q.prio_counts.get(job.priority, 0) + 1
        job.state = state
        if prev == WAITING and job.group is not None:
            self._refresh_group_head(q, job.group)
        self.events.append((q.name, job.seq, state, prev))

    def _enqueue_ready(self, q: Queue, job: Job) -> None:
        if job.group is None:
            heapq.heappush(q.ready, (job.priority, job.seq))
            return
        fifo = q.group_fifo.setdefault(job.group, [])
        heapq.heappush(fifo, job.seq)
        if job.group not in q.group_active and fifo[0] == job.seq:
            heapq.heappush(q.group_heads, (self.jobs[fifo[0]].priority, fifo[0], job.group))

    def _refresh_group_head(self, q: Queue, group: str) -> None:
        """A waiting group job left the queue some other way than a pull: expose the next head."""
        if group not in q.group_active:
            head = self._group_head(q, group)
            if head is not None:
                heapq.heappush(q.group_heads, (self.jobs[head].priority, head, group))

    def _group_head(self, q: Queue, group: str) -> int | None:
        fifo = q.group_fifo.get(group)
        while fifo:
            job = self.jobs.get(fifo[0])
            if job is not None and job.state == WAITING and job.group == group:
                return fifo[0]
            heapq.heappop(fifo)
        q.group_fifo.pop(group, None)
        return None

    def _peek_ready(self, q: Queue) -> tuple[int, int, str | None] | None:
        """The next pullable (priority, seq, group) of ``q``, cleaning stale heap tops."""
        ready = q.ready
        while ready:
            prio, seq = ready[0]
            job = self.jobs.get(seq)
            if job is None and self.segments:
                job = self._materialize(seq, waiting_only=True)
            if job is not None and job.state == WAITING and job.group is None and job.queue == q.name:
                break
            heapq.heappop(ready)
        heads = q.group_heads
        while heads:
            prio_g, seq_g, group = heads[0]
            if group not in q.group_active and self._group_head(q, group) == seq_g:
                break
            heapq.heappop(heads)
            if group not in q.group_active:
                head = self._group_head(q, group)
                if head is not None:
                    heapq.heappush(heads, (self.jobs[head].priority, head, group))
        best: tuple[int, int, str | None] | None = None
        if ready:
            best = (ready[0][0], ready[0][1], None)
        if heads and (best is None or heads[0][:2] < best[:2]):
            best = heads[0]
        return best

    def _pop_ready(self, q: Queue) -> Job | None:
        top = self._peek_ready(q)
        if top is None:
            return None
        if top[2] is None:
            heapq.heappop(q.ready)
        else:
            heapq.heappop(q.group_heads)
            heapq.heappop(q.group_fifo[top[2]])
        return self.jobs[top[1]]

    def _release_group(self, q: Queue, job: Job) -> None:
        if job.group is not None and q.group_active.get(job.group) == job.seq:
            del q.group_active[job.group]
            head = self._group_head(q, job.group)
            if head is not None:
                heapq.heappush(q.group_heads, (self.jobs[head].priority, head, job.group))

    def _end_lease(self, q: Queue, job: Job) -> None:
        if job.session is not None:
            leased = self.sessions.get(job.session)
            if leased is not None:
                leased.pop(job.seq, None)
                if not leased:
                    del self.sessions[job.session]
        job.token = None
        job.session = None
        job.lease_deadline_ms = 0
        self._release_group(q, job)

    def _to_waiting(self, q: Queue, job: Job, delay_ms: int = 0) -> None:
        if job.state == ACTIVE:
            self._end_lease(q, job)
        if delay_ms > 0:
            job.run_at_ms = self.now_ms + delay_ms
            self._set_state(q, job, DELAYED)
            heapq.heappush(self.delayed, (job.run_at_ms, job.seq))
        else:
            job.run_at_ms = self.now_ms
            self._set_state(q, job, WAITING)
            self._enqueue_ready(q, job)

    def _finish(self, q: Queue, job: Job, state: str) -> None:
        if job.state == ACTIVE:
            self._end_lease(q, job)
        job.finished_ms = self.now_ms
        self._set_state(q, job, state)
        if state == COMPLETED:
            q.history.append(job.seq)
            q.totals["completed"] += 1
            if len(q.history) > q.opts["historyMax"]:
                self._trim_history(q)  # the age limit is enforced by _Tick
        else:
            q.dlq[job.seq] = None
            q.totals["failed"] += 1

    def _complete(self, q: Queue, job: Job, trim: bool = True) -> None:
        """``_finish(q, job, COMPLETED)`` for an active job (the ack path), without the general checks.

        ``trim`` False: the caller trims the history once its batch is done.
        """
        self._end_lease(q, job)
        job.finished_ms = self.now_ms
        job.state = COMPLETED  # active -> completed, a move of the diagram (_transitions)
        counts = q.counts
        counts[ACTIVE] -= 1
        counts[COMPLETED] += 1
        if self.replies and self.record_events:  # events feed the leader's subscribers (not state)
            self.events.append((q.name, job.seq, COMPLETED, ACTIVE))
        q.history.append(job.seq)
        q.totals["completed"] += 1
        if trim and len(q.history) > q.opts["historyMax"]:
            self._trim_history(q)

    def _remove(self, q: Queue, job: Job) -> None:
        """Delete a job for good (cancel, drain, clean, TTL, purge)."""
        if job.state == ACTIVE:
            self._end_lease(q, job)
        if job.state == WAITING:
            self._drop_prio(q, job.priority)
        q.counts[job.state] -= 1
        q.dlq.pop(job.seq, None)
        if job.custom_id is not None and q.custom_ids.get(job.custom_id) == job.seq:
            del q.custom_ids[job.custom_id]
        del self.jobs[job.seq]
        if job.state == WAITING and job.group is not None:
            self._refresh_group_head(q, job.group)
        self.events.append((q.name, job.seq, "removed", job.state))

    def _trim_history(self, q: Queue) -> None:
        limit = q.opts["historyMax"]
        oldest_ms = self.now_ms - q.opts["historyAgeMs"]
        history, all_jobs, segments = q.history, self.jobs, self.segments
        seg: Segment | None = None  # the segment the previous completed job was held in
        while history:
            seq = history[0]
            job = all_jobs.get(seq)
            if job is None:
                # A completed segment job: let its slot go without making it an object first.
                if seg is None or not 0 <= seq - seg.first < len(seg.datas):
                    seg = segments.find(seq)
                i = seq - seg.first if seg is not None else 0
                if seg is None or seg.states[i] != SLOT_COMPLETED:
                    history.popleft()
                    continue
                over = len(history) - limit
                if over > 1 and self._trim_run(q, seg, seq, over):
                    continue
                if over > 0 or seg.finished[i] < oldest_ms:
                    self._let_go_completed(q, seg, i, 1)
                    continue
                break
            if job.state != COMPLETED:
                history.popleft()
                continue
            if len(history) > limit or job.finished_ms < oldest_ms:
                history.popleft()
                self._remove(q, job)
                continue
            break

    def _trim_run(self, q: Queue, seg: Segment, first: int, n: int) -> bool:
        """Let the ``n`` oldest history entries go at once if they are ``seg``'s completed slots
        ``first .. first+n-1`` (the usual case: acked in runs); False, changing nothing, if not."""
        i = first - seg.first
        end = i + n
        history = q.history
        if end > len(seg.datas) or seg.states.count(SLOT_COMPLETED, i, end) != n or history[n - 1] != first + n - 1:
            return False
        if list(islice(history, n)) != list(range(first, first + n)):
            return False
        self._let_go_completed(q, seg, i, n)
        return True

    def _let_go_completed(self, q: Queue, seg: Segment, i: int, n: int) -> None:
        """Remove completed slots ``i .. i+n-1`` of ``seg``, the ``n`` oldest entries of the history."""
        end = i + n
        seg.datas[i:end] = [None] * n
        seg.states[i:end] = bytes([SLOT_GONE]) * n
        self.segments.gone(seg, n)
        q.counts[COMPLETED] -= n
        popleft = q.history.popleft
        for _ in range(n):
            popleft()
        if self.record_events:
            name, first = q.name, seg.first
            self.events.extend([(name, first + j, "removed", COMPLETED) for j in range(i, end)])

    def _check_token(self, job: Job, cmd: dict[str, Any]) -> None:
        token = cmd.get("token")
        if token is not None and (job.state != ACTIVE or str(token) != job.token):
            raise CommandError(ErrorCode.LEASE_MISMATCH,
                               f"job {self._id(job)}: token does not match the current lease")

    def _require_active(self, job: Job, cmd: dict[str, Any]) -> None:
        self._check_token(job, cmd)
        if job.state != ACTIVE:
            raise CommandError(ErrorCode.INVALID_STATE, f"job {self._id(job)} is {job.state}, not active")

    def wire_job(self, job: Job) -> dict[str, Any]:
        """The job as the protocol shows it (data spliced raw)."""
        out: dict[str, Any] = {
            "id": self._id(job), "queue": job.queue, "data": Raw(job.data), "priority": job.priority,
            "state": job.state, "attempts": job.attempts, "maxAttempts": job.max_attempts,
            "createdAt": job.created_ms, "runAt": job.run_at_ms, "progress": job.progress,
        }
        if job.group is not None:
            out["group"] = job.group
        if job.custom_id is not None:
            out["customId"] = job.custom_id
        if job.tag is not None:
            out["tag"] = job.tag
        if job.result is not None:
            out["result"] = Raw(job.result)
        if job.error is not None:
            out["error"] = job.error
        if job.state == ACTIVE:
            out["leaseDeadline"] = job.lease_deadline_ms
        if job.finished_ms:
            out["finishedAt"] = job.finished_ms
        return out

    # ------------------------------------------------------------------------------------------
    # expiry (lazy on pull, and in _Tick)

    def _expire(self) -> None:
        now = self.now_ms
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            run_at, seq = heapq.heappop(delayed)
            job = self.jobs.get(seq)
            if job is not None and job.state == DELAYED and job.run_at_ms == run_at:
                q = self.queues[job.queue]
                self._set_state(q, job, WAITING)
                self._enqueue_ready(q, job)
        leases = self.leases
        while leases and leases[0][0] <= now:
            deadline, seq, token, last = heapq.heappop(leases)
            if last:
                self._expire_run(deadline, seq, token, last)
                continue
            job = self.jobs.get(seq)
            if job is None or job.state != ACTIVE or job.token != token or job.lease_deadline_ms != deadline:
                continue
            self._reclaim(job)
        ttls = self.ttls
        while ttls and ttls[0][0] <= now:
            deadline, seq = heapq.heappop(ttls)
            job = self.jobs.get(seq)
            if job is not None and job.ttl_deadline_ms == deadline and job.state in (WAITING, DELAYED):
                q = self.queues[job.queue]
                q.totals["expired"] += 1
                self._remove(q, job)

    def _expire_run(self, deadline: int, first: int, token: str, last: int) -> None:
        """Reclaim the jobs of one run lease (seqs ``first .. last``) still under it.

        A run is contiguous, so handling it in seq order here is the order in which its
        jobs' own lease entries would surface. A job materialized since keeps the run's
        token and deadline unless something (a touch, a new lease) changed its lease.
        """
        prefix = f"{self.partition}."
        base = int(token[len(prefix):]) - first  # lease number of seq s: base + s
        segments = self.segments
        for s in range(first, last + 1):
            job = self.jobs.get(s)
            if job is None:
                seg = segments.find(s)
                if seg is None:
                    continue
                i = s - seg.first
                if seg.states[i] != SLOT_ACTIVE or seg.deadlines[i] != deadline or seg.lease_nos[i] != base + s:
                    continue
                job = self._materialize(s)
                assert job is not None
            elif job.state != ACTIVE or job.lease_deadline_ms != deadline or job.token != prefix + str(base + s):
                continue
            self._reclaim(job)

    def _reclaim(self, job: Job) -> None:
        """An active job's lease lapsed: back to waiting, or dead-lettered after maxDeliveries."""
        q = self.queues[job.queue]
        q.totals["reclaimed"] += 1
        if job.attempts >= q.opts["maxDeliveries"]:
            job.error = f"lease expired after {job.attempts} deliveries"
            self._finish(q, job, FAILED)
        else:
            self._to_waiting(q, job)

    def _fire_crons(self) -> None:
        for name in [n for n, c in self.crons.items() if c["nextRunAt"] <= self.now_ms]:
            cron = self.crons[name]
            q = self._queue(cron["queue"], create=True)
            job = self._new_job(q, cron["data"], {"priority": cron["priority"]})
            cron["count"] += 1
            cron["lastRunAt"] = self.now_ms
            cron["lastJobId"] = self._id(job)
            if cron["limit"] and cron["count"] >= cron["limit"]:
                del self.crons[name]
            else:
                cron["nextRunAt"] = _next_run(cron, self.now_ms)

    def _purge_idempotency(self) -> None:
        order = self.idempotency_order
        while order and order[0][0] <= self.now_ms:
            _, key = order.popleft()
            entry = self.idempotency.get(key)
            if entry is not None and entry[1] <= self.now_ms:
                del self.idempotency[key]

    # ------------------------------------------------------------------------------------------
    # push

    def _check_log_capacity(self, q: Queue, adding: int) -> None:
        """A log queue's capacity counts its records (``discard: reject``: nothing is dropped)."""
        capacity = q.opts["capacity"]
        if capacity and len(q.log) + adding > capacity:
            raise CommandError(ErrorCode.QUEUE_FULL, f"queue {q.name!r} is at its capacity of {capacity}")

    def _check_push(self, q: Queue, options: dict[str, Any], extra: int = 0) -> None:
        if q.type == "log":
            self._check_log_capacity(q, 1 + extra)
            return
        preset = q.preset
        if not preset["group"] and options.get("group") is not None:
            raise CommandError(ErrorCode.INVALID, f"group: queue {q.name!r} ({q.type}) has no groups")
        capacity = q.opts["capacity"]
        if capacity and preset["capacity"]:
            live = q.counts[WAITING] + q.counts[DELAYED] + q.counts[ACTIVE]
            if live + extra >= capacity:
                raise CommandError(ErrorCode.QUEUE_FULL, f"queue {q.name!r} is at its capacity of {capacity}")

    def _duplicate(self, q: Queue, options: dict[str, Any]) -> str | None:
        key = options.get("idempotencyKey")
        if key is not None:
            entry = self.idempotency.get((q.name, key))
            if entry is not None and entry[1] > self.now_ms:
                return entry[0]
        custom = options.get("customId")
        if custom is not None:
            seq = q.custom_ids.get(custom)
            if seq is not None and seq in self.jobs:
                return format_job_id(self.partition, seq)
        return None

    def _new_job(self, q: Queue, data: Any, options: dict[str, Any]) -> Job:
        # The hottest function of a push (it runs on every replica): locals, one .get each.
        self.seq = seq = self.seq + 1
        get = options.get
        preset = q.preset
        opts = q.opts
        now = self.now_ms
        name = q.name
        job = Job(seq, name, data.packed if type(data) is Raw else data,
                  (get("priority") or 0) if preset["priority"] else 0, now)
        job.max_attempts = get("attempts") or opts["attempts"]
        backoff = get("backoff")
        job.backoff_ms = opts["backoff"] if backoff is None else backoff
        job.ttr_ms = (get("ttr") if preset["ttr"] else None) or opts["ttr"]
        if len(options) > 1:  # anything beside ``data``
            job.group = get("group")
            job.custom_id = custom = get("customId")
            job.tag = get("tag")
            if custom is not None:
                q.custom_ids[custom] = seq
            key = get("idempotencyKey")
            if key is not None:
                expires = now + IDEMPOTENCY_WINDOW_MS
                self.idempotency[(name, key)] = (format_job_id(self.partition, seq), expires)
                self.idempotency_order.append((expires, (name, key)))
            delay = (get("delay") or 0) if preset["delay"] else 0
        else:
            delay = 0
        self.jobs[seq] = job
        q.totals["enqueued"] += 1
        if preset["ttl"]:
            ttl = get("ttl") or opts["ttl"]
            if ttl:
                job.ttl_deadline_ms = now + delay + ttl
                heapq.heappush(self.ttls, (job.ttl_deadline_ms, seq))
        if delay:
            self.events.append((name, seq, DELAYED, None))
            job.state = DELAYED
            q.counts[DELAYED] += 1
            job.run_at_ms = now + delay
            heapq.heappush(self.delayed, (job.run_at_ms, seq))
        else:
            self.events.append((name, seq, WAITING, None))
            q.counts[WAITING] += 1
            prio = job.priority
            q.prio_counts[prio] = q.prio_counts.get(prio, 0) + 1
            if job.group is None:
                heapq.heappush(q.ready, (prio, seq))
            else:
                self._enqueue_ready(q, job)
        return job

    @staticmethod
    def _drop_prio(q: Queue, priority: int) -> None:
        n = q.prio_counts.get(priority, 0) - 1
        if n:
            q.prio_counts[priority] = n
        else:
            q.prio_counts.pop(priority, None)

    def _push_segment(self, q: Queue, datas: list[Any], keys: list[str | None] | None,
                      per_item: bool = False) -> tuple[list[Any], list[Any] | None]:
        """Plain jobs (data and maybe a key, no TTL) as one segment: O(1) index work per batch.

        Same outcome as pushing the items one by one: a key seen within the window, or
        earlier in this batch, answers the original id and adds nothing. Capacity is checked
        for the batch as a whole (PUSHB: all or nothing) or, with ``per_item``, item by item
        (coalesced single PUSHes: the ones past the capacity are refused).

        Returns, per item, its job id (a duplicate's is the original's; None when refused),
        and the plan (None: every item new; else per item None = new, a str = duplicate of an
        earlier job, an int = duplicate of that earlier item, ``_FULL`` = refused). A follower
        (``replies`` off) gets no ids.
        """
        now, name = self.now_ms, q.name
        prefix = f"{self.partition}-"
        room = None
        if per_item:
            capacity = q.opts["capacity"]
            if capacity and q.preset["capacity"]:
                counts = q.counts
                room = capacity - (counts[WAITING] + counts[DELAYED] + counts[ACTIVE])
        plan: list[Any] | None = None
        fresh = datas
        if keys is not None or room is not None:
            plan = [None] * len(datas)
            idem = self.idempotency
            first_in_batch: dict[str, int] = {}
            for i in range(len(datas)):
                key = keys[i] if keys is not None else None
                if key is not None:
                    entry = idem.get((name, key))
                    if entry is not None and entry[1] > now:
                        plan[i] = entry[0]
                        continue
                    earlier = first_in_batch.get(key)
                    if earlier is not None:
                        plan[i] = earlier
                        continue
                if room is not None:
                    if room <= 0:
                        plan[i] = _FULL
                        continue
                    room -= 1
                if key is not None:
                    first_in_batch[key] = i
            fresh = [d for d, step in zip(datas, plan) if step is None]
        n = len(fresh)
        if n and not per_item:
            self._check_push(q, {}, extra=n - 1)  # before any change: a refused batch leaves no trace
        first = self.seq + 1
        self.seq += n
        ids: list[Any] = []
        if plan is not None:
            seq = first
            expires = now + IDEMPOTENCY_WINDOW_MS
            order = self.idempotency_order
            for i, step in enumerate(plan):
                if step is None:
                    job_id = prefix + str(seq)
                    seq += 1
                    key = keys[i] if keys is not None else None
                    if key is not None:
                        self.idempotency[(name, key)] = (job_id, expires)
                        order.append((expires, (name, key)))
                    ids.append(job_id)
                elif step is _FULL:
                    ids.append(None)
                else:
                    ids.append(ids[step] if type(step) is int else step)
        if n:
            opts = q.opts
            # A copy: the segment marks taken slots in its list, and a command may be applied
            # twice (the same dict on two engines in tests).
            self.segments.add(Segment(first, list(fresh), name, now, opts["attempts"], opts["backoff"], opts["ttr"]))
            heapq.heappush(q.ready, (0, first))
            q.counts[WAITING] += n
            q.prio_counts[0] = q.prio_counts.get(0, 0) + n
            q.totals["enqueued"] += n
            if per_item:
                q.calls["PUSH"] = q.calls.get("PUSH", 0) + n  # as n accepted PUSH commands count
        if not self.replies:
            return [], plan  # a follower's reply (and event feed) is never read
        seqs = range(first, first + n)
        if n and self.record_events:
            self.events.extend([(name, seq, WAITING, None) for seq in seqs])
        return (ids if plan is not None else [prefix + str(seq) for seq in seqs]), plan

    def _op_PushMany(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Consecutive plain PUSHes to one queue that group commit put in one command.

        Each keeps its own outcome, exactly as if applied one by one: ``results`` holds per
        push the PUSH reply or the ``CommandError`` it would have raised.
        """
        q = self._queue(cmd["queue"], create=True)
        datas, keys = cmd["_datas"], cmd.get("_keys")
        results: list[Any] = []
        if q.type == "log" or (q.preset["ttl"] and q.opts["ttl"]):
            for i, data in enumerate(datas):
                single = {"cmd": "PUSH", "queue": q.name, "data": data}
                if keys is not None and keys[i] is not None:
                    single["idempotencyKey"] = keys[i]
                try:
                    results.append(self._op_PUSH(single))
                except CommandError as exc:
                    results.append(exc)
            return {"results": results}
        ids, plan = self._push_segment(q, datas, keys, per_item=True)
        if not self.replies:
            return {"results": results}
        for i, job_id in enumerate(ids):
            step = plan[i] if plan is not None else None
            if step is None:
                results.append({"id": job_id})
            elif step is _FULL:
                results.append(CommandError(ErrorCode.QUEUE_FULL, f"queue {q.name!r} is at its capacity of "
                                                                  f"{q.opts['capacity']}"))
            else:
                results.append({"id": job_id, "duplicate": True})
        return {"results": results}

    def _append_log(self, q: Queue, data: Any, tag: str | None) -> dict[str, Any]:
        lseq = q.log_next
        q.log_next += 1
        q.log[lseq] = (data.packed if type(data) is Raw else data, tag, self.now_ms)
        q.totals["enqueued"] += 1
        return {"id": f"{self.partition}-L{lseq}", "seq": lseq}

    def _op_PUSH(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        if q.type == "log":
            self._check_log_capacity(q, 1)
            self._count(q, "PUSH")
            return self._append_log(q, cmd["data"], cmd.get("tag"))
        dup = self._duplicate(q, cmd)
        if dup is not None:
            return {"id": dup, "duplicate": True}
        self._check_push(q, cmd)
        self._count(q, "PUSH")
        return {"id": self._id(self._new_job(q, cmd["data"], cmd))}

    def _op_PUSHB(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        reply = self._push_batch(q, cmd)
        self._count(q, "PUSHB")  # after the checks: a refused batch leaves no trace
        return reply

    def _push_batch(self, q: Queue, cmd: dict[str, Any]) -> dict[str, Any]:
        # ``_datas``/``_keys``: the node's replicated form of a batch whose items carry only
        # data and maybe an idempotency key (what bulk ingest sends).
        datas, keys = cmd.get("_datas"), cmd.get("_keys")
        if datas is None:
            plain = split_plain(cmd["jobs"])
            if plain is not None:
                datas, keys = plain
        if datas is not None:
            if q.type != "log" and not (q.preset["ttl"] and q.opts["ttl"]):
                return {"ids": self._push_segment(q, datas, keys)[0]}
            items = [{"data": d} if k is None else {"data": d, "idempotencyKey": k}
                     for d, k in zip(datas, keys or [None] * len(datas))]
        else:
            items = cmd["jobs"]
        if q.type == "log":
            self._check_log_capacity(q, len(items))
            return {"ids": [self._append_log(q, item["data"], item.get("tag"))["id"] for item in items]}
        # Only items with a key or customId can be duplicates; only the first fresh item
        # needs the capacity check (state does not change while checking), later ones the
        # group check. Same outcome as checking every item, in a fraction of the calls.
        fresh = 0
        for item in items:
            if ("idempotencyKey" in item or "customId" in item) and self._duplicate(q, item) is not None:
                continue
            if fresh == 0 or item.get("group") is not None:
                self._check_push(q, item)
            fresh += 1
        if fresh > 1:
            self._check_push(q, {}, extra=fresh - 1)
        ids = []
        new_job = self._new_job
        prefix = f"{self.partition}-"
        for item in items:
            if "idempotencyKey" in item or "customId" in item:
                dup = self._duplicate(q, item)
                if dup is not None:
                    ids.append(dup)
                    continue
            ids.append(prefix + str(new_job(q, item["data"], item).seq))
        return {"ids": ids}

    # ------------------------------------------------------------------------------------------
    # pull, ack, fail and the lease commands

    def _lease(self, q: Queue, job: Job, ttr_ms: int | None, session: str | None) -> str:
        self.lease_seq += 1
        token = f"{self.partition}.{self.lease_seq}"
        job.attempts += 1
        job.token = token
        job.session = session
        job.lease_deadline_ms = self.now_ms + (ttr_ms or job.ttr_ms or q.opts["ttr"])
        if job.group is not None:
            q.group_active[job.group] = job.seq  # before the state change: the group is now busy
        self._set_state(q, job, ACTIVE)
        heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, token, 0))
        if session is not None:
            self.sessions.setdefault(session, {})[job.seq] = None
        return token

    def _pull(self, cmd: dict[str, Any], count: int) -> tuple[list[dict[str, Any]], list[str]]:
        q = self.queues.get(cmd["queue"])
        if q is not None and q.type == "log":
            raise CommandError(ErrorCode.INVALID, f"queue {q.name!r} is a log queue: read it with Read")
        self._expire()
        if q is None:
            return [], []
        self._count(q, cmd["cmd"])
        if q.paused:
            return [], []
        if not q.group_heads and not q.group_fifo:
            return self._pull_ungrouped(q, cmd, count)
        jobs, tokens = [], []
        # ``_bytesMax`` (set by the node from its frame limit): stop before the reply would
        # outgrow a frame; the first job is always taken (its data fits a frame by the limits).
        budget = cmd.get("_bytesMax") or 0
        used = REPLY_BYTES_OVERHEAD
        for _ in range(count):
            if budget:
                top = self._peek_ready(q)
                if top is None:
                    break
                used += wire_bytes_max(self.jobs[top[1]])
                if jobs and used > budget:
                    break
            job = self._pop_ready(q)
            if job is None:
                break
            tokens.append(self._lease(q, job, cmd.get("ttr"), cmd.get("_session")))
            jobs.append(self.wire_job(job) if self.replies else None)
        return jobs, tokens

    def _pull_ungrouped(self, q: Queue, cmd: dict[str, Any], count: int) -> tuple[list[Any], list[str]]:
        """``_pull`` for a queue with no group jobs waiting: the ready heap alone orders it.

        The same steps as ``_pop_ready`` + ``_lease`` per job, with one heap look per job
        and the counters moved once per batch (the hot loop of every consumer). When the
        heap's top is a segment's lowest waiting job, the segment's consecutive waiting jobs
        that come before every other heap entry are leased as one run (``_lease_run``).
        """
        jobs: list[Any] = []
        tokens: list[str] = []
        budget = cmd.get("_bytesMax") or 0
        used = REPLY_BYTES_OVERHEAD
        ttr_ms = cmd.get("ttr")
        session = cmd.get("_session")
        sessions = self.sessions
        leased = sessions.setdefault(session, {}) if session is not None else None
        ready, all_jobs, segments, leases, events = q.ready, self.jobs, self.segments, self.leases, self.events
        heappop, heappush = heapq.heappop, heapq.heappush
        name, now, default_ttr, prio_counts = q.name, self.now_ms, q.opts["ttr"], q.prio_counts
        replies = self.replies
        wire_job = self.wire_job
        job_bytes_fixed = JOB_WIRE_BYTES_OVERHEAD + 4 * len(name)  # wire_bytes_max of a job with no texts
        prefix = f"{self.partition}."
        taken = 0
        full = False  # the reply's byte budget is spent
        while taken < count and ready and not full:
            seq = ready[0][1]
            job = all_jobs.get(seq)
            if job is None and segments:
                seg = segments.find(seq)
                if seg is not None and seg.low == seq and seg.queue == name:
                    k, full, used = self._lease_run(q, seg, count - taken, budget, used, taken > 0, ttr_ms,
                                                    session, jobs, tokens)
                    if k or full:
                        taken += k
                        continue
                job = self._materialize(seq, waiting_only=True)
            if job is None or job.state != WAITING or job.group is not None or job.queue != name:
                heappop(ready)  # stale entry (lazy deletion)
                continue
            if budget:
                if job.custom_id is None and job.tag is None and job.error is None and job.result is None:
                    used += len(job.data) + job_bytes_fixed  # = wire_bytes_max(job), without the call
                else:
                    used += wire_bytes_max(job)
                if taken and used > budget:
                    break
            heappop(ready)
            self.lease_seq = lease_seq = self.lease_seq + 1
            token = prefix + str(lease_seq)
            job.attempts += 1
            job.token = token
            job.session = session
            job.lease_deadline_ms = deadline = now + (ttr_ms or job.ttr_ms or default_ttr)
            job.state = ACTIVE  # waiting -> active, a move of the diagram (_transitions)
            prio = job.priority
            left = prio_counts[prio] - 1
            if left:
                prio_counts[prio] = left
            else:
                del prio_counts[prio]
            q.counts[WAITING] -= 1
            q.counts[ACTIVE] += 1
            heappush(leases, (deadline, seq, token, 0))
            if leased is not None:
                leased[seq] = None
            taken += 1
            if replies:  # the leader: its reply, and events for its subscribers
                if self.record_events:
                    events.append((name, seq, ACTIVE, WAITING))
                tokens.append(token)
                jobs.append(wire_job(job))
        if leased is not None and not leased:
            del sessions[session]  # type: ignore[arg-type]
        return jobs, tokens

    def _lease_run(self, q: Queue, seg: Segment, want: int, budget: int, used: int, any_taken: bool,
                   ttr_ms: int | None, session: str | None, jobs: list[Any],
                   tokens: list[str]) -> tuple[int, bool, int]:
        """Lease up to ``want`` consecutive waiting jobs of ``seg`` from its lowest, as one run.

        The run stops before the next job another heap entry ranks first (the heap's top is
        the segment's entry, so only its two children can), before a slot that is not
        waiting, and where the reply would outgrow ``budget``. The run's jobs stay in the
        segment (state, lease number, deadline and session per slot) and share one lease
        heap entry. Returns how many were leased, whether the budget stopped the run, and
        the reply bytes ``used`` so far (counted only with a budget).
        """
        ready = q.ready
        first = seg.low
        i = first - seg.first
        limit = min(len(seg.datas), i + want)
        for child in ready[1:3]:
            if child[0] == 0 and child[1] - seg.first < limit:
                limit = child[1] - seg.first
        end = seg.run_end(i, limit)
        full = False
        if budget:
            fixed = JOB_WIRE_BYTES_OVERHEAD + 4 * len(q.name)
            datas = seg.datas
            for j in range(i, end):
                size = len(datas[j]) + fixed  # type: ignore[arg-type]
                if used + size > budget and (any_taken or j > i):
                    end, full = j, True
                    break
                used += size
        k = end - i
        if not k:
            return 0, full, used
        base = self.lease_seq
        self.lease_seq = base + k
        deadline = self.now_ms + (ttr_ms or seg.ttr_ms or q.opts["ttr"])
        seg.lease_run(i, k, base, deadline, session)
        if seg.left:
            heapq.heapreplace(ready, (0, seg.low))
        else:
            heapq.heappop(ready)
        prefix = f"{self.partition}."
        last = first + k - 1
        heapq.heappush(self.leases, (deadline, first, prefix + str(base + 1), last))
        prio_counts = q.prio_counts
        left = prio_counts[0] - k
        if left:
            prio_counts[0] = left
        else:
            del prio_counts[0]
        q.counts[WAITING] -= k
        q.counts[ACTIVE] += k
        seqs = range(first, last + 1)
        if session is not None:
            self.sessions[session].update(dict.fromkeys(seqs))
        if self.replies:
            name = q.name
            if self.record_events:
                self.events.extend([(name, s, ACTIVE, WAITING) for s in seqs])
            tokens.extend(decimal_run(prefix, base + 1, k))
            # The wire form of each job (wire_job's keys, in its order): copies of one template,
            # then the two fields that differ (a third cheaper than a literal per job).
            created = seg.created_ms
            template = {"id": None, "queue": name, "data": None, "priority": 0, "state": ACTIVE, "attempts": 1,
                        "maxAttempts": seg.max_attempts, "createdAt": created, "runAt": created, "progress": 0,
                        "leaseDeadline": deadline}
            copy = template.copy
            wire = [copy() for _ in seqs]
            id_prefix = f"{self.partition}-"
            for job, job_id, d in zip(wire, decimal_run(id_prefix, first, k), seg.datas[i:end]):
                job["id"] = job_id
                job["data"] = Raw(d)
            jobs.extend(wire)
        return k, full, used

    def _op_PULL(self, cmd: dict[str, Any]) -> dict[str, Any]:
        jobs, tokens = self._pull(cmd, 1)
        return {"job": jobs[0], "token": tokens[0]} if jobs else {"job": None}

    def _op_PULLB(self, cmd: dict[str, Any]) -> dict[str, Any]:
        jobs, tokens = self._pull(cmd, cmd["count"])
        return {"jobs": jobs, "tokens": tokens}

    def _op_ACK(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        result = cmd.get("result")
        if result is not None:
            job.result = result.packed if type(result) is Raw else _pack(result)
        self._count(q, "ACK")
        self._complete(q, job)
        return {}

    def _op_ACKB(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if "_ackRun" in cmd:
            # The leader looked (replica.propose): a consecutive batch in its compact form, or None.
            run = cmd["_ackRun"]
        elif not cmd.get("results") and self.segments:
            run = ack_run_of(self.partition, cmd["ids"], cmd.get("tokens"))
        else:
            run = None
        if run is not None:
            done = self._ack_run(*run) if self.segments else 0
            if done:
                return {"count": done}
            if "ids" not in cmd:
                cmd = _ack_of_run(self.partition, run)  # the batch it stands for, with its errors
        ids = cmd["ids"]
        tokens = cmd.get("tokens") or [None] * len(ids)
        results = cmd.get("results") or [None] * len(ids)
        # Per id: its Job, or the slot (segment, index) of a leased segment job acked without
        # a result, which completes in place (no object is made for it).
        targets: list[Any] = []
        find, all_jobs, segments = self._job, self.jobs, self.segments
        prefix = f"{self.partition}-"
        token_prefix = f"{self.partition}."
        cut = len(prefix)
        seg: Segment | None = None  # the segment of the previous slot
        for job_id, token, result in zip(ids, tokens, results):   # check all first: the batch is atomic
            # A validated id of this partition: the seq is the digits after the prefix. Anything
            # else (another partition, a bad id) takes ``_job`` and its errors.
            tail = job_id[cut:] if job_id.startswith(prefix) else ""
            seq = int(tail) if tail.isdigit() and tail.isascii() and len(job_id) <= 40 else 0
            job = all_jobs.get(seq) if seq else None
            if job is None and seq and segments and result is None:
                if seg is None or not 0 <= seq - seg.first < len(seg.datas):
                    seg = segments.find(seq)
                if seg is not None:
                    i = seq - seg.first
                    if (seg.states[i] == SLOT_ACTIVE
                            and (token is None or str(token) == token_prefix + str(seg.lease_nos[i]))):
                        targets.append((seg, i))
                        continue
            if job is None:
                job = find(job_id)
            if job.state != ACTIVE or (token is not None and str(token) != job.token):
                self._require_active(job, {"token": token})  # raises the precise error
            targets.append(job)
        if len({t.seq if type(t) is Job else t[0].first + t[1] for t in targets}) != len(targets):
            raise CommandError(ErrorCode.INVALID, "ids: the same job appears twice")
        queues = self.queues
        touched: dict[str, Queue] = {}
        q = None
        complete = self._complete
        for target, result in zip(targets, results):
            if type(target) is Job:
                if q is None or q.name != target.queue:
                    q = touched[target.queue] = queues[target.queue]
                if result is not None:
                    target.result = result.packed if type(result) is Raw else _pack(result)
                q.calls["ACKB"] = q.calls.get("ACKB", 0) + 1
                complete(q, target, trim=False)
                continue
            seg, i = target
            if q is None or q.name != seg.queue:
                q = touched[seg.queue] = queues[seg.queue]
            self._complete_slots(q, seg, i, 1)
        for q in touched.values():
            if len(q.history) > q.opts["historyMax"]:
                self._trim_history(q)  # once per batch: the same jobs go as trimming after each ack
        return {"count": len(targets)}

    def _ack_run(self, first: int, k: int, lease: int) -> int:
        """ACKB of one segment's consecutive leased jobs ``first .. first+k-1`` (``ack_run_of``),
        their leases numbered from ``lease`` (-1: no tokens given).

        Checks and completes the run slice by slice: the same outcome as acking the jobs
        one by one. Returns 0, having changed nothing, when the jobs are not that run
        (the general path then handles the batch, errors included).
        """
        seg = self.segments.find(first)
        if seg is None:
            return 0
        i = first - seg.first
        end = i + k
        if end > len(seg.datas) or seg.states.count(SLOT_ACTIVE, i, end) != k:
            return 0
        if lease >= 0 and seg.lease_nos[i:end] != list(range(lease, lease + k)):
            return 0
        q = self.queues[seg.queue]
        self._complete_slots(q, seg, i, k)
        if len(q.history) > q.opts["historyMax"]:
            self._trim_history(q)
        return k

    def _complete_slots(self, q: Queue, seg: Segment, i: int, k: int) -> None:
        """ACKB's completion of leased slots ``i .. i+k-1`` of ``seg``, without a result: the
        steps of ``_complete`` (lease ended, completed, into the history) done slice by slice.
        The caller checked them and trims the history."""
        end = i + k
        first = seg.first + i
        seqs = range(first, first + k)
        seg.states[i:end] = bytes([SLOT_COMPLETED]) * k
        seg.finished[i:end] = [self.now_ms] * k
        sessions = self.sessions
        for session in set(seg.sessions[i:end]):
            if session is not None:
                leased = sessions.get(session)
                if leased is not None:
                    pop = leased.pop
                    for seq in seqs:
                        pop(seq, None)
                    if not leased:
                        del sessions[session]
        seg.sessions[i:end] = [None] * k
        counts = q.counts
        counts[ACTIVE] -= k
        counts[COMPLETED] += k
        if self.record_events:
            name = q.name
            self.events.extend([(name, seq, COMPLETED, ACTIVE) for seq in seqs])
        q.history.extend(seqs)
        q.totals["completed"] += k
        q.calls["ACKB"] = q.calls.get("ACKB", 0) + k

    def _op_FAIL(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        self._count(q, "FAIL")
        job.error = cmd.get("error") or "failed"
        if job.attempts < job.max_attempts:
            delay = cmd.get("delay")
            if delay is None:
                delay = job.backoff_ms * (2 ** max(0, job.attempts - 1))
            q.totals["retried"] += 1
            self._to_waiting(q, job, delay)
        else:
            self._finish(q, job, FAILED)
        return {"state": job.state}

    def _op_Release(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        self._count(q, "Release")
        self._to_waiting(q, job, cmd.get("delay") or 0)
        return {"state": job.state}

    def _op_Bury(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._check_token(job, cmd)
        if job.state in (COMPLETED, FAILED):
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is already {job.state}")
        q = self.queues[job.queue]
        self._count(q, "Bury")
        if cmd.get("error"):
            job.error = cmd["error"]
        self._finish(q, job, FAILED)
        return {}

    def _op_Kick(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        self._count(q, "Kick")
        return {"count": self._retry_dlq(q, list(q.dlq)[:cmd["count"]], reset=False)}

    def _touch(self, cmd: dict[str, Any], ttr_ms: int | None) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        self._count(q, cmd["cmd"])
        job.lease_deadline_ms = self.now_ms + (ttr_ms or job.ttr_ms)
        heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, job.token or "", 0))
        return {"deadline": job.lease_deadline_ms}

    def _op_Touch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return self._touch(cmd, cmd["ttr"])

    def _op_JobHeartbeat(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return self._touch(cmd, cmd.get("ttr"))

    def _op_ReleaseAll(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        self._count(q, "ReleaseAll")
        self._materialize_active(q)
        active = [j for j in self.jobs.values() if j.queue == q.name and j.state == ACTIVE]
        for job in active:
            self._to_waiting(q, job)
        return {"count": len(active)}

    def _op_ReleaseSession(self, cmd: dict[str, Any]) -> dict[str, Any]:
        seqs = list(self.sessions.get(cmd["session"], ()))
        for seq in seqs:
            job = self._get(seq)
            if job is not None and job.state == ACTIVE and job.session == cmd["session"]:
                self._to_waiting(self.queues[job.queue], job)
        self.sessions.pop(cmd["session"], None)
        return {"count": len(seqs)}

    def _op_Tick(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._expire()
        self._fire_crons()
        self._purge_idempotency()
        for q in self.queues.values():
            if q.history:
                self._trim_history(q)
        return {}

    # ------------------------------------------------------------------------------------------
    # per-job control

    def _op_Cancel(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        if job.state == ACTIVE:
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is active; fail or release it first")
        q = self.queues[job.queue]
        self._count(q, "Cancel")
        self._remove(q, job)
        return {}

    def _op_Promote(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        if job.state != DELAYED:
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is {job.state}, not delayed")
        q = self.queues[job.queue]
        self._count(q, "Promote")
        self._to_waiting(q, job)
        return {}

    def _op_MoveToDelayed(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._check_token(job, cmd)
        if job.state not in (WAITING, ACTIVE, DELAYED):
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is {job.state}")
        q = self.queues[job.queue]
        self._count(q, "MoveToDelayed")
        if job.state == DELAYED:
            job.run_at_ms = self.now_ms + cmd["delay"]
            heapq.heappush(self.delayed, (job.run_at_ms, job.seq))
        else:
            self._to_waiting(q, job, max(1, cmd["delay"]))
        return {}

    def _op_Progress(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._check_token(job, cmd)
        job.progress = cmd["progress"]
        if cmd.get("message") is not None:
            job.message = cmd["message"]
        self._count(self.queues[job.queue], "Progress")
        self.events.append((job.queue, job.seq, "progress", job.progress))
        return {}

    def _op_AddLog(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        logs = job.logs if job.logs is not None else []
        logs.append((self.now_ms, cmd["message"]))
        if len(logs) > JOB_LOGS_MAX:
            del logs[0]  # bounded: the oldest line goes
        job.logs = logs
        self._count(self.queues[job.queue], "AddLog")
        return {"count": len(logs)}

    # ------------------------------------------------------------------------------------------
    # queue control

    def _op_CreateQueue(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = cmd["queue"]
        qtype = cmd.get("type") or "standard"
        opts = {k: v for k, v in (cmd.get("options") or {}).items() if v is not None and k in DEFAULTS}
        existing = self.queues.get(name)
        if existing is not None:
            if existing.type != qtype:
                raise CommandError(ErrorCode.INVALID, f"type: queue {name!r} exists as {existing.type}")
            existing.opts.update(opts)
            return {"created": False}
        self.queues[name] = Queue(name, qtype, opts)
        return {"created": True}

    def _op_Pause(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        q.paused = True
        return {}

    def _op_Resume(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        q.paused = False
        return {}

    def _remove_where(self, q: Queue, states: tuple[str, ...], older_than_ms: int | None = None,
                      limit: int | None = None) -> int:
        victims = []
        for job in self._all_jobs():
            if job.queue != q.name or job.state not in states:
                continue
            stamp = job.finished_ms or job.created_ms
            if older_than_ms is not None and stamp > older_than_ms:
                continue
            victims.append(job.seq)
            if limit is not None and len(victims) >= limit:
                break
        for seq in victims:
            self._remove(q, self._get(seq))  # type: ignore[arg-type]
        return len(victims)

    def _op_Drain(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        self._count(q, "Drain")
        return {"count": self._remove_where(q, (WAITING, DELAYED))}

    def _op_Clean(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        state = cmd.get("state") or COMPLETED
        if state == ACTIVE:
            raise CommandError(ErrorCode.INVALID, "state: active jobs cannot be cleaned (release them first)")
        self._count(q, "Clean")
        return {"count": self._remove_where(q, (state,), self.now_ms - cmd["grace"], cmd.get("limit"))}

    def _op_Obliterate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {}
        self._remove_where(q, STATES)
        self.crons = {n: c for n, c in self.crons.items() if c["queue"] != q.name}
        del self.queues[q.name]
        return {}

    def _retry_dlq(self, q: Queue, seqs: list[int], reset: bool) -> int:
        for seq in seqs:
            job = self.jobs[seq]
            q.dlq.pop(seq, None)
            if reset:
                job.attempts = 0
            job.error = None
            job.finished_ms = 0
            self._to_waiting(q, job)
        return len(seqs)

    def _op_RetryDlq(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if cmd.get("id") is not None:
            job = self._job(cmd["id"])
            if job.queue != q.name or job.state != FAILED:
                raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is not in {q.name}'s DLQ")
            seqs = [job.seq]
        else:
            seqs = list(q.dlq)
        self._count(q, "RetryDlq")
        return {"count": self._retry_dlq(q, seqs, reset=True)}

    def _op_RetryCompleted(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if cmd.get("id") is not None:
            job = self._job(cmd["id"])
            if job.queue != q.name or job.state != COMPLETED:
                raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is not completed in {q.name}")
            seqs = [job.seq]
        else:
            seqs = [s for s in q.history if (j := self._get(s)) is not None and j.state == COMPLETED]
        for seq in seqs:
            job = self.jobs[seq]
            job.attempts = 0
            job.result = None
            job.finished_ms = 0
            self._to_waiting(q, job)
        self._count(q, "RetryCompleted")
        return {"count": len(seqs)}

    def _op_PurgeDlq(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        seqs = list(q.dlq)
        for seq in seqs:
            self._remove(q, self.jobs[seq])
        self._count(q, "PurgeDlq")
        return {"count": len(seqs)}

    # ------------------------------------------------------------------------------------------
    # log queues

    def _op_Truncate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if q.type != "log":
            count = self._remove_where(q, (WAITING, DELAYED, COMPLETED, FAILED))  # tarantool truncate
            return {"count": count}
        before, tag = cmd.get("beforeSeq"), cmd.get("tag")
        victims = [s for s, (_, t, _) in q.log.items()
                   if (before is not None and s < before) or (tag is not None and t == tag)]
        if before is None and tag is None:
            victims = list(q.log)
        for s in victims:
            del q.log[s]
        self._count(q, "Truncate")
        return {"count": len(victims)}

    def _op_Read(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if q.type != "log":
            raise CommandError(ErrorCode.INVALID, f"queue {q.name!r} is not a log queue")
        limit = cmd.get("limit") or PAGE_DEFAULT
        records = []
        seq = max(1, cmd["fromSeq"])
        while seq < q.log_next and len(records) < limit:
            rec = q.log.get(seq)
            if rec is not None:
                item: dict[str, Any] = {"seq": seq, "data": Raw(rec[0]), "createdAt": rec[2]}
                if rec[1] is not None:
                    item["tag"] = rec[1]
                records.append(item)
            seq += 1
        return {"records": records, "next": seq}

    # ------------------------------------------------------------------------------------------
    # cron

    def _op_Cron(self, cmd: dict[str, Any]) -> dict[str, Any]:
        schedule, every = cmd.get("schedule"), cmd.get("repeatEvery")
        if (schedule is None) == (every is None):
            raise CommandError(ErrorCode.INVALID, "schedule: give exactly one of schedule and repeatEvery")
        data = cmd.get("data")
        cron = {"name": cmd["name"], "queue": cmd["queue"], "schedule": schedule, "repeatEvery": every,
                "data": data.packed if type(data) is Raw else _pack(data), "priority": cmd.get("priority") or 0,
                "limit": cmd.get("limit") or 0, "count": 0, "createdAt": self.now_ms}
        cron["nextRunAt"] = _next_run(cron, self.now_ms)
        self.crons[cmd["name"]] = cron
        self._queue(cmd["queue"], create=True)
        return {"name": cmd["name"], "nextRunAt": cron["nextRunAt"]}

    def _op_CronDelete(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"deleted": self.crons.pop(cmd["name"], None) is not None}

    def _op_CronList(self, cmd: dict[str, Any]) -> dict[str, Any]:
        limit = cmd.get("limit") or PAGE_LIMIT_MAX
        crons = list(islice(self.crons.values(), limit + 1))
        return {"crons": [{k: (Raw(v) if k == "data" else v) for k, v in c.items()} for c in crons[:limit]],
                "more": len(crons) > limit}

    # ------------------------------------------------------------------------------------------
    # queries (never change state)

    def _op_GetJob(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"job": self.wire_job(self._job(cmd["id"]))}
        except CommandError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                return {"job": None}
            raise

    def _op_GetJobByCustomId(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        seq = q.custom_ids.get(cmd["customId"]) if q else None
        job = self.jobs.get(seq) if seq is not None else None
        return {"job": self.wire_job(job) if job else None}

    def _op_GetState(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"state": self._job(cmd["id"]).state}

    def _op_GetResult(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        return {"result": Raw(job.result) if job.result is not None else None, "state": job.state}

    def _op_GetProgress(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        out: dict[str, Any] = {"progress": job.progress}
        if job.message is not None:
            out["message"] = job.message
        return out

    def _op_GetLogs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        logs = job.logs or []
        limit = cmd.get("limit")
        if limit:
            logs = logs[-limit:]
        return {"logs": [{"time": t, "message": m} for t, m in logs]}

    def _op_GetJobs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"jobs": [], "total": 0}
        state = cmd.get("state")
        tag = cmd.get("tag")
        offset = cmd.get("offset") or 0
        limit = cmd.get("limit") or PAGE_DEFAULT
        total = q.counts[state] if state else sum(q.counts.values())
        page: list[dict[str, Any]] = []
        matched = 0
        for job in self._queue_jobs(q.name, state):  # seq order, built lazily: a page costs its offset
            if tag is not None and job.tag != tag:
                continue
            matched += 1
            if matched <= offset or len(page) >= limit:
                if tag is None and len(page) >= limit:
                    break  # the total is known from the counters; with a tag it is counted here
                continue
            page.append(self.wire_job(job))
        return {"jobs": page, "total": matched if tag is not None else total}

    def _op_GetJobCounts(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        return {"counts": dict(q.counts) if q else {s: 0 for s in STATES}}

    def _op_GetCountsPerPriority(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        return {"counts": {str(p): n for p, n in sorted(q.prio_counts.items())} if q else {}}

    def _op_Count(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"count": 0}
        state = cmd.get("state")
        if q.type == "log" and not state:
            return {"count": len(q.log)}
        return {"count": q.counts[state] if state else sum(q.counts.values())}

    def _op_IsPaused(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        return {"paused": bool(q and q.paused)}

    def _op_ListQueues(self, cmd: dict[str, Any]) -> dict[str, Any]:
        # One page in name order after ``after``: a reply of every name of a partition with a
        # million queues would be built, encoded and sent in one go on the node's loop.
        after, limit = cmd.get("after"), cmd.get("limit") or PAGE_LIMIT_MAX
        names = heapq.nsmallest(limit + 1, self.queues if after is None else (n for n in self.queues if n > after))
        return {"queues": names[:limit], "more": len(names) > limit}

    def _op_Dlq(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        limit = cmd.get("limit") or PAGE_DEFAULT
        seqs = list(q.dlq)[:limit] if q else []
        return {"jobs": [self.wire_job(self.jobs[s]) for s in seqs]}

    def _queue_metrics(self, q: Queue) -> dict[str, Any]:
        return {"type": q.type, "paused": q.paused, "durability": "fsync" if q.opts.get("durable", True) else "disk",
                "counts": dict(q.counts), "totals": dict(q.totals),
                "calls": dict(q.calls), "options": dict(q.opts),
                **({"logRecords": len(q.log), "nextSeq": q.log_next} if q.type == "log" else {})}

    def _op_Metrics(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        return {"metrics": self._queue_metrics(q)}

    def _op_Stats(self, cmd: dict[str, Any]) -> dict[str, Any]:
        totals = {s: 0 for s in STATES}
        for q in self.queues.values():
            for s, n in q.counts.items():
                totals[s] += n
        return {"stats": {"partition": self.partition, "queues": {n: self._queue_metrics(q)
                                                                   for n, q in self.queues.items()},
                          "jobs": totals, "sessions": len(self.sessions), "crons": len(self.crons),
                          "lastSeq": self.seq, "now": self.now_ms}}


#: ``_push_segment``'s plan mark for an item refused for capacity.
_FULL = object()


def _slot_job(seg: Segment, i: int, partition: int) -> Job:
    """Slot ``i`` of ``seg`` as the job the per-job path would hold in the same state.

    A plain push makes a waiting job at priority 0; a pull leases it for the first time
    (attempt 1); an ack without a result completes it and ends its lease.
    """
    job = Job(seg.first + i, seg.queue, seg.datas[i], 0, seg.created_ms,  # type: ignore[arg-type]
              seg.max_attempts, seg.backoff_ms, seg.ttr_ms)
    code = seg.states[i]
    if code != SLOT_WAITING:
        job.attempts = 1
        if code == SLOT_ACTIVE:
            job.state = ACTIVE
            job.token = f"{partition}.{seg.lease_nos[i]}"
            job.session = seg.sessions[i]
            job.lease_deadline_ms = seg.deadlines[i]
        else:
            job.state = COMPLETED
            job.finished_ms = seg.finished[i]
    return job


def _ack_of_run(partition: int, run: tuple[int, int, int]) -> dict[str, Any]:
    """The ACKB that ``ack_run_of`` turned into ``run``."""
    first, k, lease = run
    cmd: dict[str, Any] = {"cmd": "ACKB", "ids": [f"{partition}-{s}" for s in range(first, first + k)]}
    if lease >= 0:
        cmd["tokens"] = [f"{partition}.{n}" for n in range(lease, lease + k)]
    return cmd


#: The segment slot codes a job state can have (delayed and failed jobs never stay in a segment).
_SLOT_CODES: dict[str, tuple[int, ...]] = {WAITING: (SLOT_WAITING,), ACTIVE: (SLOT_ACTIVE,),
                                           COMPLETED: (SLOT_COMPLETED,), DELAYED: (), FAILED: ()}


def _seq_of(job: Job) -> int:
    return job.seq


def _pack(value: Any) -> bytes:
    """Results and cron data that did not arrive raw (e.g. from tests or HTTP)."""
    return msgpack.packb(value, use_bin_type=True)


def _next_run(cron: dict[str, Any], now_ms: int) -> int:
    if cron["repeatEvery"]:
        return now_ms + cron["repeatEvery"]
    start = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)
    return int(croniter(cron["schedule"], start).get_next(float) * 1000)
