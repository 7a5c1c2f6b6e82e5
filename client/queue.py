"""``AsyncQueue``: the BullMQ/bunqueue-style API of one queue (times in seconds)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from .job import Job

if TYPE_CHECKING:
    from ._async import AsyncClient

__all__ = ["AsyncQueue"]

_JOB_OPTIONS = {"priority": "priority", "custom_id": "customId", "attempts": "attempts", "group": "group",
                "tag": "tag"}
_TIME_OPTIONS = {"delay": "delay", "ttl": "ttl", "ttr": "ttr", "backoff": "backoff"}


def job_fields(options: dict[str, Any]) -> dict[str, Any]:
    """Python keyword options → wire fields (seconds → ms)."""
    from ._async import ms
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _JOB_OPTIONS:
            out[_JOB_OPTIONS[key]] = value
        elif key in _TIME_OPTIONS:
            out[_TIME_OPTIONS[key]] = ms(value)
        else:
            raise TypeError(f"unknown job option {key!r}")
    return out


def _id(job: Job | str) -> str:
    return job.id if isinstance(job, Job) else job


def _token(job: Job | str, token: str | None) -> dict[str, Any]:
    token = token if token is not None else (job.token if isinstance(job, Job) else None)
    return {"token": token} if token is not None else {}


class AsyncQueue:
    """One queue of an :class:`AsyncClient`."""

    def __init__(self, client: "AsyncClient", name: str) -> None:
        self.client = client
        self.name = name

    async def _call(self, cmd: str, **fields: Any) -> dict[str, Any]:
        return await self.client.call({"cmd": cmd, "queue": self.name, **fields})

    async def create(self, type: str = "standard", **options: Any) -> bool:
        """Create the queue with a type (fifo, fifottl, limfifottl, utube, utubettl, log) and options."""
        from ._async import ms
        wire = {k: (ms(v) if k in ("ttr", "ttl", "backoff", "historyAgeMs") else v) for k, v in options.items()}
        return (await self._call("CreateQueue", type=type, options=wire))["created"]

    async def add(self, data: Any, *, priority: int | None = None, delay: float | None = None,
                  custom_id: str | None = None, attempts: int | None = None, backoff: float | None = None,
                  ttl: float | None = None, ttr: float | None = None, group: str | None = None,
                  tag: str | None = None) -> str:
        """Enqueue one job; returns its id. Safe to retry: the client adds an idempotency key."""
        fields = job_fields({"priority": priority, "delay": delay, "custom_id": custom_id, "attempts": attempts,
                             "backoff": backoff, "ttl": ttl, "ttr": ttr, "group": group, "tag": tag})
        reply = await self._call("PUSH", data=data, idempotencyKey=self.client.new_idempotency_key(), **fields)
        return reply["id"]

    async def add_bulk(self, items: Iterable[Any], *, batch_size: int = 1000, **options: Any) -> list[str]:
        """Enqueue many jobs in pipelined batches; ``options`` apply to every job."""
        import asyncio
        fields = job_fields(options)
        jobs = [{"data": item, "idempotencyKey": self.client.new_idempotency_key(), **fields} for item in items]
        batches = [jobs[i:i + batch_size] for i in range(0, len(jobs), batch_size)]
        replies = await asyncio.gather(*(self._call("PUSHB", jobs=b) for b in batches))
        return [job_id for r in replies for job_id in r["ids"]]

    async def pull(self, timeout: float = 0.0, *, ttr: float | None = None) -> Job | None:
        """Lease the next job (waiting up to ``timeout`` seconds), or ``None``."""
        from ._async import ms
        fields: dict[str, Any] = {"timeout": ms(timeout)} if timeout else {}
        if ttr is not None:
            fields["ttr"] = ms(ttr)
        reply = await self._call("PULL", **fields)
        return Job.from_wire(reply["job"], reply.get("token")) if reply.get("job") else None

    async def pull_many(self, count: int, timeout: float = 0.0, *, ttr: float | None = None) -> list[Job]:
        from ._async import ms
        fields: dict[str, Any] = {"count": count}
        if timeout:
            fields["timeout"] = ms(timeout)
        if ttr is not None:
            fields["ttr"] = ms(ttr)
        reply = await self._call("PULLB", **fields)
        return [Job.from_wire(j, t) for j, t in zip(reply["jobs"], reply.get("tokens") or [])]

    async def ack(self, job: Job | str, result: Any = None, *, token: str | None = None) -> None:
        fields = _token(job, token)
        if result is not None:
            fields["result"] = result
        await self.client.call({"cmd": "ACK", "id": _id(job), **fields})

    async def ack_many(self, jobs: list[Job]) -> int:
        """Acknowledge jobs (split by partition, as ACKB requires)."""
        from shoal.cluster.jobid import partition_of_job
        groups: dict[int, list[Job]] = {}
        for job in jobs:
            groups.setdefault(partition_of_job(job.id), []).append(job)
        done = 0
        for batch in groups.values():
            reply = await self.client.call({"cmd": "ACKB", "ids": [j.id for j in batch],
                                             "tokens": [j.token for j in batch]})
            done += reply.get("count", len(batch))
        return done

    async def fail(self, job: Job | str, error: str = "failed", *, delay: float | None = None,
                   token: str | None = None) -> str:
        """Fail an attempt: retried with backoff while attempts remain, else dead-lettered."""
        from ._async import ms
        fields = {"error": error, **_token(job, token)}
        if delay is not None:
            fields["delay"] = ms(delay)
        return (await self.client.call({"cmd": "FAIL", "id": _id(job), **fields}))["state"]

    async def release(self, job: Job | str, *, delay: float | None = None, token: str | None = None) -> str:
        from ._async import ms
        fields = _token(job, token)
        if delay:
            fields["delay"] = ms(delay)
        return (await self.client.call({"cmd": "Release", "id": _id(job), **fields}))["state"]

    async def extend(self, job: Job | str, ttr: float, *, token: str | None = None) -> float:
        """Extend the lease to ``ttr`` seconds from now; returns the new deadline (epoch seconds)."""
        from ._async import ms
        reply = await self.client.call({"cmd": "Touch", "id": _id(job), "ttr": ms(ttr), **_token(job, token)})
        return reply["deadline"] / 1000

    async def progress(self, job: Job | str, progress: int, message: str | None = None) -> None:
        fields: dict[str, Any] = {"progress": progress}
        if message is not None:
            fields["message"] = message
        await self.client.call({"cmd": "Progress", "id": _id(job), **fields})

    async def log(self, job: Job | str, message: str) -> None:
        await self.client.call({"cmd": "AddLog", "id": _id(job), "message": message})

    async def logs(self, job: Job | str, limit: int | None = None) -> list[dict[str, Any]]:
        fields = {"limit": limit} if limit else {}
        return (await self.client.call({"cmd": "GetLogs", "id": _id(job), **fields}))["logs"]

    async def get_job(self, job_id: str) -> Job | None:
        reply = await self.client.call({"cmd": "GetJob", "id": job_id})
        return Job.from_wire(reply["job"]) if reply.get("job") else None

    async def get_state(self, job_id: str) -> str:
        return (await self.client.call({"cmd": "GetState", "id": job_id}))["state"]

    async def get_result(self, job_id: str) -> Any:
        return (await self.client.call({"cmd": "GetResult", "id": job_id}))["result"]

    async def counts(self) -> dict[str, int]:
        return (await self._call("GetJobCounts"))["counts"]

    async def count(self, state: str | None = None) -> int:
        return (await self._call("Count", **({"state": state} if state else {})))["count"]

    async def get_jobs(self, state: str | None = None, offset: int = 0, limit: int = 100) -> tuple[list[Job], int]:
        fields: dict[str, Any] = {"offset": offset, "limit": limit}
        if state:
            fields["state"] = state
        reply = await self._call("GetJobs", **fields)
        return [Job.from_wire(j) for j in reply["jobs"]], reply["total"]

    async def pause(self) -> None:
        await self._call("Pause")

    async def resume(self) -> None:
        await self._call("Resume")

    async def is_paused(self) -> bool:
        return (await self._call("IsPaused"))["paused"]

    async def drain(self) -> int:
        return (await self._call("Drain"))["count"]

    async def clean(self, grace: float = 0.0, state: str = "completed", limit: int | None = None) -> int:
        from ._async import ms
        fields: dict[str, Any] = {"grace": ms(grace), "state": state}
        if limit:
            fields["limit"] = limit
        return (await self._call("Clean", **fields))["count"]

    async def obliterate(self) -> None:
        await self._call("Obliterate")

    async def dlq(self, limit: int = 100) -> list[Job]:
        return [Job.from_wire(j) for j in (await self._call("Dlq", limit=limit))["jobs"]]

    async def retry_dlq(self, job_id: str | None = None) -> int:
        return (await self._call("RetryDlq", **({"id": job_id} if job_id else {})))["count"]

    async def purge_dlq(self) -> int:
        return (await self._call("PurgeDlq"))["count"]

    async def cron(self, name: str, data: Any = None, *, schedule: str | None = None,
                   every: float | None = None, priority: int | None = None, limit: int | None = None) -> float:
        """Add or replace a named schedule (cron expression or every N seconds); returns next run (epoch s)."""
        from ._async import ms
        fields: dict[str, Any] = {"name": name, "data": data}
        if schedule is not None:
            fields["schedule"] = schedule
        if every is not None:
            fields["repeatEvery"] = ms(every)
        if priority is not None:
            fields["priority"] = priority
        if limit is not None:
            fields["limit"] = limit
        return (await self._call("Cron", **fields))["nextRunAt"] / 1000

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async for event in self.client.events(self.name):
            yield event
