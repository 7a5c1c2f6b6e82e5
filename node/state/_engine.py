"""``PartitionEngine``: the mixins of each concern over one :class:`~._store.Store`, and ``apply``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from shoal.cluster.commands import READ_COMMANDS
from shoal.cluster.errors import CommandError, ErrorCode

from ._ack import AckOps
from ._cancel import CancelOps
from ._commands import AckRun, PushBatch, PushRun, SessionPull, TypedCommand
from ._control import ControlOps
from ._flows import FlowOps
from ._forwarded import FORWARDED_PURGE_LATE_MS, ForwardedKeys
from ._dedupe import DedupeOps
from ._model import Event
from ._moves import Moves
from ._payloads import PayloadSpace
from ._pull import PullOps
from ._push import PushOps
from ._reads import ReadOps
from ._ready import ReadyIndex
from ._snapshot import SnapshotOps
from ._timers import TimerOps
from ._transitions import ACTIVE, WAITING

__all__ = ["PartitionEngine", "Applied", "event_dicts"]

_NO_EVENTS: tuple[Event, ...] = ()  # ``apply`` with ``events=False`` answers it (immutable: shared)
_new_tuple = tuple.__new__


class Applied(NamedTuple):
    """What one command did: its reply fields and the job events it caused, in order."""

    result: dict[str, Any]
    events: Sequence[Event]


class PartitionEngine(PushOps, DedupeOps, ForwardedKeys, PullOps, AckOps, CancelOps, TimerOps, ControlOps, FlowOps,
                      ReadOps, SnapshotOps, Moves, ReadyIndex):
    """All queues of one partition, driven by :meth:`apply` (see the package docstring)."""

    def __init__(self, partition: int, space: PayloadSpace | None = None) -> None:
        """An empty partition ``partition``; its segments' job data goes to ``space`` (a
        :class:`~._payloads.MemorySpace` when None)."""
        super().__init__(partition, space)
        self._handlers = {name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}
        self._typed: dict[type, Any] = {PushRun: self._apply_push_run, PushBatch: self._apply_push_batch,
                                        AckRun: self._apply_ack_run, SessionPull: self._apply_session_pull}

    def apply(self, cmd: dict[str, Any] | TypedCommand, now_ms: int, *, replies: bool = True,
              events: bool = True) -> Applied:
        """Apply one validated command (a dict, or one of the typed forms of :mod:`._commands`);
        return its reply and events, or raise ``CommandError``.

        ``replies`` False: build no reply contents (a follower's replies are never read; ids
        and jobs are left out, the state is the same). ``events`` False: collect no events
        (nobody listens). The partition clock only moves when a write succeeds: reads are
        served by the leader alone and a refused command must leave no trace, or replicas
        would differ.
        """
        if type(cmd) is dict:
            name = cmd["cmd"]
            handler = self._handlers.get(name.lstrip("_") if name[0] == "_" else name)
            if handler is None:
                raise CommandError(ErrorCode.UNKNOWN_COMMAND, f"the engine does not handle {name!r}")
        else:
            name = cmd.name  # type: ignore[union-attr]
            handler = self._typed[type(cmd)]
        before = self.now_ms
        if now_ms > before:
            self.now_ms = now_ms
        self._replies = replies
        out = self._events = [] if events else None
        try:
            reply = handler(cmd)
        except BaseException:
            self.now_ms = before
            raise
        if name in READ_COMMANDS:
            self.now_ms = before
        # tuple.__new__: a NamedTuple's own __new__ is a Python function, a cost on every command
        return _new_tuple(Applied, (reply, _NO_EVENTS if out is None else out))

    def has_ready(self, queue: str, group: str | None = None, ungrouped: bool = False) -> bool:
        """True when a pull on ``queue`` would get a job now; with ``group``, a pull limited to
        that group's jobs, with ``ungrouped``, one limited to jobs without a group."""
        q = self.queues.get(queue)
        if q is None or q.paused or q.type == "log":
            return False
        if q.limiter is not None and not q.limiter.queue_open(q.counts[ACTIVE], self.now_ms):
            return False  # out of budget: next_due_ms ticks the leader when it returns
        if self.delayed.due_ms <= self.now_ms:
            return True  # a due delayed job may belong to it; the pull promotes it
        if group is not None:
            # A queue type without groups refuses the pull (INVALID): it must not wait to say so.
            return not q.preset["group"] or self._group_ready(q, group) is not None
        if ungrouped:
            return self._ungrouped_head(q) is not None
        return self._peek_ready(q) is not None

    def next_due_ms(self) -> int | None:
        """Earliest time a delayed job, lease, TTL or cron becomes due."""
        if not (self.queues or self.delayed or self.leases or self.ttls or self.crons or self.idem.runs
                or self.forwarded):
            return None  # the node's tick loop asks every led partition several times a second
        due = [h[0][0] for h in (self.leases, self.ttls) if h]
        if self.delayed:
            due.append(self.delayed.due_ms)
        if self.forwarded:  # dropped in passing: at most one tick a second for them, never one per entry
            due.append(self.forwarded[0][0] + FORWARDED_PURGE_LATE_MS)
        due += [c["nextRunAt"] for c in self.crons.values()]
        if self.idem.runs:
            due.append(self.idem.runs[0][0])
        for q in self.queues.values():  # a parked long poll wakes when a rate window frees up
            if q.limiter is not None and q.counts[WAITING]:
                budget_ms = q.limiter.next_budget_ms(q.counts[ACTIVE])
                if budget_ms is not None:
                    due.append(budget_ms)
        return min(due) if due else None

    def queue_names(self) -> list[str]:
        """Names of this partition's queues, sorted."""
        return sorted(self.queues)


def event_dicts(partition: int, events: Sequence[Event], engine: "PartitionEngine | None" = None
                ) -> list[dict[str, Any]]:
    """``events`` of ``partition`` in the form the node publishes to subscribers; with the
    partition's ``engine``, a job with a custom id is named by it (its id on the wire)."""
    out = []
    for queue, seq, state, prev in events:
        job_id = engine.wire_id_of_seq(seq) if engine is not None else f"{partition}-{seq}"
        if state == "progress":
            out.append({"event": "progress", "queue": queue, "id": job_id, "progress": prev, "partition": partition})
        else:
            out.append({"event": "job", "queue": queue, "id": job_id, "state": state, "prev": prev,
                        "partition": partition})
    return out
