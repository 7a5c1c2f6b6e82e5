"""The engine's values: a job, a queue's settings and indexes, defaults, presets and limits."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack

from ._custom_ids import CustomIds
from ._limits import group_concurrency_of, limiter_of
from ._payloads import Stored
from ._segments import SLOT_ACTIVE, SLOT_COMPLETED, SLOT_DELAYED, SLOT_READY, SLOT_WAITING, Segment
from ._transitions import ACTIVE, CANCELLED, COMPLETED, DELAYED, FAILED, STATES, WAITING, WAITING_CHILDREN

__all__ = ["DEFAULTS", "QUEUE_PRESETS", "Job", "Queue", "wire_bytes_max", "slot_job", "slot_tuples", "slot_like", "seq_of", "pack", "SLOT_CODES", "Event",
           "SEQ_BITS", "SEQ_MASK", "ready_key", "due_key"]


#: Defaults for a queue created by its first PUSH ("standard") and for presets.
DEFAULTS: dict[str, Any] = {
    "ttr": 30_000, "ttl": 0, "capacity": 0, "maxDeliveries": 10, "attempts": 1, "backoff": 1_000,
    "historyMax": 10_000, "historyAgeMs": 24 * 3600 * 1000,
    "durable": True,  # True: the fsync durability class (synced before acknowledged); False: the disk class
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
#: The idempotency keys a forwarding node gives the adds it forwards without one
#: (``shoal.node.relay``) begin with the first (its first send) or the second (sent again);
#: the engine keeps them FORWARDED_KEY_WINDOW_MS, in records of their own (``_forwarded``).
FORWARDED_KEY_PREFIX = "~fwd:"
FORWARDED_AGAIN_PREFIX = "~fwr:"
FORWARDED_KEY_WINDOW_MS = 45_000
JOB_LOGS_MAX = 100
EVENTS_MAX = 10_000
PAGE_DEFAULT = 100
PAGE_LIMIT_MAX = 10_000  # ListQueues/CronList page (cluster.limits.page_limit_max)
#: The engine state version snapshots are written in (3: dedupe and debounce entries as hashes;
#: 2: the idempotency window as hashes), and those a restore reads (1: both as strings).
SNAPSHOT_VERSION = 3
READ_SNAPSHOT_VERSIONS = (1, 2, 3)


#: A queue's ready heap and the partition's delayed heap hold one int per entry, a job's seq in
#: its low SEQ_BITS bits under what orders it: :func:`ready_key` (``key >> SEQ_BITS`` the negated
#: priority) and :func:`due_key` (the run-at time). Ints order as the pairs they stand for while
#: seqs stay below 2**48 (a partition adding a million jobs a second reaches that in nine
#: years), cost less than a tuple, compare faster in a heap, and a priority-0 job's ready
#: entry is its own seq.
SEQ_BITS = 48
SEQ_MASK = (1 << SEQ_BITS) - 1


def ready_key(priority: int, seq: int) -> int:
    """The ready-heap entry of waiting job ``seq`` of ``priority``: ordered as ``(-priority, seq)``."""
    return seq - (priority << SEQ_BITS) if priority else seq


def due_key(run_at_ms: int, seq: int) -> int:
    """The delayed-heap entry of job ``seq`` due at ``run_at_ms``: ordered as ``(run_at_ms, seq)``."""
    return (run_at_ms << SEQ_BITS) | seq


# Upper bounds of a PULLB reply's bytes beside job data and strings: the reply's own
# fields, and each job's fixed wire fields, id and lease token.
REPLY_BYTES_OVERHEAD = 1024
JOB_WIRE_BYTES_OVERHEAD = 512

#: A job event: (queue, seq, new state, previous state), the previous state None for a new job;
#: for a progress report (queue, seq, "progress", the progress value).
Event = tuple[str, int, str, Any]


def wire_bytes_max(job: "Job") -> int:
    """An upper bound of ``job``'s size in a reply (a str char packs to at most 4 bytes)."""
    size = len(job.data) + JOB_WIRE_BYTES_OVERHEAD + 4 * len(job.queue)
    for text in (job.group, job.custom_id, job.tag, job.error, job.name):
        if text is not None:
            size += 8 * len(text)  # a custom id is written as the id and as customId
    if job.result is not None:
        size += len(job.result)
    if job.meta is not None:
        size += len(msgpack.packb(job.meta, use_bin_type=True))
    if type(job.progress) is not int:
        size += len(msgpack.packb(job.progress, use_bin_type=True))
    return size


