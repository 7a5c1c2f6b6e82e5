"""Streaming reads: log queues exactly once by offsets, job queues at least once with acks on commit.

**Log queues.** The offset is ``{"<shard>": next sequence number}`` per (sub-)queue. A
micro-batch reads ``[start, end)`` of each shard; records stay in the log until truncated,
so a batch re-run after a failure reads the same records, and Spark's checkpointed offsets
make the output exactly once. ``commit`` has nothing to do.

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

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from shoal.client import InvalidState, LeaseMismatch, NotFound
from shoal.client._core import ms

from ._cluster import connected
from ._convert import job_columns, log_columns, to_record_batch
from ._options import StreamOptions
from ._read import QueuePartition, read_log_range

__all__ = ["ShoalLogStreamReader", "ShoalJobStreamReader", "JobBatchPartition", "acks_queue"]


def acks_queue(queue: str) -> str:
    """The side log queue that remembers what each micro-batch pulled from ``queue``."""
    return f"{queue}.spark-acks"


class ShoalLogStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("shoal")`` over a log queue: per-shard sequence offsets."""

    def __init__(self, options: StreamOptions, shards: int | None, schema: StructType) -> None:
        self.options = options
        self.names = options.connect.queue_names(shards)
        self.schema = schema

    def _ends(self) -> dict[str, int]:
        ends = {}
        with connected(self.options.connect) as client:
            for i, name in enumerate(self.names):
                try:
                    ends[str(i)] = int(client.call({"cmd": "Metrics", "queue": name})["metrics"].get("nextSeq") or 1)
                except NotFound:
                    ends[str(i)] = 1
        return ends

    def initialOffset(self) -> dict:  # noqa: N802 (Spark's name)
        """``earliest`` (every shard from 1), ``latest`` (the current ends) or the given JSON."""
        starting = self.options.starting
        if starting == "earliest":
            return {str(i): 1 for i in range(len(self.names))}
        if starting == "latest":
            return self._ends()
        import json
        given = json.loads(starting)
        return {str(i): int(given.get(str(i), 1)) for i in range(len(self.names))}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.max_per_batch)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        """The current end of every shard, capped so one batch reads at most the limit's rows."""
        ends = self._ends()
        if isinstance(limit, ReadAllAvailable) or not isinstance(limit, ReadMaxRows):
            return {k: max(int(start.get(k, 1)), v) for k, v in ends.items()}
        share = max(1, limit.max_rows // max(1, len(ends)))
        return {k: max(int(start.get(k, 1)), min(v, int(start.get(k, 1)) + share)) for k, v in ends.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One partition per shard with new records: ``[start, end)``."""
        return [QueuePartition(name, i, int(start.get(str(i), 1)), int(end[str(i)]))
                for i, name in enumerate(self.names) if int(end[str(i)]) > int(start.get(str(i), 1))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueuePartition)
        o = self.options
        with connected(o.connect) as client:
            for records in read_log_range(client, partition.queue, partition.start, partition.end, o.page_size):
                yield to_record_batch(log_columns(partition.queue, partition.shard, records, o.data_format),
                                      self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpointed offsets are the whole state."""


class JobBatchPartition(InputPartition):
    """One shard's share of a job-queue micro-batch."""

    def __init__(self, queue: str, shard: int, batch: int, count: int) -> None:
        super().__init__(queue)
        self.queue, self.shard, self.batch, self.count = queue, shard, batch, count


class ShoalJobStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("shoal")`` over a job queue: pull, ack when the batch commits."""

    def __init__(self, options: StreamOptions, shards: int | None, schema: StructType) -> None:
        self.options = options
        self.names = options.connect.queue_names(shards)
        self.schema = schema

    def initialOffset(self) -> dict:  # noqa: N802
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.options.max_per_batch)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        """A new batch when some shard has waiting jobs; otherwise no new data."""
        with connected(self.options.connect) as client:
            for name in self.names:
                try:
                    if client.call({"cmd": "Count", "queue": name, "state": "waiting"})["count"]:
                        return {"batch": int(start["batch"]) + 1}
                except NotFound:
                    continue
        return start

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        count = max(1, self.options.max_per_batch // len(self.names))
        return [JobBatchPartition(name, i, int(end["batch"]), count) for i, name in enumerate(self.names)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Pull up to the share of jobs, record them for the ack, then yield them."""
        assert isinstance(partition, JobBatchPartition)
        o = self.options
        with connected(o.connect) as client:
            # detach: the lease must outlive this task's connection until the commit acks it.
            reply = client.call({"cmd": "PULLB", "queue": partition.queue, "count": partition.count,
                                 "ttr": ms(o.lease_s), "detach": True})
            jobs, tokens = reply.get("jobs") or [], reply.get("tokens") or []
            if not jobs:
                return
            client.queue(acks_queue(o.connect.queue)).create("log")
            client.call({"cmd": "PUSH", "queue": acks_queue(o.connect.queue),
                         "data": {"batch": partition.batch, "queue": partition.queue,
                                  "ids": [j["id"] for j in jobs], "tokens": tokens}})
        yield to_record_batch(job_columns(jobs, o.data_format), self.schema)

    def commit(self, end: dict) -> None:
        """Ack every job pulled by batches up to ``end`` (their output is committed)."""
        upto = int(end["batch"])
        side = acks_queue(self.options.connect.queue)
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
