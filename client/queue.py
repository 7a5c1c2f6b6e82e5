"""``AsyncQueue`` and its blocking twin ``Queue``: the BullMQ/bunqueue-style API of one queue.

Times are seconds (floats); the wire gets milliseconds. A sharded queue
(``client.queue(name, shards=k)``, or created here with ``shards=k``) spreads
over the sub-queues ``name#0 .. name#k-1``: a job goes to the shard of its
``group`` (or ``custom_id``), else round-robin; pulls take from every shard;
counts and control commands cover every shard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from shoal.cluster.errors import CommandError as WireCommandError

from . import _tracing
from ._core import Debounce, Dedupe, ShardPicker, group_by_partition, job_fields, ms
from ._loop import SyncHandle, blocking, blocking_iter
from .exceptions import InvalidCommand
from .job import Job

__all__ = ["AsyncQueue", "Queue", "QueueClient", "job_fields"]

_BATCH_JOBS_MAX = 10_000
_SHARD_POLL_SLICE_S = 0.25
_COUNT_KEYS = ("waiting", "delayed", "active", "completed", "failed", "waiting-children", "cancelled")
_QUEUE_TIME_OPTIONS = {"ttr": "ttr", "ttl": "ttl", "backoff": "backoff", "delay": "delay",
                       "history_age": "historyAgeMs"}
_QUEUE_OPTIONS = {"capacity": "capacity", "discard": "discard", "max_deliveries": "maxDeliveries",
                  "attempts": "attempts", "history_max": "historyMax", "priority": "priority",
                  "durable": "durable",
                  "limit": "limit", "group_limit": "groupLimit", "group_limits": "groupLimits",
                  "concurrency": "concurrency",
                  "group_concurrency": "groupConcurrency", "group_weights": "groupWeights"}


def _rate_limits(options: dict[str, Any]) -> dict[str, Any]:
    """``limit=(max, seconds)``, ``group_limit=...``, ``group_limits={group: ...}`` → the wire
    ``{max, durationMs}`` (a dict is passed as given)."""
    out = dict(options)
    for key in ("limit", "group_limit"):
        if key in out:
            out[key] = _window(out[key])
    if isinstance(out.get("group_limits"), dict):
        out["group_limits"] = {group: _window(v) for group, v in out["group_limits"].items()}
    return out


def _window(value: Any) -> Any:
    if isinstance(value, tuple):
        count, seconds = value
        return {"max": count, "durationMs": ms(seconds)}
    return value


def _id(job: Job | str) -> str:
    return job.id if isinstance(job, Job) else job


def _token(job: Job | str, token: str | None) -> dict[str, Any]:
    token = token if token is not None else (job.token if isinstance(job, Job) else None)
    return {"token": token} if token is not None else {}


def queue_options(options: dict[str, Any]) -> dict[str, Any]:
    """Python queue options (``ttr=30.0``, ``max_deliveries=5``, …; seconds) → wire ``options``."""
    wire: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _QUEUE_TIME_OPTIONS:
            wire[_QUEUE_TIME_OPTIONS[key]] = ms(value)
        elif key in _QUEUE_OPTIONS:
            wire[_QUEUE_OPTIONS[key]] = value
        elif key in _QUEUE_OPTIONS.values() or key in _QUEUE_TIME_OPTIONS.values():
            wire[key] = value  # already a wire name (ms for times)
        else:
            raise TypeError(f"unknown queue option {key!r}")
    return wire


class QueueClient(Protocol):
    """What a queue handle (and a tube) uses of its :class:`~shoal.client.AsyncClient`: the client
    makes the handles, so they know it only through this."""

    #: Queue name -> its shard count, as the client remembers it for later handles.
    _shards: dict[str, int]

    @property
    def new_idempotency_key(self) -> Callable[[], str]:
        """A fresh idempotency key for one add, each call."""

    async def call(self, frame: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Send one command to the right node; its ``ok`` reply."""

    async def get_children_values(self, job_id: str) -> dict[str, Any]:
        """A flow parent's children's results."""

    def _events(self, queues: set[str] | None, max_buffered: int) -> AsyncIterator[dict[str, Any]]:
        """Job events of ``queues`` (None: every queue) as they happen."""