class Job:
    """One job; data stays the raw MessagePack bytes the client sent.

    ``name`` is the job's name (bunqueue's; None reads as ``default``); ``meta`` holds the rare
    per-job settings and records as a small dict, or None: ``removeOnComplete``,
    ``removeOnFail``, ``backoffType``, ``stackTraceLimit``, ``keepLogs``, ``traceContext`` (the
    trace it was added in), the last failure's ``stacktrace`` and the start of its latest attempt
    (``startedAt``).
    """

    __slots__ = ("seq", "queue", "data", "priority", "state", "attempts", "max_attempts", "backoff_ms",
                 "created_ms", "run_at_ms", "ttl_deadline_ms", "ttr_ms", "token", "session",
                 "lease_deadline_ms", "group", "custom_id", "tag", "result", "error", "progress",
                 "message", "logs", "finished_ms", "name", "meta")

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
        self.name: str | None = None
        self.meta: dict[str, Any] | None = None

    def to_tuple(self, stored: bool = False) -> tuple[Any, ...]:
        """The job's fields in ``__slots__`` order, its data as bytes (read from the payload
        space), or with ``stored`` as the job holds it (no read)."""
        t = tuple(getattr(self, s) for s in Job.__slots__)
        if not stored and type(t[2]) is Stored:
            t = (t[0], t[1], t[2].packed, *t[3:])
        return t

    @classmethod
    def from_tuple(cls, t: tuple[Any, ...]) -> "Job":
        """A job from :meth:`to_tuple`; a shorter tuple (written before ``name`` and ``meta``
        existed) leaves those None."""
        job = cls.__new__(cls)
        job.name = job.meta = None
        for name, value in zip(Job.__slots__, t):
            setattr(job, name, value)
        return job


class Queue:
    """Settings, indexes and counters of one queue."""

    __slots__ = ("name", "type", "opts", "paused", "ready", "group_fifo", "group_active", "group_heads",
                 "group_listed", "group_tags", "group_sizes", "group_vtime", "counts", "prio_counts", "history",
                 "dlq", "custom_ids", "calls", "totals", "log", "log_next", "limiter", "group_conc")

    def __init__(self, name: str, qtype: str = "standard", opts: dict[str, Any] | None = None, *,
                 custom_of: Callable[[int], str | None]) -> None:
        """``custom_of(seq)``: the custom id of the engine's job ``seq``, if it holds one (the
        index of custom ids confirms its candidates with it)."""
        self.name = name
        self.type = qtype
        self.opts = {**DEFAULTS, **(opts or {})}
        self.paused = False
        self.ready: list[int] = []                          # ready_key(priority, seq) of jobs without a group
        # Groups (see ``_ready``): each group's waiting jobs, and the fair turns between groups.
        self.group_fifo: dict[str, list[int]] = {}  # group -> heap of its waiting jobs' ready_key
        self.group_active: dict[str, int] = {}              # group -> how many of its jobs are active
        self.group_heads: list[tuple[int, str]] = []        # (key ≤ virtual finish tag, group) of listed groups
        self.group_listed: dict[str, int] = {}              # group with a live entry in group_heads -> its key
        self.group_tags: dict[str, int] = {}                # group with live jobs -> its virtual finish tag
        self.group_sizes: dict[str, int] = {}               # group -> its waiting and delayed jobs
        self.group_vtime = 0                                # the queue's virtual time (the last turn's tag)
        self.counts = {s: 0 for s in STATES}
        self.prio_counts: dict[int, int] = {}               # waiting jobs per priority
        self.history: deque[int] = deque()                  # completed seqs, oldest first
        self.dlq: dict[int, None] = {}                      # failed seqs in order
        self.custom_ids = CustomIds(custom_of)
        self.calls: dict[str, int] = {}
        self.totals = {"enqueued": 0, "completed": 0, "failed": 0, "reclaimed": 0, "expired": 0, "retried": 0}
        self.log: dict[int, tuple[bytes, str | None, int]] = {}  # log queues: lseq -> (data, tag, createdAt)
        self.log_next = 1
        self.limiter = limiter_of(self.opts)                # None: no rate or queue concurrency limit
        self.group_conc = group_concurrency_of(self.opts, qtype)  # active jobs per group, 0: no limit

    @property
    def preset(self) -> dict[str, bool]:
        return QUEUE_PRESETS[self.type]

    def settings(self) -> tuple[Any, ...]:
        return (self.name, self.type, dict(sorted(self.opts.items())), self.paused, self.custom_ids.as_dict(),
                dict(self.calls), dict(self.totals), dict(self.log), self.log_next, list(self.history),
                list(self.dlq))



def slot_job(seg: Segment, i: int, partition: int) -> Job:
    """Slot ``i`` of ``seg`` as the job the per-job path would hold in the same state.

    An add makes a waiting (or, with a delay, delayed) job never attempted; a pull leases a
    waiting slot for the first time (attempt 1); an ack without a result completes it and ends
    its lease.
    """
    createds, priorities = seg.createds, seg.priorities
    job = Job(seg.first + i, seg.queue, seg.job_data(i),
              priorities[i] if priorities is not None else 0,
              createds[i] if createds is not None else seg.created_ms, seg.max_attempts, seg.backoff_ms, seg.ttr_ms)
    if seg.run_ats is not None:
        job.run_at_ms = seg.run_ats[i]
    names = seg.names
    if names is not None:
        job.name = names[i]
    groups = seg.groups
    if groups is not None:
        job.group = groups[i]
    custom_ids = seg.custom_ids
    if custom_ids is not None:
        job.custom_id = custom_ids[i]
    tags = seg.tags
    if tags is not None:
        job.tag = tags[i]
    code = seg.states[i]
    if code == SLOT_DELAYED:
        job.state = DELAYED
    elif code != SLOT_WAITING and code != SLOT_READY:
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


