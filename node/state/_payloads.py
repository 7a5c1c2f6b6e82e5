"""Where the data of a segment's jobs lives: a payload space, and a reference into it.

A :class:`~._segments.Segment` keeps no job's data itself, only where it is in its
partition's payload space (offset and length, 12 bytes a job), and a job object keeps a
:class:`Stored` reference in its ``data``. The space is a port the engine is given: it
stores appended bytes at the offsets it returns and gives them back. The engine's own
:class:`MemorySpace` keeps them in process memory (tests, the simulation, tools); a node
gives each engine a space of files on disk (``shoal.node.partition.payload_files``), so a waiting
job's data costs disk and page cache, not the process's memory.

Offsets are a replica's own: the replicated state as replicas compare it (digests) and as one
sends it to another (an installed snapshot) carries the data itself. Only a snapshot a node
keeps for its own restart may refer to its payload files instead (:func:`data_ref`). The
engine hands a job's data out as a :class:`Stored` reference, read only when the reply is
encoded; it reads bytes itself only for a pull's run of a segment's jobs (one read for the
run, cut per job) and as it writes a snapshot that carries the data.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from typing import Protocol

import msgpack

from shoal.cluster.codec import Raw

__all__ = ["PayloadSpace", "MemorySpace", "Stored", "DATA_REF_EXT", "data_ref", "ref_range"]

#: MessagePack extension type of a job's data written as where it is in the payload space (a
#: snapshot that refers to its payload files instead of carrying the data).
DATA_REF_EXT = 1
_REF = struct.Struct("<QI")


def data_ref(start: int, end: int) -> msgpack.ExtType:
    """Bytes ``start .. end`` of the payload space as a snapshot refers to them."""
    return msgpack.ExtType(DATA_REF_EXT, _REF.pack(start, end - start))


def ref_range(ref: msgpack.ExtType) -> tuple[int, int]:
    """``(start, end)`` of a :func:`data_ref`; ValueError for another extension or a bad length."""
    if ref.code != DATA_REF_EXT or len(ref.data) != _REF.size:
        raise ValueError(f"job data is MessagePack extension {ref.code} of {len(ref.data)} bytes, "
                         "not a payload reference")
    start, n = _REF.unpack(ref.data)
    return start, start + n


class PayloadSpace(Protocol):
    """Append-only byte storage of one engine's job data."""

    def append(self, blob: bytes) -> int:
        """Keep ``blob``; returns the offset of its first byte (offsets only grow)."""

    def read(self, start: int, end: int) -> bytes:
        """The bytes ``start .. end`` of what was appended (a range some append covered).

        May raise OSError (files on disk): the engine never lets that interrupt a command's
        apply, and a reply that cannot read a job's data is refused as it is encoded."""

    def release(self, start: int, end: int) -> None:
        """Bytes ``start .. end`` are no longer referenced (each byte is released once)."""


class Stored(Raw):
    """Job data ``start .. end`` of ``space``: a :class:`Raw` whose bytes are read when asked for
    (by the frame encoder, as a reply is written), not when the engine builds the reply."""

    __slots__ = ("space", "start", "end")

    def __init__(self, space: PayloadSpace, start: int, end: int) -> None:  # noqa: D107 - no Raw.__init__
        self.space = space
        self.start = start
        self.end = end

    @property  # type: ignore[override]
    def packed(self) -> bytes:  # noqa: D102
        return self.space.read(self.start, self.end)

    def __len__(self) -> int:
        return self.end - self.start

    __eq__ = Raw.__eq__  # as a Raw of its bytes (read now)
    __hash__ = Raw.__hash__

    def __repr__(self) -> str:
        return f"Stored({self.start}..{self.end})"

    def __reduce__(self) -> tuple[type, tuple[bytes]]:
        return (Raw, (self.packed,))


class MemorySpace:
    """A payload space in process memory: each appended blob kept as it came, dropped once all
    its bytes are released. Pure (no I/O); the engine's default."""

    __slots__ = ("_starts", "_blobs", "_live", "_dropped", "end")

    def __init__(self) -> None:
        # Ascending start of each blob appended, dropped ones included until they are half of
        # the list: taking each out as it went would move the list's tail every time.
        self._starts: list[int] = []
        self._blobs: dict[int, bytes] = {}    # start -> blob, of the blobs kept
        self._live: dict[int, int] = {}       # start -> bytes not released
        self._dropped = 0                     # starts of dropped blobs still in _starts
        self.end = 0

    def append(self, blob: bytes) -> int:
        start = self.end
        if blob:
            self._starts.append(start)
            self._blobs[start] = blob
            self._live[start] = len(blob)
            self.end = start + len(blob)
        return start

    def _blob_at(self, offset: int) -> int:
        starts = self._starts
        k = bisect_right(starts, offset) - 1
        blob = self._blobs.get(starts[k]) if k >= 0 else None
        if blob is None or offset >= starts[k] + len(blob):
            raise KeyError(f"payload offset {offset} is not held")
        return starts[k]

    def read(self, start: int, end: int) -> bytes:
        if start == end:
            return b""
        parts = []
        at = start
        while at < end:
            first = self._blob_at(at)
            blob = self._blobs[first]
            upto = min(end, first + len(blob))
            parts.append(blob[at - first:upto - first])
            at = upto
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self, start: int, end: int) -> None:
        at = start
        while at < end:
            first = self._blob_at(at)
            upto = min(end, first + len(self._blobs[first]))
            left = self._live[first] - (upto - at)
            if left:
                self._live[first] = left
            else:
                del self._live[first], self._blobs[first]
                self._dropped += 1
                if 2 * self._dropped > len(self._starts):
                    self._starts = [s for s in self._starts if s in self._blobs]
                    self._dropped = 0
            at = upto

    @property
    def held_bytes(self) -> int:
        """Bytes of the blobs still kept (a blob goes when its last byte is released)."""
        return sum(len(b) for b in self._blobs.values())
