"""``Worker``: runs a handler over a queue's jobs with a concurrency limit.

Each of ``concurrency`` slots long-polls a job, runs the handler, and while it
runs extends the lease every ``lease / 3`` seconds. The handler's return value
acks the job (it becomes the job's result); an exception fails the attempt with
its text (the node retries it with the queue's backoff while attempts remain,
then dead-letters it); :class:`Retry` puts it back after a delay. Inside the
handler ``job.set_progress(n)`` and ``job.add_log(text)`` report on the job.

``close(grace)`` stops taking jobs, lets running handlers finish within
``grace`` seconds, and releases the jobs of those that did not. Leases belong to
the client's session, which every connection re-identifies with after a
reconnect, so a worker keeps its jobs across a short link failure (within the
node's session grace).

A job cancelled while its handler runs (``queue.cancel(id)``) stops: the worker
learns it when its next lease extension answers ``CANCELLED`` or, with
``watch_cancel=True``, from the queue's event stream within moments; it then
cancels an async handler's task (the handler sees ``asyncio.CancelledError``) or
sets ``job.cancelled`` for a plain-function handler to check, and acks nothing.

Async handlers run on the event loop; plain functions run in a thread pool of
``concurrency`` threads (so they may block). Jobs
given to a plain-function handler are bound to a blocking :class:`Queue`, so
``job.set_progress(n)`` blocks in the handler's thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import _tracing
from ._async import AsyncClient
from ._loop import LoopRunner
from ._sync import Client
from .exceptions import Cancelled, LeaseMismatch, NotFound, ShoalError
from .job import Job
from .queue import Queue

__all__ = ["Worker", "Retry"]

log = logging.getLogger(__name__)
_ERROR_CHARS_MAX = 60_000
_PULL_ERROR_PAUSE_S = 0.5


class Retry(Exception):
    """Raise from a handler to put the job back after ``delay`` seconds without failing it."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(f"retry in {delay}s")
        self.delay = delay


Handler = Callable[[Job], Any] | Callable[[Job], Awaitable[Any]]


