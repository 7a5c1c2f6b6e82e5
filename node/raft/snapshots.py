"""Partition snapshots taken in a forked child, so the event loop never serialises the state.

Theory of operation. pysyncobj decides *when* to snapshot (every
:data:`SnapshotSettings.entries_min` journal entries or
:data:`SnapshotSettings.interval_s` seconds) and asks its serializer object to
write one; :class:`ForkSnapshotter` is that object. ``serialize`` forks: the
child holds a copy-on-write image of the engine exactly at the last applied
entry, serialises it and writes it with :func:`~.snapshot_file.write_snapshot`
(temp file, fsync, rename, directory fsync), then exits 0. The parent returns
at once and polls the child with ``waitpid(WNOHANG)`` on each tick
(``checkSerializing``). Only when the child exited 0 and the file reads back as
a complete snapshot ending at that entry does it report success, which is when
pysyncobj drops the journal prefix the snapshot covers. A failure (non-zero
exit; the child's error text comes back through a pipe) is logged as an error,
the journal keeps its prefix, and the next attempt waits a backoff that grows
from :data:`RETRY_MIN_S` to :data:`RETRY_MAX_S`.

The parent's cost is the ``fork`` itself (copying page tables, a few ms per GB
of heap) and the copy-on-write faults of pages it writes while the child runs.

The same file is what a leader streams to a follower that lags behind the
journal; the follower writes it under a temp name, fsyncs it, checks header and
trailer, renames it into place and fsyncs the directory before pysyncobj loads
it. A snapshot arriving while a local child still writes one cancels the child,
so an older local snapshot can never be renamed over a newer installed one.

Content layout (inside the :mod:`.snapshot_file` envelope)::

    u32 meta length | meta: MessagePack [[command, index, term] of the entry before the last applied,
                                          [command, index, term] of the last applied entry]
    engine snapshot (PartitionEngine.snapshot(), MessagePack)
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
from pysyncobj.config import SERIALIZER_STATE

from ..state import PartitionEngine
from ._io import FileHandle, FileIO, RealIO
from .snapshot_file import SnapshotCorrupt, read_snapshot, read_snapshot_info, write_snapshot

__all__ = ["ForkSnapshotter", "align_journal", "become_background_child", "SnapshotSettings", "RETRY_MIN_S", "RETRY_MAX_S", "SNAPSHOT_JOBS_PER_CHUNK",
           "ENV_ENTRIES_MIN", "ENV_INTERVAL_S"]

log = logging.getLogger(__name__)

#: Children run at this niceness above the node's: they are background work.
CHILD_NICE = 10

#: A failed snapshot is retried after this long, doubling per failure up to RETRY_MAX_S.
RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0
#: The child packs and writes this many jobs at a time (~1.5 MB of ~117-byte jobs), so it
#: never holds the whole serialised state.
SNAPSHOT_JOBS_PER_CHUNK = 10_000
#: A leader sends a lagging follower at most this much snapshot per tick, so a large snapshot
#: travels over many ticks instead of holding the loop for pysyncobj's whole send period.
TRANSMISSION_BURST_BYTES = 4 * 1024 * 1024
TRANSMISSION_BURST_WINDOW_S = 0.05
#: The child's error message is cut to this many bytes (one pipe buffer, so it never blocks).
ERROR_BYTES_MAX = 4096
_META_LEN = struct.Struct("<I")
ENV_ENTRIES_MIN = "SHOAL_SNAPSHOT_ENTRIES_MIN"
ENV_INTERVAL_S = "SHOAL_SNAPSHOT_INTERVAL_S"

Entry = tuple[bytes, int, int]

#: Snapshot children a node runs at once: each fork copies the node's page tables (a stall of
#: ~75 ms per GB here) and each child takes a core and copies pages; partitions whose
#: thresholds pass together (the interval starts at process start for all) take turns.
SNAPSHOT_CHILDREN_MAX = 1


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
            snapshotter._slot_free()
            if snapshotter.in_progress:
                return


_SLOTS = _ChildSlots(SNAPSHOT_CHILDREN_MAX)


@dataclass(frozen=True, slots=True)
class SnapshotSettings:
    """When pysyncobj takes a snapshot: after ``entries_min`` journal entries or ``interval_s`` seconds."""

    entries_min: int = 20_000
    interval_s: float = 120.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "SnapshotSettings":
        """Defaults, overridden by ``SHOAL_SNAPSHOT_ENTRIES_MIN`` / ``SHOAL_SNAPSHOT_INTERVAL_S``."""
        env = dict(os.environ) if env is None else env
        default = cls()
        settings = cls(int(env.get(ENV_ENTRIES_MIN) or default.entries_min),
                       float(env.get(ENV_INTERVAL_S) or default.interval_s))
        if settings.entries_min < 2 or settings.interval_s <= 0:
            raise ValueError(f"{ENV_ENTRIES_MIN} must be >= 2 and {ENV_INTERVAL_S} > 0")
        return settings


def _entry(value: Any) -> Entry:
    command, index, term = value
    return bytes(command), int(index), int(term)


def snapshot_chunks(engine: PartitionEngine, prev_entry: Entry, last_entry: Entry) -> Iterator[bytes]:
    """The snapshot content of ``engine`` after ``last_entry``, in chunks of bounded size."""
    meta = msgpack.packb([list(prev_entry), list(last_entry)], use_bin_type=True)
    yield _META_LEN.pack(len(meta)) + meta
    yield from engine.snapshot_chunks(SNAPSHOT_JOBS_PER_CHUNK)


def load_snapshot(io: FileIO, path: str) -> tuple[PartitionEngine, Entry, Entry]:
    """Read and check a snapshot file: the engine and the two entries it ends with."""
    blob = b"".join(read_snapshot(io, path))  # raises SnapshotCorrupt before anything is adopted
    if len(blob) < _META_LEN.size:
        raise SnapshotCorrupt(f"{path}: content too short for its metadata")
    (meta_len,) = _META_LEN.unpack_from(blob)
    end = _META_LEN.size + meta_len
    prev_entry, last_entry = msgpack.unpackb(blob[_META_LEN.size:end], raw=False)
    engine = PartitionEngine.restore(blob[end:])
    return engine, _entry(prev_entry), _entry(last_entry)


def become_background_child() -> None:
    """In a child the node forked to write or hash its state: the parent's handlers (asyncio's
    wakeup fd, SIGTERM shutdown) must not run here, and the node's own loop comes first."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    os.nice(CHILD_NICE)


