"""``AsyncTube`` and its blocking twin ``Tube``: tarantool's queue API over the same engine.

=====================  =========================  ==========================================
tarantool              Shoal command              notes
=====================  =========================  ==========================================
``put(data, opts)``    PUSH                       ``pri``, ``delay``/``ttl``/``ttr`` seconds, ``utube``
``take(timeout)``      PULL                       ``None`` when nothing came in ``timeout`` s
``ack(task)``          ACK                        with the task's lease token
``release(task)``      Release                    optional ``delay``
``bury(task)``         Bury                       to the buried (``!``) state
``kick(count)``        Kick                       buried → ready; how many
``touch(task, inc)``   Touch                      lease = ``inc`` seconds from now
``peek(task_id)``      GetJob
``delete(task_id)``    Cancel                     a task that is not taken
``drop()``             Obliterate
``release_all()``      ReleaseAll                 every taken task back to ready
``truncate()``         Truncate                   every task that is not taken
``statistics()``       Metrics                    ``{tasks: {ready, taken, ...}, calls}``
=====================  =========================  ==========================================
"""

from __future__ import annotations

from typing import Any

from ._loop import SyncHandle, blocking
from .job import Job
from .queue import AsyncQueue, QueueClient

__all__ = ["AsyncTube", "Tube", "TASK_STATES"]

#: Shoal state → tarantool's state name.
TASK_STATES = {"waiting": "ready", "delayed": "delayed", "active": "taken", "completed": "done",
               "failed": "buried"}


class AsyncTube:
    """A tarantool-style tube (get it with ``client.tube(name)``)."""

    def __init__(self, client: QueueClient, name: str) -> None:
        self.client = client
        self.name = name
        self.queue = AsyncQueue(client, name)

    def __repr__(self) -> str:
        return f"<AsyncTube {self.name!r}>"

    async def create(self, type: str = "fifottl", **options: Any) -> bool:
        """``create_tube``: a tube of ``type`` (fifo, fifottl, limfifottl, utube, utubettl) with options
        (``ttr``, ``ttl`` seconds, ``capacity``, …); ``True`` if it is new."""
        return await self.queue.create(type, **options)

    async def put(self, data: Any, *, pri: int | None = None, delay: float | None = None, ttl: float | None = None,
                  ttr: float | None = None, utube: str | None = None) -> Job:
        """Put a task; returns it as stored (state ``waiting`` or ``delayed``). ``pri`` is
        tarantool's: a lower ``pri`` is taken first (the job's priority on the wire is ``-pri``)."""
        job_id = await self.queue.add(data, priority=-pri if pri else None, delay=delay, ttl=ttl, ttr=ttr,
                                      group=utube)
        job = await self.queue.get_job(job_id)
        if job is None:  # removed already (ttl of 0, a concurrent delete): report what we know
            return Job(id=job_id, queue=self.name, data=data, handle=self.queue)
        return job

    async def take(self, timeout: float = 0.0) -> Job | None:
        """Take a task, waiting up to ``timeout`` seconds; ``None`` if none came."""
        return await self.queue.pull(timeout)

    async def ack(self, task: Job) -> None:
        """The task is done."""
        await self.queue.ack(task)

    async def release(self, task: Job, *, delay: float | None = None) -> str:
        """Put a taken task back (after ``delay`` seconds); its new state."""
        return await self.queue.release(task, delay=delay)

    async def bury(self, task: Job | str, error: str | None = None) -> None:
        """Bury a task (it stays until kicked or deleted)."""
        frame: dict[str, Any] = {"cmd": "Bury", "id": task.id if isinstance(task, Job) else task}
        if isinstance(task, Job) and task.token is not None:
            frame["token"] = task.token
        if error is not None:
            frame["error"] = error
        await self.client.call(frame)

    async def kick(self, count: int) -> int:
        """Move up to ``count`` buried tasks back to ready; how many moved."""
        return int((await self.client.call({"cmd": "Kick", "queue": self.name, "count": count}))["count"])

    async def touch(self, task: Job, increment: float) -> float:
        """Extend a taken task's lease to ``increment`` seconds from now; the new deadline (epoch s)."""
        return await self.queue.extend(task, increment)

    async def peek(self, task_id: str) -> Job | None:
        """Look at a task without taking it."""
        return await self.queue.get_job(task_id)

    async def delete(self, task_id: str) -> None:
        """Delete a task that is not taken."""
        await self.queue.cancel(task_id)

    async def drop(self) -> None:
        """Delete the tube and every task."""
        await self.queue.obliterate()

    async def release_all(self) -> int:
        """Put every taken task back to ready; how many."""
        return int((await self.client.call({"cmd": "ReleaseAll", "queue": self.name}))["count"])

    async def truncate(self) -> int:
        """Delete every task that is not taken; how many."""
        return int((await self.client.call({"cmd": "Truncate", "queue": self.name}))["count"])

    async def statistics(self) -> dict[str, Any]:
        """tarantool's ``statistics()``: ``{"tasks": {ready, taken, delayed, done, buried, total},
        "calls": {command: n}}``."""
        metrics = (await self.client.call({"cmd": "Metrics", "queue": self.name}))["metrics"]
        tasks = {TASK_STATES.get(s, s): int(n) for s, n in metrics["counts"].items()}
        tasks["total"] = sum(int(n) for n in metrics["counts"].values())
        return {"tasks": tasks, "calls": dict(metrics.get("calls") or {})}


class Tube(SyncHandle):
    """The blocking twin of :class:`AsyncTube` (from ``Client.tube(name)``)."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return str(self._async.name)

    def __repr__(self) -> str:
        return f"<Tube {self.name!r}>"

    create = blocking(AsyncTube.create)
    put = blocking(AsyncTube.put)
    take = blocking(AsyncTube.take)
    ack = blocking(AsyncTube.ack)
    release = blocking(AsyncTube.release)
    bury = blocking(AsyncTube.bury)
    kick = blocking(AsyncTube.kick)
    touch = blocking(AsyncTube.touch)
    peek = blocking(AsyncTube.peek)
    delete = blocking(AsyncTube.delete)
    drop = blocking(AsyncTube.drop)
    release_all = blocking(AsyncTube.release_all)
    truncate = blocking(AsyncTube.truncate)
    statistics = blocking(AsyncTube.statistics)
