"""The node's one clock: wall-clock milliseconds that never go back.

Every time the node hands to the engine (a Raft entry's stamp), reports (``Ping``,
workers, the dashboard) or schedules by (tick due times) comes from one
:class:`WallClock`, made by the server and injected where it is needed. A step
back of the system clock (NTP) holds the reading at its last value instead of
going back, so entries a leader stamps are ordered like the commands in them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "WallClock"]


class Clock(Protocol):
    """What a part of the node needs of the clock."""

    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch, never less than an earlier reading."""
        ...


class WallClock:
    """:class:`Clock` over the system's wall clock (or ``source``, seconds as a float, in tests)."""

    __slots__ = ("_source", "_last_ms")

    def __init__(self, source: Callable[[], float] = time.time) -> None:
        self._source = source
        self._last_ms = 0

    def now_ms(self) -> int:
        """Milliseconds since the epoch, held at the last reading while the system clock is behind it."""
        now = int(self._source() * 1000)
        if now < self._last_ms:
            return self._last_ms
        self._last_ms = now
        return now
