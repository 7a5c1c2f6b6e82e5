"""``Worker``: runs a handler over a queue's jobs with a concurrency limit.

Each slot pulls a job (long poll), runs the handler, and while it runs extends
the lease every ``lease/3`` seconds. A return value acks the job with it as
the result; an exception fails the attempt with its text (retried with backoff
while attempts remain, then dead-lettered); :class:`Retry` re-queues it after
a delay without counting a failure. ``close()`` stops taking jobs, lets
running handlers finish within ``grace`` seconds, and releases the rest.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .exceptions import ConnectionLost, ShoalError
from .job import Job

__all__ = ["Worker", "Retry"]

log = logging.getLogger(__name__)


class Retry(Exception):
    """Raise from a handler to put the job back after ``delay`` seconds."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(f"retry in {delay}s")
        self.delay = delay


Handler = Callable[[Job], Any] | Callable[[Job], Awaitable[Any]]


class Worker:
    """Process ``queue`` with ``handler``; async use: ``await worker.run()`` or ``start()``/``close()``."""

    def __init__(self, client: Any, queue: str, handler: Handler, *, concurrency: int = 1, lease: float = 30.0,
                 poll_timeout: float = 1.0) -> None:
        from ._sync import Client
        self._sync = isinstance(client, Client)
        self.client = client._async if self._sync else client
        self.queue = self.client.queue(queue)
        self.handler = handler
        self.concurrency = max(1, concurrency)
        self.lease = lease
        self.poll_timeout = poll_timeout
        self.processed = 0
        self.failed = 0
        self._stopping = asyncio.Event() if not self._sync else None
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, Job] = {}
        self._runner = client if self._sync else None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "Worker":
        """Start the slots (from a sync Client: on its loop thread)."""
        if self._sync:
            self._runner._run(self._start())  # type: ignore[union-attr]
        else:
            asyncio.get_running_loop()
            self._spawn()
        return self

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        self._spawn()

    def _spawn(self) -> None:
        assert self._stopping is not None
        self._tasks = [asyncio.get_running_loop().create_task(self._slot(i)) for i in range(self.concurrency)]

    async def run(self) -> None:
        """Run until ``close()`` is called from another task."""
        self._spawn()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self, grace: float = 30.0) -> Any:
        """Stop taking jobs; finish running ones within ``grace`` seconds, release the rest."""
        if self._sync:
            return self._runner._run(self._close(grace))  # type: ignore[union-attr]
        return self._close(grace)

    async def _close(self, grace: float) -> None:
        assert self._stopping is not None
        self._stopping.set()
        done, pending = await asyncio.wait(self._tasks, timeout=grace) if self._tasks else (set(), set())
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for job in list(self._running.values()):
            try:
                await self.queue.release(job)
            except ShoalError:
                pass  # the lease will lapse by itself
        self._running.clear()

    # --- one slot -------------------------------------------------------------------------------

    async def _slot(self, index: int) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            try:
                job = await self.queue.pull(self.poll_timeout, ttr=self.lease)
            except ShoalError as exc:
                log.warning("worker slot %d: pull failed: %s", index, exc)
                await asyncio.sleep(min(1.0, self.poll_timeout))
                continue
            if job is None:
                continue
            await self._process(job)

    async def _process(self, job: Job) -> None:
        self._running[job.id] = job
        extender = asyncio.get_running_loop().create_task(self._extend(job))
        try:
            result = self.handler(job)
            if inspect.isawaitable(result):
                result = await result
        except Retry as retry:
            await self._settle(self.queue.release(job, delay=retry.delay))
        except asyncio.CancelledError:
            raise  # close() releases jobs of cancelled slots
        except Exception as exc:  # the handler's failure is the job's failure
            self.failed += 1
            await self._settle(self.queue.fail(job, f"{type(exc).__name__}: {exc}"))
        else:
            self.processed += 1
            await self._settle(self.queue.ack(job, result))
        finally:
            extender.cancel()
        self._running.pop(job.id, None)

    async def _settle(self, op: Awaitable[Any]) -> None:
        try:
            await op
        except (ShoalError, ConnectionLost) as exc:
            log.warning("worker: settling a job failed (%s); its lease will lapse and it is redelivered", exc)

    async def _extend(self, job: Job) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self.queue.extend(job, self.lease)
            except ShoalError as exc:
                log.warning("worker: extending %s failed: %s", job.id, exc)
