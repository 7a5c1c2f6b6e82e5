"""Flow control of a queue: rate limits and concurrency, per queue and per group.

A queue's options may hold ``limit: {max, durationMs}`` (leases per sliding window of the
queue), ``groupLimit: {max, durationMs}`` (the same per group), ``groupLimits: {group:
{max, durationMs}}`` (per-group overrides of ``groupLimit``), ``concurrency`` (active
jobs of the queue) and ``groupConcurrency`` (active jobs per group; 1 unless set, and
always 1 for utube queues). ``max`` 0 and ``concurrency`` 0 mean no limit. ``groupWeights:
{group: weight}`` sets the share of turns of a group (``_ready``: fair turns between groups).

The windows are sliding, not fixed: a :class:`Limiter` keeps the lease stamps of the last
``durationMs`` (at most ``max`` of them), so no window of ``durationMs`` ever holds more
than ``max`` leases, wherever it starts. The stamps are replicated state (the snapshot
holds them, trimmed to the window at the snapshot's ``now``), so a new leader continues
the same windows after a failover. A group whose window is full is *parked* in a heap
keyed by the instant its oldest stamp leaves the window, so a pull never looks at a
throttled group twice before its budget returns: O(log n) in the number of groups.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from shoal.cluster.errors import CommandError, ErrorCode

__all__ = ["LIMIT_OPTIONS", "Limiter", "limiter_of", "group_concurrency_of", "check_limit_options"]

#: The flow-control options of a queue (the engine keeps them with the other queue options).
LIMIT_OPTIONS = ("limit", "groupLimit", "groupLimits", "concurrency", "groupConcurrency", "groupWeights")


def check_limit_options(opts: dict[str, Any], qtype: str) -> None:
    """Refuse limits a queue type cannot honour (the fields themselves are checked by the schema)."""
    conc = opts.get("groupConcurrency")
    if conc is not None and conc != 1 and qtype in ("utube", "utubettl"):
        raise CommandError(ErrorCode.INVALID, f"groupConcurrency: a {qtype} queue runs one job per group")
    if qtype == "log" and any(opts.get(k) for k in LIMIT_OPTIONS):
        raise CommandError(ErrorCode.INVALID, f"{next(k for k in LIMIT_OPTIONS if opts.get(k))}: "
                                              "a log queue is read, not leased, so it has no limits")


def group_concurrency_of(opts: dict[str, Any], qtype: str) -> int:
    """Active jobs allowed per group; 0 means no limit. utube queues serve one per group."""
    if qtype in ("utube", "utubettl"):
        return 1
    value = opts.get("groupConcurrency")
    return 1 if value is None else int(value)


class Limiter:
    """The rate and concurrency limits of one queue and their sliding-window stamps."""

    __slots__ = ("max", "duration_ms", "group_max", "group_duration_ms", "overrides", "concurrency", "stamps",
                 "group_stamps", "parked", "parked_groups")

    def __init__(self, opts: dict[str, Any]) -> None:
        limit = opts.get("limit") or {}
        group_limit = opts.get("groupLimit") or {}
        self.max: int = limit.get("max", 0) or 0
        self.duration_ms: int = limit.get("durationMs", 0) or 0
        self.group_max: int = group_limit.get("max", 0) or 0
        self.group_duration_ms: int = group_limit.get("durationMs", 0) or 0
        #: group -> (max, durationMs) in place of groupLimit's
        self.overrides: dict[str, tuple[int, int]] = {
            g: (o.get("max", 0) or 0, o.get("durationMs", 0) or 0) for g, o in (opts.get("groupLimits") or {}).items()}
        self.concurrency: int = opts.get("concurrency") or 0
        self.stamps: deque[int] = deque()                # lease stamps of the queue's window
        self.group_stamps: dict[str, deque[int]] = {}    # group -> lease stamps of its window
        self.parked: list[tuple[int, str]] = []          # (budget returns at, group), a heap
        self.parked_groups: set[str] = set()             # the groups in ``parked``, each once

    # -- queue-wide -------------------------------------------------------------------------

    def queue_open(self, active: int, now_ms: int) -> bool:
        """True when the queue may lease one more job at ``now_ms``."""
        if self.concurrency and active >= self.concurrency:
            return False
        if self.max:
            stamps = self.stamps
            edge = now_ms - self.duration_ms
            while stamps and stamps[0] <= edge:
                stamps.popleft()
            if len(stamps) >= self.max:
                return False
        return True

    # -- per group --------------------------------------------------------------------------

    def group_open(self, group: str, now_ms: int) -> bool:
        """True when ``group`` has rate budget at ``now_ms`` (its concurrency is checked elsewhere)."""
        group_max, duration_ms = self.group_rule(group)
        if not group_max:
            return True
        stamps = self.group_stamps.get(group)
        if stamps is None:
            return True
        edge = now_ms - duration_ms
        while stamps and stamps[0] <= edge:
            stamps.popleft()
        if not stamps:
            del self.group_stamps[group]
            return True
        return len(stamps) < group_max

    def group_rule(self, group: str) -> tuple[int, int]:
        """``(max, durationMs)`` of ``group``'s window: its override, else ``groupLimit``'s."""
        if self.overrides:
            rule = self.overrides.get(group)
            if rule is not None:
                return rule
        return self.group_max, self.group_duration_ms

    def park(self, group: str) -> None:
        """Set ``group`` aside until its oldest stamp leaves the window."""
        if group not in self.parked_groups:
            self.parked_groups.add(group)
            heapq.heappush(self.parked, (self.group_stamps[group][0] + self.group_rule(group)[1], group))

    def unpark(self, now_ms: int) -> list[str]:
        """The parked groups whose budget has returned by ``now_ms``."""
        parked, out = self.parked, []
        while parked and parked[0][0] <= now_ms:
            group = heapq.heappop(parked)[1]
            self.parked_groups.discard(group)
            out.append(group)
        return out

    def note_lease(self, group: str | None, now_ms: int) -> None:
        """Count one lease made at ``now_ms`` (of a job in ``group``, if any)."""
        if self.max:
            self.stamps.append(now_ms)
        if group is not None and (self.group_max or self.overrides) and self.group_rule(group)[0]:
            stamps = self.group_stamps.get(group)
            if stamps is None:
                stamps = self.group_stamps[group] = deque()
            stamps.append(now_ms)

    def next_budget_ms(self, active: int) -> int | None:
        """When a pull blocked by this limiter could next lease (None: not blocked by a window)."""
        due = []
        if self.max and len(self.stamps) >= self.max and not (self.concurrency and active >= self.concurrency):
            due.append(self.stamps[0] + self.duration_ms)
        if self.parked:
            due.append(self.parked[0][0])
        return min(due) if due else None

    # -- replicated state -------------------------------------------------------------------

    def state(self, now_ms: int) -> list[Any]:
        """The stamps still inside their windows at ``now_ms``, canonical (groups sorted)."""
        edge = now_ms - self.duration_ms
        groups = {g: [t for t in s if t > now_ms - self.group_rule(g)[1]] for g, s in sorted(self.group_stamps.items())}
        return [[t for t in self.stamps if t > edge], {g: s for g, s in groups.items() if s}]

    def load(self, state: list[Any]) -> None:
        """Restore :meth:`state`."""
        self.stamps = deque(state[0])
        self.group_stamps = {g: deque(s) for g, s in state[1].items()}

    def carry_from(self, old: "Limiter", now_ms: int) -> None:
        """Keep ``old``'s live stamps when the options change, so a window never restarts early.

        A stamp that had left ``old``'s window stays out even if the window grows, and a
        limit that is switched off forgets its stamps: the live state then means exactly
        what a snapshot (stamps trimmed to their window) restores.
        """
        if self.max and old.max:
            edge = now_ms - old.duration_ms
            self.stamps = deque(t for t in old.stamps if t > edge)
        if self.group_max or self.overrides:
            groups = {g: deque(t for t in s if t > now_ms - old.group_rule(g)[1])
                      for g, s in old.group_stamps.items() if old.group_rule(g)[0] and self.group_rule(g)[0]}
            self.group_stamps = {g: s for g, s in groups.items() if s}
        # ``parked`` is not carried: the engine exposes every group's head again after a change.


def limiter_of(opts: dict[str, Any], old: Limiter | None = None, now_ms: int = 0) -> Limiter | None:
    """The limiter ``opts`` ask for, or None when they set no rate or queue concurrency limit."""
    limit = opts.get("limit") or {}
    group_limit = opts.get("groupLimit") or {}
    if not (limit.get("max") or group_limit.get("max") or opts.get("concurrency") or opts.get("groupLimits")):
        return None
    lim = Limiter(opts)
    if old is not None:
        lim.carry_from(old, now_ms)
    return lim
