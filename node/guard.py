"""The node's watchdog: memory budget, event-loop lag, and connection deadlines.

One task wakes every :data:`GUARD_INTERVAL_S`:

- it reads the process's resident memory from ``/proc/self/statm`` (one small
  read per wake-up, never per command) and, above the high-water mark of the
  memory budget, makes the dispatcher refuse new jobs with ``OVERLOADED``
  (pulls, acks and deletes go on, so consumers can drain the node);
- every :data:`~.heap.TRIM_CHECK_S` seconds, and before it would refuse new jobs, it
  hands the C heap's free memory back to the system when there is much of it
  (:class:`~.heap.HeapTrimmer`), so memory freed inside the process counts neither
  against the budget nor as growth; every second in the first 30 s and at its first
  wake-up after a snapshot load (:func:`~.heap.trim_soon`) a little is enough;
- it records how late it woke up in the ``shoal_event_loop_lag_seconds``
  histogram: whatever held the loop delayed it; a lag of :data:`LAG_WARN_S` or more is
  also logged (at most every :data:`LAG_LOG_EVERY_S`), as Raft's heartbeats and elections
  waited meanwhile;
- it closes client connections whose frame has been arriving longer than
  ``frame_timeout_ms`` or that stayed silent and unauthenticated longer than
  ``unauthenticated_idle_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from shoal.cluster.errors import CommandError, ErrorCode

from .heap import TRIM_CHECK_S, TRIM_SOON_BYTES, HeapTrimmer, take_trim_soon

if TYPE_CHECKING:
    from .view import NodeView

__all__ = ["NodeGuard", "GUARD_INTERVAL_S", "rss_bytes"]

log = logging.getLogger(__name__)

GUARD_INTERVAL_S = 0.1
_SWEEP_EVERY = 5              # connection deadlines every 5 wake-ups (0.5 s)
_TRIM_EVERY = round(TRIM_CHECK_S / GUARD_INTERVAL_S)
#: For this many wake-ups after start (30 s) the heap is looked at every second, with the low bar
#: of a snapshot load's end: what start-up (a journal applied, snapshots loaded) freed goes back.
_TRIM_EARLY = round(30 / GUARD_INTERVAL_S)
_TRIM_EARLY_EVERY = round(1 / GUARD_INTERVAL_S)
#: Free heap bytes worth a trim when the node is about to refuse new jobs for memory.
_TRIM_BEFORE_REFUSING_BYTES = 1024 * 1024
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#: A lag this long is logged: a follower may start an election after 0.8 s without its leader.
LAG_WARN_S = 0.5
#: Least time between two such log lines.
LAG_LOG_EVERY_S = 10.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class NodeGuard(Collector):
    """Runs the watchdog task and exports its figures to Prometheus."""

    def __init__(self, node: "NodeView") -> None:
        self.node = node
        limits = node.config.limits
        self.budget_bytes = limits.memory_budget_bytes()
        self.high_bytes = int(self.budget_bytes * limits.memory_high_ratio)
        self.rss_bytes = rss_bytes()
        self.refusing = False
        self._frame_timeout_s = limits.frame_timeout_ms / 1000
        self._idle_s = limits.unauthenticated_idle_ms / 1000
        self._lag_counts = [0] * (len(_LAG_BUCKETS) + 1)
        self._lag_sum = 0.0
        self.lag_max_s = 0.0
        self._lag_logged_at = -LAG_LOG_EVERY_S
        self._lags_unlogged = 0
        self.trimmer = HeapTrimmer(rss_bytes)

    def record_lag(self, lag: float, now: float) -> None:
        """The watchdog woke ``lag`` seconds late at loop time ``now``: counted, and logged when long."""
        self._lag_counts[bisect_left(_LAG_BUCKETS, lag)] += 1
        self._lag_sum += lag
        self.lag_max_s = max(self.lag_max_s, lag)
        if lag < LAG_WARN_S:
            return
        if now - self._lag_logged_at < LAG_LOG_EVERY_S:
            self._lags_unlogged += 1
            return
        more = f" ({self._lags_unlogged} more of {LAG_WARN_S} s or more since the last such line)" \
            if self._lags_unlogged else ""
        log.warning("the event loop was held %.2f s: Raft's heartbeats and elections waited (a busy "
                    "machine, a long command, a slow disk's sync)%s", lag, more)
        self._lag_logged_at = now
        self._lags_unlogged = 0

    def memory(self) -> dict[str, Any]:
        """The budget and its use (``/health``)."""
        return {"budgetBytes": self.budget_bytes, "highWaterBytes": self.high_bytes,
                "usedBytes": self.rss_bytes, "refusingNewJobs": self.refusing}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = 0
        while True:
            expected = loop.time() + GUARD_INTERVAL_S
            await asyncio.sleep(GUARD_INTERVAL_S)
            lag = max(0.0, loop.time() - expected)
            self.record_lag(lag, loop.time())
            self.check_memory()
            tick += 1
            if tick % _SWEEP_EVERY == 0:
                self.sweep()
            if take_trim_soon() or (tick <= _TRIM_EARLY and tick % _TRIM_EARLY_EVERY == 0):
                self.trimmer.maybe_trim(free_min_bytes=TRIM_SOON_BYTES)
            elif tick % _TRIM_EVERY == 0:
                self.trimmer.maybe_trim()

    def check_memory(self) -> None:
        """Sample RSS and switch new-job refusal on above the high-water mark, off below it."""
        self.rss_bytes = rss = rss_bytes()
        over = rss > self.high_bytes
        if over and not self.refusing and self.trimmer.maybe_trim(free_min_bytes=_TRIM_BEFORE_REFUSING_BYTES) > 0:
            self.rss_bytes = rss = rss_bytes()  # memory free inside the process is no reason to refuse
            over = rss > self.high_bytes
        if over == self.refusing:
            return
        self.refusing = over
        dispatcher = self.node.dispatcher
        if over:
            log.warning("node %s: %d MiB resident, over %d MiB (the memory budget's high-water mark): "
                        "refusing new jobs", self.node.node_id, rss >> 20, self.high_bytes >> 20)
            dispatcher.overloaded = CommandError(
                ErrorCode.OVERLOADED, f"node {self.node.node_id} is over its memory budget "
                f"({rss >> 20} MiB used, high-water mark {self.high_bytes >> 20} MiB of "
                f"limits.memory_max_bytes {self.budget_bytes >> 20} MiB): new jobs are refused until "
                "consumers drain it; pulls, acks and deletes work", retryAfterMs=1000)
        else:
            log.info("node %s: back under its memory high-water mark: accepting new jobs", self.node.node_id)
            dispatcher.overloaded = None

    def sweep(self) -> None:
        """Close connections past their frame or unauthenticated-idle deadline."""
        now = asyncio.get_running_loop().time()
        for conn in list(self.node.dispatcher.connections):
            conn.check_deadlines(now, self._frame_timeout_s, self._idle_s)

    # --- Prometheus -----------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily("shoal_memory_budget_bytes", "limits.memory_max_bytes (or its default)",
                                value=self.budget_bytes)
        yield GaugeMetricFamily("shoal_memory_high_water_bytes", "Resident memory above which new jobs "
                                "are refused with OVERLOADED", value=self.high_bytes)
        yield GaugeMetricFamily("shoal_memory_used_bytes", "Resident memory at the last sample",
                                value=self.rss_bytes)
        yield CounterMetricFamily("shoal_memory_heap_trims", "Times the node handed the C heap's free "
                                  "memory back to the system", value=self.trimmer.trims)
        yield CounterMetricFamily("shoal_memory_heap_trimmed_bytes", "Resident bytes those trims gave back",
                                  value=self.trimmer.released_bytes)
        yield GaugeMetricFamily("shoal_memory_refusing", "1 while new jobs are refused (over the "
                                "high-water mark)", value=1 if self.refusing else 0)
        family = HistogramMetricFamily("shoal_event_loop_lag_seconds", "How late the node's watchdog woke "
                                       f"(every {GUARD_INTERVAL_S} s): time the event loop was held")
        cumulative, total = [], 0
        for bound, n in zip([str(float(b)) for b in _LAG_BUCKETS] + ["+Inf"], self._lag_counts):
            total += n
            cumulative.append((bound, total))
        family.add_metric([], cumulative, self._lag_sum)
        yield family
