"""The dashboard's simulation: a pool of simulated workers draining a queue, with failures and hangs.

The workers are real clients of the cluster: one :class:`~shoal.client.AsyncClient` (binary
protocol, partition-aware, its own lease session) on the node's event loop, talking to the
cluster's client ports over TCP like any other client. Each worker slot pulls a job with a
short lease (``ttr``), then

- with probability ``hangRate`` *hangs*: it holds the job without acking or extending it for
  ``hangMs`` (default 1.5 × ttr). The lease lapses, the leader reclaims the job, another slot
  takes it; when the hung slot wakes, its ack carries the old fencing token and is refused
  with ``LEASE_MISMATCH`` -- the page shows both;
- with probability ``failRate`` fails it (``FAIL``): the job retries with backoff while
  attempts remain, then lands in the DLQ;
- else works ``workMs`` and acks it.

It stops when every job it pushed has left waiting/delayed/active, when the page stops it
(``DELETE /simulation``), or when the node stops (the HTTP app's cleanup).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoal.cluster.commands import validate
from shoal.cluster.errors import CommandError, ErrorCode

if TYPE_CHECKING:
    from .view import NodeView

__all__ = ["Simulation", "SimulationParams"]

log = logging.getLogger(__name__)

JOBS_MAX = 100_000
WORKERS_MAX = 200
EVENTS_KEPT = 60
PULL_TIMEOUT_S = 0.5
#: The longest a stopping simulation waits for its client to close.
CLIENT_CLOSE_TIMEOUT_S = 1.0
DONE_CHECK_S = 0.5


@dataclass(frozen=True, slots=True)
class SimulationParams:
    """What the page asks for (JSON names in :meth:`from_body`)."""

    queue: str = "demo"
    jobs: int = 500
    workers: int = 8
    fail_rate: float = 0.05
    hang_rate: float = 0.05
    work_ms: int = 50
    ttr_ms: int = 2_000
    hang_ms: int = 0          # 0: 1.5 x ttr
    attempts: int = 3
    backoff_ms: int = 200
    seed: int | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "SimulationParams":
        """Validated parameters; ``CommandError(INVALID)`` naming the first bad field."""
        names = {"queue": "queue", "jobs": "jobs", "workers": "workers", "failRate": "fail_rate",
                 "hangRate": "hang_rate", "workMs": "work_ms", "ttrMs": "ttr_ms", "hangMs": "hang_ms",
                 "attempts": "attempts", "backoffMs": "backoff_ms", "seed": "seed"}
        unknown = set(body) - set(names)
        if unknown:
            raise CommandError(ErrorCode.INVALID, f"{sorted(unknown)[0]}: unknown field")
        kw = {names[k]: v for k, v in body.items()}
        p = cls(**kw)
        validate({"cmd": "Count", "queue": p.queue})  # the queue name rules of every command
        ints = {"jobs": (p.jobs, 1, JOBS_MAX), "workers": (p.workers, 1, WORKERS_MAX),
                "workMs": (p.work_ms, 0, 60_000), "ttrMs": (p.ttr_ms, 200, 600_000),
                "hangMs": (p.hang_ms, 0, 3_600_000), "attempts": (p.attempts, 1, 1_000),
                "backoffMs": (p.backoff_ms, 0, 3_600_000)}
        for name, (v, lo, hi) in ints.items():
            if type(v) is not int or not lo <= v <= hi:
                raise CommandError(ErrorCode.INVALID, f"{name}: must be an integer {lo}..{hi}")
        for name, v in (("failRate", p.fail_rate), ("hangRate", p.hang_rate)):
            if type(v) not in (int, float) or not 0 <= v <= 1:
                raise CommandError(ErrorCode.INVALID, f"{name}: must be a number 0..1")
        if p.fail_rate + p.hang_rate > 1:
            raise CommandError(ErrorCode.INVALID, "failRate + hangRate: must be at most 1")
        if p.seed is not None and type(p.seed) is not int:
            raise CommandError(ErrorCode.INVALID, "seed: must be an integer")
        return p


class Simulation:
    """One run of simulated workers on one node."""

    def __init__(self, node: "NodeView", params: SimulationParams, token: str | None) -> None:
        self.node = node
        self.params = params
        self.token = token
        self.rng = random.Random(params.seed)
        self.running = False
        self.phase = "starting"
        self.error: str | None = None
        self.started_at = node.now_ms()
        self.finished_at: int | None = None
        self.counters = collections.Counter[str]()
        self.workers: list[dict[str, Any]] = [
            {"id": f"w{i + 1}", "state": "idle", "job": None, "done": 0, "failed": 0, "hung": 0}
            for i in range(params.workers)]
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS_KEPT)
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None

    # --- control --------------------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the workers and close the client (its session's leases go back at once)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self.phase not in ("finished", "failed"):
            self.phase = "stopped"
        self.running = False

    def status(self) -> dict[str, Any]:
        p = self.params
        return {"running": self.running, "phase": self.phase, "error": self.error, "queue": p.queue,
                "params": {"jobs": p.jobs, "workers": p.workers, "failRate": p.fail_rate, "hangRate": p.hang_rate,
                           "workMs": p.work_ms, "ttrMs": p.ttr_ms, "hangMs": self.hang_ms, "attempts": p.attempts,
                           "backoffMs": p.backoff_ms},
                "startedAt": self.started_at, "finishedAt": self.finished_at, "counters": dict(self.counters),
                "workers": [dict(w) for w in self.workers], "events": list(self.events)}

    @property
    def hang_ms(self) -> int:
        return self.params.hang_ms or int(self.params.ttr_ms * 1.5)

    # --- the run --------------------------------------------------------------------------------

    def _event(self, worker: str, text: str, job: str | None = None) -> None:
        self.events.appendleft({"time": self.node.now_ms(), "worker": worker, "job": job, "text": text})

    async def _run(self) -> None:
        from shoal.client import AsyncClient  # deferred: only a simulation needs the client library
        p = self.params
        seeds = [f"{n.host}:{n.port}" for n in self.node.config.nodes]
        session = f"sim-{self.node.node_id}-{self.started_at}"
        client = AsyncClient(seeds, token=self.token, session=session)
        self._client = client
        slots: list[asyncio.Task[None]] = []
        try:
            await client.connect()
            q = client.queue(p.queue)
            self.phase = "enqueueing"
            for start in range(0, p.jobs, 1_000):
                n = min(1_000, p.jobs - start)
                await q.add_bulk([{"n": start + i + 1, "task": "simulated"} for i in range(n)],
                                 attempts=p.attempts, backoff=p.backoff_ms / 1000, tag="simulation")
                self.counters["pushed"] += n
            self.phase = "draining"
            slots = [asyncio.get_running_loop().create_task(self._slot(q, w)) for w in self.workers]
            while True:
                await asyncio.sleep(DONE_CHECK_S)
                counts = await q.counts()
                if counts.get("waiting", 0) + counts.get("delayed", 0) + counts.get("active", 0) == 0:
                    break
            self.phase = "finished"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # shown on the page; the node keeps serving
            log.warning("simulation failed: %s", exc, exc_info=True)
            self.phase, self.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            for t in slots:
                t.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            for w in self.workers:
                w["state"], w["job"] = "stopped", None
            try:
                # Bounded: a stop relayed from another node's dashboard must answer within its
                # peer timeout; leases a slow close leaves behind go back at their TTR.
                await asyncio.wait_for(client.close(), CLIENT_CLOSE_TIMEOUT_S)
            except (Exception, asyncio.TimeoutError):
                log.debug("closing the simulation's client failed", exc_info=True)
            self.finished_at = self.node.now_ms()
            self.running = False

    async def _slot(self, q: Any, w: dict[str, Any]) -> None:
        from shoal.client.exceptions import LeaseMismatch, ShoalError
        p = self.params
        ttr_s = p.ttr_ms / 1000
        while True:
            w["state"], w["job"] = "idle", None
            try:
                job = await q.pull(PULL_TIMEOUT_S, ttr=ttr_s)
            except ShoalError as exc:
                self.counters["pullErrors"] += 1
                self._event(w["id"], f"pull failed: {exc}")
                await asyncio.sleep(0.2)
                continue
            if job is None:
                continue
            w["state"], w["job"] = "busy", job.id
            self.counters["pulled"] += 1
            if job.attempts > 1:
                self.counters["redelivered"] += 1
                self._event(w["id"], f"took it again (delivery {job.attempts}: reclaimed or retried)", job.id)
            try:
                await q.log(job, f"{w['id']} took it (delivery {job.attempts})")
                roll = self.rng.random()
                if roll < p.hang_rate:
                    w["state"], w["hung"] = "hung", w["hung"] + 1
                    self.counters["hung"] += 1
                    self._event(w["id"], f"hung (holds the lease, {self.hang_ms} ms)", job.id)
                    await asyncio.sleep(self.hang_ms / 1000)
                    try:
                        await q.ack(job, {"worker": w["id"]})
                        self.counters["lateAcks"] += 1  # the lease had not been reclaimed yet
                    except LeaseMismatch:
                        self.counters["staleAcksRefused"] += 1
                        self._event(w["id"], "woke up; its ack was refused (LEASE_MISMATCH): the job "
                                    "was reclaimed", job.id)
                elif roll < p.hang_rate + p.fail_rate:
                    await asyncio.sleep(p.work_ms / 2000)
                    state = await q.fail(job, f"simulated failure on {w['id']}")
                    w["failed"] += 1
                    self.counters["failedAttempts"] += 1
                    if state == "failed":
                        self.counters["deadLettered"] += 1
                        self._event(w["id"], "failed it; no attempts left: to the DLQ", job.id)
                else:
                    await asyncio.sleep(p.work_ms / 1000)
                    await q.ack(job, {"worker": w["id"], "n": job.data.get("n") if isinstance(job.data, dict)
                                      else None})
                    w["done"] += 1
                    self.counters["completed"] += 1
            except LeaseMismatch:
                self.counters["leaseLost"] += 1
            except ShoalError as exc:
                self.counters["errors"] += 1
                self._event(w["id"], f"error: {exc}", job.id)
                await asyncio.sleep(0.2)
