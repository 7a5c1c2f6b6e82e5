"""Snapshot files: written in slices, made durable before the journal prefix they cover is dropped.

A snapshot is produced as an iterator of byte chunks (or chunk by chunk
through :class:`SnapshotWriter`), so the state can be serialised in bounded
slices between event-loop turns or in a worker thread. The file is written to
``<path>.tmp``, fsynced, renamed over ``path`` and the directory fsynced; only
then does :func:`compaction_point` give the index below which the journal may
be dropped. A power cut at any step leaves the previous snapshot or the new
one, never a partial one under ``path``.

Layout (little-endian)::

    header   b"SHOALSNP" | version u32 | header CRC u32 | last index u64 | last term u64
    content  the chunks, as given
    trailer  content bytes u64 | CRC32C of the content u32 | CRC32C of the 12 bytes before u32 | b"SNPEND\\0\\0"

The header CRC is the CRC32C of the header with that field zero, so a damaged
last index or term is caught like damaged content. Version 1 files, whose field
is always zero and unchecked, are still read.

:func:`read_snapshot` streams the content back and checks length and CRC32C
when the stream ends: a consumer must not adopt what it read before the
iterator is exhausted without an error. :func:`verify_snapshot` checks a whole
file (header, trailer and content) in bounded memory, and
:class:`SnapshotChecker` does the same from the file's bytes as they arrive,
chunk by chunk, as a receiver writes them; it also gives the CRC32C of the whole
file, which a sender can state and a receiver compare. Every
:class:`SnapshotCorrupt` names the file and an offset.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import google_crc32c

from ._io import FileHandle, FileIO

__all__ = [
    "SnapshotChecker",
    "SnapshotCorrupt",
    "SnapshotInfo",
    "SnapshotWriter",
    "compaction_point",
    "file_crc32c",
    "read_snapshot",
    "read_snapshot_info",
    "verify_snapshot",
    "write_snapshot",
]

_HEADER = struct.Struct("<8sIIQQ")
_TRAILER = struct.Struct("<QII8s")
_MAGIC = b"SHOALSNP"
_END = b"SNPEND\0\0"
_VERSION = 2
_VERSIONS_READ = (1, 2)
HEADER_BYTES = _HEADER.size
TRAILER_BYTES = _TRAILER.size
READ_CHUNK_BYTES = 1024 * 1024


class SnapshotCorrupt(Exception):
    """A snapshot file is damaged or not a snapshot; the message names the file and offset.

    ``path`` and ``offset`` (the byte where the problem was found; for a content checksum
    mismatch, where the content starts) are set when known.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_corrupt, (str(self), self.path, self.offset)


def _rebuild_corrupt(message: str, path: str | None, offset: int | None) -> SnapshotCorrupt:
    return SnapshotCorrupt(message, path=path, offset=offset)


