"""``BatchWorker``: runs a handler over a queue's jobs a batch at a time.

Each of ``concurrency`` slots leases jobs with ``PULLB`` until a batch is ready (see
:class:`BatchOptions`: ``size``, ``min_size``, ``timeout``, ``group_affinity``: then, after a
batch's first job, only jobs of its group, limited on the node), hands the handler
a :class:`Batch` (a sequence of jobs), and settles it: the jobs it did not fail alone complete
with one ``ACKB`` (per queue), the failed ones with ``FAIL`` each, pipelined. The handler's
return value is the jobs' result (a list of one item per job gives each its own); an exception
fails every job of the batch not already settled alone (retried with the queue's backoff while
attempts remain), and :class:`~shoal.client.worker.Retry` puts them back.

One heartbeat extends every held job's lease (waiting for its batch or running in one) every
``lease / 3`` seconds with ``JobHeartbeatB``, one frame per queue; when a heartbeat covers fewer
jobs than it named, each is touched alone to learn which were cancelled (``job.cancelled`` is set
for the handler to check, and nothing is acked for it) or lost.

``close(grace)`` behaves as the :class:`~shoal.client.worker.Worker`'s: no new batch starts,
running handlers get ``grace`` seconds, and every job still held (running past the grace, or
collected for a batch that did not start) is released at once rather than left to its lease.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import _tracing
from ._async import AsyncClient
from ._batching import (BATCH_SIZE_MAX, Batch, BatchCollector, BatchOptions, Settlement, ack_frames,
                        heartbeat_frames, settle_plan)
from ._core import ms
from ._loop import LoopRunner
from ._sync import Client
from .exceptions import Cancelled, CommandError, LeaseMismatch, NotFound, ShoalError
from .job import Job
from .queue import Queue
from .worker import Retry, Worker

__all__ = ["BatchWorker", "BatchOptions", "Batch", "BATCH_SIZE_MAX"]

log = logging.getLogger(__name__)

BatchHandler = Callable[[Batch], Any] | Callable[[Batch], Awaitable[Any]]


class BatchWorker(Worker):
    """Process queue ``queue`` of ``client`` with ``handler``, which takes a :class:`Batch`.

        async def store(batch):
            saved = await db.insert_many([job.data for job in batch])
            for job, ok in zip(batch, saved):
                if not ok:
                    batch.fail(job, "duplicate key")   # this job alone fails
            # returning acks the others in one ACKB

        async with BatchWorker(client, "rows", store, batch=BatchOptions(size=100, min_size=10, timeout=0.25)):
            ...

    ``batch``: how batches form; ``concurrency``: batches handled at once; ``lease``,
    ``poll_timeout``, ``close_grace``, ``shards``, ``watch_cancel``: as for
    :class:`~shoal.client.worker.Worker`. With a sync :class:`Client`, a plain-function handler runs
    in a thread (``with BatchWorker(client, "q", fn): ...``).
    """

    def __init__(self, client: AsyncClient | Client, queue: str, handler: BatchHandler, *,
                 batch: BatchOptions = BatchOptions(), concurrency: int = 1, lease: float = 30.0,
                 poll_timeout: float = 1.0, close_grace: float = 30.0, shards: int | None = None,
                 watch_cancel: bool = False) -> None:
        if not isinstance(batch, BatchOptions):
            raise TypeError("batch must be a BatchOptions")
        super().__init__(client, queue, handler, concurrency=concurrency, lease=lease,  # type: ignore[arg-type]
                         poll_timeout=poll_timeout, close_grace=close_grace, shards=shards,
                         watch_cancel=watch_cancel)
        self.batch = batch
        #: Batches handed to the handler so far.
        self.batches = 0

    def __repr__(self) -> str:
        return (f"<BatchWorker {self.queue.name!r} size={self.batch.size} concurrency={self.concurrency} "
                f"batches={self.batches} processed={self.processed} failed={self.failed} "
                f"held={self.held}>")

    @property
    def held(self) -> int:
        """Jobs leased by this worker now: collected for a batch or in one that runs."""
        return len(self._running)

    def _spawn(self) -> None:
        super()._spawn()
        slots = self._tasks[:self.concurrency]
        self._tasks.append(asyncio.get_running_loop().create_task(self._heartbeats(slots)))

    # --- one slot: collect, run, settle ---------------------------------------------------------

    async def _slot(self, index: int) -> None:
        assert self._stopping is not None
        collector = BatchCollector(self.batch, self.poll_timeout)
        while not self._stopping.is_set():
            pull = collector.next_pull(time.monotonic())
            if pull is None:
                await self._run(Batch(collector.take(time.monotonic())))
                continue
            try:
                jobs = await self.queue.pull_many(pull.count, pull.wait_s, ttr=self.lease, group=pull.group,
                                                  ungrouped=pull.ungrouped)
            except asyncio.CancelledError:
                raise
            except ShoalError as exc:
                await self._pull_failed(index, exc)
                continue
            for job in jobs:
                self._running[job.id] = job  # held from now on: heartbeats extend it, close() releases it
            collector.add(jobs, time.monotonic())
        # Jobs collected for a batch that did not start stay in ``_running``: close() releases them.

    async def _run(self, batch: Batch) -> None:
        self.batches += 1
        consumer = _tracing.process_batch(self.queue.name, list(batch), self.client)  # None unless a provider is set
        if consumer is None:
            await self._handle_batch(batch, None)
        else:
            with consumer:  # the batch's CONSUMER span: current while the handler runs and the jobs settle
                await self._handle_batch(batch, consumer)
        for job in batch:
            self._running.pop(job.id, None)

    async def _handle_batch(self, batch: Batch, consumer: _tracing.Processing | None) -> None:
        try:
            result = await self._invoke_batch(batch)
        except Retry as retry:
            plan = settle_plan(batch, retry_delay=retry.delay)
        except asyncio.CancelledError:
            raise  # close() releases the jobs of cancelled slots
        except Exception as exc:  # the handler's failure is every job's failure
            if consumer is not None:
                consumer.failed(exc)
            plan = settle_plan(batch, error=exc)
        else:
            plan = settle_plan(batch, result=result)
        await self._settle_batch(plan)

    async def _invoke_batch(self, batch: Batch) -> Any:
        if self._is_async:
            return await self.handler(batch)  # type: ignore[arg-type,misc]
        loop = asyncio.get_running_loop()
        handle = Queue(self.queue, LoopRunner(loop))  # blocking job.set_progress() from the thread
        for job in batch:
            job.handle = handle
        # In a copy of this task's context, as the single-job Worker runs its handler.
        result = await loop.run_in_executor(self._executor, contextvars.copy_context().run,
                                            self.handler, batch)  # type: ignore[arg-type]
        if inspect.isawaitable(result):
            result = await result
        return result

    # --- settling -------------------------------------------------------------------------------

    async def _settle_batch(self, plan: Settlement) -> None:
        self.cancelled += len(plan.cancelled)
        self.failed += len(plan.fails)
        self.retried += len(plan.releases)
        await asyncio.gather(
            *(self._ack_chunk(jobs, frame) for jobs, frame in ack_frames(plan.acks)),
            *(self._settle(job, self.queue.fail(job, error, delay=delay)) for job, error, delay in plan.fails),
            *(self._settle(job, self.queue.release(job, delay=delay)) for job, delay in plan.releases))

    async def _ack_chunk(self, jobs: list[Job], frame: dict[str, Any]) -> None:
        op = _tracing.settle(self.queue, "ack", None, len(jobs))  # None unless a provider is set
        try:
            call = self.queue.client.call(frame)
            await (call if op is None else op.run(call))
        except CommandError as exc:
            # ACKB is all or nothing: one job cancelled or re-leased refuses the lot. Ack each
            # alone so that the others complete.
            log.info("batch worker: ACKB of %d jobs refused (%s); acking them one by one", len(jobs), exc)
            results = frame.get("results") or [None] * len(jobs)
            await asyncio.gather(*(self._ack_alone(job, result) for job, result in zip(jobs, results)))
        except ShoalError as exc:
            log.warning("batch worker: acking %d jobs failed (%s); their leases will lapse and they are "
                        "redelivered", len(jobs), exc)
        else:
            self.processed += len(jobs)

    async def _ack_alone(self, job: Job, result: Any) -> None:
        try:
            await self.queue.ack(job, result)
        except Cancelled:
            self.cancelled += 1
            log.info("batch worker: %s was cancelled while its batch ran; acking nothing", job.id)
        except ShoalError as exc:
            log.warning("batch worker: acking %s failed (%s); its lease will lapse and it is redelivered",
                        job.id, exc)
        else:
            self.processed += 1

    # --- leases ---------------------------------------------------------------------------------

    async def _heartbeats(self, slots: list[asyncio.Task[None]]) -> None:
        """Extend every held job's lease each ``lease / 3`` seconds until the slots end (a close's
        grace included: its running batches keep their leases)."""
        while True:
            _, pending = await asyncio.wait(slots, timeout=self.lease / 3)
            if not pending:
                return
            held = list(self._running.values())
            await asyncio.gather(*(self._beat(jobs, frame) for jobs, frame in heartbeat_frames(held, ms(self.lease))))

    async def _beat(self, jobs: list[Job], frame: dict[str, Any]) -> None:
        try:
            reply = await self.queue.client.call(frame)
        except ShoalError as exc:
            log.warning("batch worker: extending %d leases failed: %s", len(jobs), exc)
            return
        if int(reply.get("count", len(jobs))) < len(jobs):
            # Some job was cancelled, re-leased or settled meanwhile: ask each which.
            await asyncio.gather(*(self._touch(job) for job in jobs if job.id in self._running))

    async def _touch(self, job: Job) -> None:
        try:
            await self.queue.extend(job, self.lease)
        except Cancelled:
            self._cancel_job(job)
        except (LeaseMismatch, NotFound) as exc:
            log.warning("batch worker: lost the lease of %s (%s); another worker may run it", job.id, exc)
        except ShoalError as exc:
            log.info("batch worker: extending %s failed: %s", job.id, exc)
