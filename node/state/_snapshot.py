"""The replicated state as canonical bytes (snapshot, restore) and its digest."""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, Self

import msgpack

from ._model import SNAPSHOT_VERSION, Job, Queue
from ._store import Store
from ._transitions import ACTIVE, DELAYED, WAITING

__all__ = ["SnapshotOps"]

#: Bytes the streaming restore reads from its chunks at a time.
_READ_BYTES = 1 << 20


class _ChunkReader:
    """A file-like ``read`` over an iterator of byte chunks (what msgpack's Unpacker reads from)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buf) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf = self._buf + chunk if self._buf else chunk
        if size < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:size], self._buf[size:]
        return out


class SnapshotOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def snapshot(self) -> bytes:
        """Compact, canonical bytes of the whole replicated state (job data stays raw).

        MessagePack, not pickle: pickle encodes object *identity* (memo references), which
        differs between replicas holding equal state, so its bytes could not be a digest.
        """
        return b"".join(self.snapshot_chunks())

    def snapshot_chunks(self, jobs_per_chunk: int = 10_000) -> Iterator[bytes]:
        """:meth:`snapshot`'s bytes in pieces, ``jobs_per_chunk`` jobs at a time: a large
        partition is written or hashed without holding every job as a tuple at once."""
        packer = msgpack.Packer(use_bin_type=True)
        pack = packer.pack
        head = (SNAPSHOT_VERSION, self.partition, self.seq, self.lease_seq, self.now_ms)
        jobs = self._all_jobs_iter()
        count = len(self.jobs) + sum(len(seg.datas) - seg.datas.count(None) for seg in self.segments)
        # Flows, flow-control windows and dedupe/debounce entries, in one trailing map present only
        # when one of them holds something: a partition using none of them keeps its digest.
        more: dict[str, Any] = {}
        if self.flow_parents or self.flow_children or self.flow_outbox:
            more["flows"] = self.flow_state()
        limits = {n: q.limiter.state(self.now_ms) for n, q in self.queues.items() if q.limiter is not None}
        if limits:
            more["limits"] = limits
        if self.dedupe:  # type: ignore[attr-defined]  # DedupeOps
            more["dedupe"] = self.dedupe_state()  # type: ignore[attr-defined]
        extras = [more] if more else []
        # A packed array is its header followed by its packed items, so packing the job list
        # piecewise gives the same bytes as packing it whole.
        yield packer.pack_array_header(11 + len(extras)) + b"".join(map(pack, head)) + packer.pack_array_header(count)
        while chunk := [pack(j.to_tuple()) for j in islice(jobs, jobs_per_chunk)]:
            yield b"".join(chunk)
        yield b"".join(map(pack, (
            [q.settings() for q in self.queues.values()],
            {s: list(seqs) for s, seqs in self.sessions.items()},
            [(t, list(k)) for t, k in self.idempotency_order],
            [(*k, *v) for k, v in self.idempotency.items()],
            {n: dict(c) for n, c in self.crons.items()},
            *extras,
        )))

    @classmethod
    def restore(cls, data: bytes) -> Self:
        """The engine :meth:`snapshot` produced ``data`` from."""
        return cls.restore_chunks((data,))

    @classmethod
    def restore_chunks(cls, chunks: Iterable[bytes]) -> Self:
        """The engine whose :meth:`snapshot_chunks` gave ``chunks``, read as they come: a large
        snapshot is never held whole, nor its jobs as one list of tuples."""
        unpacker = msgpack.Unpacker(_ChunkReader(chunks), raw=False, strict_map_key=False,
                                    read_size=_READ_BYTES, max_buffer_size=0)
        fields = unpacker.read_array_header()
        if fields < 11:
            raise ValueError(f"snapshot has {fields} fields, expected at least 11")
        version, partition, seq, lease_seq, now_ms = (unpacker.unpack() for _ in range(5))
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {version}")
        eng = cls(partition)
        job_count = unpacker.read_array_header()
        for _ in range(job_count):
            job = Job.from_tuple(unpacker.unpack())
            if job.logs is not None:
                job.logs = [(stamp, line) for stamp, line in job.logs]
            eng.jobs[job.seq] = job
        queues, sessions, idem_order, idem, crons = (unpacker.unpack() for _ in range(5))
        extras = unpacker.unpack() if fields > 11 else {}
        limits = extras.get("limits", {})
        eng.seq, eng.lease_seq, eng.now_ms = seq, lease_seq, now_ms
        for name, qtype, opts, paused, custom_ids, calls, totals, log, log_next, history, dlq in queues:
            q = eng.queues[name] = Queue(name, qtype, opts)
            q.paused, q.custom_ids, q.calls, q.totals, q.log_next = paused, custom_ids, calls, totals, log_next
            q.log = {lseq: (rec[0], rec[1], rec[2]) for lseq, rec in log.items()}
            # Completion and dead-letter order matter (trimming, Kick), so they are kept as they were.
            q.history = deque(history)
            q.dlq = dict.fromkeys(dlq)
            if q.limiter is not None and name in limits:
                q.limiter.load(limits[name])
        for job in eng.jobs.values():
            eng._index(job)
        eng.sessions = {s: dict.fromkeys(seqs) for s, seqs in sessions.items()}
        eng.idempotency_order = deque((t, (k[0], k[1])) for t, k in idem_order)
        eng.idempotency = {(q, k): (job_id, expires) for q, k, job_id, expires in idem}
        eng.crons = crons
        if "flows" in extras:
            eng.restore_flows(extras["flows"])
        eng.load_dedupe(extras.get("dedupe", []))  # type: ignore[attr-defined]  # DedupeOps
        return eng

    def flow_state(self) -> list[object]:
        raise NotImplementedError  # ``_flows.FlowOps``

    def restore_flows(self, state: list[object]) -> None:
        raise NotImplementedError  # ``_flows.FlowOps``

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
                q.group_active[job.group] = q.group_active.get(job.group, 0) + 1
        if job.ttl_deadline_ms and job.state in (WAITING, DELAYED):
            heapq.heappush(self.ttls, (job.ttl_deadline_ms, job.seq))

    def digest(self) -> str:
        """SHA-256 of the snapshot: equal on replicas that applied the same commands."""
        digest = hashlib.sha256()
        for chunk in self.snapshot_chunks():
            digest.update(chunk)
        return digest.hexdigest()
