"""Waiting for a condition in a test: one helper, bounded by a deadline and a poll count.

A node, a cluster or a client reaches a state in its own time; a test polls for it
instead of sleeping a guessed time, and a loaded machine only makes the wait longer.
Every test directory imports it as ``from waiting import eventually`` (``tests`` is on
pytest's ``pythonpath``).

``check`` is called until it returns a true value, which is returned. An exception of
one of the ``ignoring`` types counts as "not yet" (a node restarting refuses connections);
any other propagates at once. When the deadline passes, or the poll count is spent,
an :class:`AssertionError` names what was waited for and the last value or exception.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["eventually", "eventually_async", "TIMEOUT_S", "POLL_S"]

T = TypeVar("T")

#: Default time a condition has to become true.
TIMEOUT_S = 30.0
#: Default pause between two polls.
POLL_S = 0.05

_Ignored = tuple[type[BaseException], ...]


class _Polls:
    """The bookkeeping both helpers share: the deadline, the poll count, the last thing seen."""

    def __init__(self, what: str, timeout_s: float, poll_s: float) -> None:
        self.what, self.timeout_s = what, timeout_s
        self.deadline = time.monotonic() + timeout_s
        # Each poll but the first waits at least ``poll_s``, so the deadline comes first; the count
        # only bounds the loop should the clock stall. ``poll_s`` 0: the check paces the loop
        # itself (a read with a timeout).
        self.polls_max = math.ceil(timeout_s / poll_s) + 2 if poll_s > 0 else 1_000_000
        self.polls = 0
        self.last: object = None
        self.error: BaseException | None = None

    def seen(self, value: object, error: BaseException | None = None) -> None:
        """One poll's outcome (not true): raises once the deadline or the poll count is reached."""
        self.polls += 1
        self.last, self.error = value, error
        if time.monotonic() >= self.deadline or self.polls == self.polls_max:
            seen = f"last error {error!r}" if error is not None else f"last value {value!r}"
            raise AssertionError(f"timed out after {self.timeout_s:g} s ({self.polls} polls) waiting for "
                                 f"{self.what}; {seen}")


def eventually(check: Callable[[], T], what: str, timeout_s: float = TIMEOUT_S, poll_s: float = POLL_S,
               ignoring: _Ignored = ()) -> T:
    """``check()``'s first true value, polled every ``poll_s`` until ``timeout_s``.

    ``what`` says what is waited for (the failure message names it); exceptions of the
    ``ignoring`` types count as a false value."""
    polls = _Polls(what, timeout_s, poll_s)
    while True:
        try:
            value = check()
        except ignoring as exc:
            polls.seen(None, exc)
        else:
            if value:
                return value
            polls.seen(value)
        time.sleep(poll_s)


async def eventually_async(check: Callable[[], Awaitable[T] | T], what: str, timeout_s: float = TIMEOUT_S,
                           poll_s: float = POLL_S, ignoring: _Ignored = ()) -> T:
    """:func:`eventually` inside a running loop: the loop keeps running between polls, and
    ``check`` may be a coroutine function (awaited each poll) or a plain one."""
    polls = _Polls(what, timeout_s, poll_s)
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as exc:
            polls.seen(None, exc)
        else:
            if value:
                return value
            polls.seen(value)
        await asyncio.sleep(poll_s)
