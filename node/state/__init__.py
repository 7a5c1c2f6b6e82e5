"""The deterministic queue engine: every queue model of Shoal on one state machine per partition.

Theory of operation
-------------------
A :class:`PartitionEngine` holds every queue of one partition. It is driven only by
:meth:`PartitionEngine.apply`: a validated command (a dict, or one of the typed compact
forms of :mod:`._commands` the node replicates for its fast paths) and the leader's clock stamp
``now_ms`` in, an :class:`Applied` (the reply fields and the job events the command
caused, as plain tuples) out, or a ``CommandError``. It never reads a clock, draws a
random number or does I/O, so replicas that apply the same commands hold identical state
(equal :meth:`~PartitionEngine.digest`). ``apply(..., replies=False, events=False)`` is
what a follower uses: the same state change without building a reply or events that
nobody reads.

Jobs are ``__slots__`` objects (raw MessagePack data bytes, no dict per job) indexed by
their partition sequence number. A job's state is one of ``waiting`` (tarantool ``r``),
``delayed`` (``~``), ``active`` (``t``, leased), ``completed`` (``-``) and ``failed``
(``!``, buried / dead-lettered) and ``cancelled`` (``x``, stopped by ``Cancel`` while
running); every move between them, a segment slot's included, is allowed by the one table
in :mod:`._transitions`.

Flow control (:mod:`._limits`): a queue's rate limits keep sliding windows of lease stamps
(replicated, so they hold across a failover) and a pull leases only while the queue and
the job's group have budget; groups out of budget or at their ``groupConcurrency`` leave
the heap of turns until they may run again, so limits keep a pull O(log n) in the number
of groups. Dedupe and debounce entries (:mod:`._dedupe`) are replicated too.

Per-operation costs stay O(log n) with heaps and lazy deletion: a queue keeps a ready
heap of ints ordered as ``(-priority, seq)`` (``_model.ready_key``: a priority-0 job's
entry is its seq) for jobs without a group and, for groups (utube), one such heap per
group plus a heap of the groups that may run, keyed by the
virtual finish tags of weighted fair turns (:mod:`._ready`), so a pull from a queue with
100,000 groups is a few heap operations. The partition keeps heaps of delayed run times (ints
ordered as ``(run_at_ms, seq)``, ``_model.due_key``), lease deadlines and TTL deadlines; stale
heap entries are skipped when they surface. Expiry happens lazily when a pull applies and in
the leader's periodic ``_Tick`` command.

Bulk ingest: a ``PUSHB`` whose items carry only ``data`` is stored as one
:class:`~._segments.Segment` (a list of data bytes) with one ready-heap entry pointing at
its lowest untaken job; a pull leases a segment's consecutive jobs as one run, and an
``ACKB`` of that run completes it slice by slice. Single adds to one queue that carry at most
a priority, a delay, a name, a group, a custom id, a tag and an idempotency key (what
``queue.add()`` sends), and ``PUSHB`` items that carry no more, become slots of the partition's
last segment when it ends just before them (the first two of a burst start one): the slots with
a priority, a custom id or a tag share one ready-heap entry per priority of their segment (a
cursor, ``Segment.cursors``, moved on as each is taken), a grouped one has an entry in its
group's heap and a delayed one its delayed-heap entry, a delayed slot comes due in place, and a
pull and an ``ACK`` lease and complete a slot with no group, custom id or tag in place, so such
a job's whole life makes no ``Job`` object (the others become one as a pull takes them). A segment's job becomes one
("materialized") when a command names it otherwise. Materializing changes the
representation, never the state: snapshots, digests and listings see every job in seq
order either way. A restore keeps runs of jobs a slot can hold (consecutive seqs of one
queue, waiting or delayed, never attempted) as segments again, except where only the per-job
path makes them (a log queue's records, jobs a flow or a dedupe entry names).

Job data lives in the partition's payload space (``_payloads``): a segment keeps 8 + 4 bytes
of offset and length a job, a job object a ``Stored`` reference; the engine's own space is
process memory, a node's is files on disk. Replies carry the reference, which the frame
encoder reads; snapshots and digests carry the data itself, never where a replica keeps it.

Every command is atomic: it checks everything that can fail before it changes
anything, so a refused command leaves no trace.

Modules, one concern each, as mixins over one :class:`~._store.Store` of fields:
``_model`` (Job, Queue, defaults, presets), ``_store`` (lookup, materializing, listings),
``_ready`` (what a pull takes next), ``_moves`` (state moves, removal, history trimming),
``_push``, ``_idempotency`` (the keys clients give their adds, kept two minutes), ``_dedupe``
(dedupe and debounce of adds), ``_forwarded`` (the keys of adds forwarded by another node),
``_pull``, ``_limits`` (rate limits and concurrency), ``_ack`` (ack/fail/retry and leases),
``_cancel`` (cancelling a running job), ``_payloads`` (where segment jobs' data lives), ``_timers`` (expiry, cron, ``_Tick``), ``_control``
(per-job and per-queue commands, log queues), ``_reads``, ``_snapshot``, ``_segments`` (plain
batch jobs), ``_transitions`` (the state diagram), ``_commands`` (the typed compact commands the
node replicates) and ``_engine`` (``PartitionEngine.apply``).
"""

from ._commands import AckRun, Command, PushBatch, PushRun, SessionPull, TypedCommand, command_name, command_queue
from ._pull import TERM_LEASE_BITS
from ._pulled import PulledJobs, loose_jobs
from ._engine import Applied, PartitionEngine, event_dicts
from ._model import DEFAULTS, EVENTS_MAX, QUEUE_PRESETS, Event, Job
from ._payloads import MemorySpace, PayloadSpace, Stored
from ._snapshot import ChunkReader
from ._transitions import STATES, TARANTOOL_CODES, TRANSITIONS

__all__ = ["PartitionEngine", "Applied", "PulledJobs", "loose_jobs", "Event", "event_dicts", "Job", "DEFAULTS",
           "QUEUE_PRESETS", "EVENTS_MAX",
           "STATES", "TRANSITIONS", "TARANTOOL_CODES", "Command", "TypedCommand", "PushRun", "PushBatch", "AckRun",
           "SessionPull", "command_name", "command_queue", "TERM_LEASE_BITS", "PayloadSpace", "MemorySpace", "Stored",
           "ChunkReader"]
