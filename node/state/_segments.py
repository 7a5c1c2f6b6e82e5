"""Plain batch-pushed jobs kept as one record per batch until each is touched.

A ``PUSHB`` whose items carry nothing but ``data`` (the bulk-ingest case) would
otherwise build one :class:`~._core.Job` object, one heap entry and one dict
slot per job on every replica. A :class:`Segment` holds the whole batch as a
list of data bytes plus the few fields its jobs share (queue, creation time and
the queue's defaults at push time). The engine turns a segment's job into a
real ``Job`` ("materializes" it) the first time anything needs it as one: a
pull reaching it, a command naming its id, a listing. Until then it is waiting
at priority 0, exactly as if it had been pushed on its own.

Segments cover disjoint, increasing seq ranges, so a seq is found by bisecting
the segments' first seqs. No I/O, clock or randomness: part of the engine.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import Any

from shoal.cluster.codec import Raw

__all__ = ["Segment", "SegmentStore", "split_plain"]

_PLAIN_KEYED = frozenset({"data", "idempotencyKey"})


def split_plain(items: list[dict[str, Any]]) -> tuple[list[Any], list[str | None] | None] | None:
    """``(datas, keys)`` of PUSHB items that carry only ``data`` (and maybe ``idempotencyKey``).

    ``keys`` is None when no item has a key; the result is None when any item has another
    field (priority, delay, group, ...): such a batch takes the per-job path. A ``Raw`` data
    becomes its packed bytes (what the engine stores); any other value stays as given.
    """
    keyed = False
    for item in items:
        if len(item) != 1:
            if len(item) != 2 or "idempotencyKey" not in item or "data" not in item:
                return None
            keyed = True
    datas = [d.packed if type(d) is Raw else d for d in [item["data"] for item in items]]
    return datas, ([item.get("idempotencyKey") for item in items] if keyed else None)


class Segment:
    """The still-untouched jobs of one plain ``PUSHB`` (taken slots hold ``None``)."""

    __slots__ = ("first", "datas", "queue", "created_ms", "max_attempts", "backoff_ms", "ttr_ms", "low", "left")

    def __init__(self, first: int, datas: list[bytes | None], queue: str, created_ms: int,
                 max_attempts: int, backoff_ms: int, ttr_ms: int) -> None:
        self.first = first
        self.datas = datas
        self.queue = queue
        self.created_ms = created_ms
        self.max_attempts = max_attempts
        self.backoff_ms = backoff_ms
        self.ttr_ms = ttr_ms
        self.low = first           # lowest untaken seq: the one the queue's ready heap points at
        self.left = len(datas)     # untaken jobs

    def seqs(self) -> Iterator[int]:
        """Untaken seqs, ascending."""
        first = self.first
        return (first + i for i, d in enumerate(self.datas) if d is not None)


class SegmentStore:
    """Every segment of one partition, by first seq."""

    __slots__ = ("_by_first", "_firsts", "jobs")

    def __init__(self) -> None:
        self._by_first: dict[int, Segment] = {}
        self._firsts: list[int] = []   # ascending: seqs only grow
        self.jobs = 0                  # untaken jobs over all segments

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def __iter__(self) -> Iterator[Segment]:
        """Segments in seq order."""
        by_first = self._by_first
        return (by_first[f] for f in self._firsts)

    def add(self, segment: Segment) -> None:
        self._by_first[segment.first] = segment
        self._firsts.append(segment.first)
        self.jobs += segment.left

    def find(self, seq: int) -> Segment | None:
        """The segment still holding ``seq`` untaken, if any."""
        firsts = self._firsts
        if not firsts or seq < firsts[0]:
            return None
        segment = self._by_first[firsts[bisect_right(firsts, seq) - 1]]
        i = seq - segment.first
        if i < len(segment.datas) and segment.datas[i] is not None:
            return segment
        return None

    def take(self, segment: Segment, seq: int) -> bytes:
        """Remove ``seq`` from ``segment`` and return its data; advances ``segment.low`` past it."""
        datas = segment.datas
        i = seq - segment.first
        data = datas[i]
        assert data is not None
        datas[i] = None
        segment.left -= 1
        self.jobs -= 1
        if segment.left == 0:
            del self._by_first[segment.first]
            firsts = self._firsts
            del firsts[bisect_right(firsts, segment.first) - 1]
            segment.low = 0
        elif seq == segment.low:
            i += 1
            while datas[i] is None:
                i += 1
            segment.low = segment.first + i
        return data

    def clear(self) -> None:
        self._by_first.clear()
        self._firsts.clear()
        self.jobs = 0
