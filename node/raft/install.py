"""Streaming a snapshot to a follower that lags behind the leader's journal (Raft §7, Shoal's own).

The leader's core asks for it (``Ready.snapshot_requests``) when a follower needs an
entry the journal no longer holds. The leader's replica then runs one
:class:`SnapshotSender` for that follower: it streams the *verified* snapshot file
(:class:`~.snapshots.SnapshotFile`) as :class:`~.messages.SnapshotChunk` messages that
carry the leader's term, the snapshot's last index and term, the offset, the file's
total size and whole-file CRC32C, and each chunk's own CRC32C. At most
:data:`WINDOW_BYTES` are unacknowledged at a time, and a token bucket
(:class:`ByteRate`) bounds the bytes per second, so a large snapshot never holds the
leader's loop and leaves room on the link for the partitions' own traffic.

The follower's :class:`SnapshotReceiver` writes the chunks to a temp file and
acknowledges each with the next offset it wants (:class:`~.messages.SnapshotChunkAck`).
The first chunk of a stream is empty: it asks where to start, so a transfer the link
broke resumes where it stopped. The chunks are checked as they arrive
(:class:`~.snapshot_file.SnapshotChecker`: a foreign header at the first chunk, the content
CRC32C at the end), and the whole file's CRC32C must equal the leader's before it replaces
anything; any mismatch drops the temp file and the stream starts over. A chunk from an older term than the follower's is refused, so a deposed
leader's stream cannot install anything.

A snapshot that refers to files of the leader (its metadata names a directory beside it) is
streamed with them: the files follow the snapshot file in one stream, whose offer names each
file and its size (what the file holds when the stream starts; a file the leader still
appends to may hold more than the snapshot refers to, which the follower ignores as the
leader does). The follower writes them into ``<path>.recv.files.tmp/`` and renames that
directory to the name the snapshot gives before the snapshot itself replaces the old one.
Each chunk's CRC32C guards the transfer; the application checks the files' own checksums as
it reads them. A follower says in its answer to the offer that it takes files; one that does
not (an older release) is sent a snapshot that carries everything instead.
"""

from __future__ import annotations

import logging
import os
import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import google_crc32c

from ._io import FileHandle, FileIO
from .messages import Message, SnapshotChunk, SnapshotChunkAck
from .snapshot_file import SnapshotChecker, SnapshotCorrupt, read_snapshot_info
from .snapshots import SnapshotFile

__all__ = ["SnapshotSender", "SnapshotReceiver", "ByteRate", "Received", "CHUNK_BYTES", "WINDOW_BYTES",
           "ACK_TIMEOUT_S", "RATE_BYTES_PER_S", "GO_ON", "COMPLETE", "START_OVER", "NOT_WANTED", "NO_FILES",
           "FILES_MAX"]

log = logging.getLogger(__name__)

#: Bytes of file per chunk.
CHUNK_BYTES = 1024 * 1024
#: Unacknowledged bytes a sender keeps in flight.
WINDOW_BYTES = 4 * CHUNK_BYTES
#: A stream whose follower acknowledged nothing for this long is given up (the leader retries).
ACK_TIMEOUT_S = 10.0
#: An offer unanswered for this long is sent again, until ACK_TIMEOUT_S: a node joining the group
#: drops what comes before it knows it is a member, and the offer is a few bytes.
OFFER_RESEND_S = 1.0
#: Default per-follower rate of snapshot bytes.
RATE_BYTES_PER_S = 64 * 1024 * 1024
#: Ack statuses (:class:`~.messages.SnapshotChunkAck`).
GO_ON, COMPLETE, START_OVER, NOT_WANTED = 0, 1, 2, 3
#: What :meth:`SnapshotSender.on_ack` returns when the follower cannot take the files the
#: snapshot refers to (never on the wire).
NO_FILES = 4
#: The most files one snapshot stream carries beside the snapshot file.
FILES_MAX = 100_000
#: A file's name in a stream: plain, no directory, no leading dot.
_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


