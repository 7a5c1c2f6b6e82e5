"""The one I/O layer every journal, meta and snapshot write goes through.

Two implementations share one small interface:

* :class:`RealIO` — ``os.*`` calls on real files: ordinary ``pwrite`` (no mmap,
  so a full disk is an ``ENOSPC`` error and never a ``SIGBUS``), ``fdatasync``,
  ``fsync``, ``rename`` and a directory ``fsync``.
* :class:`SimIO` — files in memory for tests. Every file keeps the bytes a
  power cut would keep (``synced``) apart from the bytes only the page cache
  holds, and directory entries are durable only after the directory is
  fsynced, as on Linux. :meth:`SimIO.power_cut` drops everything not synced
  (optionally keeping a torn prefix of an unsynced appended tail, and any mix
  of old, new and torn sectors of bytes rewritten in place, as a real disk
  may); :meth:`SimIO.fill_disk` and a capacity make writes fail with
  ``ENOSPC``; :meth:`SimIO.flip_bits` and :meth:`SimIO.cut_file` damage the
  medium itself (synced bytes included).

Free space. Writes that pass ``check_space=True`` (journal appends of client
data) are refused with :class:`NoSpace` once free space falls below
``disk_free_min_bytes``. Free space is not asked of the kernel per write: the
layer keeps an estimate, lowers it by what it writes, and asks again (``statvfs``)
after ``space_recheck_bytes`` written or ``space_recheck_s`` elapsed, so space
taken by other processes or given back is noticed within those bounds.
"""

from __future__ import annotations

import errno
import os
import shutil
import queue
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "DISK_FREE_MIN_BYTES",
    "FileHandle",
    "FileIO",
    "NoSpace",
    "PowerCut",
    "RealIO",
    "SimIO",
    "close_later",
    "start_retiring",
]

DISK_FREE_MIN_BYTES = 256 * 1024 * 1024


