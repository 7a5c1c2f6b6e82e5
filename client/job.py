"""A job as the client sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Job", "JobState"]


class JobState(str, Enum):
    """A job's state as the node reports it."""

    WAITING = "waiting"
    DELAYED = "delayed"
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING_CHILDREN = "waiting-children"  # a flow's parent until its children are done
    CANCELLED = "cancelled"


@dataclass(slots=True)
class Job:
    """A pulled or fetched job. ``token`` is the lease's fencing token (set when pulled).

    ``attempts`` counts the attempts made, the current one included (1 on a job's first
    pull). Times (``created_at``, ``run_at``) are epoch seconds. A job that came from a queue
    handle can report on itself: ``job.set_progress(50)``, ``job.add_log("..")``, ``job.extend(30)``
    (awaitables from an async queue, blocking calls from a sync one).
    """

    id: str
    queue: str
    data: Any
    priority: int = 0
    state: str = "waiting"
    attempts: int = 0
    max_attempts: int = 1
    created_at: float = 0.0
    run_at: float = 0.0
    progress: int = 0
    token: str | None = None
    group: str | None = None
    custom_id: str | None = None
    tag: str | None = None
    result: Any = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    handle: Any = field(default=None, repr=False, compare=False)
    #: Set by a ``Worker`` when the job is cancelled while its handler runs (a plain-function
    #: handler checks it; an async handler's task is cancelled instead).
    cancelled: bool = field(default=False, repr=False, compare=False)

    def set_progress(self, progress: int, message: str | None = None) -> Any:
        """Report progress 0..100 (with an optional message) through the queue handle."""
        return self._handle().progress(self, progress, message)

    def add_log(self, message: str) -> Any:
        """Append a line to the job's log through the queue handle."""
        return self._handle().log(self, message)

    def extend(self, ttr: float) -> Any:
        """Extend the lease to ``ttr`` seconds from now through the queue handle."""
        return self._handle().extend(self, ttr)

    @property
    def parent(self) -> str | None:
        """A flow child's parent id (``None`` for a job outside a flow or a top parent)."""
        return self.raw.get("parent")

    def children_values(self) -> Any:
        """A flow parent's children's results ``{child_id: result}`` through the queue handle."""
        return self._handle().get_children_values(self)

    def _handle(self) -> Any:
        if self.handle is None:
            raise RuntimeError("this Job is not bound to a queue handle")
        return self.handle

    @classmethod
    def from_wire(cls, wire: dict[str, Any], token: str | None = None, handle: Any = None) -> "Job":
        """A job from the node's record (bunqueue's job record: ``attempts`` there counts the
        attempts before the current one, a waiting job with a priority is ``prioritized``)."""
        state = wire.get("state", "waiting")
        if state == "prioritized":
            state = JobState.WAITING.value
        attempts = wire.get("attempts", 0)
        if state in (JobState.ACTIVE.value, JobState.COMPLETED.value, JobState.CANCELLED.value):
            attempts += 1  # here: the attempts made, this one included
        return cls(id=wire["id"], queue=wire["queue"], data=wire.get("data"), priority=wire.get("priority", 0),
                   state=state, attempts=attempts,
                   max_attempts=wire.get("maxAttempts", 1), created_at=wire.get("createdAt", 0) / 1000,
                   run_at=wire.get("runAt", 0) / 1000, progress=wire.get("progress", 0), token=token,
                   group=wire.get("group"), custom_id=wire.get("customId"), tag=wire.get("tag"),
                   result=wire.get("result"), error=wire.get("error"), raw=wire, handle=handle)
