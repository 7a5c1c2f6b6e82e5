"""A read-only view of one partition's applied state, for the node's edge.

The edge (the HTTP API and dashboard, the metrics collector, the flow forwarder, the
digests, the server's tick loop, the dispatcher's reads) reads a partition through a
:class:`PartitionView` and never holds its engine: what comes back is a number, a tuple, a
frozen record, a read-only mapping or a freshly built reply, so state changes only through
replicated commands. The view asks its getter for the engine on every call, because the
partition's machine (:class:`~.machine.PartitionMachine`) replaces its engine object when
its replica installs a snapshot.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import Any

from shoal.cluster.commands import READ_COMMANDS

from ..state import Event, PartitionEngine, event_dicts

__all__ = ["FlowReport", "PartitionView", "QueueFigures"]

FlowReport = tuple[int, tuple[Any, ...]]
"""``(seq of the finished child job here, (parent id, failed, result, error, on_failure))``."""


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One queue's figures: its name, durability class, jobs by state and running totals.

    ``counts`` and ``totals`` are read-only views of the live counters: read them in the
    same loop turn (a scrape, a request), or copy them.
    """

    name: str
    durable: bool
    counts: Mapping[str, int]
    totals: Mapping[str, int]


class PartitionView:
    """Read-only access to the applied state of one replica's partition.

    ``engine_getter`` returns the partition's current engine (the machine swaps it when
    its replica installs a snapshot). Every method is cheap enough for a scrape or a tick, except
    :meth:`digest`, which hashes the whole state.
    """

    __slots__ = ("_engine", "_seen", "_state_id")

    def __init__(self, engine_getter: Callable[[], PartitionEngine]) -> None:
        self._engine = engine_getter
        self._seen: weakref.ref[PartitionEngine] | None = None
        self._state_id = 0

    def read(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """The reply to a read-only command (``cluster.commands.READ_COMMANDS``) from the applied state.

        Raises ``ValueError`` for any other command: writes go through Raft.
        """
        if cmd.get("cmd") not in READ_COMMANDS:
            raise ValueError(f"{cmd.get('cmd')!r} is not a read-only command")
        return self._engine().apply(cmd, now_ms, events=False).result

    def fresh_heartbeat(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any] | None:
        """The reply to a ``JobHeartbeatB`` that would only move fresh leases a little, from the
        applied state; None when it must go through Raft (``PartitionEngine.fresh_heartbeat``)."""
        return self._engine().fresh_heartbeat(cmd, now_ms)

    def has_ready(self, queue: str, group: str | None = None, ungrouped: bool = False) -> bool:
        """True when a pull on ``queue`` would get a job now (limited to ``group``'s jobs, or to
        jobs without a group with ``ungrouped``: see ``PartitionEngine.has_ready``)."""
        return self._engine().has_ready(queue, group, ungrouped)

    def job_count(self) -> int:
        """Jobs held in every state."""
        return self._engine().job_count()

    def has_queues(self) -> bool:
        """True when the partition holds at least one queue."""
        return bool(self._engine().queues)

    def next_due_ms(self) -> int | None:
        """Earliest time a delayed job, lease, TTL or cron becomes due (None: nothing pending)."""
        return self._engine().next_due_ms()

    def queue_figures(self) -> tuple[QueueFigures, ...]:
        """Every queue's name, durability class and counters."""
        return tuple(
            QueueFigures(name, bool(q.opts.get("durable", True)), MappingProxyType(q.counts), MappingProxyType(q.totals))
            for name, q in self._engine().queues.items()
        )

    def lease_sessions(self, limit: int) -> tuple[str, ...]:
        """At most ``limit`` of the sessions that hold leases here (for the leader's session audit)."""
        return tuple(islice(self._engine().sessions, limit))

    def holds_leases(self, session: str) -> bool:
        """True when ``session`` holds a lease here."""
        return self._engine().sessions.count(session) > 0

    def has_flow_reports(self) -> bool:
        """True when finished child jobs here have reports their parents have not acknowledged."""
        return bool(self._engine().flow_outbox)

    def flow_reports(self, limit: int) -> tuple[FlowReport, ...]:
        """The oldest ``limit`` unacknowledged child reports (acknowledged by a replicated ``_FlowAcked``)."""
        return tuple(islice(self._engine().flow_outbox.items(), limit))

    def event_job(self, job_id: str) -> tuple[str, Any, Any] | None:
        """A job's wire id, result and error for an event frame (None when the job is gone)."""
        return self._engine().event_job(job_id)

    def event_job_at(self, seq: int) -> tuple[str, Any, Any] | None:
        """:meth:`event_job` by the job's number, for an event the engine recorded: None for a
        segment's plain job (Shoal's own id, no result or error) or a job that is gone."""
        return self._engine().event_job_at(seq)

    def event_jobs_plain(self, first: int, count: int) -> bool:
        """True when :meth:`event_job_at` is None for each of ``first`` .. ``first + count - 1``."""
        return self._engine().event_jobs_plain(first, count)

    def event_dicts(self, partition: int, events: Sequence[Event]) -> list[dict[str, Any]]:
        """``events`` as the node publishes them, a job with a custom id named by it."""
        return event_dicts(partition, events, self._engine())

    def digest(self) -> str:
        """SHA-256 of the state's snapshot: equal on replicas that applied the same entries.

        Proportional to the state: a large one is hashed in a forked child, which calls
        this on its copy-on-write image of the view (see :mod:`shoal.node.digests`).
        """
        return self._engine().digest()

    def state_id(self) -> int:
        """A number that changes whenever the machine replaces its state object (a snapshot was
        installed), so a digest cached with ``(state_id(), applied index)`` is known stale."""
        engine = self._engine()
        if self._seen is None or self._seen() is not engine:
            self._seen = weakref.ref(engine)  # weak: a replaced engine is freed at once
            self._state_id += 1
        return self._state_id