def slot_tuples(seg: Segment, i: int, j: int, partition: int, refs: bool = False) -> list[tuple[Any, ...]]:
    """``slot_job(seg, k, partition).to_tuple()`` for each slot ``k`` in ``i .. j-1`` (all held),
    made without a job object each and with the run's data read at once (a snapshot writes
    millions of them); with ``refs``, the data as where it is (:meth:`Segment.run_refs`)."""
    datas = seg.run_refs(i, j) if refs else seg.run_bytes(i, j)
    first, queue, created = seg.first, seg.queue, seg.created_ms
    max_attempts, backoff_ms, ttr_ms = seg.max_attempts, seg.backoff_ms, seg.ttr_ms
    createds, run_ats, priorities, names, states = seg.createds, seg.run_ats, seg.priorities, seg.names, seg.states
    groups, custom_ids, tags = seg.groups, seg.custom_ids, seg.tags
    if (createds is None and run_ats is None and priorities is None and names is None and groups is None
            and custom_ids is None and tags is None
            and states.count(SLOT_WAITING, i, j) == j - i):  # a bulk push's waiting run
        tail = (WAITING, 0, max_attempts, backoff_ms, created, created, 0, ttr_ms, *_PLAIN_LEASE, None, None, None,
                *_PLAIN_TAIL, None, None)
        return [(first + k, queue, data, 0, *tail) for k, data in zip(range(i, j), datas)]
    out = []
    for k, data in zip(range(i, j), datas):
        code = states[k]
        made = createds[k] if createds is not None else created
        state, attempts, token, session, lease_deadline, finished = WAITING, 0, None, None, 0, 0
        if code == SLOT_DELAYED:
            state = DELAYED
        elif code != SLOT_WAITING and code != SLOT_READY:
            attempts = 1
            if code == SLOT_ACTIVE:
                state, token = ACTIVE, f"{partition}.{seg.lease_nos[k]}"  # type: ignore[index]
                session, lease_deadline = seg.sessions[k], seg.deadlines[k]  # type: ignore[index]
            else:
                state, finished = COMPLETED, seg.finished[k]  # type: ignore[index]
        out.append((first + k, queue, data, priorities[k] if priorities is not None else 0, state, attempts,
                    max_attempts, backoff_ms, made, run_ats[k] if run_ats is not None else made, 0, ttr_ms,
                    token, session, lease_deadline, groups[k] if groups is not None else None,
                    custom_ids[k] if custom_ids is not None else None, tags[k] if tags is not None else None,
                    None, None, 0, None, None, finished,
                    names[k] if names is not None else None, None))
    return out


#: The fields of a job tuple (``Job.__slots__`` order) from ``token`` to ``lease_deadline_ms``
#: and from ``result`` to ``finished_ms`` as a plain push leaves them: nothing leased, finished
#: or logged (``group``, ``custom_id`` and ``tag``, between them, may hold strings).
_PLAIN_LEASE = (None, None, 0)
_PLAIN_TAIL = (None, None, 0, None, None, 0)


#: What a job's data is when a segment's slot can hold it: bytes (a restore's), or where the
#: payload space holds them (a job object's).
_SLOT_DATA = (bytes, Stored)


def slot_like(t: list[Any] | tuple[Any, ...]) -> bool:
    """True when job tuple ``t`` (:meth:`Job.to_tuple`) is what a segment's slot gives
    (:func:`slot_job`) for a job never attempted: waiting or delayed, no TTL, only a name, a
    group, a custom id and a tag beside its data and times."""
    return ((t[4] == WAITING or t[4] == DELAYED) and t[5] == 0 and t[10] == 0 and type(t[3]) is int
            and tuple(t[12:15]) == _PLAIN_LEASE and (t[15] is None or type(t[15]) is str)
            and (t[16] is None or type(t[16]) is str) and (t[17] is None or type(t[17]) is str)
            and tuple(t[18:24]) == _PLAIN_TAIL and type(t[20]) is int
            and (len(t) < 26 or t[25] is None)
            and type(t[2]) in _SLOT_DATA and (len(t) < 25 or t[24] is None or type(t[24]) is str))


def seq_of(job: Job) -> int:
    return job.seq


def pack(value: Any) -> bytes:
    """Results and cron data that did not arrive raw (e.g. from tests or HTTP)."""
    return msgpack.packb(value, use_bin_type=True)


#: The segment slot codes a job state can have (failed jobs never stay in a segment).
SLOT_CODES: dict[str, tuple[int, ...]] = {WAITING: (SLOT_WAITING, SLOT_READY), ACTIVE: (SLOT_ACTIVE,),
                                          COMPLETED: (SLOT_COMPLETED,), DELAYED: (SLOT_DELAYED,), FAILED: (),
                                          WAITING_CHILDREN: (), CANCELLED: ()}