class Worker:
    """Process queue ``queue`` of ``client`` with ``handler``.

        async with AsyncClient(seeds) as client:
            async with Worker(client, "emails", send_email, concurrency=8):
                ...                      # runs until the block ends (graceful close)

        with Client(seeds) as client, Worker(client, "emails", send_email) as worker:
            ...

    ``lease``: seconds each job is leased for (extended while the handler runs);
    ``poll_timeout``: seconds one long-poll waits for a job; ``close_grace``: the
    default grace of :meth:`close`; ``watch_cancel``: subscribe to the queue's job
    events to stop a cancelled job's handler at once (otherwise at its next lease
    extension, every ``lease / 3`` seconds).
    """

    def __init__(self, client: AsyncClient | Client, queue: str, handler: Handler, *, concurrency: int = 1,
                 lease: float = 30.0, poll_timeout: float = 1.0, close_grace: float = 30.0,
                 shards: int | None = None, watch_cancel: bool = False) -> None:
        if concurrency < 1 or concurrency > 10_000:
            raise ValueError("concurrency must be in 1..10000")
        if lease <= 0 or poll_timeout < 0:
            raise ValueError("lease must be positive and poll_timeout non-negative")
        self._sync_client = client if isinstance(client, Client) else None
        self.client: AsyncClient = client._async if isinstance(client, Client) else client
        self.queue = self.client.queue(queue, shards=shards)
        self.handler = handler
        self.concurrency = concurrency
        self.lease = lease
        self.poll_timeout = poll_timeout
        self.close_grace = close_grace
        self.watch_cancel = watch_cancel
        #: Jobs acked, failed (handler raised), retried (:class:`Retry`), cancelled so far.
        self.processed = 0
        self.failed = 0
        self.retried = 0
        self.cancelled = 0
        self._is_async = inspect.iscoroutinefunction(handler) or \
            inspect.iscoroutinefunction(getattr(handler, "__call__", None))
        self._executor: ThreadPoolExecutor | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: asyncio.Task[None] | None = None  # watch_cancel's event subscription
        self._running: dict[str, Job] = {}
        self._handler_tasks: dict[str, asyncio.Future[Any]] = {}  # job id -> its running handler

    def __repr__(self) -> str:
        return (f"<Worker {self.queue.name!r} concurrency={self.concurrency} processed={self.processed} "
                f"failed={self.failed} running={len(self._running)}>")

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not all(t.done() for t in self._tasks)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "Worker":
        """Start the slots (with a sync :class:`Client`: on its loop thread; returns at once)."""
        if self._sync_client is not None:
            self._sync_client._runner.run(self._start())
        else:
            self._spawn()
        return self

    async def _start(self) -> None:
        self._spawn()

    def _spawn(self) -> None:
        if self._tasks and not all(t.done() for t in self._tasks):
            raise RuntimeError("the worker is already running")
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if not self._is_async and self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"shoal-{self.queue.name}")
        self._tasks = [loop.create_task(self._slot(i)) for i in range(self.concurrency)]
        self._watcher = loop.create_task(self._watch_cancel()) if self.watch_cancel else None
        if self._watcher is not None:
            self._tasks.append(self._watcher)

    async def run(self) -> None:
        """Run until :meth:`close` is called from another task (or the task is cancelled)."""
        if not self._tasks or all(t.done() for t in self._tasks):
            self._spawn()
        try:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        except asyncio.CancelledError:
            await self._close(self.close_grace)
            raise

    def close(self, grace: float | None = None) -> Any:
        """Stop taking jobs; let running handlers finish within ``grace`` seconds, release the rest.

        With an :class:`AsyncClient` this returns an awaitable; with a :class:`Client` it blocks.
        """
        grace = self.close_grace if grace is None else grace
        if self._sync_client is not None:
            return self._sync_client._runner.run(self._close(grace))
        return self._close(grace)

    async def _close(self, grace: float) -> None:
        if self._stopping is not None:
            self._stopping.set()
        # The cancellation watcher waits for events, not for jobs: it runs while the handlers have
        # their grace (a job cancelled meanwhile is still stopped), then ends with them.
        tasks = [t for t in self._tasks if not t.done() and t is not self._watcher]
        pending: set[asyncio.Task[None]] = set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(grace, 0.0))
        if self._watcher is not None and not self._watcher.done():
            pending.add(self._watcher)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for job in list(self._running.values()):
            try:
                await self.queue.release(job)
            except ShoalError as exc:
                log.info("worker: releasing %s on close failed (%s); its lease will lapse", job.id, exc)
        self._running.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self) -> "Worker":
        self._spawn()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close(self.close_grace)

    def __enter__(self) -> "Worker":
        if self._sync_client is None:
            raise TypeError("use 'async with' for a Worker of an AsyncClient")
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one slot -------------------------------------------------------------------------------

    async def _slot(self, index: int) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            try:
                job = await self.queue.pull(self.poll_timeout, ttr=self.lease)
            except asyncio.CancelledError:
                raise
            except ShoalError as exc:
                await self._pull_failed(index, exc)
                continue
            if job is not None:
                await self._process(job)

    async def _pull_failed(self, index: int, exc: ShoalError) -> None:
        """Slot ``index``'s pull failed: say so, and pause before the next (less if closing)."""
        assert self._stopping is not None
        log.warning("worker %s slot %d: pull failed: %s", self.queue.name, index, exc)
        try:
            async with asyncio.timeout(_PULL_ERROR_PAUSE_S):  # not wait_for: it can lose a cancellation
                await self._stopping.wait()
        except TimeoutError:
            pass

    async def _process(self, job: Job) -> None:
        consumer = _tracing.process(self.queue.name, job, self.client)  # None unless a provider is set
        if consumer is None:
            await self._handle(job, None)
        else:
            with consumer:  # the job's CONSUMER span: current while the handler runs and the job settles
                await self._handle(job, consumer)

    async def _handle(self, job: Job, consumer: _tracing.Processing | None) -> None:
        self._running[job.id] = job
        loop = asyncio.get_running_loop()
        extender = loop.create_task(self._extend(job))
        handler = self._handler_tasks[job.id] = asyncio.ensure_future(self._invoke(job))
        try:
            try:
                result = await asyncio.shield(handler)
            except asyncio.CancelledError:
                if not job.cancelled:
                    handler.cancel()  # the slot itself is being cancelled (close): pass it on
                    raise
                if not handler.done():  # a sync handler's thread: it has job.cancelled to check
                    handler.add_done_callback(_ignore_outcome)
                self.cancelled += 1
                self._running.pop(job.id, None)
                log.info("worker: %s was cancelled while running; acking nothing", job.id)
                return
        except Retry as retry:
            self.retried += 1
            await self._settle(job, self.queue.release(job, delay=retry.delay))
        except asyncio.CancelledError:
            raise  # close() releases the jobs of cancelled slots
        except Exception as exc:  # the handler's failure is the job's failure
            if consumer is not None:
                consumer.failed(exc)
            self.failed += 1
            text = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS_MAX]
            await self._settle(job, self.queue.fail(job, text))
        else:
            self.processed += 1
            await self._settle(job, self.queue.ack(job, result))
        finally:
            extender.cancel()
            self._handler_tasks.pop(job.id, None)
        self._running.pop(job.id, None)  # not when the slot is cancelled: close() releases the job

    def _cancel_job(self, job: Job) -> None:
        """``job`` was cancelled on the node: stop its handler and settle nothing."""
        if job.cancelled:
            return
        job.cancelled = True
        handler = self._handler_tasks.get(job.id)
        if handler is not None and not handler.done():
            # An async handler sees CancelledError; a plain function's thread runs on with the
            # flag set, while its slot moves on (the task awaiting the thread ends now).
            handler.cancel()

    async def _watch_cancel(self) -> None:
        """Cancel the handler of a running job as soon as the queue's events say it was cancelled."""
        assert self._stopping is not None
        async for event in self.queue.events():
            if self._stopping.is_set():
                return
            if event.get("state") == "cancelled":
                job = self._running.get(str(event.get("id")))
                if job is not None:
                    self._cancel_job(job)

    async def _invoke(self, job: Job) -> Any:
        if self._is_async:
            return await self.handler(job)  # type: ignore[misc]
        loop = asyncio.get_running_loop()
        job.handle = Queue(self.queue, LoopRunner(loop))  # blocking job.set_progress() from the thread
        # In a copy of this task's context, as asyncio.to_thread does: the handler's thread sees
        # the job's span (and any other context variable) as an async handler would.
        result = await loop.run_in_executor(self._executor, contextvars.copy_context().run, self.handler, job)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _settle(self, job: Job, op: Awaitable[Any]) -> None:
        try:
            await op
        except ShoalError as exc:
            log.warning("worker: settling %s failed (%s); its lease will lapse and it is redelivered", job.id, exc)

    async def _extend(self, job: Job) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self.queue.extend(job, self.lease)
            except Cancelled:
                self._cancel_job(job)
                return
            except (LeaseMismatch, NotFound) as exc:
                log.warning("worker: lost the lease of %s (%s); another worker may run it", job.id, exc)
                return
            except ShoalError as exc:
                log.warning("worker: extending %s failed: %s", job.id, exc)


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    """A cancelled job's plain-function handler ended: its result or error goes nowhere."""
    if not future.cancelled():
        future.exception()
