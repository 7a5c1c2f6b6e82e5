"""Snapshot files: written in slices, made durable before the journal prefix they cover is dropped.

A snapshot is produced as an iterator of byte chunks (or chunk by chunk
through :class:`SnapshotWriter`), so the state can be serialised in bounded
slices between event-loop turns or in a worker thread. The file is written to
``<path>.tmp``, fsynced, renamed over ``path`` and the directory fsynced; only
then does :func:`compaction_point` give the index below which the journal may
be dropped. A power cut at any step leaves the previous snapshot or the new
one, never a partial one under ``path``.

Layout (little-endian)::

    header   b"SHOALSNP" | version u32 | 0 u32 | last index u64 | last term u64
    content  the chunks, as given
    trailer  content bytes u64 | CRC32C of the content u32 | CRC32C of the 12 bytes before u32 | b"SNPEND\\0\\0"

:func:`read_snapshot` streams the content back and checks length and CRC32C
when the stream ends: a consumer must not adopt what it read before the
iterator is exhausted without an error.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import google_crc32c

from ._io import FileHandle, FileIO

__all__ = [
    "SnapshotCorrupt",
    "SnapshotInfo",
    "SnapshotWriter",
    "compaction_point",
    "read_snapshot",
    "read_snapshot_info",
    "write_snapshot",
]

_HEADER = struct.Struct("<8sIIQQ")
_TRAILER = struct.Struct("<QII8s")
_MAGIC = b"SHOALSNP"
_END = b"SNPEND\0\0"
_VERSION = 1
READ_CHUNK_BYTES = 1024 * 1024


class SnapshotCorrupt(Exception):
    """A snapshot file is damaged or not a snapshot; the message names the file and offset."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot on disk: the Raft entry it ends at, its size and checksum, and whether it is durable."""

    path: str
    last_index: int
    last_term: int
    content_bytes: int
    crc32c: int
    durable: bool


def _trailer(content_bytes: int, crc: int) -> bytes:
    fields = struct.pack("<QI", content_bytes, crc)
    return _TRAILER.pack(content_bytes, crc, google_crc32c.value(fields), _END)


class SnapshotWriter:
    """Writes one snapshot chunk by chunk; :meth:`finish` makes it durable under its final name."""

    def __init__(self, io: FileIO, path: str, last_index: int, last_term: int) -> None:
        self._io = io
        self.path = path
        self.tmp_path = path + ".tmp"
        self.last_index = last_index
        self.last_term = last_term
        self._crc = 0
        self._bytes = 0
        self._handle: FileHandle | None = io.open(self.tmp_path)
        try:
            self._handle.truncate(0)
            self._handle.append(_HEADER.pack(_MAGIC, _VERSION, 0, last_index, last_term))
        except BaseException:
            self.abort()
            raise

    def write(self, chunk: bytes) -> None:
        """Append one chunk of content (not synced; a full disk raises ``NoSpace``)."""
        assert self._handle is not None, "snapshot already finished or aborted"
        try:
            self._handle.append(chunk)
        except BaseException:
            self.abort()
            raise
        self._crc = google_crc32c.extend(self._crc, chunk)
        self._bytes += len(chunk)

    def finish(self) -> SnapshotInfo:
        """Write the trailer, fsync, rename over ``path``, fsync the directory."""
        handle = self._handle
        assert handle is not None, "snapshot already finished or aborted"
        try:
            handle.append(_trailer(self._bytes, self._crc))
            handle.fsync()
        except BaseException:
            self.abort()
            raise
        handle.close()
        self._handle = None
        self._io.rename(self.tmp_path, self.path)
        self._io.fsync_dir(os.path.dirname(self.path) or ".")
        return SnapshotInfo(self.path, self.last_index, self.last_term, self._bytes, self._crc, durable=True)

    def abort(self) -> None:
        """Drop the temp file; the previous snapshot stays."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._io.unlink(self.tmp_path)


def write_snapshot(io: FileIO, path: str, last_index: int, last_term: int, chunks: Iterable[bytes]) -> SnapshotInfo:
    """Write ``chunks`` as the snapshot ending at ``(last_index, last_term)``; durable on return."""
    writer = SnapshotWriter(io, path, last_index, last_term)
    try:
        for chunk in chunks:
            writer.write(chunk)
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def read_snapshot_info(io: FileIO, path: str) -> SnapshotInfo:
    """Header and trailer of a snapshot (the content is checked by :func:`read_snapshot`)."""
    handle = io.open(path, create=False)
    try:
        size = handle.size
        if size < _HEADER.size + _TRAILER.size:
            raise SnapshotCorrupt(f"{path}: {size} bytes, too short for a snapshot (offset 0)")
        magic, version, _, last_index, last_term = _HEADER.unpack(handle.pread(0, _HEADER.size))
        if magic != _MAGIC or version != _VERSION:
            raise SnapshotCorrupt(f"{path}: bad header at offset 0")
        content_bytes, crc, trailer_crc, end = _TRAILER.unpack(handle.pread(size - _TRAILER.size, _TRAILER.size))
        if end != _END or trailer_crc != google_crc32c.value(struct.pack("<QI", content_bytes, crc)):
            raise SnapshotCorrupt(f"{path}: bad trailer at offset {size - _TRAILER.size}")
        if _HEADER.size + content_bytes + _TRAILER.size != size:
            raise SnapshotCorrupt(f"{path}: trailer says {content_bytes} content bytes, file has {size} bytes")
        return SnapshotInfo(path, last_index, last_term, content_bytes, crc, durable=True)
    finally:
        handle.close()


def read_snapshot(io: FileIO, path: str, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
    """Stream the content; raises :class:`SnapshotCorrupt` at the end if the checksum fails."""
    info = read_snapshot_info(io, path)
    handle = io.open(path, create=False)
    try:
        crc = 0
        offset = _HEADER.size
        end = _HEADER.size + info.content_bytes
        while offset < end:
            chunk = handle.pread(offset, min(chunk_bytes, end - offset))
            if not chunk:
                raise SnapshotCorrupt(f"{path}: content ends early at offset {offset}")
            crc = google_crc32c.extend(crc, chunk)
            offset += len(chunk)
            yield chunk
        if crc != info.crc32c:
            raise SnapshotCorrupt(f"{path}: content checksum mismatch over offsets {_HEADER.size}-{end}")
    finally:
        handle.close()


def compaction_point(info: SnapshotInfo) -> int:
    """The journal may drop entries below this index once ``info`` is durable.

    The entry at ``last_index`` itself is kept so its term stays known for
    the log-matching check of the next AppendEntries (Raft §5.3/§7).
    """
    if not info.durable:
        raise ValueError(f"{info.path}: snapshot not yet durable; the journal must keep its prefix")
    return info.last_index
