"""``AsyncTube``: tarantool's queue API over the same engine (seed 002).

put/take/ack/release/bury/kick/touch/peek/delete/drop/release_all/truncate/
statistics map onto PUSH/PULL/ACK/Release/Bury/Kick/Touch/GetJob/Cancel/
Obliterate/ReleaseAll/Truncate/Metrics. Times in seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .job import Job
from .queue import AsyncQueue

if TYPE_CHECKING:
    from ._async import AsyncClient

__all__ = ["AsyncTube"]


class AsyncTube:
    """A tarantool-style tube."""

    def __init__(self, client: "AsyncClient", name: str) -> None:
        self.client = client
        self.name = name
        self._queue = AsyncQueue(client, name)

    async def create(self, type: str = "fifottl", **options: Any) -> bool:
        return await self._queue.create(type, **options)

    async def put(self, data: Any, *, pri: int | None = None, delay: float | None = None, ttl: float | None = None,
                  ttr: float | None = None, utube: str | None = None) -> Job:
        job_id = await self._queue.add(data, priority=pri, delay=delay, ttl=ttl, ttr=ttr, group=utube)
        job = await self._queue.get_job(job_id)
        assert job is not None
        return job

    async def take(self, timeout: float = 0.0) -> Job | None:
        return await self._queue.pull(timeout)

    async def ack(self, job: Job) -> None:
        await self._queue.ack(job)

    async def release(self, job: Job, *, delay: float | None = None) -> str:
        return await self._queue.release(job, delay=delay)

    async def bury(self, job: Job | str) -> None:
        token = job.token if isinstance(job, Job) else None
        frame: dict[str, Any] = {"cmd": "Bury", "id": job.id if isinstance(job, Job) else job}
        if token:
            frame["token"] = token
        await self.client.call(frame)

    async def kick(self, count: int) -> int:
        return (await self.client.call({"cmd": "Kick", "queue": self.name, "count": count}))["count"]

    async def touch(self, job: Job, increment: float) -> float:
        return await self._queue.extend(job, increment)

    async def peek(self, job_id: str) -> Job | None:
        return await self._queue.get_job(job_id)

    async def delete(self, job_id: str) -> None:
        await self.client.call({"cmd": "Cancel", "id": job_id})

    async def drop(self) -> None:
        await self._queue.obliterate()

    async def release_all(self) -> int:
        return (await self.client.call({"cmd": "ReleaseAll", "queue": self.name}))["count"]

    async def truncate(self) -> int:
        return (await self.client.call({"cmd": "Truncate", "queue": self.name}))["count"]

    async def statistics(self) -> dict[str, Any]:
        """tarantool's statistics(): tasks by state and calls by command."""
        metrics = (await self.client.call({"cmd": "Metrics", "queue": self.name}))["metrics"]
        codes = {"waiting": "ready", "delayed": "delayed", "active": "taken", "completed": "done", "failed": "buried"}
        tasks = {codes[s]: n for s, n in metrics["counts"].items()}
        tasks["total"] = sum(metrics["counts"].values())
        return {"tasks": tasks, "calls": metrics["calls"]}