class ByteRate:
    """A token bucket of bytes per second (``rate`` may change while streams run)."""

    def __init__(self, rate_bytes_per_s: float, burst_bytes: int = WINDOW_BYTES) -> None:
        self.rate = float(rate_bytes_per_s)
        self.burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._at: float | None = None

    def take(self, nbytes: int, now: float) -> float:
        """Take ``nbytes`` if the bucket allows at ``now``: 0.0; else how long to wait (nothing taken)."""
        if self._at is not None:
            self._tokens = min(float(max(self.burst, nbytes)), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= nbytes or self._tokens >= self.burst:
            self._tokens -= nbytes
            return 0.0
        return (nbytes - self._tokens) / self.rate if self.rate > 0 else 1.0


class SnapshotSender:
    """Streams one snapshot file, and the files it refers to, to one follower (see the module docstring)."""

    def __init__(self, peer: str, snapshot: SnapshotFile, term: int, io: FileIO,
                 send: Callable[[str, Message], bool], rates: list[ByteRate], now: float,
                 files: list[tuple[str, str]] | None = None) -> None:
        """``files``: ``(name, path)`` of each file the snapshot refers to, in stream order
        (None: it refers to none). They are opened now, so a file the leader deletes
        meanwhile still streams whole; OSError when one is gone already."""
        self.peer = peer
        self.snapshot = snapshot
        self.term = term
        self._send = send
        self._rates = rates
        #: The stream's parts (the snapshot file, then its files; none once closed), and where
        #: each starts in it (one more: where the stream ends). Opened now: the inodes stay ours.
        self._handles: list[FileHandle] = [io.open(snapshot.path, create=False)]
        self._starts = [0, snapshot.size]
        #: ``(name, bytes)`` of each file, as the offer names them (None: no files).
        self.layout: list[tuple[str, int]] | None = None
        if files is not None:
            self.layout = []
            try:
                for name, path in files:
                    handle = io.open(path, create=False)
                    self._handles.append(handle)
                    size = handle.size
                    self.layout.append((name, size))
                    self._starts.append(self._starts[-1] + size)
            except OSError:
                self.close()
                raise
        #: Bytes of the whole stream.
        self.total = self._starts[-1]
        self.acked = 0
        self.sent = 0
        self.started = now
        self.last_progress = now
        self.bytes_sent = 0
        self.offered = False
        self.resumed = False
        self.done = False
        self._resent_from = -1
        self._offered_at = now

    @property
    def index(self) -> int:
        return self.snapshot.index

    def opened_whole(self) -> bool:
        """True when the file opened is the size the verified snapshot had (a newer snapshot renamed
        over the path in the meantime is, almost always, another size)."""
        return bool(self._handles) and self._handles[0].size == self.snapshot.size

    def _chunk(self, offset: int, data: bytes) -> SnapshotChunk:
        snap = self.snapshot
        return SnapshotChunk(self.term, snap.index, snap.term, offset, self.total, snap.file_crc,
                             google_crc32c.value(data), data, self.layout if offset == 0 else None)

    def pump(self, now: float) -> float | None:
        """Send what the window and the rates allow; the delay until the next call, or None
        when waiting for acknowledgements (or finished)."""
        if self.done:  # finished, or closed
            return None
        if not self.offered:
            self.offered = True
            self.last_progress = self._offered_at = now
            self._send(self.peer, self._chunk(0, b""))
            return None
        if not self.resumed:  # waiting for the answer to the offer
            if now - self._offered_at >= OFFER_RESEND_S:
                self._offered_at = now
                self._send(self.peer, self._chunk(0, b""))
            return None
        while self.sent < self.total and self.sent - self.acked < WINDOW_BYTES:
            part = bisect_right(self._starts, self.sent) - 1  # a chunk stays within one part
            nbytes = min(CHUNK_BYTES, self._starts[part + 1] - self.sent)
            wait = max((rate.take(nbytes, now) for rate in self._rates), default=0.0)
            if wait > 0:
                return wait
            data = self._handles[part].pread(self.sent - self._starts[part], nbytes)
            if len(data) != nbytes:
                raise SnapshotCorrupt(f"{self.snapshot.path}: short read at offset {self.sent} of the stream "
                                      f"(part {part})")
            if not self._send(self.peer, self._chunk(self.sent, data)):
                return 0.05  # the link's buffer is full or down: try again shortly
            if self.sent == self.acked:
                self.last_progress = now  # an answer is due from now on (not since a wait on the rate)
            self.sent += nbytes
            self.bytes_sent += nbytes
        return None

    def on_ack(self, ack: SnapshotChunkAck, now: float) -> int:
        """Take the follower's answer; returns its status (:data:`GO_ON` … :data:`NOT_WANTED`)."""
        if ack.index != self.snapshot.index or self.done:
            return GO_ON
        if self.layout is not None and not ack.files and not self.resumed and ack.status == GO_ON:
            self.close()  # the follower cannot take the files (an older release)
            return NO_FILES
        if ack.status in (COMPLETE, NOT_WANTED):
            self.close()
            return ack.status
        self.last_progress = now
        if ack.status == START_OVER:
            self.acked = self.sent = 0
            self._resent_from = -1
            self.offered = self.resumed = False
            return START_OVER
        offset = min(max(0, ack.next_offset), self.total)
        if not self.resumed:  # the answer to the offer: where the follower's copy ends
            self.resumed = True
            self.acked = self.sent = offset
        elif offset > self.acked:
            self.acked = offset
        elif offset == self.acked < self.sent and self._resent_from != offset:
            # A chunk was refused (it did not follow): send again from there, once per position
            # (the chunks in flight behind it are refused with the same offset). An offset below
            # what was acknowledged is a stale answer: the follower's copy never shrinks within
            # a stream (it starts over instead).
            self.sent = self._resent_from = offset
        return GO_ON

    def timed_out(self, now: float) -> bool:
        """True when the follower owes an answer (to the offer, for bytes in flight, or that the
        whole file arrived) and gave none for :data:`ACK_TIMEOUT_S`. A stream waiting on its rate
        owes nothing: the move rate may allow less than a chunk in that time."""
        owed = (self.offered and not self.resumed) or self.sent > self.acked or self.acked >= self.total
        return not self.done and owed and now - self.last_progress > ACK_TIMEOUT_S

    def progress(self) -> dict[str, int | float]:
        """Bytes acknowledged, total, bytes sent (with resends) for status displays."""
        return {"index": self.snapshot.index, "acked": self.acked, "total": self.total,
                "sent": self.bytes_sent, "started": self.started}

    def close(self) -> None:
        self.done = True
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.close()


@dataclass(frozen=True, slots=True)
class Received:
    """A complete snapshot file whose CRC matched the leader's, waiting under its temp name,
    with the files it refers to (``files_dir``, None: none came) and their names."""

    tmp_path: str
    index: int
    term: int
    size: int
    file_crc: int
    files_dir: str | None = None
    files: tuple[str, ...] = ()


class SnapshotReceiver:
    """Collects one partition's incoming snapshot in ``<path>.recv.tmp``, and the files it refers
    to in ``<path>.recv.files.tmp/`` (see the module docstring)."""

    def __init__(self, path: str, io: FileIO, partition: int) -> None:
        self.path = path
        self.tmp_path = path + ".recv.tmp"
        self.files_tmp = path + ".recv.files.tmp"
        self._io = io
        self.partition = partition
        self._key: tuple[int, int, int, int] | None = None  # index, snapshot term, stream bytes, file CRC
        self._handle: FileHandle | None = None  # of the part being written
        self._checker: SnapshotChecker | None = None
        #: The stream's parts: (path, bytes), the snapshot file first.
        self._parts: list[tuple[str, int]] = []
        self._part = 0
        self._part_end = 0
        self._offset = 0
        self._with_files = False
        self.completed = 0
        self.restarted = 0
        self._remove_files_tmp()  # left by a stop in the middle of a transfer

    def on_chunk(self, chunk: SnapshotChunk, current_term: int) -> tuple[SnapshotChunkAck, Received | None]:
        """Store ``chunk``; the answer, and the complete snapshot once the last chunk checked out."""
        if chunk.term < current_term:
            return SnapshotChunkAck(current_term, chunk.index, 0, NOT_WANTED, True), None
        key = (chunk.index, chunk.snap_term, chunk.total, chunk.file_crc)
        if key != self._key:
            if chunk.offset != 0:
                return SnapshotChunkAck(chunk.term, chunk.index, 0, START_OVER, True), None
            why = _bad_layout(chunk)
            if why is not None:
                return self._start_over(chunk, why)
            self._begin(key, chunk.files)
        checker = self._checker
        assert checker is not None and self._handle is not None
        received = self._offset
        if not chunk.data:
            return SnapshotChunkAck(chunk.term, chunk.index, received, GO_ON, True), None
        if chunk.offset != received or google_crc32c.value(chunk.data) != chunk.crc:
            return SnapshotChunkAck(chunk.term, chunk.index, received, GO_ON, True), None
        if received + len(chunk.data) > self._part_end:  # a chunk never spans two parts
            return self._start_over(chunk, f"a chunk at {received} runs past its part's end {self._part_end}")
        if self._part == 0:
            try:
                checker.update(chunk.data)  # a foreign header is refused at the first chunk
            except SnapshotCorrupt as exc:
                return self._start_over(chunk, f"{exc}")
        self._handle.append(chunk.data)
        self._offset += len(chunk.data)
        if self._offset == self._part_end:
            if self._part == 0:
                try:
                    checker.finish()
                except SnapshotCorrupt as exc:
                    return self._start_over(chunk, f"{exc}")
                if checker.file_crc32c != chunk.file_crc:
                    return self._start_over(chunk, f"checksum {checker.file_crc32c:08x}, "
                                            f"the leader's {chunk.file_crc:08x}")
            self._next_part()
        if self._offset < chunk.total:
            return SnapshotChunkAck(chunk.term, chunk.index, self._offset, GO_ON, True), None
        snap_size = self._parts[0][1]
        names = tuple(os.path.basename(path) for path, _ in self._parts[1:])
        files_dir = self.files_tmp if self._with_files else None
        self._key = None
        self._checker = None
        self._parts = []
        return (SnapshotChunkAck(chunk.term, chunk.index, chunk.total, GO_ON, True),
                Received(self.tmp_path, chunk.index, chunk.snap_term, snap_size, chunk.file_crc, files_dir, names))

    def _next_part(self) -> None:
        """Close the part just completed and open the next (an empty one is made as it is passed)."""
        assert self._handle is not None
        self._handle.close()
        self._handle = None
        while self._part + 1 < len(self._parts):
            self._part += 1
            path, size = self._parts[self._part]
            handle = self._io.open(path)
            handle.truncate(0)
            if size > 0:
                self._handle = handle
                self._part_end = self._offset + size
                return
            handle.close()
        self._part_end = self._offset  # nothing left to write

    def _start_over(self, chunk: SnapshotChunk, why: str) -> tuple[SnapshotChunkAck, None]:
        log.error("partition %d: received snapshot %d does not check out (%s); dropped, asking again",
                  self.partition, chunk.index, why)
        self.abort()
        self.restarted += 1
        return SnapshotChunkAck(chunk.term, chunk.index, 0, START_OVER, True), None

    @property
    def active(self) -> bool:
        """A transfer is under way."""
        return self._key is not None

    def _begin(self, key: tuple[int, int, int, int], files: list[tuple[str, int]] | None) -> None:
        self.abort()
        self._key = key
        snap_size = key[2] - sum(size for _, size in files or ())
        self._parts = [(self.tmp_path, snap_size)]
        self._with_files = files is not None
        if files is not None:
            self._io.makedirs(self.files_tmp)
            self._parts += [(os.path.join(self.files_tmp, name), size) for name, size in files]
        self._part = 0
        self._offset = 0
        self._part_end = snap_size
        self._handle = self._io.open(self.tmp_path)
        self._handle.truncate(0)
        self._checker = SnapshotChecker(self.tmp_path)

    def finish(self, received: Received) -> None:
        """Make the received file and files durable and check the file's envelope (off the loop:
        it fsyncs)."""
        paths = [received.tmp_path]
        if received.files_dir is not None:
            paths += [os.path.join(received.files_dir, name) for name in received.files]
        for path in paths:
            handle = self._io.open(path, create=False)
            try:
                handle.fsync()
            finally:
                handle.close()
        if received.files_dir is not None:
            self._io.fsync_dir(received.files_dir)
        info = read_snapshot_info(self._io, received.tmp_path)
        if (info.last_index, info.last_term) != (received.index, received.term):
            raise SnapshotCorrupt(f"{received.tmp_path}: ends at entry {info.last_index}/{info.last_term}, "
                                  f"the leader announced {received.index}/{received.term}")

    def install(self, received: Received, files_name: str | None = None) -> None:
        """Rename the received files' directory to ``files_name`` beside the snapshot (what the
        snapshot names), then the received file over the partition's snapshot, durably."""
        directory = os.path.dirname(self.path) or "."
        if received.files_dir is not None and files_name is not None:
            target = os.path.join(directory, files_name)
            self._io.remove_tree(target)  # a local snapshot's of the same entry, dropped
            self._io.rename(received.files_dir, target)
        self._io.rename(self.tmp_path, self.path)
        self._io.fsync_dir(directory)
        self.completed += 1

    def abort(self) -> None:
        """Drop a partial transfer."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._key = None
        self._checker = None
        self._parts = []
        self._io.unlink(self.tmp_path)
        self._remove_files_tmp()

    def _remove_files_tmp(self) -> None:
        self._io.remove_tree(self.files_tmp)


def _bad_layout(chunk: SnapshotChunk) -> str | None:
    """Why the files a stream's offer names cannot be taken, or None."""
    files = chunk.files or []
    if len(files) > FILES_MAX:
        return f"{len(files)} files, at most {FILES_MAX}"
    names = set()
    for name, size in files:
        if not _FILE_NAME.fullmatch(name) or name in names or size < 0:
            return f"a file named {name[:80]!r} of {size} bytes"
        names.add(name)
    if chunk.total - sum(size for _, size in files) <= 0:
        return f"{chunk.total} bytes in all, no room for the snapshot file"
    return None
