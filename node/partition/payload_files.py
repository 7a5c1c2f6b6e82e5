"""A partition's job data in files on disk: the payload space a node gives each engine.

The engine keeps a segment job's data in a payload space (``shoal.node.state._payloads``) and
only its offset in memory. :class:`FileSpace` is that space as files of
:data:`FILE_BYTES` each in one directory: appends collect in a small buffer and are written
in blocks with ``pwrite``; reads come from the buffer, the last block read, or ``pread`` (the
page cache, usually), so a waiting job costs disk and page cache, not the node's memory.

The files hold nothing the replicated state does not: the journal carries every job's data,
and a snapshot either carries it too or refers to the files as they were when it was taken,
under hard links of its own beside it that its child syncs (:meth:`FileSpace.link_files`,
:meth:`FileSpace.snapshot_manifest`). A restart rebuilds the files from the snapshot and the
journal, so the node never syncs them itself and removes what an earlier run left
(:meth:`PayloadFiles.__init__`). A file whose bytes
are all released (their jobs done and gone) is deleted by :meth:`FileSpace.collect`, which
the node calls from its timer, never while a reply that refers to it can still be encoded.

A file whose jobs are mostly gone but a few wait on (delayed a week, say) is *compacted*:
its bytes still referenced are copied into a smaller file, and reads of that file's offsets
go through a map of the copied ranges. Offsets never change, so the engine is not told. A
file is compacted once at least half of it, and at least a quarter of a file's size, is
released, one file at a time; so each byte is copied at most twice and every copy frees at
least as many bytes as it writes (:meth:`FileSpace.collect`). A file that consumers are
emptying at a pace that frees it soon is left alone: copying jobs about to go would double
the disk writes of every queue drained in order. The copying is done in steps
of :data:`COMPACT_STEP_BYTES` (:meth:`FileSpace.compact`) the node spreads over its timer.

A write that fails (the disk full, say) keeps the bytes in memory instead, so an applied
command is never half-applied and nothing is lost; the node's free-space watermark refuses
new pushes long before that (``NO_SPACE``).
"""

from __future__ import annotations

import logging
import os
import shutil
from array import array
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..payload_checks import BlockChecks, PayloadDamaged, read_checked
from ..raft._io import close_later, start_retiring

__all__ = ["FileSpace", "PayloadFiles", "PayloadDamaged", "FILE_BYTES", "PAYLOADS_DIR", "ENV_FILE_MIB",
           "file_bytes_from_env"]

log = logging.getLogger(__name__)

#: The directory under a node's data directory that holds its partitions' payload files.
PAYLOADS_DIR = "payloads"
#: Bytes of one payload file: the unit in which released data is given back to the disk.
FILE_BYTES = 64 << 20
#: Overrides :data:`FILE_BYTES`, in MiB (1 to 1,024): smaller files give disk back sooner, at
#: more files and more compactions.
ENV_FILE_MIB = "SHOAL_PAYLOAD_FILE_MIB"
#: Appended bytes held before they are written (one ``pwrite`` per block, not per job).
BUFFER_BYTES = 256 << 10
#: Bytes read at once from a file: a pull's run of jobs, stored one after another, is one read.
READ_AHEAD_BYTES = 64 << 10
#: Bytes read or written at once while a file is compacted.
COPY_BYTES = 1 << 20
#: A file whose releases since the last :meth:`FileSpace.collect` would, at that pace, free the
#: rest of it within this many collections is being drained (a queue consumed in order) and is
#: left to empty rather than copied.
DRAINING_COLLECTS = 8
#: Bytes one :meth:`FileSpace.compact` call copies: a compaction is spread over calls so that
#: none holds the event loop for long (a few ms for 1 MiB of small jobs).
COMPACT_STEP_BYTES = 1 << 20
#: Bytes of linked files a snapshot child reads back and checks against their checksums, taking
#: the files in turn from where the previous snapshot's child stopped: damage is found by a
#: snapshot as it was when snapshots carried the data, at a bounded cost per snapshot.
SCRUB_BYTES = 256 << 20


