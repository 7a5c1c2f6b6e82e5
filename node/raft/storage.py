"""A node's Raft storage: the I/O layer, the journals of its partitions, and when they sync.

Theory of operation: every hosted partition keeps its own :class:`~.journal.Journal`
(a directory ``p<N>.raft`` in the node's data directory). Appends only write; syncs
are the node's business, in two durability classes:

- **fsync class** (``durable: true``, the default): a follower's journal that took
  such an entry is fdatasync'ed by :meth:`NodeStorage.barrier`, which runs before any
  Raft frame leaves the node (the links call it before each write), so its answer
  leaves only once the entry is durable. A leader's journal is fdatasync'ed by
  :meth:`NodeStorage.after_send` right after the frame carrying the entry is written:
  the followers sync their copies meanwhile, and the leader's loop handles no
  answer (so counts nothing toward the commit) before its own copy is durable. A lone
  replica syncs before its tick, where it commits. All journals written in one loop
  iteration are synced together, their fdatasyncs issued from a few threads. Each sync
  writes a copy of its batch ahead of its one fdatasync (:mod:`.journal`, *Copies*; a batch
  too large to copy makes the journal's synced mark durable with a second one instead).
- **disk class** (``durable: false``): the entry only asks for a lazy sync, done by
  :meth:`NodeStorage.sync_lazy` every ``sync_interval_ms``. That sync is the same, copy
  included: the entries were acknowledged on append, and once it returns, damage to them is
  restored from the copy or refused rather than cut as a torn tail.

A failed fdatasync stops the node (exit status :data:`EXIT_SYNC_FAILED`): Linux may
have dropped the dirty pages, answers claiming durability may already be queued,
and only a restart (recovery reads what really is on disk) is safe.

Test mode: ``SHOAL_TEST_IO=deferred`` keeps every write not yet synced in process
memory (:class:`DeferredIO`), appends and rewrites in place alike, so killing the
process loses what a power cut may; the power-cut tests kill real nodes with
SIGKILL under it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._io import DISK_FREE_MIN_BYTES, FileHandle, FileIO, RealIO, _RealFile
from .journal import Journal, SyncBatcher, SyncFailed, quarantine_journal

__all__ = ["NodeStorage", "DeferredIO", "make_io", "EXIT_SYNC_FAILED", "SYNC_INTERVAL_MS", "TEST_IO_ENV"]

log = logging.getLogger(__name__)

#: Exit status of a node whose journal failed to sync (EX_TEMPFAIL: restart it).
EXIT_SYNC_FAILED = 75
SYNC_INTERVAL_MS = 1_000
TEST_IO_ENV = "SHOAL_TEST_IO"
#: Entries of the newest part of a journal kept in memory (older ones are read back from disk).
JOURNAL_CACHE_ENTRIES = 256
JOURNAL_CACHE_BYTES = 4 * 1024 * 1024
#: Threads issuing one barrier's fdatasyncs together (ext4 commits concurrent ones in one
#: transaction; serial syncs cost one commit each: docs/benchmarks.md, "One sync round").
SYNC_THREADS = 8


class NodeStorage:
    """The I/O layer and sync batching shared by every journal of one node."""

    def __init__(self, io: FileIO, data_dir: str, *, sync_interval_ms: int = SYNC_INTERVAL_MS,
                 on_sync_failed: Callable[[BaseException], None] | None = None) -> None:
        self.io = io
        self.data_dir = data_dir
        self.batcher = SyncBatcher()
        self.sync_interval_ms = sync_interval_ms
        self.barrier_syncs = 0
        self.lazy_syncs = 0
        #: Partition -> why its last write was refused for lack of space (cleared once one succeeds).
        self.no_space: dict[int, str] = {}
        self._on_sync_failed = on_sync_failed or _fail_stop
        self._executor: ThreadPoolExecutor | None = None
        #: id(journal) -> called with the journal's durable index after a leader's sync.
        self._leader_synced: dict[int, Callable[[int], None]] = {}
        #: Called right before a barrier syncs: output that vouches for nothing on this node's
        #: disk (the node's answers to its clients) leaves rather than wait for the sync.
        self.before_sync: Callable[[], None] | None = None
        io.watch_space(data_dir)

    def journal_dir(self, partition: int) -> str:
        """The directory of partition ``partition``'s journal."""
        return os.path.join(self.data_dir, f"p{partition}.raft")

    def open_journal(self, partition: int) -> Journal:
        """Open (recovering) or create partition ``partition``'s journal; a damaged one raises
        :class:`~.journal.JournalCorrupt` naming file and offset."""
        return Journal(self.io, self.journal_dir(partition), batcher=self.batcher,
                       cache_entries_max=JOURNAL_CACHE_ENTRIES, cache_bytes_max=JOURNAL_CACHE_BYTES,
                       zeros_ahead=True)

    def quarantine_journal(self, partition: int) -> str:
        """Move partition ``partition``'s (closed, damaged) journal aside, keeping term and vote,
        so the replica starts from an empty log; returns where it went (see
        :func:`~.journal.quarantine_journal`, which also says what the replica owes)."""
        return quarantine_journal(self.io, self.journal_dir(partition))

    def barrier(self) -> None:
        """Sync every journal that took an fsync-class entry since the last barrier."""
        pending = self.batcher.pending
        if not pending:
            return
        if self.before_sync is not None:
            self.before_sync()
        self._barrier(pending)

    def _barrier(self, pending: int) -> None:
        try:
            if pending == 1:
                self.barrier_syncs += len(self.batcher.sync_all())
            else:
                # The loop waits for the threads: no journal is written while they sync.
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="shoal-sync")
                self.barrier_syncs += len(self.batcher.sync_all_threads(self._executor))
        except SyncFailed as exc:
            self._on_sync_failed(exc)

    def sync_failed(self, exc: SyncFailed) -> None:
        """A journal's sync failed outside a barrier (an append over the unsynced bound, a
        suffix deletion): the same fail-stop as in a barrier."""
        self._on_sync_failed(exc)

    def apply_failed(self, exc: BaseException) -> None:
        """A committed entry could not be applied (an entry this release cannot read, a bug):
        going on would leave this replica's state apart from its group's, so the node stops the
        same way (a restart meets the same entry: the log names it)."""
        self._on_sync_failed(exc)

    def close(self) -> None:
        """Stop the sync threads (the journals are closed by their replicas)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def after_send(self) -> None:
        """Sync the journals that took a leader's fsync-class entry, right after it was sent.

        The followers receive and sync the entry while the leader syncs its own copy; the
        leader's loop runs nothing else meanwhile, so no follower's answer can make it count
        its own copy toward the commit before that copy is durable.
        """
        if not self.batcher.pending_leader:
            return
        if self.before_sync is not None:
            self.before_sync()
        self._sync_leader()

    def _sync_leader(self) -> None:
        if self.batcher.pending_leader > 1 and self._executor is None:
            self._executor = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="shoal-sync")
        try:
            synced = self.batcher.sync_leader(self._executor)
        except SyncFailed as exc:
            self._on_sync_failed(exc)
            return
        self.barrier_syncs += len(synced)
        hooks = self._leader_synced
        for journal, index in synced.items():
            hook = hooks.get(id(journal))
            if hook is not None:
                hook(index)

    def on_leader_synced(self, journal: Journal, hook: Callable[[int], None] | None) -> None:
        """Call ``hook(durable index)`` each time :meth:`after_send` syncs ``journal`` (None: stop)."""
        if hook is None:
            self._leader_synced.pop(id(journal), None)
        else:
            self._leader_synced[id(journal)] = hook

    def sync_all_now(self) -> None:
        """Both barriers at once (a lone replica, which counts only itself toward the commit; its
        answers leave after the sync, with those of the entries it commits: no ``before_sync``)."""
        if self.batcher.pending:
            self._barrier(self.batcher.pending)
        if self.batcher.pending_leader:
            self._sync_leader()

    def sync_lazy(self) -> None:
        """Sync the journals holding disk-class entries (every ``sync_interval_ms``)."""
        try:
            self.lazy_syncs += self.batcher.sync_lazy()
        except SyncFailed as exc:
            self._on_sync_failed(exc)

    def space_low(self) -> bool:
        """True while free space is below ``disk_free_min_bytes`` (writes of new data are refused)."""
        return self.io.space_low()

    def status(self) -> dict[str, Any]:
        """What /health, /ready and the metrics show of the node's storage."""
        low = self.space_low()
        return {"spaceLow": low, "noSpacePartitions": sorted(self.no_space),
                "diskFreeMinBytes": self.io.disk_free_min_bytes,
                "syncIntervalMs": self.sync_interval_ms,
                "barrierSyncs": self.barrier_syncs, "lazySyncs": self.lazy_syncs,
                "unsyncedJournals": self.batcher.unsynced()}


