"""A partition's snapshot: written by a forked child, verified whole, loaded off the event loop.

Theory of operation. The replica decides when to snapshot (every
:attr:`SnapshotSettings.entries_min` applied entries or :attr:`SnapshotSettings.interval_s`
seconds) and calls :meth:`ForkSnapshotter.start`, which forks: the child holds a
copy-on-write image of the application's state exactly at the applied index, takes
its content in bounded chunks (:meth:`~.application.Application.snapshot_chunks`)
and writes it with :func:`~.snapshot_file.write_snapshot` (temp
file, fsync, rename, directory fsync), then exits 0. The parent returns at once and
:meth:`ForkSnapshotter.poll` reaps the child without blocking. A child that runs
longer than :attr:`SnapshotSettings.child_time_limit_s` is killed. The child also
reads the file it wrote back whole (:func:`verify_snapshot`: header, trailer and the
CRC32C of the whole content) and hands the parent its size and whole-file CRC32C
through a pipe: a snapshot of gigabytes is read back in the child, never on the
parent's event loop. Only when the child exited 0 with that record, and the file's
size and metadata say the same, is the snapshot reported, which is when the replica
drops the journal prefix it covers. A failure is logged, the journal keeps
its prefix, and the next attempt waits a backoff from :data:`RETRY_MIN_S` to
:data:`RETRY_MAX_S`.

The same file is what a leader streams to a follower that lags behind its journal
(:mod:`.install`), with the files beside it that it refers to (a follower of an earlier
release that takes no files waits while the leader takes one that carries everything,
:mod:`.replica`). Only a verified file is ever sent, and its whole-file CRC32C
(:attr:`SnapshotFile.file_crc`) travels with every chunk so the follower can check
what it received before it replaces anything.

Loading (:func:`load_snapshot`) streams the file into a new state built by the
application, checking the content CRC at the end before the state is handed out; the
replica runs it in a worker thread, so the event loop keeps serving the node's other
partitions.

Content layout (inside the :mod:`.snapshot_file` envelope)::

    u32 meta length | meta: MessagePack [2, last index, last term, membership [[voters], [learners]]]
                      or [3, last index, last term, membership, name of its files' directory]
    the application's content (Application.snapshot_chunks())

A snapshot may come with a directory of files beside it (version 3 metadata names it): the
application hard-links the files its state refers to there right before the fork
(:meth:`~.application.Application.link_snapshot_files`) and the child syncs them, so a
snapshot of data the application keeps in files costs what its index does, not its data. The
replica keeps the directory as long as the snapshot, and sends a peer only a snapshot without
one (:mod:`.replica`).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import msgpack

from ._io import FileIO
from .membership import ConfigError, Membership
from .snapshot_file import (HEADER_BYTES, SnapshotChecker, SnapshotCorrupt, read_snapshot, read_snapshot_info,
                            write_snapshot)

__all__ = ["ForkSnapshotter", "SnapshotSettings", "SnapshotFile", "verify_snapshot", "load_snapshot",
           "snapshot_content", "read_snapshot_meta", "read_snapshot_head", "files_path", "become_background_child",
           "RETRY_MIN_S", "RETRY_MAX_S",
           "ENV_ENTRIES_MIN", "ENV_INTERVAL_S"]

log = logging.getLogger(__name__)

#: Children run at this niceness above the node's: they are background work.
CHILD_NICE = 10
#: A failed snapshot is retried after this long, doubling per failure up to RETRY_MAX_S.
RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0
#: The child's error message is cut to this many bytes (one pipe buffer, so it never blocks).
ERROR_BYTES_MAX = 4096
#: Bytes read at a time when verifying or loading a file.
READ_BYTES = 1024 * 1024
_META_LEN = struct.Struct("<I")
_META_VERSION = 2
_META_VERSION_FILES = 3
_META_BYTES_MAX = 64 * 1024
#: What a child that wrote and verified its snapshot writes to its pipe: a tag no error message
#: starts with, then the file's last index, last term, size and whole-file CRC32C.
_VERIFIED = struct.Struct("<4sQQQI")
_VERIFIED_TAG = b"\0VFY"
ENV_ENTRIES_MIN = "SHOAL_SNAPSHOT_ENTRIES_MIN"
ENV_INTERVAL_S = "SHOAL_SNAPSHOT_INTERVAL_S"
ENV_CHILD_LIMIT_S = "SHOAL_SNAPSHOT_CHILD_LIMIT_S"

#: Snapshot children a node runs at once: each fork copies the node's page tables (a stall of
#: ~75 ms per GB here) and each child takes a core; partitions whose thresholds pass together
#: take turns.
SNAPSHOT_CHILDREN_MAX = 1

_State = TypeVar("_State")


@dataclass(frozen=True, slots=True)
class SnapshotSettings:
    """When a replica snapshots, and how long its child may take."""

    entries_min: int = 20_000
    interval_s: float = 120.0
    child_time_limit_s: float = 600.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "SnapshotSettings":
        """Defaults, overridden by ``SHOAL_SNAPSHOT_ENTRIES_MIN`` / ``_INTERVAL_S`` / ``_CHILD_LIMIT_S``."""
        env = dict(os.environ) if env is None else env
        default = cls()
        settings = cls(int(env.get(ENV_ENTRIES_MIN) or default.entries_min),
                       float(env.get(ENV_INTERVAL_S) or default.interval_s),
                       float(env.get(ENV_CHILD_LIMIT_S) or default.child_time_limit_s))
        if settings.entries_min < 2 or settings.interval_s <= 0 or settings.child_time_limit_s <= 0:
            raise ValueError(f"{ENV_ENTRIES_MIN} must be >= 2, {ENV_INTERVAL_S} and {ENV_CHILD_LIMIT_S} > 0")
        return settings


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """A verified snapshot on disk: the entry it ends at, the membership then, its size and CRC32C."""

    path: str
    index: int
    term: int
    membership: Membership
    size: int
    file_crc: int
    #: Name of the directory beside the file holding the files it refers to (None: it has none,
    #: and may be sent to a peer).
    files: str | None = None


def snapshot_content(index: int, term: int, membership: Membership, state: Iterable[bytes],
                     files: str | None = None) -> Iterator[bytes]:
    """The snapshot content at entry ``(index, term)``: the metadata, then the application's
    ``state`` chunks (:meth:`~.application.Application.snapshot_chunks`); ``files``: the name
    of the directory beside the snapshot holding the files the state refers to."""
    if files is None:
        meta = msgpack.packb([_META_VERSION, index, term, membership.to_wire()], use_bin_type=True)
    else:
        meta = msgpack.packb([_META_VERSION_FILES, index, term, membership.to_wire(), files], use_bin_type=True)
    yield _META_LEN.pack(len(meta)) + meta
    yield from state


def files_path(path: str, files: str | None) -> str | None:
    """Where the directory named ``files`` of the snapshot file ``path`` is (beside it)."""
    return os.path.join(os.path.dirname(path), files) if files is not None else None


def _parse_meta(path: str, head: bytes) -> tuple[int, int, Membership, str | None, int]:
    """(index, term, membership, name of its files' directory, bytes of the meta prefix) from
    the start of the content."""
    if len(head) < _META_LEN.size:
        raise SnapshotCorrupt(f"{path}: content too short for its metadata")
    (meta_len,) = _META_LEN.unpack_from(head)
    end = _META_LEN.size + meta_len
    if meta_len > _META_BYTES_MAX or len(head) < end:
        raise SnapshotCorrupt(f"{path}: metadata of {meta_len} bytes does not fit")
    try:
        meta = msgpack.unpackb(head[_META_LEN.size:end], raw=False)
        version, index, term, membership = meta[:4]
        files = None
        if version == _META_VERSION_FILES:
            files = meta[4]
            if not isinstance(files, str) or not files or os.sep in files or files.startswith("."):
                raise ValueError(f"files directory {files!r} is not a plain name")
        elif version != _META_VERSION or len(meta) != 4:
            raise ValueError(f"metadata version {version}, expected {_META_VERSION} or {_META_VERSION_FILES}")
        return int(index), int(term), Membership.from_wire(membership), files, end
    except (ValueError, TypeError, ConfigError, msgpack.UnpackException) as exc:
        raise SnapshotCorrupt(f"{path}: unreadable metadata: {exc}") from exc


def verify_snapshot(io: FileIO, path: str) -> SnapshotFile:
    """Read the whole file once: envelope and content CRC32C (:class:`~.snapshot_file.SnapshotChecker`),
    its whole-file CRC32C, and the metadata; :class:`~.snapshot_file.SnapshotCorrupt` names the
    file (and offset) on any damage."""
    checker = SnapshotChecker(path)
    checker.update_from_file(io, path, chunk_bytes=READ_BYTES)
    info = checker.finish()
    index, term, membership, files = read_snapshot_head(io, path)
    if (index, term) != (info.last_index, info.last_term):
        raise SnapshotCorrupt(f"{path}: header says entry {info.last_index}/{info.last_term}, "
                              f"metadata {index}/{term}", path=path, offset=HEADER_BYTES)
    return SnapshotFile(path, index, term, membership, checker.offset, checker.file_crc32c, files)


def read_snapshot_meta(io: FileIO, path: str) -> tuple[int, int, Membership]:
    """``(index, term, membership)`` of a snapshot file, from its envelope and metadata only."""
    return read_snapshot_head(io, path)[:3]  # type: ignore[return-value]


def read_snapshot_head(io: FileIO, path: str) -> tuple[int, int, Membership, str | None]:
    """``(index, term, membership, name of its files' directory)`` of a snapshot file."""
    info = read_snapshot_info(io, path)
    handle = io.open(path, create=False)
    try:
        head = handle.pread(HEADER_BYTES, min(_META_LEN.size + _META_BYTES_MAX, info.content_bytes))
    finally:
        handle.close()
    index, term, membership, files, _ = _parse_meta(path, head)
    if (index, term) != (info.last_index, info.last_term):
        raise SnapshotCorrupt(f"{path}: header says entry {info.last_index}/{info.last_term}, metadata {index}/{term}")
    return index, term, membership, files


def load_snapshot(io: FileIO, path: str,
                  restore: Callable[[Iterator[bytes], str | None], _State]) -> tuple[_State, int, int, Membership]:
    """Stream ``path`` into ``restore`` (:meth:`~.application.Application.load_snapshot`), with
    the path of its files' directory (or None): ``(its state, index, term, membership)``.

    The content CRC is checked before the state is returned; on damage, or content
    ``restore`` cannot read, raises :class:`~.snapshot_file.SnapshotCorrupt`.
    """
    chunks = read_snapshot(io, path, READ_BYTES)
    head = next(chunks, b"")
    index, term, membership, files, meta_end = _parse_meta(path, head)

    def rest() -> Iterator[bytes]:
        if len(head) > meta_end:
            yield head[meta_end:]
        yield from chunks  # raises SnapshotCorrupt at the end if the CRC fails

    try:
        state = restore(rest(), files_path(path, files))
        for _ in chunks:  # the CRC is checked only once the iterator is exhausted
            pass
    except SnapshotCorrupt:
        raise
    except Exception as exc:  # the application refused the content: damaged in a way the CRC did not catch
        raise SnapshotCorrupt(f"{path}: the state machine cannot read the snapshot: "
                              f"{type(exc).__name__}: {exc}") from exc
    return state, index, term, membership


def become_background_child() -> None:
    """In a child the node forked to write or hash its state: the parent's handlers (asyncio's
    wakeup fd, SIGTERM shutdown) must not run here, and the node's own loop comes first."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.nice(CHILD_NICE)


class _ChildSlots:
    """Snapshot children running in this process, and the snapshotters waiting for a slot."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.waiting: deque[ForkSnapshotter] = deque()

    def release(self) -> None:
        self.running -= 1
        while self.waiting and self.running < self.limit:
            snapshotter = self.waiting.popleft()
            snapshotter.waiting = False
            if snapshotter.on_slot is not None:
                snapshotter.on_slot()
            if snapshotter.in_progress:
                return


_SLOTS = _ChildSlots(SNAPSHOT_CHILDREN_MAX)


class ForkSnapshotter:
    """Writes one partition's snapshots in forked children (see the module docstring)."""

    def __init__(self, path: str, partition: int, io: FileIO, settings: SnapshotSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.partition = partition
        self._io = io
        self.settings = settings
        self._clock = clock
        self._pid = 0
        self._error_fd = -1
        self._index = 0
        self._started = 0.0
        self._retry_at = 0.0
        self._failures = 0
        #: Called when this snapshotter waited for a child slot and one came free.
        self.on_slot: Callable[[], None] | None = None
        #: Called with the message of every snapshot that failed.
        self.on_failed: Callable[[str], None] | None = None
        self.waiting = False
        self.written = 0
        self.failed = 0
        self.last_duration_s = 0.0
        self.last_fork_s = 0.0

    def stats(self) -> dict[str, object]:
        """Counters for ``Stats``: snapshots written and failed, the last one's duration and fork time."""
        return {"written": self.written, "failed": self.failed, "inProgress": self.in_progress,
                "lastDurationMs": round(self.last_duration_s * 1000, 1),
                "lastForkMs": round(self.last_fork_s * 1000, 2)}

    @property
    def in_progress(self) -> bool:
        """A child is writing a snapshot now."""
        return self._pid != 0

    def start(self, state: Callable[..., Iterable[bytes]], index: int, term: int, membership: Membership,
              prepare: Callable[[], str | None] | None = None) -> bool:
        """Fork a child writing ``state()`` (the application's content, called in the child) as the
        snapshot at ``(index, term)``; False when not started (one runs already, a retry backoff
        is on, or every child slot is taken: ``on_slot`` then calls back once one frees).

        ``prepare`` runs right before the fork, only when it happens: it returns the directory
        beside the snapshot it filled with files the state refers to (or None), and the child
        then calls ``state(that directory)`` and names it in the metadata."""
        if self._pid or self._clock() < self._retry_at:
            return False
        if _SLOTS.running >= _SLOTS.limit:
            if not self.waiting:
                self.waiting = True
                _SLOTS.waiting.append(self)
            return False
        files = prepare() if prepare is not None else None
        read_fd, write_fd = os.pipe()
        started = self._clock()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection between fork and the child's exit would only copy pages
        try:
            pid = os.fork()
        except OSError as exc:
            if gc_was_enabled:
                gc.enable()
            os.close(read_fd)
            os.close(write_fd)
            self._failed(f"fork failed: {exc}")
            return False
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            content = (lambda: state(files)) if prepare is not None else state
            self._child(write_fd, content, index, term, membership, files)
        if gc_was_enabled:
            gc.enable()
        os.close(write_fd)
        self.last_fork_s = self._clock() - started
        self._pid, self._error_fd, self._started, self._index = pid, read_fd, started, index
        _SLOTS.running += 1
        log.info("partition %d: snapshot at entry %d started in child %d (fork %.1f ms)", self.partition,
                 index, pid, self.last_fork_s * 1000)
        return True

    def _child(self, error_fd: int, state: Callable[[], Iterable[bytes]], index: int, term: int,
               membership: Membership, files: str | None) -> None:
        code = 1
        try:
            become_background_child()
            name = os.path.basename(files) if files is not None else None
            write_snapshot(self._io, self.path, index, term,
                           snapshot_content(index, term, membership, state(), name))
            snap = verify_snapshot(self._io, self.path)
            os.write(error_fd, _VERIFIED.pack(_VERIFIED_TAG, snap.index, snap.term, snap.size, snap.file_crc))
            code = 0
        except BaseException as exc:  # reported to the parent, which logs it
            try:
                os.write(error_fd, f"{type(exc).__name__}: {exc}".encode()[:ERROR_BYTES_MAX])
            except BaseException:
                pass
        finally:
            os._exit(code)

    def poll(self) -> SnapshotFile | None:
        """Reap a finished child without blocking: the verified snapshot once (then None again).

        A child past its time limit is killed and counted as failed.
        """
        if not self._pid:
            return None
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: nothing tells whether it succeeded
            pid, status = self._pid, -1
        if pid == 0:
            if self._clock() - self._started > self.settings.child_time_limit_s:
                self._kill()
                self._failed(f"child ran longer than {self.settings.child_time_limit_s:.0f} s; killed")
            return None
        self._pid = 0
        _SLOTS.release()
        report = self._child_report()
        message = report.decode(errors="replace")
        if status == 0:
            try:
                snap = self._verified(report)
            except (OSError, SnapshotCorrupt) as exc:
                message = f"snapshot file does not verify after writing: {exc}"
            else:
                if snap.index == self._index:
                    self.written += 1
                    self._failures = 0
                    self.last_duration_s = self._clock() - self._started
                    log.info("partition %d: snapshot at entry %d durable in %.2f s (%d bytes)", self.partition,
                             snap.index, self.last_duration_s, snap.size)
                    return snap
                message = f"snapshot file ends at entry {snap.index}, expected {self._index}"
        elif not message:
            message = f"child exited with status {status}"
        self._failed(message)
        return None

    def _verified(self, report: bytes) -> SnapshotFile:
        """The snapshot the child wrote and verified, from its report (:data:`_VERIFIED`) and the
        file's envelope and metadata (a few bytes read: the child read the whole file)."""
        if len(report) != _VERIFIED.size or not report.startswith(_VERIFIED_TAG):
            raise SnapshotCorrupt(f"{self.path}: the child reported no verification ({report[:200]!r})")
        _, index, term, size, file_crc = _VERIFIED.unpack(report)
        meta_index, meta_term, membership, files = read_snapshot_head(self._io, self.path)
        handle = self._io.open(self.path, create=False)
        try:
            on_disk = handle.size
        finally:
            handle.close()
        if (meta_index, meta_term, on_disk) != (index, term, size):
            raise SnapshotCorrupt(f"{self.path}: entry {meta_index}/{meta_term}, {on_disk} bytes on disk; the child "
                                  f"verified entry {index}/{term}, {size} bytes")
        return SnapshotFile(self.path, index, term, membership, size, file_crc, files)

    def _child_report(self) -> bytes:
        """What the child wrote to its pipe: an error message, or its :data:`_VERIFIED` record."""
        fd, self._error_fd = self._error_fd, -1
        if fd < 0:
            return b""
        try:
            return os.read(fd, ERROR_BYTES_MAX)
        except OSError:
            return b""
        finally:
            os.close(fd)

    def _failed(self, message: str) -> None:
        self.failed += 1
        self._failures += 1
        delay = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + delay
        log.error("partition %d: snapshot at entry %d failed, journal prefix kept, retry in %.0f s: %s",
                  self.partition, self._index, delay, message)
        if self.on_failed is not None:
            self.on_failed(message)

    def _kill(self) -> None:
        pid, self._pid = self._pid, 0
        if not pid:
            return
        _SLOTS.release()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        self._child_report()
        self._io.unlink(self.path + ".tmp")

    def cancel(self) -> None:
        """Stop a running child (close, or a snapshot from the leader replaces ours); nothing is dropped."""
        if self.waiting:
            self.waiting = False
            _SLOTS.waiting.remove(self)
        self._kill()