class NoSpace(OSError):
    """A write was refused: the disk is full (``ENOSPC``) or free space is below the minimum.

    The file written to is left as it was before the write.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)


class PowerCut(RuntimeError):
    """A handle of a :class:`SimIO` was used after :meth:`SimIO.power_cut`."""


class FileHandle(ABC):
    """An open file: appends at its end, random reads, truncation and syncs."""

    path: str

    @property
    @abstractmethod
    def size(self) -> int:
        """Bytes in the file as this handle sees it (written, synced or not)."""

    @abstractmethod
    def _write_at(self, offset: int, data: bytes | memoryview) -> int:
        """Write at ``offset``; return the bytes written (may be short)."""

    @abstractmethod
    def pread(self, offset: int, size: int) -> bytes:
        """Read up to ``size`` bytes at ``offset``."""

    @abstractmethod
    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (durable only after a sync)."""

    @abstractmethod
    def datasync(self) -> None:
        """``fdatasync``: the file's data and size are on stable storage."""

    @abstractmethod
    def fsync(self) -> None:
        """``fsync``: data and all metadata on stable storage."""

    @abstractmethod
    def close(self) -> None:
        """Close the handle (does not sync)."""

    def append(self, data: bytes | memoryview, *, check_space: bool = False) -> int:
        """Write ``data`` at the end of the file; return the offset it starts at.

        All or nothing: on ``ENOSPC`` (or a refused free-space check) the file
        is truncated back to where it was and :class:`NoSpace` is raised.
        """
        return self.put(self.size, data, check_space=check_space)

    def put(self, offset: int, data: bytes | memoryview, *, check_space: bool = False) -> int:
        """:meth:`append` at ``offset``, the end or before it (over zeros written ahead of the
        data): all or nothing, a failed write cuts the file back to ``offset``."""
        io = self._io
        nbytes = len(data)
        if check_space:
            io.check_space(nbytes)
        view = memoryview(data)
        done = 0
        try:
            while done < nbytes:
                done += self._write_at(offset + done, view[done:])
        except OSError as exc:
            if done:
                self.truncate(offset)
            if exc.errno == errno.ENOSPC:
                io.note_no_space()
                raise NoSpace(f"disk full writing {nbytes} bytes to {self.path} at offset {offset}") from exc
            raise
        io.note_written(nbytes)
        return offset

    def put_parts(self, offset: int, parts: list[bytes | memoryview]) -> int:
        """:meth:`put` of ``parts`` joined, without a free-space check."""
        return self.put(offset, b"".join(parts))

    def pwrite(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` (used to rewrite, never to grow past the end by a hole)."""
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                done += self._write_at(offset + done, view[done:])
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self._io.note_no_space()
                raise NoSpace(f"disk full writing {len(view)} bytes to {self.path} at offset {offset}") from exc
            raise

    _io: FileIO


class FileIO(ABC):
    """Files, directories, syncs and a free-space guard under one root directory."""

    def __init__(
        self,
        disk_free_min_bytes: int = DISK_FREE_MIN_BYTES,
        space_recheck_bytes: int = 16 * 1024 * 1024,
        space_recheck_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.disk_free_min_bytes = disk_free_min_bytes
        self.space_recheck_bytes = space_recheck_bytes
        self.space_recheck_s = space_recheck_s
        self._clock = clock
        self._space_root: str | None = None
        self._free_estimate = 0
        self._written_since_check = 0
        self._checked_at = float("-inf")

    # -- files and directories -------------------------------------------------
    @abstractmethod
    def open(self, path: str, *, create: bool = True) -> FileHandle:
        """Open ``path`` for reading and writing; create it empty if missing and ``create``."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """True if ``path`` names a file."""

    @abstractmethod
    def listdir(self, directory: str) -> list[str]:
        """Names of the files in ``directory`` (sorted)."""

    @abstractmethod
    def makedirs(self, directory: str) -> None:
        """Create ``directory`` and its parents if missing."""

    @abstractmethod
    def remove_tree(self, directory: str) -> None:
        """Delete ``directory`` and everything in it, if it is there."""

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` by ``src`` (durable after :meth:`fsync_dir`)."""

    @abstractmethod
    def unlink(self, path: str) -> None:
        """Remove a file (durable after :meth:`fsync_dir`); a missing file is not an error."""

    @abstractmethod
    def fsync_dir(self, directory: str) -> None:
        """Make the directory's entries (creations, renames, removals) durable."""

    @abstractmethod
    def free_bytes(self, directory: str) -> int:
        """Bytes free for an unprivileged writer on the filesystem of ``directory``."""

    def write_atomic(self, path: str, chunks: Iterable[bytes], *, check_space: bool = False) -> int:
        """Replace ``path`` by ``chunks`` durably: temp file, fsync, rename, directory fsync.

        After a power cut at any point the path holds either the old or the
        new content, never a mix. Returns the bytes written. On failure the
        temp file is removed and the old file is untouched.
        """
        directory = os.path.dirname(path) or "."
        tmp = path + ".tmp"
        handle = self.open(tmp)
        total = 0
        try:
            handle.truncate(0)
            for chunk in chunks:
                handle.append(chunk, check_space=check_space)
                total += len(chunk)
            handle.fsync()
        except BaseException:
            handle.close()
            self.unlink(tmp)
            raise
        handle.close()
        self.rename(tmp, path)
        self.fsync_dir(directory)
        return total

    def read_all(self, path: str) -> bytes:
        """The whole content of ``path``."""
        handle = self.open(path, create=False)
        try:
            return handle.pread(0, handle.size)
        finally:
            handle.close()

    # -- the free-space guard --------------------------------------------------
    def watch_space(self, directory: str) -> None:
        """Guard free space on the filesystem of ``directory`` (the node's data directory)."""
        self._space_root = directory
        self._checked_at = float("-inf")

    def space_low(self) -> bool:
        """True if writes that check space would be refused now (asks the kernel at most as configured)."""
        if self._space_root is None:
            return False
        self._maybe_recheck()
        return self._free_estimate < self.disk_free_min_bytes

    def check_space(self, nbytes: int) -> None:
        """Raise :class:`NoSpace` if writing ``nbytes`` would leave less than the minimum free."""
        if self._space_root is None:
            return
        self._maybe_recheck()
        if self._free_estimate - nbytes < self.disk_free_min_bytes:
            raise NoSpace(
                f"free space {self._free_estimate} bytes on {self._space_root} is below "
                f"disk_free_min_bytes={self.disk_free_min_bytes}"
            )

    def note_written(self, nbytes: int) -> None:
        """Lower the free-space estimate by bytes just written."""
        self._free_estimate -= nbytes
        self._written_since_check += nbytes

    def note_no_space(self) -> None:
        """An ``ENOSPC`` happened: ask the kernel again at the next check."""
        self._checked_at = float("-inf")

    def _maybe_recheck(self) -> None:
        now = self._clock()
        if (
            self._written_since_check >= self.space_recheck_bytes
            or now - self._checked_at >= self.space_recheck_s
        ):
            assert self._space_root is not None
            self._free_estimate = self.free_bytes(self._space_root)
            self._written_since_check = 0
            self._checked_at = now


# ---------------------------------------------------------------------------
# Real files
# ---------------------------------------------------------------------------


class _RealFile(FileHandle):
    def __init__(self, io: RealIO, path: str, fd: int) -> None:
        self._io = io
        self.path = path
        self._fd = fd
        self._size = os.fstat(fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def _write_at(self, offset: int, data: bytes | memoryview) -> int:
        written = os.pwrite(self._fd, data, offset)
        self._size = max(self._size, offset + written)
        return written

    def pread(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def put_parts(self, offset: int, parts: list[bytes | memoryview]) -> int:
        """One ``pwritev`` of ``parts`` (no joined copy of them); a short write or an error
        goes on as :meth:`put` of what is left, with its all-or-nothing rule."""
        try:
            written = os.pwritev(self._fd, parts, offset)
        except OSError:
            written = 0
        nbytes = sum(len(part) for part in parts)
        if written:
            self._size = max(self._size, offset + written)
        if written == nbytes:
            self._io.note_written(nbytes)
            return offset
        if written:
            self._io.note_written(written)
        rest = b"".join(parts)[written:]
        try:
            self.put(offset + written, rest)
        except BaseException:
            if written:
                self.truncate(offset)
            raise
        return offset

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size

    def datasync(self) -> None:
        os.fdatasync(self._fd)

    def fsync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


#: A file at least this big that a rename replaces or an unlink removes is let go in a thread:
#: the kernel frees its blocks when its last name and descriptor go (seconds for a snapshot of
#: gigabytes, here), and that must not be on the event loop.
RETIRE_BYTES_MIN = 64 << 20
#: Descriptors waiting for the retiring thread: a SimpleQueue, whose ``put`` may run inside a
#: garbage collection that interrupted a thread holding any lock (a payload space's
#: ``__del__`` closes its files here), where an executor's ``submit`` could wait on itself.
_retire_queue: "queue.SimpleQueue[int]" = queue.SimpleQueue()
_retire_thread: threading.Thread | None = None
_retire_pid = 0


def _hold_if_large(path: str) -> int:
    """A descriptor of ``path`` when it is a file of at least :data:`RETIRE_BYTES_MIN`, else -1."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        if os.fstat(fd).st_size >= RETIRE_BYTES_MIN:
            return fd
    except OSError:
        pass
    os.close(fd)
    return -1


def close_later(fd: int) -> None:
    """Close ``fd`` (the last reference to a file no name refers to) on the retiring thread, where
    the kernel frees the file's blocks; -1 is nothing."""
    if fd < 0:
        return
    if not start_retiring():
        _close_quietly(fd)
        return
    _retire_queue.put(fd)


def start_retiring() -> bool:
    """Start this process's retiring thread if it runs not yet (a forked child has none): done
    ahead by owners of files closed from ``__del__``, whose first close may come within a
    garbage collection. False when no thread can start (the interpreter shutting down)."""
    global _retire_thread, _retire_pid
    if _retire_thread is None or _retire_pid != os.getpid():
        _retire_pid = os.getpid()
        _retire_thread = threading.Thread(target=_retire_forever, name="shoal-retire", daemon=True)
        try:
            _retire_thread.start()
        except RuntimeError:
            _retire_thread = None
            return False
    return True


def _retire_forever() -> None:
    get = _retire_queue.get
    while True:
        _close_quietly(get())


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class RealIO(FileIO):
    """Real files through ``os`` calls."""

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise NoSpace(f"disk full creating {path}") from exc
            raise
        return _RealFile(self, path, fd)

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def listdir(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))

    def makedirs(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)

    def remove_tree(self, directory: str) -> None:
        shutil.rmtree(directory, ignore_errors=True)

    def rename(self, src: str, dst: str) -> None:
        kept = _hold_if_large(dst)
        os.replace(src, dst)
        close_later(kept)

    def unlink(self, path: str) -> None:
        kept = _hold_if_large(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        close_later(kept)

    def fsync_dir(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def free_bytes(self, directory: str) -> int:
        st = os.statvfs(directory)
        return st.f_bavail * st.f_frsize


# ---------------------------------------------------------------------------
# Simulated files
# ---------------------------------------------------------------------------


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""


class _SimFile(FileHandle):
    def __init__(self, io: SimIO, path: str, inode: _Inode) -> None:
        self._io = io
        self.path = path
        self._inode = inode
        self._epoch = io.epoch

    def _live(self) -> _Inode:
        if self._epoch != self._io.epoch:
            raise PowerCut(f"{self.path}: handle opened before a power cut")
        return self._inode

    @property
    def size(self) -> int:
        return len(self._live().data)

    def _write_at(self, offset: int, data: bytes | memoryview) -> int:
        inode = self._live()
        io = self._io
        if io.fail_writes_errno is not None:
            raise OSError(io.fail_writes_errno, os.strerror(io.fail_writes_errno))
        grow = max(0, offset + len(data) - len(inode.data))
        room = io.capacity_bytes - io.used_bytes() if io.capacity_bytes is not None else grow
        if grow > room:
            fit = len(data) - (grow - max(room, 0))
            if fit <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = data[:fit]
        if offset > len(inode.data):  # a write past the end leaves a hole, read as zeros
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset : offset + len(data)] = data
        io._step(f"write {self.path}")
        return len(data)

    def pread(self, offset: int, size: int) -> bytes:
        return bytes(self._live().data[offset : offset + size])

    def truncate(self, size: int) -> None:
        inode = self._live()
        del inode.data[size:]
        self._io._step(f"truncate {self.path}")

    def datasync(self) -> None:
        inode = self._live()
        if self._io.fail_syncs_errno is not None:
            raise OSError(self._io.fail_syncs_errno, os.strerror(self._io.fail_syncs_errno))
        inode.synced = bytes(inode.data)
        self._io._step(f"sync {self.path}")

    def fsync(self) -> None:
        self.datasync()

    def close(self) -> None:
        pass


class SimIO(FileIO):
    """In-memory files with a durable/volatile split, power cuts and a disk capacity.

    Paths are plain strings; a directory is any prefix ending at a ``/``.
    ``capacity_bytes`` (``None`` = unlimited) bounds the sum of all file
    sizes; ``free_bytes`` reports what is left of it.
    """

    def __init__(self, capacity_bytes: int | None = None, **kwargs: object) -> None:
        kwargs.setdefault("disk_free_min_bytes", 0)
        kwargs.setdefault("space_recheck_s", 0.0)
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.capacity_bytes = capacity_bytes
        self.fail_writes_errno: int | None = None
        self.fail_syncs_errno: int | None = None
        self.epoch = 0
        self._names: dict[str, _Inode] = {}
        self._durable_names: dict[str, _Inode] = {}
        self._dir_renames: list[tuple[str, str]] = []  # (src, dst) not yet made durable
        self.log: list[str] = []
        self.step_hook: Callable[[str], None] | None = None
        """Called after every simulated operation with its name; a test may raise from it to stop there."""

    def _step(self, what: str) -> None:
        self.log.append(what)
        if self.step_hook is not None:
            self.step_hook(what)

    # -- FileIO ------------------------------------------------------------------
    def open(self, path: str, *, create: bool = True) -> FileHandle:
        inode = self._names.get(path)
        if inode is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            inode = self._names[path] = _Inode()
        handle = _SimFile(self, path, inode)
        self._step(f"open {path}")
        return handle

    def exists(self, path: str) -> bool:
        return path in self._names

    def listdir(self, directory: str) -> list[str]:
        """Files and subdirectories (a directory exists while it holds a file)."""
        prefix = directory.rstrip("/") + "/"
        return sorted({name[len(prefix) :].split("/", 1)[0] for name in self._names if name.startswith(prefix)})

    def makedirs(self, directory: str) -> None:
        pass

    def remove_tree(self, directory: str) -> None:
        prefix = directory.rstrip("/") + "/"
        inside = [n for n in self._names if n.startswith(prefix)]
        for name in inside:
            del self._names[name]
        if inside:
            self._step(f"remove_tree {directory}")

    def rename(self, src: str, dst: str) -> None:
        """Rename a file, or a directory (durable once their parent is fsynced)."""
        if src in self._names:
            self._names[dst] = self._names.pop(src)
        else:
            moved = self._move_tree(self._names, src, dst)
            if not moved:
                raise FileNotFoundError(errno.ENOENT, "no such file or directory", src)
            self._dir_renames.append((src.rstrip("/"), dst.rstrip("/")))
        self._step(f"rename {src} {dst}")

    @staticmethod
    def _move_tree(names: dict[str, _Inode], src: str, dst: str) -> int:
        prefix = src.rstrip("/") + "/"
        inside = [n for n in names if n.startswith(prefix)]
        for name in inside:
            names[dst.rstrip("/") + "/" + name[len(prefix) :]] = names.pop(name)
        return len(inside)

    def unlink(self, path: str) -> None:
        self._names.pop(path, None)
        self._step(f"unlink {path}")

    def fsync_dir(self, directory: str) -> None:
        prefix = directory.rstrip("/") + "/"
        if self.fail_syncs_errno is not None:
            raise OSError(self.fail_syncs_errno, os.strerror(self.fail_syncs_errno))

        def in_dir(name: str) -> bool:
            return name.startswith(prefix) and "/" not in name[len(prefix) :]

        for name in [n for n in self._durable_names if in_dir(n)]:
            del self._durable_names[name]
        for name, inode in self._names.items():
            if in_dir(name):
                self._durable_names[name] = inode
        parent = directory.rstrip("/")
        for src, dst in [r for r in self._dir_renames if os.path.dirname(r[0]) == parent]:
            self._move_tree(self._durable_names, src, dst)
            self._dir_renames.remove((src, dst))
        self._step(f"fsync_dir {directory}")

    def free_bytes(self, directory: str) -> int:
        if self.capacity_bytes is None:
            return 1 << 62
        return self.capacity_bytes - self.used_bytes()

    # -- failure injection -------------------------------------------------------
    def used_bytes(self) -> int:
        """Sum of the sizes of all files still named or open."""
        inodes = {id(i): i for i in self._names.values()}
        return sum(len(i.data) for i in inodes.values())

    def fill_disk(self) -> None:
        """Make the disk full: capacity becomes what is used now."""
        self.capacity_bytes = self.used_bytes()

    def power_cut(self, rng: random.Random | None = None) -> None:
        """Lose everything not synced; with ``rng``, keep a random torn prefix of appended tails.

        Directory entries revert to the last :meth:`fsync_dir` of their
        directory; file contents to their last sync. With ``rng``, bytes
        rewritten in place since (same size) keep, per 512-byte sector, the old
        or the new content, and one such sector may be torn between the two.
        Handles opened before the cut raise :class:`PowerCut` when used.
        """
        self.epoch += 1
        self._names = dict(self._durable_names)
        self._dir_renames.clear()
        for inode in {id(i): i for i in self._names.values()}.values():
            kept = inode.synced
            current = bytes(inode.data)
            if rng is not None and len(current) > len(kept) and current.startswith(kept):
                cut = rng.randint(len(kept), len(current))
                # The size may reach the disk before the data: a tail of zeros.
                zeros = rng.randint(0, len(current) - cut) if rng.random() < 0.3 else 0
                kept = current[:cut] + b"\0" * zeros
            elif rng is not None and len(current) == len(kept) and current != kept:
                kept = _mixed_sectors(kept, current, rng)
            inode.data = bytearray(kept)
            inode.synced = kept
        self.log.append("power_cut")

    def flip_bits(self, path: str, offset: int, mask: int = 0x01) -> None:
        """Damage the medium: XOR the byte at ``offset`` of ``path`` with ``mask``, synced or not."""
        for inode in self._inodes_of(path):
            if offset < len(inode.data):
                inode.data[offset] ^= mask
            if offset < len(inode.synced):
                synced = bytearray(inode.synced)
                synced[offset] ^= mask
                inode.synced = bytes(synced)
        self.log.append(f"flip_bits {path} {offset} {mask:#x}")

    def cut_file(self, path: str, size: int) -> None:
        """Damage the medium: ``path`` loses everything from ``size`` on, synced or not."""
        for inode in self._inodes_of(path):
            del inode.data[size:]
            inode.synced = inode.synced[:size]
        self.log.append(f"cut_file {path} {size}")

    def _inodes_of(self, path: str) -> list[_Inode]:
        found = [i for i in (self._names.get(path), self._durable_names.get(path)) if i is not None]
        if not found:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return list({id(i): i for i in found}.values())


SECTOR_BYTES = 512


def _mixed_sectors(old: bytes, new: bytes, rng: random.Random) -> bytes:
    """What a power cut may leave of an in-place rewrite: each sector old or new, one maybe torn."""
    out = bytearray(old)
    changed = [at for at in range(0, len(old), SECTOR_BYTES) if old[at : at + SECTOR_BYTES] != new[at : at + SECTOR_BYTES]]
    for at in changed:
        if rng.random() < 0.5:
            out[at : at + SECTOR_BYTES] = new[at : at + SECTOR_BYTES]
    if changed and rng.random() < 0.3:
        at = rng.choice(changed)
        end = min(at + SECTOR_BYTES, len(old))
        tear = rng.randint(at, end)
        out[at:tear] = new[at:tear]
        out[tear:end] = old[tear:end]
    return bytes(out)