class AsyncQueue:
    """One queue of an :class:`~shoal.client.AsyncClient` (get it with ``client.queue(name)``)."""

    def __init__(self, client: QueueClient, name: str, *, shards: int | None = None) -> None:
        self.client = client
        self.name = name
        self._shards = ShardPicker(name, shards)

    def __repr__(self) -> str:
        return f"<AsyncQueue {self.name!r}{f' shards={self._shards.shards}' if self._shards.sharded else ''}>"

    @property
    def shards(self) -> int | None:
        """The number of shards, or ``None`` for a plain queue."""
        return self._shards.shards

    @property
    def queue_names(self) -> list[str]:
        """The wire queue names behind this handle (the sub-queues of a sharded queue)."""
        return list(self._shards.names)

    # --- internals --------------------------------------------------------------------------

    async def _on(self, queue: str, cmd: str, **fields: Any) -> dict[str, Any]:
        return await self.client.call({"cmd": cmd, "queue": queue, **fields})

    async def _every(self, cmd: str, **fields: Any) -> list[dict[str, Any]]:
        """``cmd`` on every (sub-)queue, concurrently."""
        return list(await asyncio.gather(*(self._on(q, cmd, **fields) for q in self._shards.names)))

    async def _sum(self, cmd: str, key: str = "count", **fields: Any) -> int:
        return sum(int(r.get(key) or 0) for r in await self._every(cmd, **fields))

    async def _job_call(self, cmd: str, job: Job | str, **fields: Any) -> dict[str, Any]:
        return await self.client.call({"cmd": cmd, "id": _id(job), **fields})

    def _batch_target(self, group: str | None, custom_id: str | None) -> str | None:
        """The one (sub-)queue every job of a batch goes to, or None when they spread over shards."""
        if not self._shards.sharded:
            return self.name
        return self._shards.pick(group, custom_id) if group is not None or custom_id is not None else None

    def _job(self, wire: dict[str, Any], token: str | None = None) -> Job:
        return Job.from_wire(wire, token, self)

    # --- lifecycle --------------------------------------------------------------------------

    async def create(self, type: str = "standard", *, shards: int | None = None, **options: Any) -> bool:
        """Create the queue with a type (``standard``, ``fifo``, ``fifottl``, ``limfifottl``, ``utube``,
        ``utubettl``, ``log``) and options (``ttr``, ``ttl``, ``backoff`` in seconds; ``capacity``,
        ``discard``, ``max_deliveries``, ``attempts``, ``history_max``, ``durable``: ``False`` for the disk
        durability class, see the README) and flow control (``limit`` and
        ``group_limit`` as ``(max, seconds)``: leases per sliding window of the queue and of each
        group; ``concurrency`` and ``group_concurrency``: active jobs of the queue and per group).
        ``shards=k`` spreads it over ``k`` sub-queues. Returns ``True`` if it did not exist before."""
        wire = queue_options(_rate_limits(options))
        if shards is not None:
            self._shards = ShardPicker(self.name, shards)
            self.client._shards[self.name] = shards
            created = (await self._on(self.name, "CreateQueue", type=type,
                                      options={**wire, "shards": shards}))["created"]
            # Make sure every sub-queue exists with the same type and options (idempotent).
            subs = await asyncio.gather(*(self._on(q, "CreateQueue", type=type, options=wire)
                                          for q in self._shards.names))
            return bool(created) or any(r.get("created") for r in subs)
        return bool((await self._on(self.name, "CreateQueue", type=type, options=wire))["created"])

    async def update(self, **options: Any) -> None:
        """Change the queue's options (the same names as :meth:`create`), e.g. its flow control:
        ``limit=(max, seconds)``, ``group_limit=(max, seconds)``, ``group_limits={group: (max,
        seconds)}`` (overrides of ``group_limit``), ``concurrency=n``,
        ``group_concurrency=n`` (0 or a max of 0: no limit), ``group_weights={group: weight}``
        (a group's share of the turns between groups, 1 unless named)."""
        wire = queue_options(_rate_limits(options))
        await asyncio.gather(*(self._on(q, "UpdateQueue", options=wire) for q in self._shards.names))

    # --- producing --------------------------------------------------------------------------

    async def add(self, data: Any, *, priority: int | None = None, delay: float | None = None,
                  custom_id: str | None = None, attempts: int | None = None, backoff: float | None = None,
                  ttl: float | None = None, ttr: float | None = None, group: str | None = None,
                  tag: str | None = None, timeout: float | None = None, dedupe: Dedupe | None = None,
                  debounce: Debounce | None = None) -> str:
        """Enqueue one job and return its id (``"3-17"``, or ``custom_id`` when given).

        ``priority``: higher runs first (bunqueue's order); ``delay``/``ttl``/``ttr``/``backoff``
        in seconds; ``attempts``: maximum attempts; ``custom_id``: the job's id (a second add
        with it adds nothing and answers the same id); ``group``: utube sub-queue; ``timeout``:
        wait up to that long on a full capped queue;
        ``dedupe=Dedupe(id, ttl)`` / ``debounce=Debounce(id, delay, max_wait)``: an add
        they absorb answers the existing job's id. Safe to retry: the client adds an
        idempotency key, so a failover never enqueues twice.
        """
        fields = job_fields({"priority": priority, "delay": delay, "custom_id": custom_id, "attempts": attempts,
                             "backoff": backoff, "ttl": ttl, "ttr": ttr, "group": group, "tag": tag,
                             "dedupe": dedupe, "debounce": debounce})
        if timeout:
            fields["waitMs"] = ms(timeout)
        target = self._shards.pick(group, custom_id)
        op = _tracing.send(self, target)  # None unless a global OpenTelemetry provider is set
        if op is not None and op.carrier:
            fields[_tracing.TRACE_CONTEXT_FIELD] = op.carrier
        call = self._on(target, "PUSH", data=data, idempotencyKey=self.client.new_idempotency_key(), **fields)
        reply = await (call if op is None else op.run(call))
        return str(reply["id"])

    async def add_bulk(self, items: Iterable[Any], *, batch_size: int = 1000, **options: Any) -> list[str]:
        """Enqueue many jobs (``options`` as for :meth:`add`, applied to every job) in pipelined
        ``PUSHB`` batches of ``batch_size``; returns the ids in input order."""
        if not 1 <= batch_size <= _BATCH_JOBS_MAX:
            raise ValueError(f"batch_size must be in 1..{_BATCH_JOBS_MAX}")
        fields = job_fields(options)
        group, custom_id = options.get("group"), options.get("custom_id")
        per_target: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        count = 0
        for i, item in enumerate(items):
            job = {"data": item, "idempotencyKey": self.client.new_idempotency_key(), **fields}
            per_target.setdefault(self._shards.pick(group, custom_id), []).append((i, job))
            count = i + 1
        ids: list[str] = [""] * count
        op = _tracing.send(self, self._batch_target(group, custom_id), count)  # None unless a provider is set
        if op is not None and op.carrier:
            for jobs in per_target.values():
                for _, job in jobs:
                    job[_tracing.TRACE_CONTEXT_FIELD] = op.carrier

        async def send(target: str, chunk: list[tuple[int, dict[str, Any]]]) -> None:
            reply = await self._on(target, "PUSHB", jobs=[job for _, job in chunk])
            for (i, _), job_id in zip(chunk, reply["ids"]):
                ids[i] = str(job_id)

        sent = asyncio.gather(*(send(target, jobs[k:k + batch_size]) for target, jobs in per_target.items()
                                 for k in range(0, len(jobs), batch_size)))
        await (sent if op is None else op.run(sent))
        return ids

    # --- consuming --------------------------------------------------------------------------

    async def pull(self, timeout: float = 0.0, *, ttr: float | None = None, group: str | None = None,
                   ungrouped: bool = False) -> Job | None:
        """Lease the next job, waiting up to ``timeout`` seconds for one; ``None`` if none came.
        ``ttr``: the lease length in seconds (default: the queue's). ``group``: take only that
        group's next job (within the group's limits; it counts as the group's turn);
        ``ungrouped``: take only a job without a group."""
        jobs = await self._pull(1, timeout, ttr, group, ungrouped)
        return jobs[0] if jobs else None

    async def pull_many(self, count: int, timeout: float = 0.0, *, ttr: float | None = None,
                        group: str | None = None, ungrouped: bool = False) -> list[Job]:
        """Lease up to ``count`` jobs, waiting up to ``timeout`` seconds for the first (``group``,
        ``ungrouped``: as for :meth:`pull`)."""
        return await self._pull(count, timeout, ttr, group, ungrouped)

    async def _pull(self, count: int, timeout: float, ttr: float | None, group: str | None = None,
                    ungrouped: bool = False) -> list[Job]:
        extra: dict[str, Any] = {"ttr": ms(ttr)} if ttr is not None else {}
        if group is not None:
            if ungrouped:
                raise ValueError("give group (one group's jobs) or ungrouped (jobs without a group), not both")
            # A group lives on one shard: the pull goes there alone.
            return await self._pull_one(self._shards.pick(group, None), count, timeout, {**extra, "group": group})
        if ungrouped:
            extra["ungrouped"] = True
        if not self._shards.sharded:
            return await self._pull_one(self.name, count, timeout, extra)
        deadline = time.monotonic() + max(0.0, timeout)
        got: list[Job] = []
        while True:
            for target in self._shards.rotation():  # a quick sweep over every shard
                got += await self._pull_one(target, count - len(got), 0.0, extra)
                if len(got) >= count:
                    return got
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            # Park briefly on one shard, then sweep again.
            target = self._shards.rotation()[0]
            got += await self._pull_one(target, count, min(remaining, _SHARD_POLL_SLICE_S), extra)
            if got:
                return got

    async def _pull_one(self, target: str, count: int, timeout: float, extra: dict[str, Any]) -> list[Job]:
        fields = dict(extra)
        if timeout > 0:
            fields["timeout"] = ms(timeout)
        if count == 1:
            reply = await self._on(target, "PULL", **fields)
            return [self._job(reply["job"], reply.get("token"))] if reply.get("job") else []
        reply = await self._on(target, "PULLB", count=count, **fields)
        tokens = reply.get("tokens") or [None] * len(reply["jobs"])
        return [self._job(j, t) for j, t in zip(reply["jobs"], tokens)]

    async def ack(self, job: Job | str, result: Any = None, *, token: str | None = None) -> None:
        """Complete a job (with an optional ``result``, kept for :meth:`get_result`)."""
        fields = _token(job, token)
        if result is not None:
            fields["result"] = result
        op = _tracing.settle(self, "ack", job)  # None unless a global OpenTelemetry provider is set
        call = self._job_call("ACK", job, **fields)
        await (call if op is None else op.run(call))

    async def ack_many(self, jobs: list[Job], results: list[Any] | None = None) -> int:
        """Complete many jobs (``ACKB`` per partition, concurrently); returns how many."""
        if results is not None and len(results) != len(jobs):
            raise ValueError("give one result per job")
        try:
            groups = group_by_partition(j.id for j in jobs)
        except WireCommandError as exc:
            raise InvalidCommand(str(exc), exc.code.value) from exc

        async def one(indexes: list[int]) -> int:
            frame: dict[str, Any] = {"cmd": "ACKB", "ids": [jobs[i].id for i in indexes]}
            if any(jobs[i].token is not None for i in indexes):
                frame["tokens"] = [jobs[i].token for i in indexes]
            if results is not None:
                frame["results"] = [results[i] for i in indexes]
            reply = await self.client.call(frame)
            return int(reply.get("count", len(indexes)))

        op = _tracing.settle(self, "ack", None, len(jobs))
        acked = asyncio.gather(*(one(ix) for ix in groups.values()))
        return sum(await (acked if op is None else op.run(acked)))

    async def fail(self, job: Job | str, error: str = "failed", *, delay: float | None = None,
                   token: str | None = None) -> str:
        """Fail an attempt: it is retried (after ``delay`` or the queue's backoff) while attempts
        remain, else dead-lettered. Returns the job's new state."""
        fields: dict[str, Any] = {"error": error, **_token(job, token)}
        if delay is not None:
            fields["delay"] = ms(delay)
        op = _tracing.settle(self, "fail", job)
        call = self._job_call("FAIL", job, **fields)
        return str((await (call if op is None else op.run(call)))["state"])

    async def release(self, job: Job | str, *, delay: float | None = None, token: str | None = None) -> str:
        """Give a leased job back (after ``delay`` seconds) without counting a failure; its new state."""
        fields = _token(job, token)
        if delay:
            fields["delay"] = ms(delay)
        op = _tracing.settle(self, "release", job)
        call = self._job_call("Release", job, **fields)
        return str((await (call if op is None else op.run(call)))["state"])

    async def extend(self, job: Job | str, ttr: float, *, token: str | None = None) -> float:
        """Extend the lease to ``ttr`` seconds from now; returns the new deadline (epoch seconds)."""
        reply = await self._job_call("Touch", job, ttr=ms(ttr), **_token(job, token))
        return float(reply["deadline"]) / 1000

    async def progress(self, job: Job | str, progress: int, message: str | None = None) -> None:
        """Report a job's progress (0..100) and an optional message."""
        fields: dict[str, Any] = {"progress": progress}
        if message is not None:
            fields["message"] = message
        await self._job_call("Progress", job, **fields)

    async def log(self, job: Job | str, message: str) -> None:
        """Append a line to a job's log."""
        await self._job_call("AddLog", job, message=message)

    async def logs(self, job: Job | str, limit: int | None = None) -> list[dict[str, Any]]:
        """A job's log lines, oldest first: ``{"timestamp": epoch ms, "level": "info", "message": ...}``."""
        return list((await self._job_call("GetLogs", job, **({"limit": limit} if limit else {})))["logs"])

    # --- queries ----------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Job | None:
        """The job with this id, or ``None``."""
        reply = await self._job_call("GetJob", job_id)
        return self._job(reply["job"]) if reply.get("job") else None

    async def get_job_by_custom_id(self, custom_id: str) -> Job | None:
        """The job added with this ``custom_id``, or ``None``."""
        reply = await self._on(self._shards.pick(None, custom_id), "GetJobByCustomId", customId=custom_id)
        return self._job(reply["job"]) if reply.get("job") else None

    async def get_state(self, job_id: str) -> str:
        """``waiting``, ``delayed``, ``active``, ``completed``, ``failed``, ``waiting-children`` or
        ``cancelled`` (a waiting job with a priority is ``waiting`` here; the wire says ``prioritized``)."""
        state = str((await self._job_call("GetState", job_id))["state"])
        return "waiting" if state == "prioritized" else state

    async def get_result(self, job_id: str) -> Any:
        """The result a completed job was acked with."""
        return (await self._job_call("GetResult", job_id))["result"]

    async def get_children_values(self, job: Job | str) -> dict[str, Any]:
        """A flow parent's children's results, ``{child_id: result}`` (see ``client.flow``)."""
        return await self.client.get_children_values(job.id if isinstance(job, Job) else job)

    async def get_progress(self, job_id: str) -> int:
        """A job's last reported progress."""
        return int((await self._job_call("GetProgress", job_id))["progress"])

    async def counts(self) -> dict[str, int]:
        """Jobs by state: ``{"waiting", "active", "delayed", "completed", "failed", "waiting-children"}``."""
        total = dict.fromkeys(_COUNT_KEYS, 0)
        for reply in await self._every("GetJobCounts"):
            for state, n in (reply.get("counts") or {}).items():
                if state == "prioritized":
                    state = "waiting"  # the wire counts waiting jobs with a priority apart (bunqueue's)
                elif state == "paused":
                    continue
                total[state] = total.get(state, 0) + int(n)
        return total

    async def count(self, state: str | None = None) -> int:
        """How many jobs (in ``state``, or waiting + delayed by the node's default)."""
        return await self._sum("Count", **({"state": state} if state else {}))

    async def counts_per_priority(self) -> dict[int, int]:
        """Jobs still to run (waiting and delayed) by priority."""
        total: dict[int, int] = {}
        for reply in await self._every("GetCountsPerPriority"):
            for priority, n in (reply.get("counts") or {}).items():
                total[int(priority)] = total.get(int(priority), 0) + int(n)
        return total

    async def get_jobs(self, state: str | None = None, offset: int = 0, limit: int = 100) -> tuple[list[Job], int]:
        """A page of jobs (in ``state``) and the total (per shard for a sharded queue)."""
        fields: dict[str, Any] = {"offset": offset, "limit": limit}
        if state:
            fields["state"] = state
        replies = await self._every("GetJobs", **fields)
        jobs = [self._job(j) for r in replies for j in r["jobs"]][:limit]
        return jobs, sum(int(r.get("total") or 0) for r in replies)

    async def is_paused(self) -> bool:
        """Is the queue (every shard) paused?"""
        return all(r.get("paused") for r in await self._every("IsPaused"))

    async def metrics(self) -> dict[str, Any]:
        """The node's ``Metrics`` of the queue (of each shard, by name, when sharded)."""
        replies = await self._every("Metrics")
        if not self._shards.sharded:
            return dict(replies[0]["metrics"])
        return {name: r["metrics"] for name, r in zip(self._shards.names, replies)}

    # --- control ----------------------------------------------------------------------------

    async def pause(self) -> None:
        """Stop handing out jobs (pushes still land)."""
        await self._every("Pause")

    async def resume(self) -> None:
        """Hand out jobs again."""
        await self._every("Resume")

    async def drain(self) -> int:
        """Remove every waiting (and delayed) job; how many."""
        return await self._sum("Drain")

    async def clean(self, grace: float = 0.0, state: str = "completed", limit: int | None = None) -> int:
        """Remove jobs in ``state`` older than ``grace`` seconds; how many."""
        fields: dict[str, Any] = {"grace": ms(grace), "state": state}
        if limit:
            fields["limit"] = limit
        return await self._sum("Clean", **fields)

    async def obliterate(self) -> None:
        """Delete the queue and every job in it."""
        await self._every("Obliterate")

    async def cancel(self, job_id: str, *, by: str | None = None) -> None:
        """Remove a job that is not active; an active one ends ``cancelled`` (``by`` records who),
        and the worker running it is told to stop."""
        await self._job_call("Cancel", job_id, **({"by": by} if by is not None else {}))

    async def promote(self, job_id: str) -> None:
        """Make a delayed job waiting now."""
        await self._job_call("Promote", job_id)

    # --- dead-letter queue ------------------------------------------------------------------

    async def dlq(self, limit: int = 100) -> list[Job]:
        """Dead-lettered jobs (each with its last ``error``)."""
        replies = await self._every("Dlq", limit=limit)
        return [self._job(j) for r in replies for j in r["jobs"]][:limit]

    async def retry_dlq(self, job_id: str | None = None) -> int:
        """Move dead-lettered jobs (or one) back to waiting with fresh attempts; how many."""
        return await self._sum("RetryDlq", **({"id": job_id} if job_id else {}))

    async def retry_completed(self, job_id: str | None = None) -> int:
        """Run completed jobs (or one) again; how many."""
        return await self._sum("RetryCompleted", **({"id": job_id} if job_id else {}))

    async def purge_dlq(self) -> int:
        """Delete every dead-lettered job; how many."""
        return await self._sum("PurgeDlq")

    # --- cron and events --------------------------------------------------------------------

    async def cron(self, name: str, data: Any = None, *, schedule: str | None = None,
                   every: float | None = None, priority: int | None = None, limit: int | None = None) -> float:
        """Add or replace the named schedule (a cron ``schedule`` expression, or ``every`` N seconds)
        that enqueues ``data``; returns the next run (epoch seconds)."""
        fields: dict[str, Any] = {"name": name, "data": data}
        if schedule is not None:
            fields["schedule"] = schedule
        if every is not None:
            fields["repeatEvery"] = ms(every)
        if priority is not None:
            fields["priority"] = priority
        if limit is not None:
            fields["limit"] = limit
        return float((await self._on(self._shards.names[0], "Cron", **fields))["nextRunAt"]) / 1000

    async def events(self, *, max_buffered: int = 10_000) -> AsyncIterator[dict[str, Any]]:
        """This queue's job events as they happen (``async for event in q.events(): ...``)."""
        async for event in self.client._events(set(self._shards.names), max_buffered):
            yield event


