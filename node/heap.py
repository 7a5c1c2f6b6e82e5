"""Handing the C heap's free memory back to the operating system.

glibc's ``malloc`` returns freed memory to the system only from the top of its heap.
Work that allocates much and frees most of it in an order of its own leaves the memory
free inside the process yet resident: a start-up that applies a whole journal (4 MiB
reads, entries decoded and dropped), a snapshot loaded on its thread, a large backlog
drained (a node that applied its journal at start-up held more than before its restart
until its free heap went back: docs/benchmarks.md, "Memory per waiting job").

:class:`HeapTrimmer` looks at how much the heap holds free (``mallinfo2``, which sums
every arena) and calls ``malloc_trim(0)`` when that passes a threshold and something
changed since the last trim: a trim gives the pages back but leaves the chunks on the
free lists, so the free figure alone would ask again and again. Each look walks the
free lists (milliseconds on a fragmented heap of hundreds of MB), so the node's watchdog
(:mod:`.guard`) asks rarely: every :data:`TRIM_CHECK_S` seconds, and before it refuses
new jobs for memory, so freed memory neither counts against the memory budget nor shows
as growth. In the first 30 s after start (every second) and right after a snapshot load
(:func:`trim_soon`, which the partition calls as it installs the loaded state) it asks
with the lower bar of :data:`TRIM_SOON_BYTES`: a load on its thread leaves its decoded
chunks free in that thread's arena, a few MiB that no later trim would think worth it.
Where the C library is not glibc, the trimmer does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["HeapTrimmer", "TRIM_FREE_MIN_BYTES", "TRIM_SOON_BYTES", "TRIM_CHECK_S", "trim_soon", "take_trim_soon"]

log = logging.getLogger(__name__)

#: Free heap bytes from which a trim is worth its pause of the event loop (a few ms).
TRIM_FREE_MIN_BYTES = 16 * 1024 * 1024
#: How often the watchdog asks.
TRIM_CHECK_S = 10.0
#: Free heap bytes worth a trim in the first seconds after start and right after a snapshot load:
#: what they decoded was just freed, among what they keep, and would otherwise stay resident.
TRIM_SOON_BYTES = 1024 * 1024

_trim_soon = False


def trim_soon() -> None:
    """Ask the watchdog to look at the heap at its next wake-up, with the low bar
    (:data:`TRIM_SOON_BYTES`): a snapshot load just ended."""
    global _trim_soon
    _trim_soon = True


def take_trim_soon() -> bool:
    """True once after :func:`trim_soon` was called."""
    global _trim_soon
    wanted, _trim_soon = _trim_soon, False
    return wanted


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): every field a ``size_t``."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _glibc() -> tuple[Callable[[], _MallInfo2], Callable[[int], int]] | None:
    """``(mallinfo2, malloc_trim)`` of the process's C library, or None where it has not both."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2, malloc_trim = libc.mallinfo2, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    mallinfo2.argtypes = []
    malloc_trim.restype = ctypes.c_int
    malloc_trim.argtypes = [ctypes.c_size_t]
    return mallinfo2, malloc_trim


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` when the C heap holds at least ``free_min_bytes`` free and, since
    the last trim, that figure moved by a quarter of it or ``rss()`` (resident bytes) grew by it.

    ``libc``: ``(mallinfo2, malloc_trim)`` to use instead of the process's (tests).
    """

    def __init__(self, rss: Callable[[], int], free_min_bytes: int = TRIM_FREE_MIN_BYTES, libc: Any = None) -> None:
        self.free_min_bytes = free_min_bytes
        self._rss = rss
        self._libc = libc if libc is not None else _glibc()
        #: ``(free bytes, resident bytes)`` right after the last trim.
        self._after: tuple[int, int] | None = None
        #: Trims done, and the resident bytes they gave back.
        self.trims = 0
        self.released_bytes = 0

    @property
    def available(self) -> bool:
        """The C library can say what it holds free and trim it (glibc)."""
        return self._libc is not None

    def free_bytes(self) -> int:
        """Bytes the heap holds free (0 where unknown)."""
        if self._libc is None:
            return 0
        return int(self._libc[0]().fordblks)

    def maybe_trim(self, *, free_min_bytes: int | None = None) -> int:
        """Trim if it is worth it (see the class); return the resident bytes it gave back (0: no
        trim, or nothing given back). ``free_min_bytes`` overrides the threshold for this call."""
        bar = self.free_min_bytes if free_min_bytes is None else free_min_bytes
        free = self.free_bytes()
        if free == 0 or free < bar:
            return 0
        if self._after is not None:
            free_then, rss_then = self._after
            if abs(free - free_then) < bar // 4 and self._rss() - rss_then < bar:
                return 0  # the same free chunks as at the last trim: their pages went back then
        before = self._rss()
        self._libc[1](0)  # type: ignore[index]
        after = self._rss()
        self._after = (self.free_bytes(), after)
        self.trims += 1
        released = max(0, before - after)
        self.released_bytes += released
        log.debug("the C heap held %d MiB free: trimmed, %d MiB resident given back", free >> 20, released >> 20)
        return released
