"""The replicated state as canonical bytes (snapshot, restore) and its digest."""

from __future__ import annotations

import hashlib
import heapq
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, Self

import msgpack

from shoal.cluster.jobid import parse_job_id

from ._payloads import PayloadSpace, Stored, ref_range
from ._model import READ_SNAPSHOT_VERSIONS, SNAPSHOT_VERSION, Job, Queue, due_key, slot_job, slot_like
from ._segments import SEGMENT_SLOTS_MAX, SLOT_DELAYED, SLOT_READY, SLOT_WAITING, Segment
from ._store import Store
from ._transitions import ACTIVE, DELAYED, NEW, STATES, WAITING

__all__ = ["SnapshotOps", "ChunkReader"]

#: Bytes the streaming restore reads from its chunks at a time.
_READ_BYTES = 1 << 20
#: Positions in a job tuple of strings that many jobs hold alike (queue, state, group, tag, name).
_SHARED_FIELDS = (1, 4, 15, 17, 24)
#: Positions of times and durations that neighbouring jobs often hold alike (backoff, created,
#: run at, TTL deadline, TTR, lease deadline, finished): an int past 256 is an object of its own.
_SHARED_INTS = (7, 8, 9, 10, 11, 14, 23)
#: Distinct such ints remembered at once while restoring (jobs come in seq order, so neighbours
#: share most of them).
_INTS_MEMO_MAX = 1 << 16


class _Run:
    """Consecutive slot-like jobs of one queue pushed under the same queue defaults, as a restore
    reads them: each job's fields are taken as it comes (its tuple is not kept, so a long run
    leaves no trail of freed tuples between the objects the engine keeps), then one segment."""

    __slots__ = ("head", "datas", "names", "priorities", "createds", "run_ats", "states", "groups", "custom_ids",
                 "tags")

    def __init__(self, t: list[Any]) -> None:
        self.head = t  # kept whole: a run of one stays a job object
        self.datas: list[Any] = []
        self.names: list[str | None] = []
        self.priorities: list[int] = []
        self.createds: list[int] = []
        self.run_ats: list[int] = []
        self.states = bytearray()
        self.groups: list[str | None] = []
        self.custom_ids: list[str | None] = []
        self.tags: list[str | None] = []
        self.add(t)

    def __len__(self) -> int:
        return len(self.datas)

    def continues(self, t: list[Any]) -> bool:
        head = self.head
        return (t[0] == head[0] + len(self.datas) and t[1] == head[1] and t[6] == head[6]
                and t[7] == head[7] and t[11] == head[11] and len(self.datas) < SEGMENT_SLOTS_MAX)

    def add(self, t: list[Any]) -> None:
        self.datas.append(t[2])
        self.names.append(t[24] if len(t) > 24 else None)
        self.priorities.append(t[3])
        self.createds.append(t[8])
        self.run_ats.append(t[9])
        self.groups.append(t[15])
        self.custom_ids.append(t[16])
        self.tags.append(t[17])
        self.states.append(SLOT_DELAYED if t[4] == DELAYED
                           else SLOT_READY if t[3] or t[15] is not None or t[16] is not None or t[17] is not None
                           else SLOT_WAITING)

    def segment(self, space: PayloadSpace) -> Segment:
        """The segment holding the run, its data in ``space`` (priorities and times kept only
        where they differ)."""
        head = self.head
        created = head[8]
        createds, run_ats, priorities, names = self.createds, self.run_ats, self.priorities, self.names
        return Segment(head[0], self.datas, head[1], created, head[6], head[7], head[11],
                       names if any(n is not None for n in names) else None, states=self.states,
                       priorities=array("i", priorities) if any(priorities) else None,
                       createds=array("q", createds) if any(c != created for c in createds) else None,
                       run_ats=array("q", run_ats) if run_ats != createds else None, space=space,
                       groups=self.groups if any(g is not None for g in self.groups) else None,
                       custom_ids=self.custom_ids if any(c is not None for c in self.custom_ids) else None,
                       tags=self.tags if any(g is not None for g in self.tags) else None)


#: A group's tag is written relative to its queue's virtual time; a lag beyond this (a group
#: passed over for more than 10^11 turns of others) is written as this.
_LAG_MAX = 1 << 62


