"""Batch write: every Spark task pushes its rows straight to the partition leaders.

Theory of operation. ``DataSource.writer()`` runs once per write, in the driver's
planner process: it draws the write's id (or takes the ``writeId`` option) and
looks up the shards. The writer is pickled to the tasks. Each task opens its own
:class:`AsyncClient`, turns its Arrow record batches into PUSHB items — column-wise
into pre-encoded ``jobs`` arrays when the columns allow it (``_pack``), else row by
row (:class:`RowsToJobs`) — and keeps at most ``maxInFlight`` PUSHB batches of
``batchSize`` jobs in flight, each routed by the client to the leader of its
(sub-)queue's partition (and re-routed on failover). The task returns a
:class:`ShoalCommitMessage` once every batch is acknowledged.

Exactly-once per row within the node's idempotency window: every job carries
``idempotencyKey = "{writeId}:{partitionId}:{rowIndex}"``. A retried task (or a
speculative copy, or a re-run of the whole write with the same ``writeId``)
sends the same keys to the same sub-queues and the leader answers with the
original ids instead of adding jobs. The window is 120 s from the first push
of a key (``node/state``'s ``IDEMPOTENCY_WINDOW_MS``, replicated with the
partition, so it survives a failover); see ``docs/spark.md`` for what that
means for slow tasks and for ``dedupe=customId``, which lasts as long as the
job is kept.

Commit and abort: a PUSHB is visible to consumers as soon as it is
acknowledged, so there is nothing to publish at commit (it only sums the
tasks' counts) and nothing abort could take back: jobs of an aborted write
stay in the queue (workers may already run them). Re-run the write with the
same ``writeId`` within the window to finish it without duplicates.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from shoal.client import AsyncClient
from shoal.client._core import KeyedPackedPush
from shoal.cluster.codec import Raw

from ._cluster import client_options
from ._convert import RowsToJobs
from ._options import WriteOptions
from ._pack import ColumnPacker, pack_items, packable

__all__ = ["ShoalWriter", "ShoalCommitMessage", "InjectedFailure"]


class InjectedFailure(RuntimeError):
    """Raised by the ``testFailFirstAttempt`` hook (tests of task retries)."""


@dataclass(frozen=True)
class ShoalCommitMessage(WriterCommitMessage):
    """What one task pushed: its partition, attempt, rows and PUSHB batches."""

    partition_id: int
    attempt: int
    rows: int
    batches: int
    seconds: float


class ShoalWriter(DataSourceArrowWriter):
    """The batch writer (``df.write.format("shoal")``); picklable, holds no connection."""

    def __init__(self, options: WriteOptions, shards: int | None) -> None:
        self.options = options
        self.shards = shards
        #: Filled in :meth:`commit` (the driver's copy only): totals of the last committed write.
        self.committed: dict[str, int] = {}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ShoalCommitMessage:
        """Push this task's rows; returns once every PUSHB is acknowledged."""
        ctx = TaskContext.get()
        partition_id = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        started = time.monotonic()
        rows, batches = asyncio.run(asyncio.wait_for(self._push(iterator, partition_id, attempt),
                                                     self.options.task_timeout_s))
        return ShoalCommitMessage(partition_id, attempt, rows, batches, time.monotonic() - started)

    async def _push(self, iterator: Iterator[pa.RecordBatch], partition_id: int, attempt: int) -> tuple[int, int]:
        o = self.options
        convert = RowsToJobs(o, partition_id, self.shards)
        fail_after = None
        if o.fail_first_attempt is not None and o.fail_first_attempt[0] == partition_id and attempt == 0:
            fail_after = o.fail_first_attempt[1]
        async with AsyncClient(list(o.connect.seeds), o.connect.token, client_options(o.connect)) as client:
            sender = _Sender(client, o.max_in_flight)
            batches = iter(iterator)
            first = next(batches, None)
            if first is None:
                return 0, 0
            rest = itertools.chain([first], batches)
            if packable(o, first.schema):
                rows = await self._push_packed(sender, rest, partition_id, fail_after)
            else:
                rows = await self._push_rows(sender, convert, rest, fail_after)
            await sender.finish()
            if fail_after is not None and rows >= fail_after:
                raise InjectedFailure(f"testFailFirstAttempt: task {partition_id} attempt {attempt} "
                                      f"fails after pushing {rows} rows")
            return rows, sender.batches

    async def _push_packed(self, sender: "_Sender", batches: Iterator[pa.RecordBatch], partition_id: int,
                           fail_after: int | None) -> int:
        """Column-wise: each Arrow batch becomes packed PUSHB items with no Python object per row."""
        o = self.options
        packer = ColumnPacker(o.connect.queue_names(self.shards), partition_id, o.batch_size)
        prefix = f"{o.write_id}:{partition_id}:"
        rows = 0
        for batch in batches:
            if fail_after is not None and rows + batch.num_rows >= fail_after:
                batch = batch.slice(0, fail_after - rows)
            for target, count, packed in packer.add(pack_items(o, batch, prefix, rows), rows):
                await sender.send_packed(target, count, packed)
            rows += batch.num_rows
            if fail_after is not None and rows >= fail_after:
                break
        for target, count, packed in packer.rest():
            await sender.send_packed(target, count, packed)
        return rows

    async def _push_rows(self, sender: "_Sender", convert: RowsToJobs, batches: Iterator[pa.RecordBatch],
                         fail_after: int | None) -> int:
        """Row by row (nested or temporal columns, JSON data, per-row job fields)."""
        o = self.options
        pending: dict[str, list[dict[str, Any]]] = {}
        rows = 0
        for batch in batches:
            for target, item in convert.convert(batch, rows):
                buf = pending.setdefault(target, [])
                buf.append(item)
                if len(buf) >= o.batch_size:
                    await sender.send(target, buf)
                    pending[target] = []
                rows += 1
                if fail_after is not None and rows >= fail_after:
                    break
            if fail_after is not None and rows >= fail_after:
                break
        for target, buf in pending.items():
            if buf:
                await sender.send(target, buf)
        return rows

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: the jobs are already in the queue; record the totals."""
        done = [m for m in messages if isinstance(m, ShoalCommitMessage)]
        self.committed = {"tasks": len(done), "rows": sum(m.rows for m in done),
                          "batches": sum(m.batches for m in done)}

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The write failed: jobs pushed by its tasks stay queued (a push cannot be taken back).
        Re-run it with the same ``writeId`` within the idempotency window to complete it without duplicates."""