def align_journal(journal: Any, prev_entry: Entry, last_entry: Entry) -> int:
    """Drop the journal's entries before ``prev_entry`` when the journal holds both of the
    snapshot's entries; returns how many were dropped.

    At start pysyncobj keeps the journal only if it *begins* with the snapshot's two entries
    and otherwise clears it down to them, which would lose every entry after the snapshot
    when the node stopped between the child's rename and the compaction that follows it.
    Compacting here first makes the journal begin where the snapshot ends.
    """
    if len(journal) < 2:
        return 0
    k = prev_entry[1] - journal[0][1]
    if 0 < k < len(journal) - 1 and tuple(journal[k]) == prev_entry and tuple(journal[k + 1]) == last_entry:
        journal.deleteEntriesTo(k)
        return k
    return 0


class ForkSnapshotter:
    """pysyncobj's serializer for one partition: snapshots written by a forked child.

    Implements the interface pysyncobj's ``Serializer`` offers ``SyncObj``:
    ``checkSerializing``, ``serialize``, ``deserialize``, ``getTransmissionData``,
    ``setTransmissionData`` and ``cancelTransmisstion`` (sic).
    """

    def __init__(self, path: str, partition: int, engine: Callable[[], PartitionEngine],
                 adopt: Callable[[PartitionEngine, Entry, Entry], None], transmission_bytes: int,
                 io: FileIO | None = None, clock: Callable[[], float] = time.monotonic,
                 on_slot: Callable[[], None] | None = None) -> None:
        self.path = path
        self.partition = partition
        self._engine = engine
        self._adopt = adopt
        self._transmission_bytes = transmission_bytes
        self._io = io or RealIO()
        self._clock = clock
        self._pid = 0
        self._error_fd = -1
        self._last_index = 0
        self._started = 0.0
        self._retry_at = 0.0
        self._failures = 0
        self._outgoing: dict[Any, tuple[FileHandle, int]] = {}
        self._burst: dict[Any, tuple[float, int]] = {}
        #: Called when this snapshotter waited for a child slot and one came free (the replica
        #: asks pysyncobj for the snapshot again: it does not ask twice for a forced one).
        self._on_slot = on_slot
        self._waiting = False
        self._incoming: FileHandle | None = None
        #: Counters for /stats and tests: snapshots written, failed, and the last one's duration.
        self.written = 0
        self.failed = 0
        self.last_duration_s = 0.0
        self.last_fork_s = 0.0

    def stats(self) -> dict[str, Any]:
        """Counters for ``Stats``: snapshots written and failed, the last one's duration and fork time."""
        return {"written": self.written, "failed": self.failed, "inProgress": self.in_progress,
                "lastDurationMs": round(self.last_duration_s * 1000, 1), "lastForkMs": round(self.last_fork_s * 1000, 2)}

    @property
    def in_progress(self) -> bool:
        """A child is writing a snapshot now."""
        return self._pid != 0

    # --- taking a snapshot -------------------------------------------------------------------

    def serialize(self, data: Any, serialize_id: int) -> None:
        """Fork a child that writes the snapshot ending at the last applied entry; return at once.

        ``data`` is pysyncobj's ``(None, last applied entry, the entry before, cluster)``.
        """
        if self._pid or self._clock() < self._retry_at:
            return
        if _SLOTS.running >= _SLOTS.limit:
            if not self._waiting:
                self._waiting = True
                _SLOTS.waiting.append(self)
            return
        last_entry, prev_entry = _entry(data[1]), _entry(data[2])
        read_fd, write_fd = os.pipe()
        started = self._clock()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection between fork and exec-less exit would only copy pages
        try:
            pid = os.fork()
        except OSError as exc:
            if gc_was_enabled:
                gc.enable()
            os.close(read_fd)
            os.close(write_fd)
            self._failed(f"fork failed: {exc}")
            return
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            self._child(write_fd, prev_entry, last_entry)
        if gc_was_enabled:
            gc.enable()
        os.close(write_fd)
        self.last_fork_s = self._clock() - started
        self._pid, self._error_fd, self._started = pid, read_fd, started
        _SLOTS.running += 1
        self._last_index = last_entry[1]
        log.info("partition %d: snapshot at entry %d started in child %d (fork %.1f ms)", self.partition,
                 last_entry[1], pid, self.last_fork_s * 1000)

    def _child(self, error_fd: int, prev_entry: Entry, last_entry: Entry) -> None:
        code = 1
        try:
            become_background_child()
            write_snapshot(self._io, self.path, last_entry[1], last_entry[2],
                           snapshot_chunks(self._engine(), prev_entry, last_entry))
            code = 0
        except BaseException as exc:  # reported to the parent, which logs it
            try:
                os.write(error_fd, f"{type(exc).__name__}: {exc}".encode()[:ERROR_BYTES_MAX])
            except BaseException:
                pass
        finally:
            os._exit(code)

    def _slot_free(self) -> None:
        self._waiting = False
        if self._on_slot is not None:
            self._on_slot()

    def checkSerializing(self) -> tuple[int, int | None]:  # noqa: N802 (pysyncobj's name)
        """Poll the child without blocking: SERIALIZING, then SUCCESS (durable) or FAILED once."""
        if not self._pid:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: nothing tells whether it succeeded
            pid, status = self._pid, -1
        if pid == 0:
            return SERIALIZER_STATE.SERIALIZING, self._last_index - 1
        self._pid = 0
        _SLOTS.release()
        message = self._child_error()
        serialize_id = self._last_index - 1
        if status == 0:
            problem = self._check_written()
            if problem is None:
                self.written += 1
                self._failures = 0
                self.last_duration_s = self._clock() - self._started
                log.info("partition %d: snapshot at entry %d durable in %.2f s", self.partition,
                         self._last_index, self.last_duration_s)
                return SERIALIZER_STATE.SUCCESS, serialize_id
            message = problem
        elif not message:
            message = f"child exited with status {status}"
        self._failed(message)
        return SERIALIZER_STATE.FAILED, serialize_id

    def _child_error(self) -> str:
        fd, self._error_fd = self._error_fd, -1
        if fd < 0:
            return ""
        try:
            return os.read(fd, ERROR_BYTES_MAX).decode(errors="replace")
        except OSError:
            return ""
        finally:
            os.close(fd)

    def _check_written(self) -> str | None:
        try:
            info = read_snapshot_info(self._io, self.path)
        except (OSError, SnapshotCorrupt) as exc:
            return f"snapshot file unreadable after writing: {exc}"
        if info.last_index != self._last_index:
            return f"snapshot file ends at entry {info.last_index}, expected {self._last_index}"
        return None

    def _failed(self, message: str) -> None:
        self.failed += 1
        self._failures += 1
        delay = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + delay
        log.error("partition %d: snapshot at entry %d failed, journal prefix kept, retry in %.0f s: %s",
                  self.partition, self._last_index, delay, message)

    def cancel(self) -> None:
        """Stop a running child (close, or a snapshot from the leader replaces ours); nothing is dropped."""
        pid, self._pid = self._pid, 0
        if self._waiting:
            self._waiting = False
            _SLOTS.waiting.remove(self)
        if pid:
            _SLOTS.release()
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._child_error()
            self._io.unlink(self.path + ".tmp")
        for handle, _ in self._outgoing.values():
            handle.close()
        self._outgoing.clear()

    # --- loading -------------------------------------------------------------------------------

    def check_at_start(self) -> None:
        """Refuse to start on a damaged snapshot file (pysyncobj would log the failure and go on
        with an empty state and a journal that starts after the snapshot)."""
        if self._io.exists(self.path):
            read_snapshot_info(self._io, self.path)

    def deserialize(self) -> tuple[None, Entry, Entry, None]:
        """Load the snapshot file into a new engine; pysyncobj's ``(data, last, prev, cluster)``."""
        engine, prev_entry, last_entry = load_snapshot(self._io, self.path)
        self._adopt(engine, prev_entry, last_entry)
        log.info("partition %d: loaded snapshot at entry %d (%d jobs)", self.partition, last_entry[1],
                 engine.job_count())
        return None, last_entry, prev_entry, None

    # --- sending to a lagging follower ---------------------------------------------------------

    def getTransmissionData(self, node: Any) -> tuple[bytes, bool, bool] | None:  # noqa: N802
        """The next piece of the snapshot file for ``node``: ``(bytes, is_first, is_last)``."""
        if self._pid:
            return None  # the file is about to change; the follower waits for the new one
        entry = self._outgoing.get(node)
        if entry is None:
            try:
                entry = (self._io.open(self.path, create=False), 0)
            except OSError:
                log.exception("partition %d: cannot open the snapshot to send it", self.partition)
                return None
        handle, offset = entry
        now = self._clock()
        started, sent = self._burst.get(node, (now, 0))
        if now - started >= TRANSMISSION_BURST_WINDOW_S:
            started, sent = now, 0
        elif sent >= TRANSMISSION_BURST_BYTES:
            return None  # this burst's share was sent; pysyncobj sends the rest on later ticks
        data = handle.pread(offset, self._transmission_bytes)
        self._burst[node] = (started, sent + len(data))
        is_last = not data
        if is_last:
            handle.close()
            self._outgoing.pop(node, None)
        else:
            self._outgoing[node] = (handle, offset + len(data))
        return data, offset == 0, is_last

    def cancelTransmisstion(self, node: Any) -> None:  # noqa: N802 (pysyncobj's spelling)
        self._burst.pop(node, None)
        entry = self._outgoing.pop(node, None)
        if entry is not None:
            entry[0].close()

    # --- receiving from the leader ---------------------------------------------------------------

    def setTransmissionData(self, data: Any) -> bool:  # noqa: N802 (pysyncobj's name)
        """Store one piece of a snapshot from the leader; True once a whole, checked file is in place."""
        if data is None:
            return False
        chunk, is_first, is_last = data
        tmp = self.path + ".recv.tmp"
        try:
            if is_first:
                self.cancel()  # a local snapshot must not be renamed over the one being installed
                if self._incoming is not None:
                    self._incoming.close()
                self._incoming = self._io.open(tmp)
                self._incoming.truncate(0)
            if self._incoming is None:
                return False
            if chunk:
                self._incoming.append(chunk)
            if not is_last:
                return False
            handle, self._incoming = self._incoming, None
            try:
                handle.fsync()
            finally:
                handle.close()
            read_snapshot_info(self._io, tmp)
            self.cancel()  # a child started meanwhile would rename an older state over this one
            self._io.rename(tmp, self.path)
            self._io.fsync_dir(os.path.dirname(self.path) or ".")
            return True
        except (OSError, SnapshotCorrupt):
            log.exception("partition %d: storing the leader's snapshot failed", self.partition)
            if self._incoming is not None:
                self._incoming.close()
                self._incoming = None
            return False
