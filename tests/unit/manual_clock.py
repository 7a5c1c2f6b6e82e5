"""A manual clock with the part of an asyncio loop the node's services schedule on
(``time``, ``call_later``, ``call_soon``): a test moves time forward and the timers due run."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class Timer:
    """What ``call_later`` returns: cancellable until it ran."""

    def __init__(self, when: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoop:
    """Time starts at 1000.0 and moves only by :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(self.now + delay, fn, args)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.call_later(0.0, fn, *args)

    def pending(self) -> int:
        """Timers not yet run nor cancelled."""
        return sum(not t.cancelled for _, _, t in self._timers)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running every timer due on the way, in order."""
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, timer = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not timer.cancelled:
                timer.fn(*timer.args)
        self.now = end