def file_bytes_from_env(env: dict[str, str] | None = None) -> int:
    """:data:`FILE_BYTES`, or ``SHOAL_PAYLOAD_FILE_MIB`` MiB; ValueError naming it if it is not 1..1024."""
    raw = (os.environ if env is None else env).get(ENV_FILE_MIB)
    if not raw:
        return FILE_BYTES
    try:
        mib = int(raw)
    except ValueError:
        mib = 0
    if not 1 <= mib <= 1024:
        raise ValueError(f"{ENV_FILE_MIB} must be a whole number of MiB from 1 to 1024, not {raw!r}")
    return mib << 20


class _Compaction:
    """A compaction under way: file ``n``'s ranges ``ranges`` (of its file, or of its earlier
    copy) less the released ``cut_starts[k] .. cut_ends[k]``, being copied into ``into``; the
    copy has reached range ``r``, cut ``k``, offset ``at``."""

    __slots__ = ("n", "ranges", "cut_starts", "cut_ends", "into", "holes", "r", "k", "at")

    def __init__(self, n: int, ranges: list[tuple[int, int]], holes: "array[int]", into: "_Compacted") -> None:
        self.n, self.ranges, self.holes, self.into = n, ranges, holes, into
        # Released ranges never overlap, so their starts and their ends sort into the same order.
        self.cut_starts = array("q", sorted(holes[::2]))
        self.cut_ends = array("q", sorted(holes[1::2]))
        self.r = self.k = 0
        self.at = ranges[0][0]


class _Compacted:
    """Where a compacted file's ranges are: logical ``starts[i] .. ends[i]`` of the space are
    bytes ``at[i] ..`` of the file ``fd``, ``size`` bytes in all, checked by ``checks``."""

    __slots__ = ("starts", "ends", "at", "fd", "path", "size", "checks")

    def __init__(self, fd: int, path: Path) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.at = array("q")
        self.fd = fd
        self.path = path
        self.size = 0
        self.checks = BlockChecks()

    def find(self, start: int) -> int:
        """Index of the range holding offset ``start``, or -1 (its bytes were not kept)."""
        i = bisect_right(self.starts, start) - 1
        return i if i >= 0 and start < self.ends[i] else -1

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))


