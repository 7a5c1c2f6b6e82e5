"""Batch read: one Spark input partition per (sub-)queue, each listed from its partition's leader.

A job queue is listed with ``GetJobs`` pages (``pageSize`` jobs, one state at a
time when states are given); a log queue with ``Read`` from sequence 1 up to
the end it had when the task started. Both come back as Arrow record batches,
one per page.

A read is not a snapshot: jobs keep moving while it runs. Pages are in job
order (sequence numbers rise), each asked for after the last sequence number
the previous one returned (``afterSeq``), so a page costs the node its own
jobs however deep into the queue it is, no job comes twice, and a job leaving
the listed states between two pages makes no other one be missed. A job that
moves back into them behind the cursor (a retry) is not read again. Read a
queue that is paused, or a log, for an exact copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, EqualTo, Filter, In, InputPartition
from pyspark.sql.types import StructType

from shoal.client import Client, NotFound

from ._cluster import Layout, connected, wire_names
from ._convert import job_columns, log_columns, to_record_batch
from ._options import EARLIEST, LATEST, STATES, Offsets, OptionError, ReadOptions

__all__ = ["QueuePartition", "ShoalBatchReader", "ShoalPushdownReader", "read_log_range", "DataLoss", "log_ends",
           "resolve_offsets", "legacy_offsets", "log_firsts"]

#: Log offsets: ``{queue: {shard: next sequence number}}`` (the Kafka source's JSON shape).
Positions = dict[str, dict[str, int]]


class DataLoss(RuntimeError):
    """Records between a read's offsets were truncated before they were read (``failOnDataLoss=true``)."""

_PAGES_SLACK = 16


class QueuePartition(InputPartition):
    """One (sub-)queue: its wire name and shard index; for a log, the sequence range ``[start, end)``
    (``end=None``: up to the end at read time)."""

    def __init__(self, queue: str, shard: int, start: int = 1, end: int | None = None, *,
                 base: str | None = None) -> None:
        super().__init__(queue)
        self.queue = queue
        self.shard = shard
        self.start = start
        self.end = end
        self.base = base if base is not None else queue.rpartition("#")[0] or queue

    def __repr__(self) -> str:
        return f"QueuePartition({self.queue!r}, shard={self.shard}, start={self.start}, end={self.end})"


def _list_jobs(client: Client, queue: str, state: str | None, page_size: int) -> Iterator[list[dict[str, Any]]]:
    """Pages of ``queue``'s jobs (in ``state``), in job order, each job once."""
    frame: dict[str, Any] = {"cmd": "GetJobs", "queue": queue, "limit": page_size}
    if state:
        frame["state"] = state
    first = client.call({**frame, "afterSeq": 0})
    pages_max = int(first.get("total") or 0) // page_size + _PAGES_SLACK
    # The next page is asked for before this one is handed on: the node and the network work on it
    # while the caller converts this one. One request ahead at most.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shoal-read") as ahead:
        upcoming: Future[dict[str, Any]] | None = None
        reply = first
        for _ in range(pages_max):  # bounded: the total at the start, plus slack for jobs added meanwhile
            jobs = reply.get("jobs") or []
            upcoming = (ahead.submit(client.call, {**frame, "afterSeq": int(reply["lastSeq"])})
                        if len(jobs) == page_size else None)
            if jobs:
                yield jobs
            if upcoming is None:
                return
            reply = upcoming.result()


def read_log_range(client: Client, queue: str, start: int, end: int | None, page_size: int, *,
                   fail_on_data_loss: bool = False, shard: int = 0) -> Iterator[list[dict[str, Any]]]:
    """Pages of log records of ``queue`` with ``start <= seq < end`` (``end=None``: the end now).

    A sequence number in the range with no record was truncated before this read: with
    ``fail_on_data_loss`` that raises :class:`DataLoss`, else the gap is skipped."""
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
            if fail_on_data_loss:
                raise DataLoss(f"queue {queue} (shard {shard}): the log is gone, records [{seq}, {end}) were not "
                               "read (failOnDataLoss=true; set it to false to skip lost records)") from None
            return
        records = [r for r in reply.get("records") or [] if r["seq"] < end]
        nxt = min(int(reply.get("next") or seq), end)
        if fail_on_data_loss and nxt > seq and len(records) < nxt - seq:
            have = {r["seq"] for r in records}
            lost = next(s for s in range(seq, nxt) if s not in have)
            raise DataLoss(f"queue {queue} (shard {shard}): record {lost} was truncated before it was read "
                           "(failOnDataLoss=true; set it to false to skip lost records)")
        if records:
            yield records
        if nxt <= seq:
            return
        seq = nxt


