"""The reference rule of the turns between groups (docs/commands.md, "Groups"), by scanning:
the models of ``test_engine_model.py`` and ``test_engine_fair_groups.py`` share it; and what the
group tests share besides (an engine with queue ``q``, counting heap operations)."""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Iterator
from typing import Any

from shoal.node.state import PartitionEngine

LONG_TTR_MS = 24 * 3600 * 1000  # no lease lapses within a test


def run(engine: PartitionEngine, cmd: dict[str, Any], now: int = 1_000) -> dict[str, Any]:
    """``cmd``'s reply from ``engine`` at ``now``."""
    return engine.apply(cmd, now).result


def engine_with(options: dict[str, Any] | None = None, qtype: str = "standard") -> PartitionEngine:
    """An engine with queue ``q`` of ``qtype`` and ``options`` (leases of a day)."""
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "q", "type": qtype, "options": {"ttr": LONG_TTR_MS, **(options or {})}})
    return e


def fair_pull(jobs: dict[int, dict[str, Any]], tags: dict[str, int], vtime: int,
              may_run: Callable[[str], bool], stride: Callable[[str], int]) -> tuple[int | None, int]:
    """The job a pull takes from ``jobs`` (``{seq: {group, prio, state}}``), made active, and the
    queue's virtual time after it; the group whose turn it took has its tag in ``tags`` moved on.

    The group with the least ``(tag, name)`` among those with a waiting job that ``may_run``
    offers its best job (priority, then age), which competes with the ungrouped jobs by
    priority, then age."""
    waiting = {s: j for s, j in jobs.items() if j["state"] == "waiting"}
    candidates = [(-j["prio"], s) for s, j in waiting.items() if j["group"] is None]
    turns = [(tags[g], g) for g in {j["group"] for j in waiting.values() if j["group"] is not None} if may_run(g)]
    turn = min(turns) if turns else None
    if turn is not None:
        candidates.append(min((-j["prio"], s) for s, j in waiting.items() if j["group"] == turn[1]))
    if not candidates:
        return None, vtime
    seq = min(candidates)[1]
    if turn is not None and jobs[seq]["group"] == turn[1]:
        vtime = max(vtime, turn[0])
        tags[turn[1]] = vtime + stride(turn[1])
    jobs[seq]["state"] = "active"
    return seq, vtime


def one_group_pull(jobs: dict[int, dict[str, Any]], tags: dict[str, int], vtime: int, group: str | None,
                   may_run: Callable[[str], bool], stride: Callable[[str], int]) -> int | None:
    """The job a pull limited to ``group`` takes (``None``: limited to jobs without a group), made
    active: the group's best waiting job (priority, then age) if ``may_run`` lets it run. It counts
    as one turn of the group: its tag in ``tags`` steps on by its stride from no earlier than
    ``vtime``, which stays as it is."""
    waiting = [(-j["prio"], s) for s, j in jobs.items() if j["state"] == "waiting" and j["group"] == group]
    if not waiting or (group is not None and not may_run(group)):
        return None
    seq = min(waiting)[1]
    if group is not None:
        tags[group] = max(tags[group], vtime) + stride(group)
    jobs[seq]["state"] = "active"
    return seq


@contextlib.contextmanager
def heap_operations() -> Iterator[list[int]]:
    """Counts the ``heappop``/``heappush``/``heapreplace`` calls made in the block (one item per
    call in the list it yields): what a pull costs, independent of the machine's speed."""
    calls: list[int] = []
    originals = heapq.heappop, heapq.heappush, heapq.heapreplace

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls.append(1)
            return fn(*args)
        return call

    heapq.heappop, heapq.heappush, heapq.heapreplace = map(counted, originals)  # type: ignore[assignment]
    try:
        yield calls
    finally:
        heapq.heappop, heapq.heappush, heapq.heapreplace = originals  # type: ignore[assignment]