def _group_turns(q: Queue) -> list[list[Any]]:
    """``q``'s group tags relative to its virtual time, by group name, those at the present
    (the tag a group gets when its first job arrives, and the one a restore gives) left out."""
    vtime = q.group_vtime
    return [[g, max(tag - vtime, -_LAG_MAX)] for g, tag in sorted(q.group_tags.items()) if tag != vtime]


class ChunkReader:
    """A file-like ``read`` over an iterator of byte chunks (what msgpack's Unpacker reads from),
    with a look ahead, and what is left as chunks again."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def _fill(self, size: int) -> None:
        while size < 0 or len(self._buf) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf = self._buf + chunk if self._buf else chunk

    def read(self, size: int = -1) -> bytes:
        """The next ``size`` bytes (all that is left when negative; fewer at the end)."""
        self._fill(size)
        if size < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:size], self._buf[size:]
        return out

    def peek(self, size: int) -> bytes:
        """The next ``size`` bytes (fewer at the end), left to read."""
        self._fill(size)
        return self._buf[:size]

    def rest(self) -> Iterator[bytes]:
        """What was not read, as chunks."""
        if self._buf:
            yield self._buf
            self._buf = b""
        yield from self._chunks


class SnapshotOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def snapshot(self) -> bytes:
        """Compact, canonical bytes of the whole replicated state (job data stays raw).

        MessagePack, not pickle: pickle encodes object *identity* (memo references), which
        differs between replicas holding equal state, so its bytes could not be a digest.
        """
        return b"".join(self.snapshot_chunks())

    def snapshot_chunks(self, jobs_per_chunk: int = 10_000, refs: bool = False) -> Iterator[bytes]:
        """:meth:`snapshot`'s bytes in pieces, ``jobs_per_chunk`` jobs at a time: a large
        partition is written or hashed without holding every job as a tuple at once.

        With ``refs``, data held in the payload space is written as where it is
        (:func:`~._payloads.data_ref`) rather than read: a node's own snapshot beside its
        payload files, loaded with them as ``source`` (:meth:`restore_chunks`)."""
        packer = msgpack.Packer(use_bin_type=True)
        pack = packer.pack
        head = (SNAPSHOT_VERSION, self.partition, self.seq, self.lease_seq, self.now_ms)
        jobs = self._all_tuples_iter(refs)
        count = self.job_count()
        # Flows, flow-control windows and dedupe/debounce entries, in one trailing map present only
        # when one of them holds something: a partition using none of them keeps its digest.
        more: dict[str, Any] = {}
        if self.flow_parents or self.flow_children or self.flow_outbox:
            more["flows"] = self.flow_state()
        limits = {n: q.limiter.state(self.now_ms) for n, q in self.queues.items() if q.limiter is not None}
        if limits:
            more["limits"] = limits
        turns = {n: t for n, q in self.queues.items() if q.group_tags and (t := _group_turns(q))}
        if turns:
            more["groups"] = turns
        dedupe = self.dedupe_state()  # type: ignore[attr-defined]  # DedupeOps
        if dedupe:
            more["dedupe"] = dedupe
        if self.forwarded:  # type: ignore[attr-defined]  # ForwardedKeys
            more["forwarded"] = self.forwarded_state()  # type: ignore[attr-defined]
        extras = [more] if more else []
        # A packed array is its header followed by its packed items, so packing the job list
        # piecewise gives the same bytes as packing it whole.
        yield packer.pack_array_header(11 + len(extras)) + b"".join(map(pack, head)) + packer.pack_array_header(count)
        while chunk := [pack(t) for t in islice(jobs, jobs_per_chunk)]:
            yield b"".join(chunk)
        yield b"".join(map(pack, (
            [q.settings() for q in self.queues.values()],
            self.sessions.state(),
            *self.idempotency_state(),  # type: ignore[attr-defined]  # IdempotencyWindow
            {n: dict(c) for n, c in self.crons.items()},
            *extras,
        )))

    @classmethod
    def restore(cls, data: bytes) -> Self:
        """The engine :meth:`snapshot` produced ``data`` from."""
        return cls.restore_chunks((data,))

    @classmethod
    def restore_chunks(cls, chunks: Iterable[bytes], space: PayloadSpace | None = None,
                       source: PayloadSpace | None = None) -> Self:
        """The engine whose :meth:`snapshot_chunks` gave ``chunks``, read as they come: a large
        snapshot is never held whole, nor its jobs as one list of tuples. Its segments' data
        goes to ``space`` as it is read (see :class:`~._engine.PartitionEngine`); data the
        snapshot refers to (``refs``) is read from ``source``, or, when ``source`` is
        ``space`` (which adopted the files the snapshot refers to), referred to where it is
        and counted by ``space.adopt(start, end)``."""
        unpacker = msgpack.Unpacker(ChunkReader(chunks), raw=False, strict_map_key=False,
                                    read_size=_READ_BYTES, max_buffer_size=0)
        fields = unpacker.read_array_header()
        if fields < 11:
            raise ValueError(f"snapshot has {fields} fields, expected at least 11")
        version, partition, seq, lease_seq, now_ms = (unpacker.unpack() for _ in range(5))
        if version not in READ_SNAPSHOT_VERSIONS:
            raise ValueError(f"unsupported snapshot version {version}")
        eng = cls(partition, space)
        # A space that adopted the snapshot's files (the node's restore) is its own source.
        adopting = source is not None and source is space
        adopt = getattr(space, "adopt", None) if adopting else None
        if adopting and adopt is None:
            raise ValueError("a payload space that is its own source must adopt what the snapshot refers to")
        # One str per distinct queue name, state, group, tag and job name, as the engine that
        # wrote them held them: decoded anew for each job they would cost a string per job and
        # field. States are the engine's own.
        strs: dict[str, str] = {state: state for state in STATES}
        share = strs.setdefault
        ints: dict[int, int] = {}

        def same_int(value: int) -> int:
            if len(ints) > _INTS_MEMO_MAX:
                ints.clear()
            return ints.setdefault(value, value)

        # Runs of jobs a segment's slots can hold (what bulk pushes and runs of single adds leave)
        # come back as segments, as they were held before the snapshot, rather than one Job each.
        segments: list[Segment] = []
        run: _Run | None = None
        job_count = unpacker.read_array_header()
        for _ in range(job_count):
            t = unpacker.unpack()
            if type(t[2]) is msgpack.ExtType:
                if source is None:
                    raise ValueError("the snapshot refers to payload files, and none were given")
                start, end = ref_range(t[2])
                if adopting:  # the bytes are the space's already: referred to, not read
                    t[2] = Stored(space, start, end)  # type: ignore[arg-type]
                    adopt(start, end)
                else:
                    t[2] = source.read(start, end)
            for i in _SHARED_FIELDS:
                if i < len(t) and type(t[i]) is str:
                    t[i] = share(t[i], t[i])
            for i in _SHARED_INTS:
                if i < len(t) and type(t[i]) is int and t[i] > 256:
                    t[i] = same_int(t[i])
            if slot_like(t):
                if run is not None and run.continues(t):
                    run.add(t)
                    continue
                if run is not None:
                    eng._keep_run(run, segments)
                run = _Run(t)
                continue
            if run is not None:
                eng._keep_run(run, segments)
                run = None
            job = Job.from_tuple(t)
            job.data = eng._keep(job.data)
            if job.logs is not None:
                job.logs = [(stamp, line) for stamp, line in job.logs]
            eng.jobs[job.seq] = job
        if run is not None:
            eng._keep_run(run, segments)
        queues, sessions = unpacker.unpack(), unpacker.unpack()
        # The idempotency window can hold an entry per recent job: streamed entry by entry into
        # the window's own table.
        if version == 1:  # key strings: hashed as they come
            def idempotency_order() -> Iterator[tuple[int, str, str]]:
                for _ in range(unpacker.read_array_header()):
                    t, (q_name, key) = unpacker.unpack()
                    yield t, q_name, key

            def idempotency_entries() -> Iterator[tuple[str, str, int, int]]:
                for _ in range(unpacker.read_array_header()):
                    q_name, key, job_id, expires = unpacker.unpack()
                    yield q_name, key, parse_job_id(job_id)[1], expires

            eng.load_idempotency_v1(idempotency_order(), idempotency_entries())  # type: ignore[attr-defined]
        else:
            head = unpacker.unpack()

            def idempotency_hashes() -> Iterator[tuple[int, int, int]]:
                for _ in range(unpacker.read_array_header()):
                    yield unpacker.unpack()

            eng.load_idempotency(head, idempotency_hashes())  # type: ignore[attr-defined]
        del strs, ints
        crons = unpacker.unpack()
        extras = unpacker.unpack() if fields > 11 else {}
        limits = extras.get("limits", {})
        turns = extras.get("groups", {})
        eng.seq, eng.lease_seq, eng.now_ms = seq, lease_seq, now_ms
        for name, qtype, opts, paused, custom_ids, calls, totals, log, log_next, history, dlq in queues:
            q = eng.queues[name] = Queue(name, qtype, opts, custom_of=eng._custom_of)
            q.custom_ids.load(custom_ids.items())
            q.paused, q.calls, q.totals, q.log_next = paused, calls, totals, log_next
            q.log = {lseq: (rec[0], rec[1], rec[2]) for lseq, rec in log.items()}
            # Completion and dead-letter order matter (trimming, Kick), so they are kept as they were.
            q.history = deque(history)
            q.dlq = dict.fromkeys(dlq)
            if q.limiter is not None and name in limits:
                q.limiter.load(limits[name])
            if name in turns:
                q.group_tags = dict(turns[name])  # vtime restarts at 0: tags are kept relative to it
        eng.crons = crons
        if "flows" in extras:
            eng.restore_flows(extras["flows"])
        eng.load_dedupe(extras.get("dedupe", []), hashed=version >= 3)  # type: ignore[attr-defined]  # DedupeOps
        eng.load_forwarded(extras.get("forwarded", []))  # type: ignore[attr-defined]  # ForwardedKeys
        named = sorted(eng._seqs_named_elsewhere()) if segments else []
        for seg in segments:
            eng._place_run(seg, named)
        for job in eng.jobs.values():
            eng._index(job)
        for session, seqs in sessions.items():  # once the jobs are placed: their lease numbers
            eng.sessions.load(session, *eng._leases_of(session, seqs))
        return eng

    def flow_state(self) -> list[object]:
        raise NotImplementedError  # ``_flows.FlowOps``

    def restore_flows(self, state: list[object]) -> None:
        raise NotImplementedError  # ``_flows.FlowOps``

    def _keep_run(self, run: _Run, segments: list[Segment]) -> None:
        """A run of restored slot-like jobs: one segment, or a job when it is alone."""
        if len(run) == 1:
            job = self.jobs[run.head[0]] = Job.from_tuple(run.head)
            job.data = self._keep(job.data)
        else:
            segments.append(run.segment(self.segments.space))

    def _place_run(self, seg: Segment, named: list[int]) -> None:
        """Keep a restored run as a segment: its heap entries and counts (``_hold_segment``).

        Where the per-job path alone made such jobs, they stay jobs (indexed with the rest):
        a log queue's records, and jobs a flow names (its code reads them as jobs).
        ``named``: those seqs, ascending."""
        q = self.queues[seg.queue]
        n = len(seg.states)
        k = bisect_left(named, seg.first)
        if q.type == "log" or (k < len(named) and named[k] < seg.first + n):
            for i in range(n):
                job = slot_job(seg, i, self.partition)
                self.jobs[job.seq] = job  # holds its slot's data now
            self._jobs_unordered = True
            return
        self._hold_segment(q, seg)

    def _seqs_named_elsewhere(self) -> list[int]:
        """Seqs of jobs that flows name."""
        return [*self.flow_parents, *self.flow_children, *self.flow_outbox]

    def _index(self, job: Job) -> None:
        """Rebuild a restored job's place in the indexes."""
        q = self.queues[job.queue]
        q.counts[job.state] += 1
        if job.state == WAITING:
            q.prio_counts[job.priority] = q.prio_counts.get(job.priority, 0) + 1
            if job.group is not None:
                self._group_moved(q, job.group, NEW, WAITING)  # type: ignore[attr-defined]  # ReadyIndex
            self._enqueue_ready(q, job)
        elif job.state == DELAYED:
            self.delayed.push(due_key(job.run_at_ms, job.seq))
            if job.group is not None:
                self._group_moved(q, job.group, NEW, DELAYED)  # type: ignore[attr-defined]  # ReadyIndex
        elif job.state == ACTIVE:
            heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, job.token or "", 0))
            if job.group is not None:
                q.group_active[job.group] = q.group_active.get(job.group, 0) + 1
                q.group_tags.setdefault(job.group, q.group_vtime)
        if job.ttl_deadline_ms and job.state in (WAITING, DELAYED):
            heapq.heappush(self.ttls, (job.ttl_deadline_ms, job.seq))

    def digest(self) -> str:
        """SHA-256 of the snapshot: equal on replicas that applied the same commands."""
        digest = hashlib.sha256()
        for chunk in self.snapshot_chunks():
            digest.update(chunk)
        return digest.hexdigest()