def log_ends(client: Client, layout: Layout) -> Positions:
    """The next sequence number of every shard of every log queue in ``layout`` (1 if it does not exist)."""
    ends: Positions = {}
    for queue, shards in layout:
        ends[queue] = {}
        for i, name in enumerate(wire_names(queue, shards)):
            try:
                ends[queue][str(i)] = int(client.call({"cmd": "Metrics", "queue": name})["metrics"]
                                          .get("nextSeq") or 1)
            except NotFound:
                ends[queue][str(i)] = 1
    return ends


def log_firsts(client: Client, layout: Layout, ends: Positions) -> Positions:
    """The sequence number of the first record still in every shard (its end when it is empty): what
    ``earliest`` means once a log was truncated."""
    firsts: Positions = {}
    for queue, shards in layout:
        firsts[queue] = {}
        for i, name in enumerate(wire_names(queue, shards)):
            end = ends[queue][str(i)]
            try:
                records = client.call({"cmd": "Read", "queue": name, "fromSeq": 1, "limit": 1}).get("records") or []
            except NotFound:
                records = []
            firsts[queue][str(i)] = int(records[0]["seq"]) if records else end
    return firsts


def legacy_offsets(offsets: dict[str, Any], layout: Layout) -> Positions:
    """An offset of the single-queue form ``{"0": seq}`` (older checkpoints) keyed by its queue."""
    if offsets and all(not isinstance(v, dict) for v in offsets.values()):
        return {layout[0][0]: {k: int(v) for k, v in offsets.items()}}
    return {q: {k: int(v) for k, v in shards.items()} for q, shards in offsets.items()}


def resolve_offsets(spec: Offsets, layout: Layout, ends: Positions, default: str,
                    firsts: Positions | None = None) -> Positions:
    """``earliest``/``latest`` or the JSON spec as sequence numbers for every shard (shards the spec does not
    name take ``default``; -2 is the first record still in the log — ``firsts``, else 1 — and -1 its end now)."""
    given: dict[Any, dict[str, int]] = {} if isinstance(spec, str) else dict(spec)
    if None in given:  # legacy {"0": seq}: the (first) queue's
        given[layout[0][0]] = given.pop(None)
    unknown = sorted(set(given) - {q for q, _ in layout})
    if unknown:
        raise OptionError(f"offsets name queues this read does not cover: {', '.join(unknown)}")
    kind = spec if isinstance(spec, str) else default
    out: Positions = {}
    for queue, _ in layout:
        out[queue] = {}
        for shard, end in ends[queue].items():
            value = given.get(queue, {}).get(shard, EARLIEST if kind == "earliest" else LATEST)
            first = firsts[queue][shard] if firsts is not None else 1
            out[queue][shard] = first if value == EARLIEST else end if value == LATEST else int(value)
    return out


class ShoalBatchReader(DataSourceReader):
    """``spark.read.format("shoal")``: one input partition per (sub-)queue."""

    def __init__(self, options: ReadOptions, layout: Layout, schema: StructType) -> None:
        self.options = options
        self.layout = layout
        self.schema = schema
        self.states: tuple[str, ...] = options.states

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per (sub-)queue; a log's between ``startingOffsets`` and ``endingOffsets``
        (resolved here, once, so every task reads a fixed range)."""
        if self.options.queue_type != "log":
            return [QueuePartition(name, i, base=q) for q, k in self.layout for i, name in enumerate(wire_names(q, k))]
        with connected(self.options.connect) as client:
            ends = log_ends(client, self.layout)
            firsts = log_firsts(client, self.layout, ends)
        start = resolve_offsets(self.options.starting, self.layout, ends, "earliest", firsts)
        stop = resolve_offsets(self.options.ending, self.layout, ends, "latest")
        return [QueuePartition(name, i, start[q][str(i)], max(start[q][str(i)], stop[q][str(i)]), base=q)
                for q, k in self.layout for i, name in enumerate(wire_names(q, k))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's jobs (or log records), one record batch per page."""
        assert isinstance(partition, QueuePartition)
        o = self.options
        with connected(o.connect) as client:
            if o.queue_type == "log":
                for records in read_log_range(client, partition.queue, partition.start, partition.end, o.page_size,
                                              fail_on_data_loss=o.fail_on_data_loss, shard=partition.shard):
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
            wanted = tuple(v for v in dict.fromkeys(values) if v in STATES)
            current = self.states or STATES
            narrowed = tuple(s for s in current if s in wanted)
            self.states = narrowed or ("__none__",)  # no state can match: read nothing