class Queue(SyncHandle):
    """The blocking twin of :class:`AsyncQueue` (from ``Client.queue(name)``): same methods, not awaited."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return str(self._async.name)

    @property
    def shards(self) -> int | None:
        return self._async.shards  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    def _job(self, job: Job | None) -> Job | None:
        if job is not None:
            job.handle = self
        return job

    create = blocking(AsyncQueue.create)
    update = blocking(AsyncQueue.update)
    add = blocking(AsyncQueue.add)
    add_bulk = blocking(AsyncQueue.add_bulk)
    ack = blocking(AsyncQueue.ack)
    ack_many = blocking(AsyncQueue.ack_many)
    fail = blocking(AsyncQueue.fail)
    release = blocking(AsyncQueue.release)
    extend = blocking(AsyncQueue.extend)
    progress = blocking(AsyncQueue.progress)
    log = blocking(AsyncQueue.log)
    logs = blocking(AsyncQueue.logs)
    get_state = blocking(AsyncQueue.get_state)
    get_result = blocking(AsyncQueue.get_result)
    get_children_values = blocking(AsyncQueue.get_children_values)
    get_progress = blocking(AsyncQueue.get_progress)
    counts = blocking(AsyncQueue.counts)
    count = blocking(AsyncQueue.count)
    counts_per_priority = blocking(AsyncQueue.counts_per_priority)
    is_paused = blocking(AsyncQueue.is_paused)
    metrics = blocking(AsyncQueue.metrics)
    pause = blocking(AsyncQueue.pause)
    resume = blocking(AsyncQueue.resume)
    drain = blocking(AsyncQueue.drain)
    clean = blocking(AsyncQueue.clean)
    obliterate = blocking(AsyncQueue.obliterate)
    cancel = blocking(AsyncQueue.cancel)
    promote = blocking(AsyncQueue.promote)
    retry_dlq = blocking(AsyncQueue.retry_dlq)
    retry_completed = blocking(AsyncQueue.retry_completed)
    purge_dlq = blocking(AsyncQueue.purge_dlq)
    cron = blocking(AsyncQueue.cron)
    events = blocking_iter(AsyncQueue.events)

    # Methods that return jobs bind them to this sync handle (so job.set_progress() blocks).

    def pull(self, timeout: float = 0.0, *, ttr: float | None = None, group: str | None = None,
             ungrouped: bool = False) -> Job | None:
        """Lease the next job, waiting up to ``timeout`` seconds for one; ``None`` if none came
        (``group``, ``ungrouped``: see :meth:`AsyncQueue.pull`)."""
        return self._job(self._runner.run(self._async.pull(timeout, ttr=ttr, group=group, ungrouped=ungrouped)))

    def pull_many(self, count: int, timeout: float = 0.0, *, ttr: float | None = None, group: str | None = None,
                  ungrouped: bool = False) -> list[Job]:
        """Lease up to ``count`` jobs, waiting up to ``timeout`` seconds for the first."""
        jobs = self._runner.run(self._async.pull_many(count, timeout, ttr=ttr, group=group, ungrouped=ungrouped))
        return [j for j in map(self._job, jobs) if j is not None]

    def get_job(self, job_id: str) -> Job | None:
        """The job with this id, or ``None``."""
        return self._job(self._runner.run(self._async.get_job(job_id)))

    def get_job_by_custom_id(self, custom_id: str) -> Job | None:
        """The job added with this ``custom_id``, or ``None``."""
        return self._job(self._runner.run(self._async.get_job_by_custom_id(custom_id)))

    def get_jobs(self, state: str | None = None, offset: int = 0, limit: int = 100) -> tuple[list[Job], int]:
        """A page of jobs (in ``state``) and the total."""
        jobs, total = self._runner.run(self._async.get_jobs(state, offset, limit))
        return [j for j in map(self._job, jobs) if j is not None], total

    def dlq(self, limit: int = 100) -> list[Job]:
        """Dead-lettered jobs (each with its last ``error``)."""
        return [j for j in map(self._job, self._runner.run(self._async.dlq(limit))) if j is not None]
