"""A deterministic event loop on virtual time, and the executor and processes that run on it.

:class:`SimLoop` is the subset of asyncio's loop the replica, the
:class:`~shoal.node.raft.scheduler.TickScheduler` and the node's storage use:
``time``, ``call_soon``, ``call_soon_threadsafe``, ``call_later``, ``call_at`` with
cancellable handles. Callbacks run one at a time in (time, order of booking) order;
time jumps to the next booked callback, so a run takes as long as its callbacks
take to compute, not as long as the virtual time it covers.

A simulated node's process is a :class:`Process`: the loop it sees tags every
callback it books with it, and when the process dies (a crash) none of them runs
again, as none of a killed process's would. The loop knows which process the running
callback belongs to, which the network uses to bound the work of one callback.

A process may be *paused* (SIGSTOP, a frozen VM): its callbacks due meanwhile run only
once it resumes, in their order, while its links stay up. Its clock may *drift*: it runs
at ``rate`` times the loop's (the same for every run of one node, as the machine's
monotonic clock), so its timers fire early or late against the others'.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["SimLoop", "Process", "ProcessExit", "Handle", "SimExecutor", "CALLBACKS_MAX"]

#: A run that books more callbacks than this is stuck in a loop of its own making.
CALLBACKS_MAX = 20_000_000


class ProcessExit(BaseException):
    """Raised where a simulated process exits (``os._exit`` in the node): unwinds its callback."""


class Handle:
    """A booked callback; :meth:`cancel` keeps it from running."""

    __slots__ = ("when", "fn", "args", "process", "_cancelled")

    def __init__(self, when: float, fn: Callable[..., Any], args: tuple[Any, ...], process: Process | None) -> None:
        self.when = when
        self.fn = fn
        self.args = args
        self.process = process
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


class SimLoop:
    """Virtual time and the callbacks booked on it (see the module docstring)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, Handle]] = []
        self._order = 0
        #: The process whose callback runs now (None: the simulation's own).
        self.current: Process | None = None
        self.callbacks = 0
        #: Called after each callback with its process (the checkers' hook).
        self.after_callback: Callable[[Process | None], None] | None = None

    # --- the asyncio subset -------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any, process: Process | None = None) -> Handle:
        handle = Handle(max(when, self._now), fn, args, process)
        self._order += 1
        heapq.heappush(self._heap, (handle.when, self._order, handle))
        return handle

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Handle:
        return self.call_at(self._now + max(0.0, delay), fn, *args)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Handle:
        return self.call_at(self._now, fn, *args)

    call_soon_threadsafe = call_soon

    # --- running ----------------------------------------------------------------------------------

    def run_until(self, deadline: float, stop: Callable[[], bool] | None = None) -> bool:
        """Run callbacks due up to ``deadline`` (then time is ``deadline``); True when ``stop()`` said so."""
        heap = self._heap
        while heap and heap[0][0] <= deadline:
            when, _, handle = heapq.heappop(heap)
            process = handle.process
            if handle._cancelled or (process is not None and not process.alive):
                continue
            if process is not None and process.paused_until > when:
                # Stopped: runs once it resumes (booked again now, so the order of its callbacks holds).
                self._order += 1
                handle.when = process.paused_until
                heapq.heappush(heap, (handle.when, self._order, handle))
                continue
            self._now = when
            self.callbacks += 1
            if self.callbacks > CALLBACKS_MAX:
                raise RuntimeError(f"more than {CALLBACKS_MAX} callbacks: the simulation does not settle")
            self.current = handle.process
            try:
                handle.fn(*handle.args)
            except ProcessExit:
                pass  # the process is dead: the rest of its callback never ran
            finally:
                self.current = None
            if self.after_callback is not None:
                self.after_callback(handle.process)
            if stop is not None and stop():
                return True
        self._now = max(self._now, deadline)
        return False


class Process:
    """One run of a simulated node: the loop as it sees it (every booking tagged with it).

    Its clock reads ``origin + (t - origin) * rate`` at the loop's time ``t`` (a drifting
    clock when ``rate`` is not 1); times it books are converted back to the loop's.
    """

    def __init__(self, loop: SimLoop, name: str, rate: float = 1.0, origin: float = 1000.0) -> None:
        self._loop = loop
        self.name = name
        self.alive = True
        self.rate = rate
        self.origin = origin
        #: The loop's time until which the process is stopped (its callbacks wait).
        self.paused_until = float("-inf")

    def kill(self) -> None:
        """The process dies: none of its booked callbacks runs."""
        self.alive = False

    def pause(self, until: float) -> None:
        """Stop the process until the loop's time ``until`` (SIGSTOP, then SIGCONT)."""
        self.paused_until = max(self.paused_until, until)

    def time(self) -> float:
        return self.origin + (self._loop.time() - self.origin) * self.rate

    def _loop_time(self, local: float) -> float:
        return self.origin + (local - self.origin) / self.rate

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Handle:
        return self._loop.call_at(self._loop_time(when), fn, *args, process=self)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Handle:
        return self._loop.call_at(self._loop.time() + max(0.0, delay) / self.rate, fn, *args, process=self)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> Handle:
        return self._loop.call_at(self._loop.time(), fn, *args, process=self)

    call_soon_threadsafe = call_soon

    def __repr__(self) -> str:
        return f"Process({self.name}{'' if self.alive else ' dead'})"


class SimExecutor:
    """Runs submitted work later on the process's loop (a worker thread, in virtual time).

    Each job runs after a delay drawn from ``rng`` (a load or an fsync takes a while); jobs
    of one executor run in submission order, as on the node's one worker thread.
    """

    def __init__(self, process: Process, rng: random.Random, delay_s: tuple[float, float] = (0.001, 0.2)) -> None:
        self._process = process
        self._rng = rng
        self._delay_s = delay_s
        self._free_at = 0.0
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.submitted += 1
        start = max(self._process.time(), self._free_at)
        self._free_at = start + self._rng.uniform(*self._delay_s)

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except ProcessExit:
                raise
            except BaseException as exc:  # handed to the future, as a thread pool does
                future.set_exception(exc)

        self._process.call_at(self._free_at, run)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass
