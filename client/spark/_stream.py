"""Streaming reads: log queues exactly once by offsets, job queues at least once with acks on commit.

**Log queues.** The offset is ``{"<queue>": {"<shard>": next sequence number}}``, the
Kafka source's shape (an older checkpoint's ``{"<shard>": seq}`` is read as the first
queue's). A micro-batch reads ``[start, end)`` of each shard; records stay in the log until
truncated, so a batch re-run after a failure reads the same records, and Spark's
checkpointed offsets make the output exactly once. ``commit`` has nothing to do. A record
truncated before it was read fails the batch (``failOnDataLoss=true``) or is skipped.

**Admission control** (Kafka's options): ``maxOffsetsPerTrigger`` caps a micro-batch's rows
(shared fairly between the shards that have data); ``minOffsetsPerTrigger`` holds a trigger
back until that many rows are available or ``maxTriggerDelay`` passed since the last batch;
``Trigger.AvailableNow`` fixes the target when the query starts and stops once it is read.

**Job queues.** A job is pulled (leased for ``leaseSeconds``) by the task that reads it; the
offset is only a batch counter ``{"batch": n}``. Before yielding its jobs, a task records
their ids and lease tokens in a side log queue ``<queue>.spark-acks``. Spark calls
``commit(end)`` once the batch's output is committed — in practice when it plans the
next batch — and that acks every job recorded for batches up to ``end`` (ACKB with the
tokens) and truncates the side log. So a job is acked only after the batch that carried
it was committed; a batch that failed, or the last batch before the query stopped (Spark
never commits it: an ``availableNow`` run ends without planning another), is not acked,
its leases lapse and the jobs are delivered again: at least once, never lost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from shoal.client import InvalidState, LeaseMismatch, NotFound
from shoal.client._core import ms

from ._cluster import Layout, connected, wire_names
from ._convert import job_columns, log_columns, to_record_batch
from ._options import StreamOptions
from ._read import Positions, QueuePartition, legacy_offsets, log_ends, log_firsts, read_log_range, resolve_offsets

__all__ = ["ShoalLogStreamReader", "ShoalJobStreamReader", "JobBatchPartition", "acks_queue", "share_limit"]


def acks_queue(queue: str) -> str:
    """The side log queue that remembers what each micro-batch pulled from ``queue`` (the query's first)."""
    return f"{queue}.spark-acks"


def share_limit(available: dict[Any, int], limit: int) -> dict[Any, int]:
    """At most ``limit`` in total, split fairly: shards with less than an equal share take all theirs,
    the rest is shared among the others."""
    out: dict[Any, int] = {}
    budget = limit
    ordered = sorted(available.items(), key=lambda kv: kv[1])
    for i, (key, count) in enumerate(ordered):
        give = min(count, budget // (len(ordered) - i))
        out[key] = give
        budget -= give
    return out


class _Admission:
    """``minOffsetsPerTrigger`` + ``maxTriggerDelay``: whether a trigger may start a batch now."""

    def __init__(self, options: StreamOptions) -> None:
        self.min_rows = options.min_per_trigger
        self.delay_s = options.max_trigger_delay_s
        self.last = time.monotonic()

    def allows(self, available: int, limit: ReadLimit) -> bool:
        if available <= 0:
            return False
        if self.min_rows is None or isinstance(limit, ReadAllAvailable) or available >= self.min_rows:
            return True
        return time.monotonic() - self.last >= self.delay_s

    def started(self) -> None:
        self.last = time.monotonic()


class ShoalLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("shoal")`` over log queues: per-queue, per-shard sequence offsets."""

    def __init__(self, options: StreamOptions, layout: Layout, schema: StructType) -> None:
        self.options = options
        self.layout = layout
        self.schema = schema
        self.admission = _Admission(options)
        self.target: Positions | None = None  # Trigger.AvailableNow: the ends when the query started

    def _ends(self) -> Positions:
        with connected(self.options.connect) as client:
            return log_ends(client, self.layout)

    def initialOffset(self) -> dict:  # noqa: N802 (Spark's name)
        """``earliest`` (every shard from 1), ``latest`` (the current ends) or the given JSON."""
        with connected(self.options.connect) as client:
            ends = log_ends(client, self.layout)
            firsts = log_firsts(client, self.layout, ends)
        return resolve_offsets(self.options.starting, self.layout, ends, "earliest", firsts)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Fix the target: the ends now. Batches stop there, whatever is appended later."""
        self.target = self._ends()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        """The current ends (capped by the AvailableNow target), admitted and cut to the limit's rows."""
        begin = legacy_offsets(start, self.layout)
        ends = self.target if self.target is not None else self._ends()
        room = {(q, s): max(0, end - begin.get(q, {}).get(s, 1)) for q, shards in ends.items()
                for s, end in shards.items()}
        if not self.admission.allows(sum(room.values()), limit):
            return begin
        if isinstance(limit, ReadMaxRows):
            room = share_limit(room, limit.max_rows)
        self.admission.started()
        return {q: {s: begin.get(q, {}).get(s, 1) + room[(q, s)] for s in shards} for q, shards in ends.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One partition per shard with new records: ``[start, end)``."""
        begin, stop = legacy_offsets(start, self.layout), legacy_offsets(end, self.layout)
        out = []
        for queue, shards in self.layout:
            for i, name in enumerate(wire_names(queue, shards)):
                a, b = begin.get(queue, {}).get(str(i), 1), stop.get(queue, {}).get(str(i), 1)
                if b > a:
                    out.append(QueuePartition(name, i, a, b, base=queue))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueuePartition)
        o = self.options
        with connected(o.connect) as client:
            for records in read_log_range(client, partition.queue, partition.start, partition.end, o.page_size,
                                          fail_on_data_loss=o.fail_on_data_loss, shard=partition.shard):
                yield to_record_batch(log_columns(partition.queue, partition.shard, records, o.data_format),
                                      self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpointed offsets are the whole state."""


class JobBatchPartition(InputPartition):
    """One shard's share of a job-queue micro-batch."""

    def __init__(self, queue: str, shard: int, batch: int, count: int) -> None:
        super().__init__(queue)
        self.queue, self.shard, self.batch, self.count = queue, shard, batch, count


class ShoalJobStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("shoal")`` over job queues: pull, ack when the batch commits."""

    def __init__(self, options: StreamOptions, layout: Layout, schema: StructType) -> None:
        self.options = options
        self.layout = layout
        self.names = [name for q, k in layout for name in wire_names(q, k)]
        self.schema = schema
        self.admission = _Admission(options)
        #: Trigger.AvailableNow: batches left to drain what was waiting when the query started.
        self.batches_left: int | None = None

    def _share(self) -> int:
        return max(1, self.options.max_per_batch // len(self.names))

    def _waiting(self) -> dict[str, int]:
        counts = {}
        with connected(self.options.connect) as client:
            for name in self.names:
                try:
                    counts[name] = int(client.call({"cmd": "Count", "queue": name, "state": "waiting"})["count"])
                except NotFound:
                    counts[name] = 0
        return counts

    def initialOffset(self) -> dict:  # noqa: N802
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Enough batches to drain the jobs waiting now (each pulls up to its share from every shard)."""
        self.batches_left = max((math.ceil(n / self._share()) for n in self._waiting().values()), default=0)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        """A new batch when enough jobs wait (``minOffsetsPerTrigger``/``maxTriggerDelay``); else no new data."""
        if self.batches_left is not None and self.batches_left <= 0:
            return start
        if not self.admission.allows(sum(self._waiting().values()), limit):
            return start
        self.admission.started()
        if self.batches_left is not None:
            self.batches_left -= 1
        return {"batch": int(start["batch"]) + 1}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [JobBatchPartition(name, i, int(end["batch"]), self._share()) for i, name in enumerate(self.names)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Pull up to the share of jobs, record them for the ack, then yield them."""
        assert isinstance(partition, JobBatchPartition)
        o = self.options
        side = acks_queue(o.connect.queue or self.layout[0][0])
        with connected(o.connect) as client:
            # detach: the lease must outlive this task's connection until the commit acks it.
            reply = client.call({"cmd": "PULLB", "queue": partition.queue, "count": partition.count,
                                 "ttr": ms(o.lease_s), "detach": True})
            jobs, tokens = reply.get("jobs") or [], reply.get("tokens") or []
            if not jobs:
                return
            client.queue(side).create("log")
            client.call({"cmd": "PUSH", "queue": side,
                         "data": {"batch": partition.batch, "queue": partition.queue,
                                  "ids": [j["id"] for j in jobs], "tokens": tokens}})
        yield to_record_batch(job_columns(jobs, o.data_format), self.schema)

    def commit(self, end: dict) -> None:
        """Ack every job pulled by batches up to ``end`` (their output is committed)."""
        upto = int(end["batch"])
        side = acks_queue(self.options.connect.queue or self.layout[0][0])
        with connected(self.options.connect) as client:
            seq, last_done, contiguous = 1, 0, True
            for _ in range(10_000):  # bounded: each round reads a page of the side log
                try:
                    reply = client.call({"cmd": "Read", "queue": side, "fromSeq": seq, "limit": 1000})
                except NotFound:
                    return
                records = reply.get("records") or []
                for rec in records:
                    d: dict[str, Any] = rec["data"]
                    if d["batch"] > upto:
                        contiguous = False  # keep it and everything after it for a later commit
                        continue
                    _ack(client, d["ids"], d["tokens"])
                    if contiguous:
                        last_done = rec["seq"]
                nxt = int(reply.get("next") or seq)
                if not records or nxt <= seq:
                    break
                seq = nxt
            if last_done:
                client.call({"cmd": "Truncate", "queue": side, "beforeSeq": last_done + 1})


def _ack(client: Any, ids: list[str], tokens: list[str]) -> None:
    """ACKB the batch; if some lease lapsed (ACKB is all or nothing), ack the others one by one."""
    try:
        client.call({"cmd": "ACKB", "ids": ids, "tokens": tokens})
        return
    except (LeaseMismatch, InvalidState, NotFound):
        pass
    for job_id, token in zip(ids, tokens):
        try:
            client.call({"cmd": "ACK", "id": job_id, "token": token})
        except (LeaseMismatch, InvalidState, NotFound):
            pass  # lapsed (delivered again: at least once) or already acked by an earlier commit
