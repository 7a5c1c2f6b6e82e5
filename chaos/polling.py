"""Polling a cluster for a condition, bounded by a deadline (the chaos steps' one wait loop)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["poll_until"]

T = TypeVar("T")


def poll_until(check: Callable[[], T], timeout_s: float, interval_s: float,
               timed_out: Callable[[], Exception]) -> T:
    """``check()``'s first true value, asked every ``interval_s``; ``timed_out()`` (the error to
    raise, built from what the last check saw) once ``timeout_s`` passed without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise timed_out()
        time.sleep(interval_s)
