"""Batch read: one Spark input partition per (sub-)queue, each listed from its partition's leader.

A job queue is listed with ``GetJobs`` pages (``pageSize`` jobs, one state at a
time when states are given); a log queue with ``Read`` from sequence 1 up to
the end it had when the task started. Both come back as Arrow record batches,
one per page.

A read is not a snapshot: jobs keep moving while it runs. Pages are in job
order (sequence numbers rise), so a task skips anything at or below the last
sequence it returned and never yields a job twice; a job that leaves the
listed states between two pages shifts the offsets and can make the task miss
one that was further on. Read a queue that is paused, or a log, for an exact
copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, EqualTo, Filter, In, InputPartition
from pyspark.sql.types import StructType

from shoal.client import Client, NotFound
from shoal.cluster.jobid import parse_job_id

from ._cluster import connected
from ._convert import job_columns, log_columns, to_record_batch
from ._options import ReadOptions

__all__ = ["QueuePartition", "ShoalBatchReader", "ShoalPushdownReader", "read_log_range"]

_STATES = ("waiting", "delayed", "active", "completed", "failed")
_PAGES_SLACK = 16


class QueuePartition(InputPartition):
    """One (sub-)queue: its wire name and shard index; for a log, the sequence range ``[start, end)``
    (``end=None``: up to the end at read time)."""

    def __init__(self, queue: str, shard: int, start: int = 1, end: int | None = None) -> None:
        super().__init__(queue)
        self.queue = queue
        self.shard = shard
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"QueuePartition({self.queue!r}, shard={self.shard}, start={self.start}, end={self.end})"


def _seq(job_id: str) -> int:
    return parse_job_id(job_id)[1]


def _list_jobs(client: Client, queue: str, state: str | None, page_size: int) -> Iterator[list[dict[str, Any]]]:
    """Pages of ``queue``'s jobs (in ``state``), in job order, each job once."""
    frame: dict[str, Any] = {"cmd": "GetJobs", "queue": queue, "limit": page_size}
    if state:
        frame["state"] = state
    first = client.call({**frame, "offset": 0})
    pages_max = int(first.get("total") or 0) // page_size + _PAGES_SLACK
    reply, offset, last_seq = first, 0, 0
    for _ in range(pages_max):  # bounded: the total at the start, plus slack for jobs added meanwhile
        jobs = reply.get("jobs") or []
        fresh = [j for j in jobs if _seq(j["id"]) > last_seq]
        if fresh:
            last_seq = _seq(fresh[-1]["id"])
            yield fresh
        if len(jobs) < page_size:
            return
        offset += len(jobs)
        reply = client.call({**frame, "offset": offset})


def read_log_range(client: Client, queue: str, start: int, end: int | None,
                   page_size: int) -> Iterator[list[dict[str, Any]]]:
    """Pages of log records of ``queue`` with ``start <= seq < end`` (``end=None``: the end now)."""
    if end is None:
        try:
            end = int(client.call({"cmd": "Metrics", "queue": queue})["metrics"].get("nextSeq") or 1)
        except NotFound:
            return
    seq = max(1, start)
    pages_max = (end - seq) // page_size + _PAGES_SLACK
    for _ in range(pages_max):  # bounded: each page moves ``seq`` on by up to page_size
        if seq >= end:
            return
        try:
            reply = client.call({"cmd": "Read", "queue": queue, "fromSeq": seq,
                                 "limit": min(page_size, end - seq)})
        except NotFound:
            return
        records = [r for r in reply.get("records") or [] if r["seq"] < end]
        if records:
            yield records
        nxt = int(reply.get("next") or seq)
        if nxt <= seq:
            return
        seq = nxt


class ShoalBatchReader(DataSourceReader):
    """``spark.read.format("shoal")``: one input partition per (sub-)queue."""

    def __init__(self, options: ReadOptions, shards: int | None, schema: StructType) -> None:
        self.options = options
        self.shards = shards
        self.schema = schema
        self.states: tuple[str, ...] = options.states

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per (sub-)queue."""
        return [QueuePartition(name, i) for i, name in enumerate(self.options.connect.queue_names(self.shards))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's jobs (or log records), one record batch per page."""
        assert isinstance(partition, QueuePartition)
        o = self.options
        with connected(o.connect) as client:
            if o.queue_type == "log":
                for records in read_log_range(client, partition.queue, partition.start, partition.end, o.page_size):
                    yield to_record_batch(log_columns(partition.queue, partition.shard, records, o.data_format),
                                          self.schema)
                return
            if self.states == ("__none__",):
                return
            states: Iterable[str | None] = self.states or (None,)
            seen: set[str] | None = set() if len(self.states) > 1 else None
            for state in states:
                for jobs in _list_jobs(client, partition.queue, state, o.page_size):
                    if seen is not None:  # a job can move between two listed states mid-read
                        jobs = [j for j in jobs if j["id"] not in seen]
                        seen.update(j["id"] for j in jobs)
                    if jobs:
                        yield to_record_batch(job_columns(jobs, o.data_format), self.schema)


class ShoalPushdownReader(ShoalBatchReader):
    """The batch reader that also takes ``state = 'x'`` and ``state IN (...)`` filters from Spark
    (option ``filterPushdown=true``; needs ``spark.sql.python.filterPushdown.enabled=true``)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Push equality/IN filters on ``state`` down to ``GetJobs``; return the rest to Spark."""
        for f in filters:
            values: tuple[Any, ...] | None = None
            if isinstance(f, EqualTo) and f.attribute == ("state",):
                values = (f.value,)
            elif isinstance(f, In) and f.attribute == ("state",):
                values = tuple(f.value)
            if values is None or self.options.queue_type == "log":
                yield f
                continue
            wanted = tuple(v for v in dict.fromkeys(values) if v in _STATES)
            current = self.states or _STATES
            narrowed = tuple(s for s in current if s in wanted)
            self.states = narrowed or ("__none__",)  # no state can match: read nothing