class _Sender:
    """At most ``in_flight_max`` PUSHB batches in flight; the first failure is raised by :meth:`finish`
    (and by the next :meth:`send`)."""

    def __init__(self, client: AsyncClient, in_flight_max: int) -> None:
        self.client = client
        self.slots = asyncio.Semaphore(in_flight_max)
        self.tasks: set[asyncio.Task[None]] = set()
        self.error: BaseException | None = None
        self.batches = 0

    async def send(self, target: str, jobs: list[dict[str, Any]]) -> None:
        """Send one PUSHB of job items."""
        await self._start({"cmd": "PUSHB", "queue": target, "jobs": jobs}, len(jobs))

    async def send_packed(self, target: str, count: int, packed: bytes) -> None:
        """Send one PUSHB whose ``jobs`` array (``count`` keyed items) is already MessagePack."""
        await self._start(KeyedPackedPush(cmd="PUSHB", queue=target, jobs=Raw(packed)), count)

    async def _start(self, frame: dict[str, Any], count: int) -> None:
        if self.error is not None:
            await self.finish()
        await self.slots.acquire()
        task = asyncio.get_running_loop().create_task(self._one(frame, count))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        await asyncio.sleep(0)  # let the connection write it out while we build the next batch

    async def _one(self, frame: dict[str, Any], count: int) -> None:
        try:
            reply = await self.client.call(frame)
            got = len(reply.get("ids") or ())
            if got != count:
                raise RuntimeError(f"PUSHB to {frame['queue']}: {count} jobs sent, {got} ids back")
            self.batches += 1
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise
        finally:
            self.slots.release()

    async def finish(self) -> None:
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        if self.error is not None:
            raise self.error
