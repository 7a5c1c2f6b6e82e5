"""A partition's job data in files on disk: the payload space a node gives each engine.

The engine keeps a segment job's data in a payload space (``shoal.node.state._payloads``) and
only its offset in memory. :class:`FileSpace` is that space as files of
:data:`FILE_BYTES` each in one directory: appends collect in a small buffer and are written
in blocks with ``pwrite``; reads come from the buffer, the last block read, or ``pread`` (the
page cache, usually), so a waiting job costs disk and page cache, not the node's memory.

The files hold nothing the replicated state does not: the journal and the snapshots carry
every job's data, and a restart rebuilds the files from them. So they are never synced, and
a node removes what an earlier run left (:meth:`PayloadFiles.__init__`). A file whose bytes
are all released (their jobs done and gone) is deleted by :meth:`FileSpace.collect`, which
the node calls from its timer, never while a reply that refers to it can still be encoded.

A write that fails (the disk full, say) keeps the bytes in memory instead, so an applied
command is never half-applied and nothing is lost; the node's free-space watermark refuses
new pushes long before that (``NO_SPACE``).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

__all__ = ["FileSpace", "PayloadFiles", "FILE_BYTES", "PAYLOADS_DIR"]

log = logging.getLogger(__name__)

#: The directory under a node's data directory that holds its partitions' payload files.
PAYLOADS_DIR = "payloads"
#: Bytes of one payload file: the unit in which released data is given back to the disk.
FILE_BYTES = 64 << 20
#: Appended bytes held before they are written (one ``pwrite`` per block, not per job).
BUFFER_BYTES = 256 << 10
#: Bytes read at once from a file: a pull's run of jobs, stored one after another, is one read.
READ_AHEAD_BYTES = 64 << 10


class FileSpace:
    """Payload space of one engine: files ``<n>.pay`` in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, file_bytes: int = FILE_BYTES, buffer_bytes: int = BUFFER_BYTES,
                 read_ahead: int = READ_AHEAD_BYTES) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.file_bytes = file_bytes
        self.buffer_bytes = buffer_bytes
        self.read_ahead = read_ahead
        self.end = 0                    # offset of the next append
        self._buf = bytearray()         # appended bytes from _buf_start on, not written yet
        self._buf_start = 0
        self._cache = b""               # the last block read, from _cache_start on
        self._cache_start = 0
        self._fds: dict[int, int] = {}  # file number -> open descriptor
        self._live: dict[int, int] = {}  # file number -> bytes appended and not released
        self._dead: set[int] = set()     # files found all released since the last collect()
        self._dying: set[int] = set()    # files found so by the last collect(): deleted by this one
        self._writing = 0                # the file appends go to
        self._unwritten: dict[int, bytes] = {}  # start -> bytes a failed write kept in memory

    # --- the payload space -----------------------------------------------------------------------

    def append(self, blob: bytes) -> int:
        start = self.end
        n = len(blob)
        if not n:
            return start
        self.end = start + n
        self._count(start, start + n, 1)
        self._buf += blob
        if len(self._buf) >= self.buffer_bytes:
            self.flush()
        return start

    def read(self, start: int, end: int) -> bytes:
        if start >= self._buf_start:
            return bytes(self._buf[start - self._buf_start:end - self._buf_start])
        cache_start = self._cache_start
        if cache_start <= start and end <= cache_start + len(self._cache):
            return self._cache[start - cache_start:end - cache_start]
        if end > self._buf_start:  # partly written, partly still in the buffer
            return self.read(start, self._buf_start) + bytes(self._buf[:end - self._buf_start])
        if self._unwritten:
            kept = self._read_unwritten(start, end)
            if kept is not None:
                return kept
        upto = min(max(end, start + self.read_ahead), self._buf_start)
        block = self._pread(start, upto)
        self._cache, self._cache_start = block, start
        return block[:end - start]

    def release(self, start: int, end: int) -> None:
        self._count(start, end, -1)

    # --- for the node ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Write the buffered appends (a write that fails keeps them in memory)."""
        buf = self._buf
        if not buf:
            return
        start = self._buf_start
        try:
            self._pwrite(start, bytes(buf))
        except OSError as exc:
            log.error("payload files %s: cannot write %d bytes at %d (%s); kept in memory",
                      self.directory, len(buf), start, exc)
            self._unwritten[start] = bytes(buf)
        self._buf = bytearray()
        self._buf_start = self.end

    def collect(self) -> int:
        """Delete the files found all released at the previous call (a reply that named their
        bytes was written in between); returns how many were deleted."""
        dead, self._dying, self._dead = self._dying, self._dead, set()
        for n in dead:
            fd = self._fds.pop(n, None)
            if fd is not None:
                os.close(fd)
            try:
                os.unlink(self._path(n))
            except FileNotFoundError:
                pass
        if self._unwritten:
            self._unwritten = {s: b for s, b in self._unwritten.items()
                               if self._live.get(s // self.file_bytes)}
        return len(dead)

    def discard(self) -> None:
        """The engine is gone: delete every file of the space. Descriptors stay open until the
        space itself goes, so a reply still naming its bytes (or a snapshot child) reads them."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def stats(self) -> dict[str, int]:
        """Files held and bytes not released (for ``Stats``)."""
        return {"files": len(self._live), "liveBytes": sum(self._live.values()), "end": self.end}

    # --- internals -------------------------------------------------------------------------------

    def _count(self, start: int, end: int, sign: int) -> None:
        """Bytes ``start .. end`` appended (``sign`` 1) or released (-1), per file; a file all
        released once appends have moved past it is dead."""
        size, live = self.file_bytes, self._live
        at = start
        while at < end:
            n = at // size
            upto = min(end, (n + 1) * size)
            left = live.get(n, 0) + sign * (upto - at)
            if left:
                live[n] = left
            else:
                del live[n]
                if n < self._writing:
                    self._dead.add(n)
            at = upto
        if sign > 0:
            last = (end - 1) // size
            if last != self._writing:
                self._dead.update(n for n in range(self._writing, last) if n not in live)
                self._writing = last

    def _path(self, n: int) -> Path:
        return self.directory / f"{n:08d}.pay"

    def _fd(self, n: int) -> int:
        fd = self._fds.get(n)
        if fd is None:
            fd = self._fds[n] = os.open(self._path(n), os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def _pwrite(self, start: int, data: bytes) -> None:
        size = self.file_bytes
        view = memoryview(data)
        at, done = start, 0
        while done < len(data):
            n = at // size
            room = (n + 1) * size - at
            chunk = view[done:done + room]
            written = os.pwrite(self._fd(n), chunk, at - n * size)
            if written != len(chunk):
                raise OSError(f"short write to {self._path(n)}")
            at += written
            done += written

    def _pread(self, start: int, end: int) -> bytes:
        size = self.file_bytes
        parts = []
        at = start
        while at < end:
            n = at // size
            upto = min(end, (n + 1) * size)
            got = os.pread(self._fd(n), upto - at, at - n * size)
            if len(got) != upto - at:
                raise OSError(f"payload file {self._path(n)}: {upto - at} bytes at offset {at - n * size} "
                              f"could not be read (got {len(got)})")
            parts.append(got)
            at = upto
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_unwritten(self, start: int, end: int) -> bytes | None:
        for s, blob in self._unwritten.items():
            if s <= start and end <= s + len(blob):
                return blob[start - s:end - s]
        return None

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


class PayloadFiles:
    """The payload spaces of one partition on a node: one directory per engine (the running
    one and, while a snapshot is loaded, the next), under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Files of an earlier run hold nothing the journal and snapshots do not: start afresh.
        shutil.rmtree(root, ignore_errors=True)
        self._next = 0
        self.spaces: list[FileSpace] = []

    def new(self) -> FileSpace:
        """A space for a new engine."""
        self._next += 1
        space = FileSpace(self.root / f"g{self._next}")
        self.spaces.append(space)
        return space

    def discard(self, space: object) -> None:
        """``space``'s engine was replaced: its files go."""
        if isinstance(space, FileSpace) and space in self.spaces:
            self.spaces.remove(space)
            space.discard()

    def collect(self) -> None:
        """Write what the running engine's space buffers, and delete its all-released files.

        Only that one: the running engine's space is the oldest one kept (``install`` and
        ``reset`` discard it once the next takes over), and a newer one belongs to a snapshot
        being loaded on another thread, which alone touches it until it is installed."""
        if self.spaces:
            space = self.spaces[0]
            space.flush()
            space.collect()

    def stats(self) -> dict[str, int]:
        """The running engine's payload files, bytes not released and bytes appended
        (:meth:`FileSpace.stats`; zeros before the first engine)."""
        return self.spaces[0].stats() if self.spaces else {"files": 0, "liveBytes": 0, "end": 0}

    def close(self) -> None:
        """The partition left this node: every space and file goes."""
        for space in self.spaces:
            space.discard()
        self.spaces.clear()
        shutil.rmtree(self.root, ignore_errors=True)