def _fail_stop(exc: BaseException) -> None:
    log.critical("stopping the node so that a restart starts from what is on disk: %s", exc)
    logging.shutdown()
    os._exit(EXIT_SYNC_FAILED)


def make_io(disk_free_min_bytes: int = DISK_FREE_MIN_BYTES) -> FileIO:
    """The node's I/O layer: real files, or :class:`DeferredIO` when ``SHOAL_TEST_IO=deferred``."""
    mode = os.environ.get(TEST_IO_ENV, "")
    if mode == "deferred":
        log.warning("%s=deferred: unsynced writes stay in memory (test mode for power cuts)", TEST_IO_ENV)
        return DeferredIO(disk_free_min_bytes=disk_free_min_bytes)
    if mode:
        raise ValueError(f"{TEST_IO_ENV}={mode!r}: the only test I/O mode is 'deferred'")
    return RealIO(disk_free_min_bytes=disk_free_min_bytes)


class _DeferredFile(_RealFile):
    """A real file whose writes since its last sync live in memory until a sync writes them."""

    def __init__(self, io: RealIO, path: str, fd: int) -> None:
        super().__init__(io, path, fd)
        self._durable_size = self._size
        #: The writes since the last sync, in order: appends, writes over zeros or copies
        #: written ahead, and rewrites in place alike (a power cut may lose any of them).
        self._writes: list[tuple[int, bytes]] = []

    def _write_at(self, offset: int, data: bytes | memoryview) -> int:
        self._writes.append((offset, bytes(data)))
        self._size = max(self._size, offset + len(data))
        return len(data)

    #: Every write goes through ``_write_at`` (``_RealFile``'s one ``pwritev`` would pass the
    #: bytes held in memory by).
    put_parts = FileHandle.put_parts

    def pread(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self._size)
        if end <= offset:
            return b""
        buf = bytearray(os.pread(self._fd, min(end, self._durable_size) - offset, offset)
                        if offset < self._durable_size else b"")
        buf.extend(bytes(end - offset - len(buf)))  # past what is on disk: a hole, or held below
        for at, data in self._writes:
            lo, hi = max(at, offset), min(at + len(data), end)
            if lo < hi:
                buf[lo - offset : hi - offset] = data[lo - at : hi - at]
        return bytes(buf)

    def truncate(self, size: int) -> None:
        self._writes = [(at, data[: size - at]) for at, data in self._writes if at < size]
        if size < self._durable_size:
            os.ftruncate(self._fd, size)
            self._durable_size = size
        self._size = size

    def _write_out(self) -> None:
        for at, data in self._writes:
            os.pwrite(self._fd, data, at)
        if os.fstat(self._fd).st_size != self._size:
            os.ftruncate(self._fd, self._size)
        self._durable_size = self._size
        self._writes.clear()

    def datasync(self) -> None:
        # The process's death is the power cut: bytes in the page cache survive it, so a
        # write is all "stable storage" needs here (no fdatasync: tests stay fast).
        self._write_out()

    def fsync(self) -> None:
        self._write_out()


class DeferredIO(RealIO):
    """Real files whose unsynced bytes stay in this process (test mode, see the module docstring).

    Directory operations (create, rename, unlink) reach the file system at once, so a
    cut can not lose a new segment's name as a real power cut could; file contents
    behave as on a power cut.
    """

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        handle = super().open(path, create=create)
        assert isinstance(handle, _RealFile)
        fd = handle._fd
        handle._fd = -1  # the deferred handle owns the descriptor now
        return _DeferredFile(self, path, fd)

    def fsync_dir(self, directory: str) -> None:
        pass