class FileSpace:
    """Payload space of one engine: files ``<n>.pay`` in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, file_bytes: int = FILE_BYTES, buffer_bytes: int = BUFFER_BYTES,
                 read_ahead: int = READ_AHEAD_BYTES, on_damage: Callable[[OSError], None] | None = None) -> None:
        self.directory = directory
        #: Told of every read from the disk that fails (a block failing its checksum, a file cut
        #: short): the node rebuilds the replica's state, which the files only mirror.
        self.on_damage = on_damage
        start_retiring()  # __del__ closes files through it, maybe within a garbage collection
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
        self._checks: dict[int, BlockChecks | None] = {}  # file number -> its blocks' checksums
        self._live: dict[int, int] = {}  # file number -> bytes appended and not released
        self._dead: set[int] = set()     # files found all released since the last collect()
        self._dying: set[int] = set()    # files found so by the last collect(): deleted by this one
        self._writing = 0                # the file appends go to
        self._unwritten: dict[int, bytes] = {}  # start -> bytes a failed write kept in memory
        # Released ranges per file, as flat [start, end, start, end, ...]: those released before
        # the last collect() (a compaction may drop them) and those since (a reply being
        # written may still read them, as it may a dead file's).
        self._holes: dict[int, array[int]] = {}
        self._fresh: dict[int, array[int]] = {}
        self._compacted: dict[int, _Compacted] = {}
        self.copied = 0                  # bytes compactions copied
        self.read_errors = 0
        self.compactions = 0
        self._paused = 0                 # collections to skip compacting after a failed one
        self._compaction: _Compaction | None = None
        self.compact_step = COMPACT_STEP_BYTES
        self.scrub_bytes = SCRUB_BYTES
        self._scrub_from = 0             # the file the next snapshot's child starts checking at
        self._scrub_plan: list[int] = []  # the files the next snapshot's child checks
        self._adopted: set[int] = set()  # files a restore adopted, until it ends (adopted())
        self._sizes: dict[int, int] = {}  # bytes of an adopted file that are its snapshot's

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
        # Read ahead only within what surely reads back: the file (the next may be deleted) or
        # a compacted file's range (the bytes after it were not kept).
        n = start // self.file_bytes
        ahead = min(start + self.read_ahead, (n + 1) * self.file_bytes, self._buf_start)
        if self._sizes:
            adopted = self._sizes.get(n)  # an adopted file may end short of its share of the space
            if adopted is not None:
                ahead = min(ahead, n * self.file_bytes + adopted)
        kept_range = self._compacted.get(n)
        if kept_range is not None:
            i = kept_range.find(start)
            if i >= 0:
                ahead = min(ahead, kept_range.ends[i])
        try:
            block = self._pread(start, max(end, ahead))
        except OSError:
            if ahead <= end:
                raise
            block = self._pread(start, end)  # the damage may lie only in what was read ahead
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
            self._pwrite(start, buf)  # a new buffer takes its place: no copy needed
        except OSError as exc:
            log.error("payload files %s: cannot write %d bytes at %d (%s); kept in memory",
                      self.directory, len(buf), start, exc)
            self._unwritten[start] = bytes(buf)
        self._buf = bytearray()
        self._buf_start = self.end

    def collect(self) -> int:
        """Delete the files found all released at the previous call (a reply that named their
        bytes was written in between) and, unless one is under way, start compacting the
        mostly released file most worth it; returns how many files were deleted.

        A compaction drops only ranges released before the previous call, for the same reason.
        It picks the file with the most released bytes, if they are at least half of the file
        and a quarter of :attr:`file_bytes`: so a compacted file is at most half a file, is
        compacted again only while it is at least a quarter, and no byte is copied more than
        twice. A file whose releases since the previous call would empty it within
        :data:`DRAINING_COLLECTS` calls is passed over. The copying is done by :meth:`compact`;
        reads go to the file being compacted until the copy is whole."""
        dead, self._dying, self._dead = self._dying, self._dead, set()
        for n in dead:
            self._remove_file(n)
        if self._unwritten:
            self._unwritten = {s: b for s, b in self._unwritten.items()
                               if self._live.get(s // self.file_bytes)}
        if self._paused:
            self._paused -= 1
        elif self._compaction is None:
            try:
                self._compaction = self._next_compaction()
            except OSError as exc:
                self._compaction_failed(exc)
        for n, fresh in self._fresh.items():
            holes = self._holes.get(n)
            if holes is None:
                self._holes[n] = fresh
            else:
                holes.extend(fresh)
        self._fresh = {}
        return len(dead)

    @property
    def compacting(self) -> bool:
        """A compaction :meth:`collect` started is not finished."""
        return self._compaction is not None

    def compact(self) -> bool:
        """Copy up to :attr:`compact_step` bytes of the compaction under way (once all are,
        reads of its file go to the copy and the file is deleted); True while one is left."""
        if self._compaction is not None:
            try:
                self._compact_step()
            except OSError as exc:
                self._compaction_failed(exc)
        return self._compaction is not None

    def discard(self) -> None:
        """The engine is gone: delete every file of the space. Descriptors stay open until the
        space itself goes, so a reply still naming its bytes (or a snapshot child) reads them."""
        self._abort_compaction()
        shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        """Close the space's files, deleting none (a snapshot's source once it is loaded)."""
        self._abort_compaction()
        self._close_files()
        self._fds, self._compacted = {}, {}

    def stats(self) -> dict[str, int]:
        """Files held, bytes not released, bytes appended, bytes the files take on disk, what
        compactions copied, whether one is under way, and reads that failed (for ``Stats``
        and the metrics)."""
        files = set(self._live) | self._dead | self._dying
        if self.end > self._writing * self.file_bytes:  # written to, even if all released already
            files.add(self._writing)
        return {"files": len(self._live), "liveBytes": sum(self._live.values()), "end": self.end,
                "diskBytes": sum(self._disk_size(n) for n in files), "compactions": self.compactions,
                "copiedBytes": self.copied, "compacting": int(self._compaction is not None),
                "readErrors": self.read_errors}

    # --- snapshots by reference --------------------------------------------------------------------

    def link_files(self, directory: Path) -> int:
        """Hard-link every file holding bytes not released into ``directory`` (made afresh), as
        ``<n>.pay`` whatever it is (a compacted copy too): the files a snapshot of the engine as
        it is now refers to. Called right before the snapshot's fork, so a file the node deletes
        or compacts afterwards stays whole under its link. The buffered appends are written
        first (a file is made by its first write). OSError (another file system, a failed write
        whose bytes are held in memory) leaves nothing behind. Returns how many files were
        linked (none: no directory is made)."""
        shutil.rmtree(directory, ignore_errors=True)
        self.flush()
        if self._unwritten:
            raise OSError(f"payload files {self.directory}: bytes of a failed write are held in memory")
        if not self._live:
            return 0
        directory.mkdir(parents=True)
        try:
            for n in sorted(self._live):
                kept = self._compacted.get(n)
                os.link(kept.path if kept is not None else self._path(n), directory / f"{n:08d}.pay")
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._scrub_plan = self._plan_scrub()
        return len(self._live)

    def _plan_scrub(self) -> list[int]:
        """The files the next snapshot's child checks: from :attr:`_scrub_from` on, in turn,
        until :attr:`scrub_bytes`; the one after them is where the next plan starts."""
        files = sorted(self._live)
        if not files:
            return []
        k = bisect_right(files, self._scrub_from - 1)
        plan, budget = [], self.scrub_bytes
        for n in files[k:] + files[:k]:
            if plan and budget <= 0:
                self._scrub_from = n
                return plan
            plan.append(n)
            budget -= self._disk_size(n)
        self._scrub_from = 0
        return plan

    def snapshot_manifest(self, directory: Path) -> dict[str, Any]:
        """(In the snapshot's forked child, which :meth:`link_files` preceded at once: nothing is
        buffered or held in memory.) Sync every linked file and ``directory``, and describe
        them: the space's file size and end, and per file its number, the bytes it holds, its
        blocks' checksums and, for a compacted copy, where its ranges are. The files of
        :meth:`_plan_scrub` are read back and checked first (:data:`SCRUB_BYTES`). OSError if
        a file cannot be synced or read back whole (:class:`PayloadDamaged`, by the
        node's name of the file: the snapshot fails and the node repairs the replica)."""
        scrub = set(self._scrub_plan)
        files = []
        for n in sorted(self._live):
            kept = self._compacted.get(n)
            path = directory / f"{n:08d}.pay"
            checks = kept.checks if kept is not None else self._checks.get(n)
            fd = os.open(path, os.O_RDONLY)
            try:
                if n in scrub and checks is not None:
                    # Named by the node's own name for the file (the same one): its damage is the
                    # node's to repair (PartitionMachine.snapshot_failed).
                    own = kept.path if kept is not None else self._path(n)
                    size = self._disk_size(n)
                    for at in range(0, size, COPY_BYTES):
                        read_checked(fd, own, checks, at, min(size, at + COPY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            entry: dict[str, Any] = {"n": n, "size": self._disk_size(n)}
            if checks is not None:
                entry["crcs"] = checks.crcs.tobytes()
                entry["written"] = checks.written
                entry["unknown"] = sorted(checks.unknown)
            if kept is not None:
                entry["ranges"] = [kept.starts.tobytes(), kept.ends.tobytes(), kept.at.tobytes()]
            files.append(entry)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return {"fileBytes": self.file_bytes, "end": self.end, "files": files}

    def adopt_files(self, directory: Path, manifest: dict[str, Any]) -> None:
        """Make the files of a snapshot (:meth:`link_files` and :meth:`snapshot_manifest` left
        them in ``directory``) this new, empty space's own, by hard links: a restore then reads
        no data and writes none. Appends go to new files, from the first file past them. Each
        byte a restored job refers to is counted by :meth:`adopt`, and :meth:`adopted` ends
        it. ValueError on a manifest that does not fit; OSError if a file cannot be linked."""
        if self.end or self._live:
            raise ValueError(f"payload files {self.directory}: only an empty space adopts a snapshot's files")
        source = FileSpace.snapshot_source(directory, manifest)  # checks the manifest, opens the files
        try:
            if source.file_bytes != self.file_bytes:
                raise ValueError(f"payload files of {directory} are of {source.file_bytes} bytes, "
                                 f"this space's of {self.file_bytes}")
            for n, fd in source._fds.items():
                os.link(directory / f"{n:08d}.pay", self._path(n))
                self._checks[n] = source._checks.get(n)
                self._sizes[n] = source._disk_size(n)
            for n, kept in source._compacted.items():
                path = self.directory / f"{n:08d}.0.pay"
                os.link(kept.path, path)
                copy = _Compacted(os.open(path, os.O_RDWR), path)
                copy.starts, copy.ends, copy.at, copy.size, copy.checks = (kept.starts, kept.ends, kept.at,
                                                                         kept.size, kept.checks)
                self._compacted[n] = copy
        finally:
            source.close()
        size = self.file_bytes
        self.end = self._buf_start = -(-source.end // size) * size
        self._writing = self.end // size
        self._adopted = set(source._fds) | set(source._compacted)

    def adopt(self, start: int, end: int) -> None:
        """Bytes ``start .. end`` of an adopted file are a restored job's (:meth:`adopt_files`)."""
        size, live = self.file_bytes, self._live
        at = start
        while at < end:
            n = at // size
            upto = min(end, (n + 1) * size)
            live[n] = live.get(n, 0) + upto - at
            at = upto

    def adopted(self) -> None:
        """The restore is over: an adopted file no job refers to goes at the next collection.
        (The bytes between the jobs of a file are not known as released: a compaction of it
        copies them too.)"""
        for n in self._adopted:
            if n not in self._live:
                self._dead.add(n)
        self._adopted = set()

    @classmethod
    def snapshot_source(cls, directory: Path, manifest: dict[str, Any]) -> "FileSpace":
        """A read-only space over the files :meth:`link_files` and :meth:`snapshot_manifest`
        left in ``directory``: what a snapshot's references are read from as it loads. Every
        read is checked against the checksums the manifest carries; a file missing or cut short
        raises OSError naming it."""
        try:
            file_bytes, end, files = int(manifest["fileBytes"]), int(manifest["end"]), list(manifest["files"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"payload files manifest of {directory} is malformed: {exc!r}") from exc
        if not 1 <= file_bytes <= 1 << 30 or end < 0:
            raise ValueError(f"payload files manifest of {directory}: file size {file_bytes}, end {end}")
        space = cls(directory, file_bytes)
        space.end = space._buf_start = end
        space._writing = end // file_bytes + 1  # nothing is appended to a source
        for entry in files:
            n = int(entry["n"])
            if not 0 <= n <= end // file_bytes:
                raise ValueError(f"payload files manifest of {directory}: file {n} lies past the end {end}")
            checks: BlockChecks | None = None
            if "crcs" in entry:
                checks = BlockChecks()
                checks.crcs.frombytes(entry["crcs"])
                checks.written = int(entry["written"])
                checks.unknown = set(entry["unknown"])
            path = directory / f"{n:08d}.pay"
            fd = os.open(path, os.O_RDONLY)  # opened now: a missing file is named at once
            ranges = entry.get("ranges")
            if ranges is None:
                space._fds[n], space._checks[n] = fd, checks
                continue
            kept = _Compacted(fd, path)
            kept.starts.frombytes(ranges[0])
            kept.ends.frombytes(ranges[1])
            kept.at.frombytes(ranges[2])
            kept.size = int(entry["size"])
            kept.checks = checks  # type: ignore[assignment]  # None: not checked, as read_checked takes it
            space._compacted[n] = kept
        return space

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
                if sign < 0:
                    self._note_hole(n, at, upto)
            else:
                del live[n]
                self._holes.pop(n, None)
                self._fresh.pop(n, None)
                if n < self._writing:
                    self._dead.add(n)
            at = upto
        if sign > 0:
            last = (end - 1) // size
            if last != self._writing:
                self._dead.update(n for n in range(self._writing, last) if n not in live)
                self._writing = last

    def _note_hole(self, n: int, start: int, end: int) -> None:
        fresh = self._fresh.get(n)
        if fresh is None:
            self._fresh[n] = array("q", (start, end))
        elif fresh[-1] == start:  # released in the order appended: one range grows
            fresh[-1] = end
        else:
            fresh.append(start)
            fresh.append(end)

    def _disk_size(self, n: int) -> int:
        kept = self._compacted.get(n)
        if kept is not None:
            return kept.size
        adopted = self._sizes.get(n)
        if adopted is not None:
            return adopted
        return min(self.end, (n + 1) * self.file_bytes) - n * self.file_bytes

    def _next_compaction(self) -> _Compaction | None:
        """The file most worth compacting (see :meth:`collect`), with a new file to copy it to."""
        size = self.file_bytes
        best, most = -1, max(size // 4, 1) - 1
        for n, live in self._live.items():
            if n >= self._writing or n not in self._holes or (n + 1) * size > self._buf_start:
                continue
            disk = self._disk_size(n)
            released = disk - live
            if released > most and 2 * released >= disk:
                fresh = self._fresh.get(n)
                if fresh is not None:  # still readable, so copied: they do not count
                    freed = sum(fresh[1::2]) - sum(fresh[::2])
                    if live <= DRAINING_COLLECTS * freed:
                        continue  # consumers are emptying it: its jobs go soon, without a copy
                    released -= freed
                if released > most and 2 * released >= disk:
                    best, most = n, released
        if best < 0 or self._overlaps_unwritten(best):
            return None
        old = self._compacted.get(best)
        ranges = old.ranges() if old is not None else [(best * size, best * size + self._disk_size(best))]
        path = self.directory / f"{best:08d}.{self.compactions + 1}.pay"
        into = _Compacted(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600), path)
        return _Compaction(best, ranges, self._holes.pop(best), into)

    def _compact_step(self) -> None:
        job = self._compaction
        assert job is not None
        n, into, ranges = job.n, job.into, job.ranges
        cut_starts, cut_ends, cuts = job.cut_starts, job.cut_ends, len(job.cut_starts)
        old = self._compacted.get(n)
        src, src_path, src_checks = (self._fd(n), self._path(n), self._checks.get(n)) if old is None else \
            (old.fd, old.path, old.checks)
        out = bytearray()
        budget = self.compact_step
        # The kept bytes lie in the file in order: it is read a block at a time and they are cut
        # out, so a file of small jobs costs a few reads per block, not one per job; a step
        # also ends after so many released ranges skipped, however little it copied.
        block, block_at = b"", -1
        at, r, k = job.at, job.r, job.k
        for _ in range(1 << 16):
            if r >= len(ranges) or len(out) >= budget:
                break
            start, end = ranges[r]
            if at < start:
                at = start
            while k < cuts and cut_ends[k] <= at:
                k += 1
            if k < cuts and cut_starts[k] <= at:  # at a released range: skip it
                at = cut_ends[k]
                k += 1
            else:
                upto = min(end, cut_starts[k] if k < cuts else end, at + budget - len(out))
                where = at - n * self.file_bytes if old is None else old.at[r] + at - start
                if not block_at <= where < block_at + len(block):
                    block_at = where
                    try:  # checked: a damaged block must not be copied where a checksum vouches for it
                        block = read_checked(src, src_path, src_checks, where, where + max(COPY_BYTES, upto - at))
                        if not block:
                            raise OSError(f"payload file {src_path}: nothing to read at offset {where}")
                    except OSError as exc:
                        self._damaged(exc)
                        raise
                piece = block[where - block_at:where - block_at + upto - at]
                if into.ends and into.ends[-1] == at:  # continues the range copied last
                    into.ends[-1] = at + len(piece)
                else:
                    into.starts.append(at)
                    into.ends.append(at + len(piece))
                    into.at.append(into.size + len(out))
                out += piece
                at += len(piece)
            if at >= end:
                r += 1
        job.at, job.r, job.k = at, r, k
        wrote = self._write_all(into.fd, out, into.size)
        into.checks.wrote(into.size, out)
        into.size += wrote
        if r < len(ranges):
            return
        self._compaction = None
        self._remove_file(n, keep_holes=True)
        self._compacted[n] = into
        self.compactions += 1
        self.copied += into.size

    def _compaction_failed(self, exc: OSError) -> None:
        log.error("payload files %s: cannot compact (%s); tried again in a minute", self.directory, exc)
        self._abort_compaction()
        self._paused = 60

    def _abort_compaction(self) -> None:
        """Drop the compaction under way: its copy goes, its file's released ranges come back."""
        job, self._compaction = self._compaction, None
        if job is None:
            return
        os.close(job.into.fd)
        job.into.path.unlink(missing_ok=True)
        if job.n in self._live:
            holes = self._holes.get(job.n)
            self._holes[job.n] = job.holes if holes is None else job.holes + holes

    @staticmethod
    def _write_all(fd: int, data: bytearray, at: int) -> int:
        if data and os.pwrite(fd, data, at) != len(data):
            raise OSError("short write while compacting")
        return len(data)

    def _remove_file(self, n: int, keep_holes: bool = False) -> None:
        """Delete file ``n`` (the one appended to or its compacted copy), then close it on the
        retiring thread: the kernel frees a file's blocks as its last descriptor goes, and a
        drained queue's files go by the hundred in one call."""
        if not keep_holes and self._compaction is not None and self._compaction.n == n:
            self._abort_compaction()  # all its bytes were released while it was copied
        fd = self._fds.pop(n, None)
        self._checks.pop(n, None)
        self._sizes.pop(n, None)
        kept = self._compacted.pop(n, None)
        (kept.path if kept is not None else self._path(n)).unlink(missing_ok=True)
        if fd is not None:
            close_later(fd)
        if kept is not None:
            close_later(kept.fd)
        if not keep_holes:
            self._holes.pop(n, None)
            self._fresh.pop(n, None)

    def _overlaps_unwritten(self, n: int) -> bool:
        lo, hi = n * self.file_bytes, (n + 1) * self.file_bytes
        return any(s < hi and s + len(b) > lo for s, b in self._unwritten.items())

    def _path(self, n: int) -> Path:
        return self.directory / f"{n:08d}.pay"

    def _fd(self, n: int) -> int:
        fd = self._fds.get(n)
        if fd is None:
            fd = self._fds[n] = os.open(self._path(n), os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def _pwrite(self, start: int, data: bytes | bytearray) -> None:
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
            self._note_written(n, at - n * size, chunk)
            at += written
            done += written

    def _note_written(self, n: int, at: int, data: memoryview) -> None:
        if n not in self._checks:
            self._checks[n] = BlockChecks()
        checks = self._checks[n]
        if checks is None:
            return
        try:
            checks.wrote(at, data)
        except ValueError as exc:  # files are written in order; were one not, it goes unchecked
            log.error("payload files %s: %s; file %d is no longer checked", self.directory, exc, n)
            self._checks[n] = None

    def _pread(self, start: int, end: int) -> bytes:
        size = self.file_bytes
        parts = []
        at = start
        while at < end:
            n = at // size
            upto = min(end, (n + 1) * size)
            kept = self._compacted.get(n)
            if kept is None:
                fd, path, where, checks = self._fd(n), self._path(n), at - n * size, self._checks.get(n)
            else:
                i = kept.find(at)
                if i < 0:
                    raise OSError(f"payload file {kept.path}: offset {at} of the space was released "
                                  "and not kept")
                upto = min(upto, kept.ends[i])
                fd, path, where, checks = kept.fd, kept.path, kept.at[i] + at - kept.starts[i], kept.checks
            try:
                got = read_checked(fd, path, checks, where, where + upto - at)
                if len(got) != upto - at:
                    raise OSError(f"payload file {path}: {upto - at} bytes at offset {where} "
                                  f"could not be read (got {len(got)})")
            except OSError as exc:
                self._damaged(exc)
                raise
            parts.append(got)
            at = upto
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _damaged(self, exc: OSError) -> None:
        self.read_errors += 1
        if self.read_errors == 1 or self.read_errors % 1000 == 0:
            log.error("payload files %s: a read failed (%d so far; the replica's state is rebuilt "
                      "from its snapshot and journal): %s", self.directory, self.read_errors, exc)
        if self.on_damage is not None:
            self.on_damage(exc)

    def _read_unwritten(self, start: int, end: int) -> bytes | None:
        for s, blob in self._unwritten.items():
            if s <= start and end <= s + len(blob):
                return blob[start - s:end - s]
        return None

    def _close_files(self) -> None:
        """Hand every open file of the space to the retiring thread."""
        for fd in getattr(self, "_fds", {}).values():
            close_later(fd)
        for kept in getattr(self, "_compacted", {}).values():
            close_later(kept.fd)

    def __del__(self) -> None:
        # A discarded space's files have no names left: their blocks go as these close.
        self._close_files()


class PayloadFiles:
    """The payload spaces of one partition on a node: one directory per engine (the running
    one and, while a snapshot is loaded, the next), under ``root``."""

    def __init__(self, root: Path, file_bytes: int = FILE_BYTES,
                 on_damage: Callable[[OSError], None] | None = None) -> None:
        self.root = root
        self.file_bytes = file_bytes
        self.on_damage = on_damage  # given to every space (FileSpace.on_damage)
        # Files of an earlier run hold nothing the journal and snapshots do not: start afresh.
        shutil.rmtree(root, ignore_errors=True)
        self._next = 0
        self.spaces: list[FileSpace] = []

    def new(self) -> FileSpace:
        """A space for a new engine."""
        self._next += 1
        space = FileSpace(self.root / f"g{self._next}", self.file_bytes, on_damage=self.on_damage)
        self.spaces.append(space)
        return space

    def discard(self, space: object) -> None:
        """``space``'s engine was replaced: its files go."""
        if isinstance(space, FileSpace) and space in self.spaces:
            self.spaces.remove(space)
            space.discard()

    @property
    def compacting(self) -> bool:
        """The running engine's space has a compaction under way."""
        return bool(self.spaces) and self.spaces[0].compacting

    def compact(self) -> bool:
        """A step of the running engine's compaction (:meth:`FileSpace.compact`); True while
        one is left."""
        return bool(self.spaces) and self.spaces[0].compact()

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
        """The running engine's :meth:`FileSpace.stats` (zeros before the first engine)."""
        if self.spaces:
            return self.spaces[0].stats()
        return {"files": 0, "liveBytes": 0, "end": 0, "diskBytes": 0, "compactions": 0, "copiedBytes": 0,
                "compacting": 0, "readErrors": 0}

    def close(self) -> None:
        """The partition left this node: every space and file goes."""
        for space in self.spaces:
            space.discard()
        self.spaces.clear()
        shutil.rmtree(self.root, ignore_errors=True)