def _corrupt(path: str, offset: int, problem: str) -> SnapshotCorrupt:
    return SnapshotCorrupt(f"{path}: {problem} at offset {offset}", path=path, offset=offset)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot on disk: the Raft entry it ends at, its size and checksum, and whether it is durable."""

    path: str
    last_index: int
    last_term: int
    content_bytes: int
    crc32c: int
    durable: bool


def _header(last_index: int, last_term: int) -> bytes:
    crc = google_crc32c.value(_HEADER.pack(_MAGIC, _VERSION, 0, last_index, last_term))
    return _HEADER.pack(_MAGIC, _VERSION, crc, last_index, last_term)


def _parse_header(path: str, header: bytes) -> tuple[int, int]:
    """``(last index, last term)`` of a whole header, or :class:`SnapshotCorrupt`."""
    magic, version, crc, last_index, last_term = _HEADER.unpack(header)
    if magic != _MAGIC or version not in _VERSIONS_READ:
        raise _corrupt(path, 0, "bad header (not a Shoal snapshot of a known version)")
    want = google_crc32c.value(_HEADER.pack(_MAGIC, version, 0, last_index, last_term)) if version >= 2 else 0
    if crc != want:
        raise _corrupt(path, 0, "header checksum mismatch")
    return last_index, last_term


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
            self._handle.append(_header(last_index, last_term))
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
    """Header and trailer of a snapshot (the content is checked by :func:`read_snapshot`
    and :func:`verify_snapshot`)."""
    handle = io.open(path, create=False)
    try:
        size = handle.size
        if size < HEADER_BYTES + TRAILER_BYTES:
            raise _corrupt(path, 0, f"{size} bytes, too short for a snapshot")
        last_index, last_term = _parse_header(path, handle.pread(0, HEADER_BYTES))
        content_bytes, crc = _parse_trailer(path, handle.pread(size - TRAILER_BYTES, TRAILER_BYTES), size)
        return SnapshotInfo(path, last_index, last_term, content_bytes, crc, durable=True)
    finally:
        handle.close()


def _parse_trailer(path: str, trailer: bytes, size: int) -> tuple[int, int]:
    """``(content bytes, content CRC32C)`` of the trailer of a file of ``size`` bytes."""
    at = size - TRAILER_BYTES
    content_bytes, crc, trailer_crc, end = _TRAILER.unpack(trailer)
    if end != _END or trailer_crc != google_crc32c.value(struct.pack("<QI", content_bytes, crc)):
        raise _corrupt(path, at, "bad trailer")
    if HEADER_BYTES + content_bytes + TRAILER_BYTES != size:
        raise _corrupt(path, at, f"trailer says {content_bytes} content bytes, file has {size} bytes")
    return content_bytes, crc


def read_snapshot(io: FileIO, path: str, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
    """Stream the content; raises :class:`SnapshotCorrupt` at the end if the checksum fails."""
    info = read_snapshot_info(io, path)
    handle = io.open(path, create=False)
    try:
        crc = 0
        offset = HEADER_BYTES
        end = HEADER_BYTES + info.content_bytes
        while offset < end:
            chunk = handle.pread(offset, min(chunk_bytes, end - offset))
            if not chunk:
                raise _corrupt(path, offset, "content ends early")
            crc = google_crc32c.extend(crc, chunk)
            offset += len(chunk)
            yield chunk
        if crc != info.crc32c:
            raise _corrupt(path, HEADER_BYTES, f"content checksum mismatch over offsets {HEADER_BYTES}-{end}")
    finally:
        handle.close()


class SnapshotChecker:
    """Checks a snapshot file from its bytes, fed in file order as they arrive.

    A receiver feeds each chunk it writes (:meth:`update`), or the part of a file already
    on disk (:meth:`update_from_file`, e.g. to resume a transfer), and calls
    :meth:`finish` once the last byte is in: it returns the :class:`SnapshotInfo` of a
    whole, intact file or raises :class:`SnapshotCorrupt` naming ``path`` and an
    offset. The header is checked as soon as it is complete, so a wrong file is refused at
    its first chunk. Memory is bounded (a header and a trailer's worth of bytes), whatever
    the chunk sizes. :attr:`file_crc32c` is the CRC32C of every byte fed so far.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        #: Bytes fed so far: the file offset the next chunk must start at.
        self.offset = 0
        #: CRC32C of every byte fed so far (header, content and trailer alike).
        self.file_crc32c = 0
        self.last_index: int | None = None
        self.last_term: int | None = None
        self._head = b""
        self._tail = b""  # the last TRAILER_BYTES bytes seen past the header: maybe the trailer
        self._content_crc = 0
        self._content_bytes = 0

    def update(self, chunk: bytes) -> None:
        """Feed the file's next bytes."""
        if not chunk:
            return
        chunk = bytes(chunk)  # google_crc32c takes bytes only
        self.file_crc32c = google_crc32c.extend(self.file_crc32c, chunk)
        self.offset += len(chunk)
        if self.last_index is None:
            need = HEADER_BYTES - len(self._head)
            self._head += chunk[:need]
            chunk = chunk[need:]
            if len(self._head) < HEADER_BYTES:
                return
            self.last_index, self.last_term = _parse_header(self.path, self._head)
        if len(chunk) >= TRAILER_BYTES:
            # What was held back, and all but the last TRAILER_BYTES of this chunk, is content.
            self._content(self._tail)
            self._content(chunk[:-TRAILER_BYTES])
            self._tail = chunk[-TRAILER_BYTES:]
        else:
            joined = self._tail + chunk
            self._content(joined[:-TRAILER_BYTES])
            self._tail = joined[-TRAILER_BYTES:]

    def _content(self, data: bytes) -> None:
        if data:
            self._content_crc = google_crc32c.extend(self._content_crc, data)
            self._content_bytes += len(data)

    def update_from_file(self, io: FileIO, path: str, stop: int | None = None,
                         chunk_bytes: int = READ_CHUNK_BYTES) -> None:
        """Feed bytes ``offset`` to ``stop`` (default: the end) of ``path``, in bounded chunks."""
        handle = io.open(path, create=False)
        try:
            end = handle.size if stop is None else stop
            while self.offset < end:
                chunk = handle.pread(self.offset, min(chunk_bytes, end - self.offset))
                if not chunk:
                    raise _corrupt(self.path, self.offset, f"file ends early (expected {end} bytes)")
                self.update(chunk)
        finally:
            handle.close()

    def finish(self) -> SnapshotInfo:
        """The checked snapshot, once every byte was fed; :class:`SnapshotCorrupt` if it is not whole."""
        if self.last_index is None or len(self._tail) < TRAILER_BYTES:
            raise _corrupt(self.path, 0, f"{self.offset} bytes, too short for a snapshot")
        content_bytes, crc = _parse_trailer(self.path, self._tail, self.offset)
        assert content_bytes == self._content_bytes  # _parse_trailer checked the size
        if crc != self._content_crc:
            end = HEADER_BYTES + content_bytes
            raise _corrupt(self.path, HEADER_BYTES, f"content checksum mismatch over offsets {HEADER_BYTES}-{end}")
        assert self.last_term is not None
        return SnapshotInfo(self.path, self.last_index, self.last_term, content_bytes, crc, durable=True)


def verify_snapshot(io: FileIO, path: str, chunk_bytes: int = READ_CHUNK_BYTES) -> SnapshotInfo:
    """Check header, trailer and the whole content's CRC32C of ``path``, reading it in chunks
    of ``chunk_bytes`` (memory stays bounded); :class:`SnapshotCorrupt` names file and offset.

    Header and trailer are checked before the content is read, so a truncated or foreign
    file is refused without reading it through.
    """
    info = read_snapshot_info(io, path)
    checker = SnapshotChecker(path)
    checker.update_from_file(io, path, HEADER_BYTES + info.content_bytes + TRAILER_BYTES, chunk_bytes)
    return checker.finish()


def file_crc32c(io: FileIO, path: str, chunk_bytes: int = READ_CHUNK_BYTES) -> int:
    """CRC32C of the whole file at ``path`` (what :attr:`SnapshotChecker.file_crc32c` ends at), in bounded memory."""
    handle = io.open(path, create=False)
    try:
        crc, offset, size = 0, 0, handle.size
        while offset < size:
            chunk = handle.pread(offset, min(chunk_bytes, size - offset))
            if not chunk:
                break
            crc = google_crc32c.extend(crc, chunk)
            offset += len(chunk)
        return crc
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
