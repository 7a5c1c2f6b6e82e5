"""Producers and consumers that record every operation in a :class:`History`.

Producers push unique values (``"p<k>-<n>"``) one at a time with the real client,
which adds an idempotency key and retries across leader changes. Consumers pull
with a short lease and ack. Outcomes: ``ok``; ``fail`` when the node refused for
certain (invalid, lease mismatch, not found); ``info`` when it is unknown (timeouts,
lost connections after the client's own retries).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from shoal.client import AsyncClient, ConnectionOptions
from shoal.client.exceptions import (AuthError, InvalidCommand, InvalidState, LeaseMismatch, NotFound,
                                     ShoalError)

from .history import FAIL, INFO, INVOKE, OK, History

__all__ = ["Workload", "WorkloadConfig"]

DEFINITE_PUSH_FAILURES = (InvalidCommand, AuthError)
DEFINITE_ACK_FAILURES = (LeaseMismatch, InvalidState, NotFound, InvalidCommand)


@dataclass
class WorkloadConfig:
    queue: str = "chaos"
    producers: int = 2
    consumers: int = 2
    lease_s: float = 3.0            # a lapsed lease redelivers: keep it short for the drain
    command_timeout_s: float = 5.0
    push_interval_s: float = 0.002  # pause between one producer's pushes
    drain_timeout_s: float = 45.0


class Workload:
    """Runs producers until :meth:`stop_producing`, consumers until the queue is drained."""

    def __init__(self, addresses: list[str], history: History, config: WorkloadConfig | None = None) -> None:
        self.addresses = addresses
        self.history = history
        self.config = config or WorkloadConfig()
        self._producing = True
        self._consuming = True
        self.client: AsyncClient | None = None

    def _options(self) -> ConnectionOptions:
        c = self.config
        return ConnectionOptions(command_timeout=c.command_timeout_s, ping_interval=1.0, max_ping_failures=2,
                                 max_command_timeouts=2, connect_timeout=1.0, pool_size=1)

    async def run(self, produce_s: float, until: "asyncio.Future[Any] | None" = None, overrun_s: float = 0.0) -> None:
        """Produce for ``produce_s`` seconds (faults happen meanwhile), and on while ``until`` is not
        done (at most ``overrun_s`` longer: a membership change that takes its time), then drain."""
        async with AsyncClient(self.addresses, options=self._options()) as client:
            self.client = client
            queue = client.queue(self.config.queue)
            tasks = [asyncio.create_task(self._produce(queue, f"p{i}")) for i in range(self.config.producers)]
            tasks += [asyncio.create_task(self._consume(queue, f"c{i}")) for i in range(self.config.consumers)]
            await asyncio.sleep(produce_s)
            if until is not None and not until.done():
                await asyncio.wait([until], timeout=overrun_s)
            self._producing = False
            await asyncio.gather(*tasks[:self.config.producers])
            await self._drain(queue)
            self._consuming = False
            await asyncio.gather(*tasks[self.config.producers:])

    async def _produce(self, queue: Any, process: str) -> None:
        n = 0
        add = self.history.add
        while self._producing:
            n += 1
            value = f"{process}-{n}"
            add(process, INVOKE, "push", value)
            try:
                await queue.add(value)
            except DEFINITE_PUSH_FAILURES:
                add(process, FAIL, "push", value)
            except (ShoalError, OSError, asyncio.TimeoutError):
                add(process, INFO, "push", value)
            else:
                add(process, OK, "push", value)
            await asyncio.sleep(self.config.push_interval_s)

    async def _consume(self, queue: Any, process: str) -> None:
        add = self.history.add
        while self._consuming:
            add(process, INVOKE, "pull", None)
            try:
                job = await queue.pull(timeout=0.5, ttr=self.config.lease_s)
            except (ShoalError, OSError, asyncio.TimeoutError):
                add(process, INFO, "pull", None)
                await asyncio.sleep(0.05)
                continue
            if job is None:
                add(process, OK, "pull", None)
                continue
            add(process, OK, "pull", (job.id, job.data, job.token))
            add(process, INVOKE, "ack", (job.id, job.token))
            try:
                await queue.ack(job)
            except DEFINITE_ACK_FAILURES:
                add(process, FAIL, "ack", (job.id, job.token))
            except (ShoalError, OSError, asyncio.TimeoutError):
                add(process, INFO, "ack", (job.id, job.token))
            else:
                add(process, OK, "ack", (job.id, job.token))

    async def _drain(self, queue: Any) -> None:
        """Wait until nothing is waiting, delayed or leased (bounded by ``drain_timeout_s``)."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        quiet = 0
        while time.monotonic() < deadline:
            try:
                counts = await queue.counts()
            except (ShoalError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)
                continue
            if counts.get("waiting", 0) + counts.get("active", 0) + counts.get("delayed", 0) == 0:
                quiet += 1
                if quiet >= 2:   # twice in a row: no ack in flight will put one back
                    return
            else:
                quiet = 0
            await asyncio.sleep(0.5)
