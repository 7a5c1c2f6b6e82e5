"""The partition's delayed heap: due keys (``due_key(run_at_ms, seq)``), soonest first.

Jobs delayed by one fixed amount (a retry in an hour, a reminder in a day) come due in the
order they were added, so their keys arrive in order. Those are kept as a *run*: two packed
arrays of run-at times and seqs, 16 bytes a key, consumed from the front. A key that arrives
before the run's last one (a shorter delay, a backoff) goes to a plain heap of ints beside it,
as every key did before (about 44 bytes a key: the int and its list slot). The soonest key is
the smaller of the run's first and the heap's top.

Which structure holds a key is never replicated state: a restore pushes the keys again in its
own order, and the keys given out, in order, are the same.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator

from ._model import SEQ_BITS, SEQ_MASK

__all__ = ["DueHeap", "NEVER"]

#: :attr:`DueHeap.due_ms` of an empty heap: later than any run-at time.
NEVER = 1 << 62

#: Consumed keys at the front of the run that are given back (a copy of the rest) at once.
_TRIM_AT = 4096


class DueHeap:
    """A min-heap of due keys; see the module docstring."""

    __slots__ = ("_run_ats", "_seqs", "_head", "_last", "_heap", "due_ms")

    def __init__(self) -> None:
        #: The run-at time of the soonest key (:data:`NEVER` when none is held): an attribute, so
        #: the check every pull makes for due jobs calls nothing.
        self.due_ms = NEVER
        self._run_ats = array("q")
        self._seqs = array("q")
        self._head = 0   # the run's first key not taken yet
        self._last = -1  # the run's last key (-1: none since it emptied)
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._seqs) - self._head + len(self._heap)

    def __bool__(self) -> bool:
        return self._head < len(self._seqs) or bool(self._heap)

    def __iter__(self) -> Iterator[int]:
        """Every key held, in no particular order."""
        for run_at, seq in zip(self._run_ats[self._head:], self._seqs[self._head:]):
            yield run_at << SEQ_BITS | seq
        yield from self._heap

    def push(self, key: int) -> None:
        """Hold ``key``: at the run's end when it comes at or after the run's last key."""
        run_at = key >> SEQ_BITS
        if key >= self._last:
            self._run_ats.append(run_at)
            self._seqs.append(key & SEQ_MASK)
            self._last = key
        else:
            heapq.heappush(self._heap, key)
        if run_at < self.due_ms:
            self.due_ms = run_at

    def top(self) -> int:
        """The soonest key (the heap must not be empty)."""
        head, heap = self._head, self._heap
        if head < len(self._seqs):
            key = self._run_ats[head] << SEQ_BITS | self._seqs[head]
            return key if not heap or key <= heap[0] else heap[0]
        return heap[0]

    def pop(self) -> int:
        """Take the soonest key (the heap must not be empty)."""
        head, heap = self._head, self._heap
        key = -1  # keys are never negative
        if head < len(self._seqs):
            run_key = self._run_ats[head] << SEQ_BITS | self._seqs[head]
            if not heap or run_key <= heap[0]:
                self._take_head()
                key = run_key
        if key < 0:
            key = heapq.heappop(heap)
        self.due_ms = self.top() >> SEQ_BITS if self else NEVER
        return key

    def _take_head(self) -> None:
        head = self._head + 1
        n = len(self._seqs)
        if head == n:  # the run is empty: it starts again from the next key in order
            del self._run_ats[:], self._seqs[:]
            self._head, self._last = 0, -1
        elif head >= _TRIM_AT and head * 2 >= n:
            del self._run_ats[:head], self._seqs[:head]
            self._head = 0
        else:
            self._head = head
