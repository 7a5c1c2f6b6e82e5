"""Shoal's write-ahead journal: one replica's Raft log in checksummed segment files.

Theory of operation
-------------------
The log is a run of entries ``(index, term, payload)`` with contiguous
indexes and non-decreasing terms. It lives in a directory of segment files
named ``<first index, 20 digits>.wal``; each starts with a 20-byte header
(magic, format version, the unsynced-bytes bound, their CRC32C) followed by
records of three kinds, little-endian::

    entry:  length u32 | crc32c u32 | term u64 | index u64 | payload (length bytes)
    mark:   0xFFFFFFFF | crc32c u32 | "SHOALMRK" | offset u64 | index u64
    copy:   0xFFFFFFFE | crc32c u32 | "SHOALCPY" | offset u64 | copy_at u64 | length u64
    and, at copy_at (a 4 KiB boundary ahead of the records), the copy itself:
            "SHOALDUP" | crc32c u32 | start u64 | end u64 | copy_at u64 | the copied bytes

An entry's CRC32C covers ``length, term, index`` and the payload. A mark record
says that the bytes of its segment before ``offset`` (its own position) and the
entries up to ``index`` were durable when it was written (see *Mark records*); a
copy record holds a copy of the ``length`` bytes before it (see *Copies*). The
CRC32C of a mark or copy record covers its fields and the segment's first index;
the copy's own header's covers its fields, that index and the copied bytes. No
payload is 0xFFFFFFFE bytes long or more, so the kinds cannot be confused.
Records are appended with ordinary writes; a segment is sealed (fdatasync'ed)
when it reaches ``segment_bytes`` and the next one is started. Version 5
segments may hold mark and copy records, with the copies ahead of the records;
version 4 (each copy right after its copy record, the next records after it), 3
(marks, no copies) and 2 (entries only) are read, and an older last segment is
sealed at the first append rather than continued.

Durability is explicit. :meth:`Journal.append` only writes (it syncs on its
own only when sealing a segment, or when more than ``unsynced_bytes_max``
would be left unsynced). :meth:`Journal.sync` writes the batch's copy and
fdatasyncs what was written (and fsyncs the directory if segments were
created), and returns the highest durable index: one flush per sync; a failed
sync raises :class:`SyncFailed` and the journal refuses all further use until
reopened. :class:`SyncBatcher` lets the node sync every journal written in one
loop iteration once, after all of them wrote.
Deleting a suffix (a follower's log conflicts with its leader) is made durable
before it returns, whole segments first, so every state a power cut can leave
is a prefix of the log and entries appended afterwards can never be followed by
stale ones. Deleting a prefix (after a snapshot) records the new first index
durably in ``start`` and then removes whole segments below it; a segment that
still holds some covered entries is kept until all of it is covered.

Recovery at open scans the segments from the first needed one. Only the
unsynced tail can be torn by a power cut, and it lies in the last segment,
beyond the last synced offset, and spans at most ``unsynced_bytes_max`` bytes
(recorded in each segment's header) or one record, and the copies written ahead
of the records (version 4: twice that bound and a block, the batch and its
copy). A record that fails its checks beyond everything
known synced and close enough to the end is a torn write or damage to the
newest batch a sync returned: a whole copy of its batch past it puts the batch
back (see *Copies*); without one it is a torn tail, and the segment is cut at
it and the cut (file, offset, bytes) is logged. A failing record anywhere else
— in a sealed segment, in the part of the last one the synced mark or a mark
record vouches for, or further from its end than a torn write can reach — a
journal that ends before the mark, and segments that do not follow each other
raise :class:`JournalCorrupt` naming the file and offset. What recovery found
is then synced, since after a crash of the process alone it may still be only
in the page cache.

Copies
------
Every sync of a batch up to :data:`COPY_BATCH_BYTES` bytes writes, ahead of the
same fdatasync, a copy of the batch (the bytes written since the previous sync)
on a 4 KiB boundary ahead of the records, and a copy record naming it right
after the batch, so that no block holds both a byte of the batch and a byte of
its copy. The sync returns only once both are on stable storage. The copy lies
in the zeros written ahead (see *Zeros ahead*), so the file does not grow by
it: the records grow by the copy record alone, and later records are written
over copies no longer needed. Consecutive copies take turns between two places
(:func:`_copy_places`): four copied batches past the batch's own block, so
that the next batch does not reach the copy before its sync makes a mark
record vouch for the batch, and one copy and batch further, so that a copy is
never written over the one still vouching for the batch before it. A batch
that would reach the copy still vouching (a large one), the trim of the zeros
ahead (sealing a segment, a clean close) and a suffix deletion first make the
synced mark durable (an fdatasync of the mark file), which then vouches
instead. A sealed segment ends with its last record and holds no copy.
After any power cut, then, a batch whose sync returned survives whole in at
least one of the two places if one block of the medium is damaged. Where nothing else vouches
for a failing record (past the synced mark and every mark record: the newest
batch), recovery restores its batch byte for byte from a copy whose checksum
holds and logs what it restored; damage anywhere else is refused, copy or
not. A batch whose sync never returned may have left its copy whole and itself
torn: the copy puts back entries that were never acknowledged, which Raft
allows (a log may hold entries nobody was told of).
A copy counts only at the offset its header names, for the segment its
checksum covers and within reach of the batch it copies (right after its copy
record's block in version 4, at most :data:`_COPY_AHEAD_MAX` past it in version
5), and recovery looks for one only past the damaged record, where no synced
record lies; a copy of a copy kept inside a payload elsewhere restores nothing.

This is what protects the newest synced batch, which nothing written after it
vouches for, without a second flush: telling damage in it from a torn write
would otherwise need a mark made durable after the data (the disk has no
ordered or forced-unit writes), which doubles the cost of each sync.

The synced mark
---------------
The ``synced`` file holds ``(segment, offset, index)``: the bytes of segment
``segment`` before ``offset``, and the entries up to ``index``, are on stable
storage. It is a lower bound: it is written only after the sync of what it
names returned. After a sync whose batch was copied it is written without a
flush of its own (it reaches the disk with the kernel's writeback), and only
once in :data:`MARK_WRITE_EVERY` such syncs within a segment: the mark
records vouch for those batches (and its copy for the newest), and a mark that
the writeback has not taken to the disk lags the same way after a power cut (a
crash of the process alone cuts no file). After a sync that copied nothing (a
batch larger than :data:`COPY_BATCH_BYTES`, or a full disk refusing the copy)
it is fdatasync'ed before the sync returns, and it is made durable at a clean
close. Damage before the offset it names is
refused; a journal ending before it is refused.

The file holds two copies of the mark, each with its own CRC32C, in different
4 KiB blocks, and each write replaces the older copy: a power cut during a
write can tear only that copy, and the other still names an earlier sync.
Recovery takes the higher of the copies whose checksums hold (its own first
write then replaces the other one, which may be the torn one). Every operation
that makes the durable log shorter — a suffix deletion into synced entries,
:meth:`Journal.clear` — first rewrites both copies and fdatasyncs them, so the
mark never names bytes that are gone; a torn-tail cut at recovery needs no
rewrite, as it only ever cuts beyond the mark. If neither copy holds (or the
file is missing beside existing segments), nothing is assumed unsynced and any
bad record is refused.

*Mark records* are a witness kept in the segment itself. The first append to
the active segment after a completed fdatasync of it writes a mark record
naming its own offset ahead of the entry, in the same write call (no write call
or sync of its own): everything before that offset was durable by then. The
next fdatasync makes the record durable along with the entries after it. Since
it names only bytes an earlier, completed sync made durable, it is true
whatever a power cut does to the write carrying it (a disk may keep any part
of an unfinished sync's writes). A mark record counts only at the offset and
in the segment it names (its checksum covers both), so a copy of one inside a
payload counts for nothing. The scan checks mark records with the entries. At
a bad record in the last segment, the records after it cannot be walked (its
length may be what is damaged), so the rest of the segment is searched for the
mark records' magic: a whole mark record past the bad record proves that the
bad record was synced, and the journal is refused.
Reads skip mark and copy records. A suffix deletion cuts at an entry's offset:
the mark and copy records past the cut go with it, and those before the cut
name only bytes before themselves, which stay.

What is left: the newest synced batch, when nothing was appended after it and
the ``synced`` file does not name it yet (its writeback has not reached the
disk, or it waits for its turn of :data:`MARK_WRITE_EVERY`), is vouched for by
its copy alone. Damage to both the batch and its copy (two blocks) looks like a
torn write and is cut; so does a file cut short past the offset the ``synced``
file names (a file system losing the tail of a synced file), which takes the mark
records and the copy after the cut with it: nothing left in the segment names
a byte past the cut.

Zeros ahead
-----------
With ``zeros_ahead`` (the node's journals), the active segment's file is kept
up to :data:`ZEROS_AHEAD_BYTES` longer than its records and the copy ahead of
them, in zeros written before the records or copies that go over them. The
fdatasync after a record then finds the file's size and blocks as the last
extension left them, and skips the file-system journal commit a growing file
costs. Only one sync in so many pays for an extension. A sealed segment, and
the active one at a clean close, are cut to their last record. At recovery the
zeros are a bad record (length 0, a checksum that does not hold) beyond the
synced mark and within the tail a power cut may leave: they are cut like a
torn tail with the copies among them, logged as written ahead when the bad
record is zeros. The torn-tail bounds below allow for them.

The directory also holds ``meta`` (term, vote, commit hint: :mod:`.meta`),
``start`` (the durable first index after a prefix drop) and ``synced``.

A damaged journal directory can be moved aside with
:func:`quarantine_journal` (keeping term and vote) so the replica can fetch a
fresh copy of the log from its leader.

Memory does not grow with the payloads: the journal keeps one 8-byte offset per
entry (``array('q')`` per segment), the term changes, and a bounded cache of
the newest entries; older entries are read back from disk.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import NamedTuple

import google_crc32c

from ._io import FileHandle, FileIO, NoSpace
from .meta import RaftMeta

__all__ = [
    "Entry",
    "Journal",
    "JournalCorrupt",
    "NoSpace",
    "SyncFailed",
    "SyncBatcher",
    "SyncMark",
    "QUARANTINE_INFIX",
    "quarantine_journal",
    "read_sync_mark",
    "SEGMENT_BYTES",
    "ZEROS_AHEAD_BYTES",
    "RECORD_HEADER_BYTES",
    "MARK_RECORD_BYTES",
    "COPY_RECORD_BYTES",
    "COPY_HEADER_BYTES",
    "COPY_BYTES_MAX",
    "COPY_BATCH_BYTES",
    "MARK_WRITE_EVERY",
]

log = logging.getLogger(__name__)

SEGMENT_BYTES = 64 * 1024 * 1024
#: How far the active segment's file reaches past its records, in zeros (see *Zeros ahead*).
ZEROS_AHEAD_BYTES = 1024 * 1024
UNSYNCED_BYTES_MAX = 8 * 1024 * 1024
_SEGMENT_MAGIC = b"SHOALWAL"
#: Version 5 segments hold copies ahead of their records, version 4 right after each batch,
#: version 3 mark records only; versions 2 (entry records only) to 4 are still read.
_SEGMENT_VERSION = 5
_SEGMENT_VERSIONS_READ = (2, 3, 4, 5)
_MARKS_SINCE_VERSION = 3
_COPIES_SINCE_VERSION = 4
_COPIES_AHEAD_SINCE_VERSION = 5
#: magic, version, the unsynced-bytes bound, CRC32C of the three: a header torn by a power cut
#: (it is unsynced until the segment's first sync) is told from one that states a wrong bound.
_SEGMENT_HEADER = struct.Struct("<8sIII")
SEGMENT_HEADER_BYTES = _SEGMENT_HEADER.size


def _segment_header(unsynced_bytes_max: int) -> bytes:
    body = struct.pack("<8sII", _SEGMENT_MAGIC, _SEGMENT_VERSION, unsynced_bytes_max)
    return body + struct.pack("<I", google_crc32c.value(body))


def _segment_header_fields(header: bytes) -> tuple[bytes, int, int] | None:
    """(magic, version, bound) of a whole header whose checksum holds, else None."""
    if len(header) != SEGMENT_HEADER_BYTES:
        return None
    magic, version, bound, crc = _SEGMENT_HEADER.unpack(header)
    if google_crc32c.value(header[:-4]) != crc:
        return None
    return magic, version, bound


class SyncMark(NamedTuple):
    """How much of a journal is known durable: entries up to ``index``, and in the segment
    starting at index ``segment`` the bytes before ``offset``. ``segment == 0``: nothing.
    (A tuple: one is made at every sync, and marks compare in field order.)"""

    index: int
    segment: int
    offset: int


_NOTHING_SYNCED = SyncMark(0, 0, 0)
MARK_NAME = "synced"
_MARK_MAGIC = b"SHOALSYN"
_MARK = struct.Struct("<8sQQQI")  # magic, index, segment, offset, CRC32C of the 32 bytes before
#: The two copies of the mark sit in different 4 KiB blocks: a torn write of one leaves the other.
_MARK_SLOT_BYTES = 4096


def _mark_slot(mark: SyncMark) -> bytes:
    body = struct.pack("<8sQQQ", _MARK_MAGIC, mark.index, mark.segment, mark.offset)
    return body + struct.pack("<I", google_crc32c.value(body))


def _mark_file(mark: SyncMark) -> bytes:
    slot = _mark_slot(mark)
    return slot + bytes(_MARK_SLOT_BYTES - len(slot)) + slot


def read_sync_mark(io: FileIO, directory: str) -> SyncMark | None:
    """The synced mark of the journal in ``directory``: the higher of its readable copies,
    or None if the file is missing or neither copy's checksum holds."""
    return _read_sync_mark_slot(io, directory)[0]


def _read_sync_mark_slot(io: FileIO, directory: str) -> tuple[SyncMark | None, int]:
    """:func:`read_sync_mark`, and which copy (0 or 1) holds it (the next plain write must
    replace the other one: it may be the only copy a power cut left whole)."""
    path = os.path.join(directory, MARK_NAME)
    if not io.exists(path):
        return None, 0
    raw = io.read_all(path)
    best: SyncMark | None = None
    best_slot = 0
    for copy, at in enumerate((0, _MARK_SLOT_BYTES)):
        slot = raw[at : at + _MARK.size]
        if len(slot) != _MARK.size:
            continue
        magic, index, segment, offset, crc = _MARK.unpack(slot)
        if magic != _MARK_MAGIC or google_crc32c.value(slot[:-4]) != crc:
            continue
        mark = SyncMark(index, segment, offset)
        if best is None or mark > best:
            best, best_slot = mark, copy
    return best, best_slot


_RECORD = struct.Struct("<IIQQ")
RECORD_HEADER_BYTES = _RECORD.size
#: A mark record has this where an entry record has its payload length: no payload is that long.
_MARK_LENGTH = 0xFFFFFFFF
_MARK_RECORD_MAGIC = b"SHOALMRK"
#: The length sentinel, CRC32C, magic, the record's own offset (everything before it was synced
#: when it was written) and the index of the last entry before it.
_MARK_RECORD = struct.Struct("<II8sQQ")
MARK_RECORD_BYTES = _MARK_RECORD.size
#: What a mark record's CRC32C covers: its fields and the first index of its segment, so that
#: a copy of one anywhere else (another offset, another segment, inside a payload) is not valid.
_MARK_RECORD_CRC = struct.Struct("<I8sQQQ")
_CRC_FIELDS = struct.Struct("<IQQ")
#: A copy record has this where an entry record has its payload length.
_COPY_LENGTH = 0xFFFFFFFE
_COPY_RECORD_MAGIC = b"SHOALCPY"
#: The length sentinel, CRC32C, magic, the record's own offset, where the copy begins (4 KiB
#: aligned) and how many bytes before the record it copies.
_COPY_RECORD = struct.Struct("<II8sQQQ")
COPY_RECORD_BYTES = _COPY_RECORD.size
#: What a copy record's CRC32C covers: its fields and the first index of its segment.
_COPY_RECORD_CRC = struct.Struct("<I8sQQQQ")
_COPY_MAGIC = b"SHOALDUP"
#: The copy's own header: magic, CRC32C (of its other fields, the segment's first index and the
#: copied bytes), the copied range's start and end, and the header's own offset.
_COPY_HEADER = struct.Struct("<8sIQQQ")
COPY_HEADER_BYTES = _COPY_HEADER.size
#: The copy starts in a block of its own: damage to one 4 KiB block leaves a batch or its copy.
COPY_ALIGN = 4096
#: The largest batch a copy holds, and so how far past a damaged record recovery looks for one
#: (a journal written with copies of up to this size stays restorable).
COPY_BYTES_MAX = 256 * 1024
#: A sync whose batch is larger than this writes no copy; it makes the synced mark durable. Past
#: about 32 KiB, a second fdatasync of the small mark costs less than flushing the batch twice
#: (``python bench/bench_journal.py --only mark --mark-bytes N``, docs/benchmarks.md).
COPY_BATCH_BYTES = 32 * 1024
#: After a sync whose batch was copied, the synced mark file is written once in this many such
#: syncs (a non-copied sync, a new segment and a clean close write it at once); see *The synced mark*.
MARK_WRITE_EVERY = 8
#: How far past its copy record's 4 KiB boundary a version 5 copy may begin (see *Copies*).
_COPY_AHEAD_MAX = 4 * COPY_BYTES_MAX
#: Zeros to write ahead, sliced without copying: enough for an extension past the farthest copy
#: (the records' end, the copy's reach and the copy itself). One buffer for the process: a new
#: one per write would fault its pages in again for every megabyte written.
_ZEROS = memoryview(bytes(ZEROS_AHEAD_BYTES + COPY_ALIGN + _COPY_AHEAD_MAX + COPY_HEADER_BYTES + COPY_BYTES_MAX))
#: Restores from a copy one scan of the last segment tries at most.
_RESTORES_MAX = 4
_START = struct.Struct("<8sQI")
_START_MAGIC = b"SHOALSTA"
PAYLOAD_BYTES_MAX = 256 * 1024 * 1024
_SUFFIX = ".wal"

Entry = tuple[bytes, int, int]
"""One log entry: ``(payload, index, term)``."""


class JournalCorrupt(Exception):
    """A journal file is damaged where no power cut could have torn it.

    ``path`` names the file and ``offset`` the byte where the damage was found (0 for
    a whole-file problem such as a missing segment); the message says what is wrong.
    """

    def __init__(self, path: str, offset: int, problem: str) -> None:
        super().__init__(f"{path} at offset {offset}: {problem}")
        self.path = path
        self.offset = offset
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:
        return type(self), (self.path, self.offset, self.problem)


class SyncFailed(OSError):
    """An fdatasync/fsync of the journal, or the write of its synced mark, failed; the journal
    refuses all further use.

    After a failed fsync Linux may have dropped the dirty pages and a retry can
    report success without writing them, so nothing written since the last good
    sync can be trusted: the partition must be reopened (recovery reads what is
    really on disk).
    """


def _crc(length: int, term: int, index: int, payload: bytes) -> int:
    return google_crc32c.extend(google_crc32c.value(_CRC_FIELDS.pack(length, term, index)), payload)


def encode_record(index: int, term: int, payload: bytes) -> bytes:
    """One record's bytes: header and payload."""
    n = len(payload)
    return _RECORD.pack(n, _crc(n, term, index, payload), term, index) + payload


def _mark_record(segment: int, offset: int, index: int) -> bytes:
    """A mark record written at ``offset`` of segment ``segment``, after entry ``index``."""
    crc = google_crc32c.value(_MARK_RECORD_CRC.pack(_MARK_LENGTH, _MARK_RECORD_MAGIC, offset, index, segment))
    return _MARK_RECORD.pack(_MARK_LENGTH, crc, _MARK_RECORD_MAGIC, offset, index)


def _mark_record_index(buf: bytes | memoryview, at: int, offset: int, segment: int) -> int | None:
    """The entry index named by a whole, valid mark record at ``buf[at:]`` that sits at file
    offset ``offset`` of segment ``segment``; None if there is no such record there."""
    if at < 0 or at + MARK_RECORD_BYTES > len(buf):
        return None
    sentinel, crc, magic, named, index = _MARK_RECORD.unpack_from(buf, at)
    if sentinel != _MARK_LENGTH or magic != _MARK_RECORD_MAGIC or named != offset:
        return None
    if google_crc32c.value(_MARK_RECORD_CRC.pack(sentinel, magic, named, index, segment)) != crc:
        return None
    return index


def _copy_at(end: int) -> int:
    """Where the copy of a batch ending at ``end`` begins: the first block after its copy record."""
    return -(-(end + COPY_RECORD_BYTES) // COPY_ALIGN) * COPY_ALIGN


def _copy_places(end: int, copy_bytes_max: int) -> tuple[int, int]:
    """The two places a version 5 copy of a batch ending at ``end`` may begin (see *Copies*):
    four copied batches past its copy record's block, so that the next batch seldom reaches it
    before its own sync, and one copy and batch further, so consecutive copies never overlap."""
    near = _copy_at(end) + _copy_at(min(4 * copy_bytes_max, COPY_BYTES_MAX))
    return near, near + _copy_at(2 * copy_bytes_max + COPY_HEADER_BYTES) + COPY_ALIGN


def _copy_place_valid(copy_at: int, end: int, ahead: bool) -> bool:
    """Whether a copy of a batch ending at ``end`` may begin at ``copy_at``: right after its
    copy record's block (version 4) or past it within :data:`_COPY_AHEAD_MAX` (version 5)."""
    if not ahead:
        return copy_at == _copy_at(end)
    return _copy_at(end) < copy_at <= _copy_at(end) + _COPY_AHEAD_MAX and copy_at % COPY_ALIGN == 0


def _copy_record(segment: int, offset: int, copy_at: int, length: int) -> bytes:
    """The copy record written at ``offset`` of segment ``segment``: the ``length`` bytes before
    it are copied at ``copy_at``."""
    crc = google_crc32c.value(
        _COPY_RECORD_CRC.pack(_COPY_LENGTH, _COPY_RECORD_MAGIC, offset, copy_at, length, segment))
    return _COPY_RECORD.pack(_COPY_LENGTH, crc, _COPY_RECORD_MAGIC, offset, copy_at, length)


def _copy_record_fields(buf: bytes | memoryview, at: int, offset: int, segment: int,
                        ahead: bool) -> tuple[int, int] | None:
    """``(copy_at, length)`` of a whole, valid copy record at ``buf[at:]`` that sits at file
    offset ``offset`` of segment ``segment`` (``ahead``: a version 5 segment, whose copies lie
    ahead of the records); None if there is no such record there."""
    if at < 0 or at + COPY_RECORD_BYTES > len(buf):
        return None
    sentinel, crc, magic, named, copy_at, length = _COPY_RECORD.unpack_from(buf, at)
    if sentinel != _COPY_LENGTH or magic != _COPY_RECORD_MAGIC or named != offset:
        return None
    if google_crc32c.value(_COPY_RECORD_CRC.pack(sentinel, magic, named, copy_at, length, segment)) != crc:
        return None
    if not _copy_place_valid(copy_at, offset, ahead) or length > offset - SEGMENT_HEADER_BYTES:
        return None
    return copy_at, length


def _copy_crc(segment: int, start: int, end: int, copy_at: int, parts: list[bytes]) -> int:
    """The CRC32C a copy's header holds: its fields, its segment's first index and the copied
    bytes (``parts`` in order)."""
    crc = google_crc32c.value(struct.pack("<QQQQ", start, end, copy_at, segment))
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    return crc


def _copy_header(segment: int, start: int, end: int, copy_at: int, parts: list[bytes]) -> bytes:
    """The header of the copy of bytes ``start``..``end`` (``parts``) of segment ``segment``,
    written at ``copy_at`` right before them."""
    return _COPY_HEADER.pack(_COPY_MAGIC, _copy_crc(segment, start, end, copy_at, parts), start, end, copy_at)


def _copy_block_fields(buf: bytes | memoryview, at: int, copy_at: int, segment: int) -> tuple[int, int, bytes] | None:
    """``(start, end, data)`` of a whole copy whose checksum holds at ``buf[at:]``, which sits at
    file offset ``copy_at`` of segment ``segment``; None otherwise."""
    if at < 0 or at + COPY_HEADER_BYTES > len(buf):
        return None
    magic, crc, start, end, named = _COPY_HEADER.unpack_from(buf, at)
    if magic != _COPY_MAGIC or named != copy_at or not SEGMENT_HEADER_BYTES <= start <= end < copy_at:
        return None
    data = bytes(buf[at + COPY_HEADER_BYTES : at + COPY_HEADER_BYTES + end - start])
    if len(data) != end - start:
        return None
    if _copy_crc(segment, start, end, copy_at, [data]) != crc:
        return None
    return start, end, data


def _segment_name(first_index: int) -> str:
    return f"{first_index:020d}{_SUFFIX}"


@dataclass
class _Segment:
    path: str
    first_index: int
    offsets: array = field(default_factory=lambda: array("q"))
    size: int = SEGMENT_HEADER_BYTES
    unsynced_max: int = UNSYNCED_BYTES_MAX  # as recorded in its header: recovery relies on it
    version: int = _SEGMENT_VERSION
    #: Bytes a completed fdatasync of this segment made durable (0: none yet).
    synced_size: int = 0
    #: Offset of its newest mark record (the header's end if it has none): the bytes before
    #: it are vouched for in the segment itself.
    marked: int = SEGMENT_HEADER_BYTES
    #: Where the bytes the next sync makes durable begin (what its copy record copies).
    batch_start: int = SEGMENT_HEADER_BYTES

    @property
    def next_index(self) -> int:
        return self.first_index + len(self.offsets)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.offsets) - 1


#: A copy of a journal's ``meta`` kept beside its directory while :func:`quarantine_journal` runs.
_KEPT_META_SUFFIX = ".meta.kept"
QUARANTINE_INFIX = ".damaged-"


def quarantine_journal(io: FileIO, directory: str, *, clock: Callable[[], float] = time.time) -> str:
    """Move the damaged journal in ``directory`` aside, keeping its term and vote; return where it went.

    The directory is renamed to ``<directory>.damaged-<UTC time>`` (with ``-<n>`` added if
    that name is taken) and left for an operator to inspect or delete; a new ``directory``
    holds only ``meta``, so the replica restarts with an empty log and catches up from its
    leader. Every step is durable before the next (directory fsyncs) and a power cut at any
    point is finished or undone by the next :class:`Journal` opened on ``directory``. The
    journal must be closed.

    Why term and vote survive: Raft lets a server vote at most once per term, and the
    durable ``votedFor`` is what keeps that promise across restarts (paper §5.2 and
    Figure 2). A discarded log is a loss the leader repairs by sending its own; a forgotten
    vote is not: the replica could vote for a second candidate in a term it already voted
    in, and two leaders could then be elected in one term. The term stays for the same
    reason, and so that a deposed leader's messages are still recognised as stale.

    The caller must also keep the replica from *granting* votes until a leader of a term at
    least the kept one has caught it up: entries it acknowledged were counted toward
    commits, and with an empty log it would vote for a candidate that lacks them.
    Raises :class:`~.meta.MetaCorrupt` (and moves nothing) if ``meta`` is unreadable.
    """
    directory = directory.rstrip("/")
    parent = os.path.dirname(directory) or "."
    meta_path = os.path.join(directory, "meta")
    kept = directory + _KEPT_META_SUFFIX
    meta = b""
    if io.exists(meta_path):
        RaftMeta(io, meta_path)  # refuses an unreadable file before anything moves
        meta = io.read_all(meta_path)
        io.write_atomic(kept, [meta])
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
    taken = set(io.listdir(parent))
    base = os.path.basename(directory) + QUARANTINE_INFIX + stamp
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    target = os.path.join(parent, name)
    io.rename(directory, target)
    io.fsync_dir(parent)
    io.makedirs(directory)
    if meta:
        io.write_atomic(meta_path, [meta])
        io.fsync_dir(parent)  # the new directory's own entry
        io.unlink(kept)
        io.fsync_dir(parent)
    log.warning("journal %s: damaged copy moved to %s; term and vote kept", directory, target)
    return target


def _finish_quarantine(io: FileIO, directory: str) -> None:
    """Complete or undo a :func:`quarantine_journal` a power cut interrupted."""
    directory = directory.rstrip("/")
    kept = directory + _KEPT_META_SUFFIX
    if not io.exists(kept):
        return
    parent = os.path.dirname(directory) or "."
    meta_path = os.path.join(directory, "meta")
    if not io.exists(meta_path):  # the damaged directory was moved, its successor not yet made
        io.makedirs(directory)
        io.write_atomic(meta_path, [io.read_all(kept)])
        io.fsync_dir(parent)
    io.unlink(kept)
    io.fsync_dir(parent)


class Journal:
    """One replica's Raft log, durable on :meth:`sync`; see the module docstring.

    ``cache_entries_max``/``cache_bytes_max`` bound the newest entries held in
    memory; ``segment_bytes`` is the size at which a segment is sealed;
    ``unsynced_bytes_max`` bounds what may be written but not synced (an
    append that would exceed it syncs first), which with the synced mark lets
    recovery tell a torn tail from a damaged record (see *The synced mark*).
    ``batcher``, if given, is told each time this journal writes.
    """

    def __init__(
        self,
        io: FileIO,
        directory: str,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        cache_entries_max: int = 1024,
        cache_bytes_max: int = 8 * 1024 * 1024,
        unsynced_bytes_max: int = UNSYNCED_BYTES_MAX,
        batcher: SyncBatcher | None = None,
        zeros_ahead: bool = False,
    ) -> None:
        self._io = io
        self.directory = directory
        #: Write zeros ahead of the active segment's records (see *Zeros ahead*).
        self.zeros_ahead = zeros_ahead
        self.segment_bytes = segment_bytes
        self.cache_entries_max = cache_entries_max
        self.cache_bytes_max = cache_bytes_max
        self.unsynced_bytes_max = unsynced_bytes_max
        self._unsynced_bytes = 0
        self._failed: str | None = None
        self._batcher = batcher
        #: While True, appends only ask the batcher for a lazy sync (:meth:`SyncBatcher.sync_lazy`):
        #: the disk durability class.
        self.lazy_appends = False
        #: While True (the replica leads), appends ask for :meth:`SyncBatcher.sync_leader`: a
        #: leader's entry may leave for the followers before it is synced, as long as it is
        #: synced before the leader counts it toward the commit.
        self.leader_appends = False
        self._segments: list[_Segment] = []
        self._active: FileHandle | None = None
        #: The records written to the active segment since its last sync, while they are
        #: contiguous and few enough to copy: the copy then needs no read back (``_batch_of``).
        self._batch_parts: list[bytes] = []
        self._batch_seg: _Segment | None = None
        self._batch_from = 0
        self._batch_end = 0
        self._first_index = 1
        self._last_index = 0
        self._run_index = array("q")
        self._run_term = array("q")
        self._cache: deque[bytes] = deque()
        self._cache_bytes = 0
        self._synced_index = 0
        self._data_dirty = False
        self._dir_dirty = False
        #: The synced mark as last written (see the module docstring), its open file, and
        #: which of its two copies the next plain write replaces.
        self._mark = _NOTHING_SYNCED
        self._mark_path = os.path.join(directory, MARK_NAME)
        self._mark_handle: FileHandle | None = None
        self._mark_slot = 0
        self._mark_ready = False
        #: Whether the last sync of the log wrote a copy of its batch (see *Copies*): if not, the
        #: mark naming it is made durable before the sync returns.
        self._copied = False
        #: The bytes ``[start, end)`` of the active segment holding the copy that alone vouches
        #: for its newest synced batch (version 5: ahead of the records), or None.
        self._copy_live: tuple[int, int] | None = None
        #: Which of its two places (:func:`_copy_places`) the next copy takes.
        self._copy_far = False
        #: Batches larger than this are synced without a copy, with a durable mark (0: never copy);
        #: at most :data:`COPY_BYTES_MAX`, the reach within which recovery looks for copies.
        self.copy_bytes_max = COPY_BATCH_BYTES
        #: Whether the mark file holds a write no fdatasync has covered yet.
        self._mark_lazy = False
        #: Copied syncs since the mark file was last written: it names an earlier sync (in this
        #: segment) until :data:`MARK_WRITE_EVERY` of them have passed (see *The synced mark*).
        self._marks_held = 0
        #: fdatasyncs issued: the log's, and the synced mark's when a batch had no copy.
        self.syncs = 0
        self.disk_reads = 0
        _finish_quarantine(io, directory)
        io.makedirs(directory)
        self.meta = RaftMeta(io, os.path.join(directory, "meta"))
        self._recover()
        self._commit_index = min(self.meta.state.commit_index, self._last_index)
        self._commit_stored = self.meta.state.commit_index

    # ------------------------------------------------------------------ state
    @property
    def first_index(self) -> int:
        """Index of the first entry held (``last_index + 1`` when empty)."""
        return self._first_index

    @property
    def last_index(self) -> int:
        """Index of the last entry written (``first_index - 1`` when empty)."""
        return self._last_index

    @property
    def synced_index(self) -> int:
        """Highest index known to be on stable storage."""
        return self._synced_index

    @property
    def synced_mark(self) -> SyncMark:
        """How far the journal is durable, as its syncs reported it (its ``synced`` file may name
        an earlier sync of the same segment; see *The synced mark*)."""
        return self._mark

    @property
    def dirty(self) -> bool:
        """True if something written is not yet synced."""
        return self._data_dirty or self._dir_dirty

    def term_at(self, index: int) -> int | None:
        """Term of the entry at ``index``, or ``None`` if not held."""
        if index < self._first_index or index > self._last_index:
            return None
        pos = bisect.bisect_right(self._run_index, index) - 1
        return self._run_term[pos]

    def memory_bytes(self) -> int:
        """Bytes the journal holds in memory: offsets, term changes and the tail cache."""
        offsets = sum(s.offsets.itemsize * len(s.offsets) for s in self._segments)
        runs = 16 * len(self._run_index)
        return offsets + runs + self._cache_bytes

    @property
    def last_term(self) -> int:
        """Term of the last entry (0 when empty)."""
        return self._run_term[-1] if self._last_index >= self._first_index else 0

    # ------------------------------------------------------------------ writes
    def append(self, index: int, term: int, payload: bytes, *, check_space: bool = True) -> None:
        """Write one entry (not synced). ``index`` must follow the last one.

        With ``check_space`` the write is refused with :class:`NoSpace` below
        ``disk_free_min_bytes``; a real ``ENOSPC`` is refused either way. A
        refused append leaves the journal as it was.
        """
        self._check_usable()
        if self._last_index >= self._first_index:
            if index != self._last_index + 1:
                raise ValueError(f"append index {index} does not follow last index {self._last_index}")
            if term < self._run_term[-1]:
                raise ValueError(f"append term {term} below last term {self._run_term[-1]}")
        else:
            self._restart_at(index, term)
        assert index == self._last_index + 1 and self._first_index <= index, \
            f"append of {index} to a journal holding {self._first_index}..{self._last_index}"
        record = encode_record(index, term, payload)
        seg = self._segments[-1]
        # An older segment cannot hold mark or copy records: it is sealed and a current one started.
        if len(seg.offsets) and (seg.size + len(record) > self.segment_bytes or seg.version < _SEGMENT_VERSION):
            seg = self._roll(index)
        elif self._unsynced_bytes and self._unsynced_bytes + len(record) > seg.unsynced_max:
            self.sync()
        active = self._active
        assert active is not None
        marked = seg.marked < seg.synced_size == seg.size and seg.version >= _MARKS_SINCE_VERSION
        if marked:
            # The first write after a sync of this segment carries a mark record vouching for
            # the synced bytes before it, in the same write call; the next fdatasync makes it
            # durable with the entry. It names only bytes a completed sync made durable, so it
            # is true whatever a power cut does to this write.
            record = _mark_record(seg.first_index, seg.size, index - 1) + record
        if self._copy_live is not None and seg.size + len(record) > self._copy_live[0]:
            self._retire_copy()  # a large batch reaches the copy ahead: the mark vouches instead
        if self.zeros_ahead and seg.size + len(record) > active.size:
            self._write_zeros_ahead(seg.size + len(record))
        at = active.put(seg.size, record, check_space=check_space)
        if at == self._batch_end and seg is self._batch_seg:
            if self._batch_end - self._batch_from + len(record) <= self.copy_bytes_max:
                self._batch_parts.append(record)
            else:
                self._batch_seg = None  # too large to copy: no parts kept
            self._batch_end = at + len(record)
        else:
            self._batch_parts = [record]
            self._batch_seg, self._batch_from, self._batch_end = seg, at, at + len(record)
        if marked:
            seg.marked = at
            offset = at + MARK_RECORD_BYTES
        else:
            offset = at
        self._unsynced_bytes += len(record)
        seg.offsets.append(offset)
        seg.size = at + len(record)
        self._last_index = index
        if not self._run_term or self._run_term[-1] != term:
            assert not self._run_term or self._run_term[-1] < term, f"term {term} after {self._run_term[-1]}"
            self._run_index.append(index)
            self._run_term.append(term)
        self._cache_push(payload)
        self._mark_dirty()

    def _write_zeros_ahead(self, end: int) -> None:
        """Extend the active segment with zeros to :data:`ZEROS_AHEAD_BYTES` past ``end`` (see
        *Zeros ahead*); on a full disk the records go on without them."""
        active = self._active
        assert active is not None
        try:
            n = end + ZEROS_AHEAD_BYTES - active.size
            active.append(_ZEROS[:n] if n <= len(_ZEROS) else bytes(n))
        except NoSpace:
            pass  # the append cut what it wrote; the record's own write says whether it fits

    def _trim_zeros_ahead(self) -> None:
        """Cut the active segment's zeros ahead (it is sealed, or the journal closes), and the
        copy among them once the synced mark vouches instead."""
        self._retire_copy()
        if self._active is not None and self._segments and self._active.size > self._segments[-1].size:
            self._active.truncate(self._segments[-1].size)
            self._data_dirty = True

    def _restart_at(self, index: int, term: int) -> None:
        """The journal is empty: make sure the active segment can take ``(index, term)`` next.

        The last segment may still hold entries below the first index (a prefix drop keeps
        a partly covered segment); it is continued only where the new entry follows them.
        """
        if self._segments and self._segments[-1].next_index == index and (
                not self._run_term or self._run_term[-1] <= term):
            if index < self._start:  # entries a power cut lost below the durable start
                self._store_start(index)
            self._first_index = index
            return
        self._drop_all_segments()
        self._first_index = index
        self._last_index = index - 1
        self._synced_index = min(self._synced_index, index - 1)
        self._new_segment(index)

    def _new_segment(self, first_index: int) -> _Segment:
        path = os.path.join(self.directory, _segment_name(first_index))
        handle = self._io.open(path)
        try:
            handle.truncate(0)
            handle.append(_segment_header(self.unsynced_bytes_max))
        except BaseException:
            handle.close()
            self._io.unlink(path)
            raise
        if self._active is not None:
            self._active.close()
        self._active = handle
        self._copy_live = None
        self._unsynced_bytes = SEGMENT_HEADER_BYTES
        seg = _Segment(path, first_index, unsynced_max=self.unsynced_bytes_max)
        self._segments.append(seg)
        # The header is data the next sync must flush even if no entry follows it (an append
        # refused for space): the mark it then writes names the header's bytes.
        self._data_dirty = self._dir_dirty = True
        return seg

    def _roll(self, next_index: int) -> _Segment:
        # The sealed segment is synced before its successor can exist on disk,
        # so after a power cut only the last segment can have a torn tail.
        assert self._active is not None
        old = self._active
        self._trim_zeros_ahead()  # a sealed segment ends with its last record
        # Its last batch is synced without a copy (nothing may follow a sealed segment's
        # records), so the mark naming it is made durable now, after the directory.
        self._sync(zeros_ahead=False)
        try:
            return self._new_segment(next_index)
        except NoSpace:
            self._active = old
            raise

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise SyncFailed(self._failed)

    def _datasync(self, handle: FileHandle) -> None:
        try:
            handle.datasync()
        except OSError as exc:
            self._failed = f"{self.directory}: fdatasync of {handle.path} failed ({exc}); reopen the journal"
            raise SyncFailed(self._failed) from exc
        self.syncs += 1

    def _fsync_dir(self) -> None:
        try:
            self._io.fsync_dir(self.directory)
        except OSError as exc:
            self._failed = f"{self.directory}: directory fsync failed ({exc}); reopen the journal"
            raise SyncFailed(self._failed) from exc

    def _mark_dirty(self) -> None:
        self._data_dirty = True
        if self._batcher is not None:
            if self.lazy_appends:
                self._batcher.mark_lazy(self)
            elif self.leader_appends:
                self._batcher.mark_leader(self)
            else:
                self._batcher.mark(self)

    def sync(self) -> int:
        """fdatasync everything written so far; return the highest durable index."""
        return self._sync(zeros_ahead=True)

    def _sync(self, *, zeros_ahead: bool) -> int:
        target = self._last_index
        self._check_usable()
        if self._data_dirty and self._active is not None:
            self._sync_active(zeros_ahead=zeros_ahead)
        self._sync_dir_if_dirty()
        self._note_synced()  # before the entries count as durable: see *The synced mark*
        self._synced_index = max(self._synced_index, target)
        self._assert_bounds()
        return self._synced_index

    def _note_synced(self) -> None:
        """Everything written is durable: make the mark say so if it moved (durably unless the
        batch was synced with its copy; see *The synced mark*)."""
        if self._segments and self._mark_ready:
            seg = self._segments[-1]
            mark = SyncMark(self._last_index, seg.first_index, seg.size)
            if mark == self._mark:
                return
            if self._copied and self._marks_held < MARK_WRITE_EVERY - 1 and mark.segment == self._mark.segment:
                self._mark = mark  # the file catches up within MARK_WRITE_EVERY copied syncs
                self._marks_held += 1
                return
            self._write_mark(mark, durable=not self._copied)

    def _write_mark(self, mark: SyncMark, *, durable: bool = True) -> None:
        """Write ``mark`` over the older of the two copies; with ``durable``, fdatasync it
        before returning.

        A power cut during the write can tear only that copy; the other still holds the mark
        of the sync before, a lower bound. A failure poisons the journal as a failed data sync
        does: the entries just synced must not be reported durable while nothing durable
        protects them (recovery could then take damage among them for a torn tail).
        """
        try:
            if self._mark_handle is None:
                self._mark_handle = self._io.open(self._mark_path, create=False)
            self._mark_handle.pwrite(self._mark_slot * _MARK_SLOT_BYTES, _mark_slot(mark))
        except OSError as exc:
            self._failed = f"{self.directory}: writing the synced mark failed ({exc}); reopen the journal"
            raise SyncFailed(self._failed) from exc
        if durable:
            self._datasync(self._mark_handle)
            self._copy_live = None  # the mark vouches for everything synced
        self._mark_lazy = not durable
        self._mark_slot ^= 1
        self._mark = mark
        self._marks_held = 0

    def _store_mark(self, mark: SyncMark) -> None:
        """Make ``mark`` durable in both copies before returning (the log is about to get shorter).

        Rewritten in place and fdatasync'ed: a cut on the way leaves old and new copies, each
        still a lower bound of the log, which is cut only after this returns.
        """
        self._check_usable()
        if self._mark_handle is None:
            self._mark_handle = self._io.open(self._mark_path, create=False)
        slot = _mark_slot(mark)
        self._mark_handle.pwrite(0, slot)
        self._mark_handle.pwrite(_MARK_SLOT_BYTES, slot)
        self._datasync(self._mark_handle)
        self._mark, self._mark_slot = mark, 0
        self._mark_lazy = False
        self._marks_held = 0
        self._copy_live = None

    def _create_mark(self, mark: SyncMark) -> None:
        """Write the mark file anew, durably (a new journal, or one whose mark was unreadable)."""
        if self._mark_handle is not None:
            self._mark_handle.close()
            self._mark_handle = None
        self._io.write_atomic(self._mark_path, [_mark_file(mark)])
        self._copy_live = None
        self._mark, self._mark_slot = mark, 0
        self._mark_lazy = False
        self._marks_held = 0
        self._mark_ready = True

    def _sync_active(self, *, zeros_ahead: bool = True) -> None:
        """fdatasync the active segment, with a copy of its batch written ahead in the same
        flush when it has one (see *Copies*): everything written to it is durable."""
        assert self._active is not None
        seg = self._segments[-1]
        self._copied = self._write_copy(seg, self._active, zeros_ahead=zeros_ahead)
        size = seg.size  # taken first: a mark record must never vouch for a byte written after it
        self._datasync(self._active)
        self._batch_parts = []
        self._batch_seg = None
        seg.synced_size = seg.batch_start = size
        self._data_dirty = False
        self._unsynced_bytes = 0

    def _write_copy(self, seg: _Segment, active: FileHandle, *, zeros_ahead: bool) -> bool:
        """Write the copy of the bytes since the last sync ahead of the records, and the copy
        record naming it after them, if the segment takes copies, stays active (``zeros_ahead``)
        and the batch is small enough; return whether it did (see *Copies*)."""
        start, end = seg.batch_start, seg.size
        assert self.copy_bytes_max <= COPY_BYTES_MAX, "a copy recovery would not look for"
        if seg.version < _COPIES_AHEAD_SINCE_VERSION or not zeros_ahead or not 0 < end - start <= self.copy_bytes_max:
            return False
        near, far = _copy_places(end, self.copy_bytes_max)
        copy_at = far if self._copy_far else near
        copy_end = copy_at + COPY_HEADER_BYTES + end - start
        live = self._copy_live
        if live is not None and copy_at < live[1] and live[0] < copy_end:
            return False  # it would overwrite the copy still vouching (copy_bytes_max was raised)
        assert _copy_place_valid(copy_at, end, ahead=True), f"copy at {copy_at} for a batch ending at {end}"
        data = self._batch_of(seg, start, end)
        if self.zeros_ahead and copy_end > active.size:
            self._write_zeros_ahead(copy_end)
        try:
            active.put_parts(copy_at, [_copy_header(seg.first_index, start, end, copy_at, data), *data])
            active.put_parts(end, [_copy_record(seg.first_index, end, copy_at, end - start)])
        except NoSpace:
            return False  # the write was cut back: this batch gets a durable mark instead
        except OSError as exc:
            self._failed = f"{self.directory}: writing the copy of a batch failed ({exc}); reopen the journal"
            raise SyncFailed(self._failed) from exc
        seg.size = end + COPY_RECORD_BYTES
        self._copy_live = (copy_at, copy_end)
        self._copy_far = not self._copy_far
        return True

    def _retire_copy(self) -> None:
        """Make the synced mark durable if a copy ahead of the records alone vouches for the
        newest synced batch, which the caller is about to cut or overwrite."""
        if self._copy_live is not None and self._mark_ready:
            self._write_mark(self._mark)

    def _batch_of(self, seg: _Segment, start: int, end: int) -> list[bytes]:
        """The bytes ``start``..``end`` of ``seg``, the active segment, in parts: the records as
        appended when they are exactly those bytes, else read back."""
        if seg is self._batch_seg and self._batch_from == start and self._batch_end == end:
            return self._batch_parts
        assert self._active is not None
        data = self._active.pread(start, end - start)
        assert len(data) == end - start, f"batch {start}..{end} of {seg.path} reads back {len(data)} bytes"
        return [data]

    def _sync_dir_if_dirty(self) -> None:
        """fsync the directory when a segment was created or removed since the last one."""
        if self._dir_dirty:
            self._fsync_dir()
            self._dir_dirty = False

    def delete_from(self, index: int) -> None:
        """Delete entries ``index`` and later, durably before returning (Raft §5.3 conflict)."""
        self._check_usable()
        if index > self._last_index:
            return
        index = max(index, self._first_index)
        # The mark must never name bytes that are gone: lower it durably first.
        kept = self._segments[-1]
        for seg in reversed(self._segments):
            kept = seg
            if seg.first_index < index:
                break
        keep = index - kept.first_index
        end = SyncMark(index - 1, kept.first_index, kept.offsets[keep] if 0 <= keep < len(kept.offsets) else kept.size)
        if self._mark > end:
            self._store_mark(end)
        self._retire_copy()  # the cut below may take the copy ahead with it
        # Whole segments go first, durably, then the one left is cut: every state a
        # power cut can leave on the way is a prefix of the log before the call.
        dropped = False
        while len(self._segments) > 1 and self._segments[-1].first_index >= index:
            seg = self._segments.pop()
            self._io.unlink(seg.path)
            dropped = True
            if self._active is not None:
                self._active.close()
            self._active = self._io.open(self._segments[-1].path, create=False)
        if dropped:
            self._fsync_dir()
        seg = self._segments[-1]
        keep = index - seg.first_index
        cut = seg.offsets[keep] if keep < len(seg.offsets) else seg.size
        del seg.offsets[keep:]
        seg.size = cut
        if seg.marked >= cut:  # its newest mark record goes with the cut: the next write names the cut anew
            seg.marked = SEGMENT_HEADER_BYTES
        seg.batch_start = min(seg.batch_start, cut)
        assert self._active is not None
        self._active.truncate(cut)
        self._sync_active()
        self._sync_dir_if_dirty()
        removed = self._last_index - index + 1
        self._last_index = index - 1
        self._note_synced()
        self._synced_index = self._last_index  # all of what is left was just synced
        pos = bisect.bisect_left(self._run_index, index)
        del self._run_index[pos:]
        del self._run_term[pos:]
        for _ in range(min(removed, len(self._cache))):
            self._cache_bytes -= len(self._cache.pop())
        self._assert_bounds()

    def first_within(self, index: int, bytes_max: int) -> int:
        """The lowest index from which the entries up to ``index`` lie in segments of at most
        ``bytes_max`` bytes in all (whole segments counted, the one holding ``index`` always
        kept): where a journal dropping what a snapshot covers may stop keeping entries."""
        keep, total = index, 0
        for seg in reversed(self._segments):
            if seg.first_index > index:
                continue
            total += seg.size
            if total > bytes_max and keep < index:
                break
            keep = seg.first_index
        return max(keep, self._first_index)

    def delete_to(self, index: int) -> None:
        """Forget entries below ``index`` (covered by a durable snapshot).

        The new first index is made durable first; then whole segments below
        it are removed (their removal is made durable by the next :meth:`sync`).
        """
        self._check_usable()
        index = min(index, self._last_index + 1)
        if index <= self._first_index:
            return
        self._store_start(index)
        self._first_index = index
        while len(self._segments) > 1 and self._segments[1].first_index <= index:
            self._io.unlink(self._segments.pop(0).path)
            self._dir_dirty = True
        pos = bisect.bisect_right(self._run_index, index) - 1
        if pos > 0:
            del self._run_index[:pos]
            del self._run_term[:pos]
        if self._dir_dirty and self._batcher is not None:
            self._batcher.mark(self)
        self._assert_bounds()

    def clear(self) -> None:
        """Delete every entry, durably before returning."""
        self._check_usable()
        self._drop_all_segments()
        self._first_index = self._last_index + 1
        self._assert_bounds()

    def _assert_bounds(self) -> None:
        """What every change must leave: ``first <= last + 1``, ``synced <= last``."""
        assert self._first_index <= self._last_index + 1, f"first index {self._first_index} past {self._last_index + 1}"
        assert self._synced_index <= self._last_index, \
            f"synced index {self._synced_index} past the last index {self._last_index}"

    def _drop_all_segments(self) -> None:
        if self._segments and self._mark != _NOTHING_SYNCED:
            self._store_mark(_NOTHING_SYNCED)
        if self._active is not None:
            self._active.close()
            self._active = None
        for seg in self._segments:
            self._io.unlink(seg.path)
        if self._segments:
            self._fsync_dir()
        self._segments.clear()
        if self._start != 0:
            self._store_start(0)
        self._run_index = array("q")
        self._run_term = array("q")
        self._cache.clear()
        self._cache_bytes = 0
        self._data_dirty = self._dir_dirty = False

    def _store_start(self, index: int) -> None:
        self._start = index
        body = struct.pack("<Q", index)
        self._io.write_atomic(
            os.path.join(self.directory, "start"),
            [_START.pack(_START_MAGIC, index, google_crc32c.value(body))],
        )

    def close(self) -> None:
        """Sync and close the files (after a failed sync: only close them)."""
        try:
            if self._active is not None and self._failed is None:
                self._trim_zeros_ahead()
                self._sync(zeros_ahead=False)
                if self._marks_held:
                    self._write_mark(self._mark, durable=True)  # the mark is durable and exact from here on
                elif self._mark_lazy and self._mark_handle is not None:
                    self._datasync(self._mark_handle)
                    self._mark_lazy = False
                self.store_commit_hint()
        finally:
            for handle in (self._active, self._mark_handle):
                if handle is not None:
                    handle.close()
            self._active = self._mark_handle = None

    # ------------------------------------------------------------------ reads
    def _cache_push(self, payload: bytes) -> None:
        self._cache.append(payload)
        self._cache_bytes += len(payload)
        while len(self._cache) > self.cache_entries_max or (
            self._cache_bytes > self.cache_bytes_max and len(self._cache) > 1
        ):
            self._cache_bytes -= len(self._cache.popleft())

    def entries(self, start: int, stop: int) -> list[Entry]:
        """Entries with ``start <= index < stop`` (clamped to what is held), oldest first."""
        start = max(start, self._first_index)
        stop = min(stop, self._last_index + 1)
        if start >= stop:
            return []
        cache = self._cache
        cached_from = self._last_index + 1 - len(cache)
        out: list[Entry] = []
        if start < cached_from:
            out.extend(self._read_disk(start, min(stop, cached_from)))
        base = max(start, cached_from)
        if base < stop:
            first = base - cached_from
            run_index = self._run_index
            if run_index[-1] <= base:  # one term throughout (the usual case): no lookup per entry
                term = self._run_term[-1]
                if stop - base == 1:
                    out.append((cache[first], base, term))
                else:
                    shift = base - first
                    out.extend([(cache[j], j + shift, term) for j in range(first, first + stop - base)])
            else:
                for i in range(stop - base):
                    index = base + i
                    out.append((cache[first + i], index, self._term_unchecked(index)))
        return out

    def __len__(self) -> int:
        """Number of entries held."""
        return self._last_index - self._first_index + 1

    def __iter__(self) -> Iterator[Entry]:
        """Every entry held, oldest first, read in bounded slices."""
        step = 1024
        for start in range(self._first_index, self._last_index + 1, step):
            yield from self.entries(start, start + step)

    def _term_unchecked(self, index: int) -> int:
        run_index = self._run_index
        if run_index[-1] <= index:
            return self._run_term[-1]
        return self._run_term[bisect.bisect_right(run_index, index) - 1]

    def _read_disk(self, start: int, stop: int) -> Iterator[Entry]:
        self.disk_reads += 1
        firsts = [s.first_index for s in self._segments]
        k = bisect.bisect_right(firsts, start) - 1
        index = start
        while index < stop:
            seg = self._segments[k]
            a = index - seg.first_index
            b = min(stop, seg.next_index) - seg.first_index
            lo = seg.offsets[a]
            hi = seg.offsets[b] if b < len(seg.offsets) else seg.size
            if seg is self._segments[-1] and self._active is not None:
                raw = self._active.pread(lo, hi - lo)
            else:
                handle = self._io.open(seg.path, create=False)
                try:
                    raw = handle.pread(lo, hi - lo)
                finally:
                    handle.close()
            view = memoryview(raw)
            pos = 0
            while pos < len(view):
                if pos + RECORD_HEADER_BYTES > len(view):
                    raise JournalCorrupt(seg.path, lo + pos, "record cut short on read")
                length, crc, term, idx = _RECORD.unpack_from(view, pos)
                if length == _MARK_LENGTH:  # a mark record between two entries: nothing to read
                    if _mark_record_index(view, pos, lo + pos, seg.first_index) != index - 1:
                        raise JournalCorrupt(seg.path, lo + pos, "mark record fails its check on read")
                    pos += MARK_RECORD_BYTES
                    continue
                if length == _COPY_LENGTH:  # a batch's copy: nothing to read
                    ahead = seg.version >= _COPIES_AHEAD_SINCE_VERSION
                    fields = _copy_record_fields(view, pos, lo + pos, seg.first_index, ahead)
                    if fields is None:
                        raise JournalCorrupt(seg.path, lo + pos, "copy record fails its check on read")
                    pos = pos + COPY_RECORD_BYTES if ahead else fields[0] + COPY_HEADER_BYTES + fields[1] - lo
                    continue
                payload = bytes(view[pos + RECORD_HEADER_BYTES : pos + RECORD_HEADER_BYTES + length])
                if idx != index or len(payload) != length or _crc(length, term, idx, payload) != crc:
                    raise JournalCorrupt(seg.path, lo + pos, "record fails its check on read")
                yield payload, idx, term
                pos += RECORD_HEADER_BYTES + length
                index += 1
            if index != seg.first_index + b:
                raise JournalCorrupt(seg.path, hi, f"records end at index {index - 1} on read, "
                                     f"before {seg.first_index + b - 1}")
            k += 1

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        io = self._io
        names = [n for n in io.listdir(self.directory) if n.endswith(_SUFFIX) and n[:-4].isdigit()]
        segments = sorted((int(n[:-4]), os.path.join(self.directory, n)) for n in names)
        start = self._start = self._load_start()
        # Segments wholly below the durable start are leftovers of a prefix drop.
        while len(segments) > 1 and segments[1][0] <= start:
            io.unlink(segments.pop(0)[1])
            self._dir_dirty = True
        mark, held_in = _read_sync_mark_slot(io, self.directory)
        self._mark_slot = held_in ^ 1  # the next plain write spares the copy that holds the mark
        if not segments:
            if mark is not None and mark.segment:
                raise JournalCorrupt(os.path.join(self.directory, _segment_name(mark.segment)), 0,
                                     f"segment missing (entries up to {mark.index} were synced)")
            self._first_index = max(start, 1)
            self._last_index = self._first_index - 1
            self.sync()
            if mark is None:
                self._create_mark(_NOTHING_SYNCED)
            else:
                self._mark, self._mark_ready = mark, True
            return
        if mark is None:
            log.warning("journal %s: the synced mark %s is %s: any damaged record is refused, "
                        "even one a power cut could have torn", self.directory, self._mark_path,
                        "unreadable" if io.exists(self._mark_path) else "missing")
        tail_first = segments[-1][0]
        synced_end: int | None = None  # of the last segment; None: unknown, all of it counts
        if mark is not None:
            if mark.segment > tail_first:
                raise JournalCorrupt(os.path.join(self.directory, _segment_name(mark.segment)), 0,
                                     f"segment missing (entries up to {mark.index} were synced)")
            synced_end = mark.offset if mark.segment == tail_first else 0
        for k, (first, path) in enumerate(segments):
            last = k == len(segments) - 1
            seg = self._scan(path, first, synced_end if last else None, last)
            if self._segments and self._segments[-1].next_index != first:
                raise JournalCorrupt(
                    path, 0, f"segment starts at index {first} but the previous one ends at "
                    f"{self._segments[-1].last_index}"
                )
            self._segments.append(seg)
        tail = self._segments[-1]
        tail.batch_start = tail.size  # recovery's own sync makes the mark durable instead of copying
        if mark is not None and tail.last_index < mark.index:
            raise JournalCorrupt(tail.path, tail.size,
                                 f"journal ends at index {tail.last_index}, but entries up to {mark.index} were synced")
        self._active = io.open(tail.path, create=False)
        self._last_index = tail.last_index
        self._first_index = min(max(start, self._segments[0].first_index), self._last_index + 1)
        pos = bisect.bisect_right(self._run_index, self._first_index) - 1
        if pos > 0:
            del self._run_index[:pos]
            del self._run_term[:pos]
        # What was read may still sit only in the page cache (the process died,
        # the machine did not): make it durable before anyone counts on it. That
        # includes the directory entries of the segments found: a segment created
        # just before the crash is only named in a directory that was never synced.
        self._data_dirty = True
        self._dir_dirty = True
        if mark is None:
            self.sync()
            self._create_mark(SyncMark(self._last_index, tail.first_index, tail.size))
        else:
            self._mark, self._mark_ready = mark, True
            self.sync()
        self.syncs = 0
        for payload, _, _ in self._read_disk(
            max(self._first_index, self._last_index + 1 - self.cache_entries_max), self._last_index + 1
        ):
            self._cache_push(payload)
        self.disk_reads = 0

    def _load_start(self) -> int:
        path = os.path.join(self.directory, "start")
        if not self._io.exists(path):
            return 0
        raw = self._io.read_all(path)
        if len(raw) != _START.size:
            raise JournalCorrupt(path, 0, f"{len(raw)} bytes, expected {_START.size}")
        magic, index, crc = _START.unpack(raw)
        if magic != _START_MAGIC or google_crc32c.value(struct.pack("<Q", index)) != crc:
            raise JournalCorrupt(path, 0, "bad magic or checksum")
        return index

    def _scan(self, path: str, first: int, synced_end: int | None, is_last: bool, restored: int = 0) -> _Segment:
        """Read one segment's records, checking each; at the end of the last segment, restore a
        damaged batch from its copy or cut a torn tail.

        ``synced_end``: the bytes of the last segment known synced (None: unknown, so all).
        """
        handle = self._io.open(path, create=False)
        runs_before = len(self._run_index)
        try:
            size = handle.size
            seg = _Segment(path, first, unsynced_max=self.unsynced_bytes_max)
            header = handle.pread(0, SEGMENT_HEADER_BYTES)
            fields = _segment_header_fields(header)
            if fields is None:
                if not is_last or synced_end != 0:
                    raise JournalCorrupt(path, 0, "bad segment header" + self._not_torn_because(is_last, synced_end))
                log.warning("journal %s: torn segment header (%d bytes), rewriting it", path, size)
                handle.truncate(0)
                handle.append(_segment_header(self.unsynced_bytes_max))
                handle.datasync()
                return seg
            magic, version, unsynced_max = fields
            if magic != _SEGMENT_MAGIC or version not in _SEGMENT_VERSIONS_READ:
                # A whole header (its checksum holds) is no torn write: never rewrite it.
                raise JournalCorrupt(path, 0, f"segment header of an unknown format (magic {magic!r}, version "
                                     f"{version}; this build reads {_SEGMENT_MAGIC!r} versions "
                                     f"{', '.join(map(str, _SEGMENT_VERSIONS_READ))})")
            seg.unsynced_max = unsynced_max
            seg.version = version
            marks = version >= _MARKS_SINCE_VERSION
            copies = version >= _COPIES_SINCE_VERSION
            ahead = version >= _COPIES_AHEAD_SINCE_VERSION
            offset = SEGMENT_HEADER_BYTES
            index = first
            chunk_bytes = 4 * 1024 * 1024
            buf = b""
            buf_at = offset
            offsets = seg.offsets
            run_index, run_term = self._run_index, self._run_term
            last_term = run_term[-1] if run_term else 0
            problem = ""
            while offset < size:
                rel = offset - buf_at
                if rel + RECORD_HEADER_BYTES > len(buf):
                    buf = handle.pread(offset, max(chunk_bytes, RECORD_HEADER_BYTES))
                    buf_at, rel = offset, 0
                    if len(buf) < RECORD_HEADER_BYTES:
                        problem = "incomplete record header"
                        break
                length, crc, term, idx = _RECORD.unpack_from(buf, rel)
                if length == _MARK_LENGTH and marks:
                    if rel + MARK_RECORD_BYTES > len(buf):
                        buf = handle.pread(offset, chunk_bytes)
                        buf_at, rel = offset, 0
                    if _mark_record_index(buf, rel, offset, first) != index - 1:
                        problem = "mark record fails its checks"
                        break
                    seg.marked = offset
                    offset += MARK_RECORD_BYTES
                    continue
                if length == _COPY_LENGTH and copies:
                    if rel + COPY_RECORD_BYTES > len(buf):
                        buf = handle.pread(offset, chunk_bytes)
                        buf_at, rel = offset, 0
                    fields = _copy_record_fields(buf, rel, offset, first, ahead)
                    if fields is None:
                        problem = "copy record fails its checks"
                        break
                    if ahead:  # the copy lies ahead of the records, read only to restore the batch
                        offset += COPY_RECORD_BYTES
                        continue
                    after = fields[0] + COPY_HEADER_BYTES + fields[1]
                    if after > size:
                        problem = "copy cut short"
                        break
                    offset = after  # the copy is read only to restore the batch before it
                    continue
                if length > PAYLOAD_BYTES_MAX:
                    problem = f"record length {length} beyond the limit"
                    break
                end = rel + RECORD_HEADER_BYTES + length
                if end > len(buf):
                    buf = handle.pread(offset, max(chunk_bytes, RECORD_HEADER_BYTES + length))
                    buf_at, rel = offset, 0
                    end = RECORD_HEADER_BYTES + length
                    if end > len(buf):
                        problem = "incomplete record"
                        break
                payload = buf[rel + RECORD_HEADER_BYTES : end]
                if _crc(length, term, idx, payload) != crc:
                    problem = "checksum mismatch"
                    break
                if idx != index:
                    problem = f"index {idx} where {index} was expected"
                    break
                if term < last_term:
                    problem = f"term {term} below the previous term {last_term}"
                    break
                if term != last_term or not run_term:
                    run_index.append(idx)
                    run_term.append(term)
                    last_term = term
                offsets.append(offset)
                offset += RECORD_HEADER_BYTES + length
                index += 1
            if problem:
                if not is_last or synced_end is None or offset < synced_end:
                    raise JournalCorrupt(path, offset, problem + self._not_torn_because(is_last, synced_end))
                zeros = self._zeros_at_end(handle, offset, size)
                if not self._may_be_torn(handle, offset, size - zeros, unsynced_max, marks, copies, ahead):
                    raise JournalCorrupt(
                        path, offset, f"{problem}, {size - offset} bytes before the end: more than the "
                        f"{unsynced_max} bytes that can be unsynced, so not a torn write"
                    )
                vouched = self._mark_record_after(handle, offset, size, first) if marks else None
                if vouched is not None:
                    raise JournalCorrupt(
                        path, offset, f"{problem} in synced data (the mark record at offset {vouched} says "
                        "the bytes before it were synced)"
                    )
                # Nothing after it vouches for the record: a torn write, or damage to the newest
                # batch a sync returned, which its copy (flushed with it) tells apart and undoes.
                found = None
                if copies and restored < _RESTORES_MAX:
                    found = self._copy_covering(handle, offset, size, first, ahead)
                if found is not None:
                    start, end, copy_at, data = found
                    log.warning("journal %s: %s at offset %d; bytes %d..%d restored from their copy at %d",
                                path, problem, offset, start, end, copy_at)
                    handle.pwrite(start, data)
                    handle.pwrite(end, _copy_record(first, end, copy_at, end - start))
                    handle.datasync()
                    del self._run_index[runs_before:]
                    del self._run_term[runs_before:]
                    return self._scan(path, first, synced_end, is_last, restored + 1)
                if zeros == size - offset:
                    log.info("journal %s: the %d bytes of zeros written ahead of the records cut at offset %d",
                             path, size - offset, offset)
                elif ahead and not any(handle.pread(offset, RECORD_HEADER_BYTES)):
                    log.info("journal %s: the %d bytes of zeros and copies written ahead of the records cut at "
                             "offset %d", path, size - offset, offset)
                else:
                    log.warning(
                        "journal %s: torn tail cut at offset %d (%d bytes dropped: %s%s)",
                        path, offset, size - offset, problem,
                        "; or what was written ahead of the records" if ahead else "",
                    )
                handle.truncate(offset)
                handle.datasync()
            elif is_last and synced_end is not None and offset < synced_end:
                raise JournalCorrupt(path, offset, f"segment ends, but its first {synced_end} bytes were synced")
            seg.size = offset
            return seg
        finally:
            handle.close()

    def _not_torn_because(self, is_last: bool, synced_end: int | None) -> str:
        """Why damage found in a segment cannot be a torn write (for :class:`JournalCorrupt`)."""
        if not is_last:
            return " in a sealed segment"
        if synced_end is None:
            return f" (the synced mark {self._mark_path} is unreadable: nothing can be taken for a torn write)"
        return f" in synced data (the segment is synced up to offset {synced_end})"

    @staticmethod
    def _mark_record_after(handle: FileHandle, offset: int, size: int, segment: int) -> int | None:
        """The offset of a valid mark record past ``offset`` in the segment, if there is one.

        The records after a bad one cannot be walked (its length may be what is damaged), so
        the bytes are searched for the mark records' magic; only a record whose checksum holds
        and that names its own offset counts.
        """
        step = 4 * 1024 * 1024
        base = offset + 1
        while base + MARK_RECORD_BYTES <= size:
            buf = handle.pread(base, step + MARK_RECORD_BYTES - 1)
            magic_at = 8  # the magic follows the length sentinel and the CRC
            found = buf.find(_MARK_RECORD_MAGIC, magic_at)
            while 0 <= found and found - magic_at < step:
                at = found - magic_at
                if _mark_record_index(buf, at, base + at, segment) is not None:
                    return base + at
                found = buf.find(_MARK_RECORD_MAGIC, found + 1)
            base += step
        return None

    @staticmethod
    def _zeros_at_end(handle: FileHandle, offset: int, size: int) -> int:
        """How many of the file's last bytes after ``offset`` are zeros, up to
        :data:`ZEROS_AHEAD_BYTES` (what the writer may have put ahead of its records)."""
        n = min(ZEROS_AHEAD_BYTES, size - offset)
        if n <= 0:
            return 0
        tail = handle.pread(size - n, n)
        return len(tail) - len(tail.rstrip(b"\0"))

    @staticmethod
    def _copy_covering(handle: FileHandle, offset: int, size: int, segment: int,
                       ahead: bool) -> tuple[int, int, int, bytes] | None:
        """``(start, end, copy_at, data)`` of a whole copy past ``offset`` of bytes ``start``..
        ``end`` with ``start <= offset <= end`` (the damage is in the batch or its copy record),
        or None. Copies begin on 4 KiB boundaries within reach of the batch they copy: right
        after it (``ahead`` False, version 4) or up to :data:`_COPY_AHEAD_MAX` past that."""
        first = -(-(offset + 1) // COPY_ALIGN) * COPY_ALIGN
        last = min(size - COPY_HEADER_BYTES,
                   _copy_at(offset + COPY_BYTES_MAX) + (_COPY_AHEAD_MAX if ahead else 0))
        if first > last:
            return None
        buf = handle.pread(first, last - first + COPY_HEADER_BYTES + COPY_BYTES_MAX)
        for copy_at in range(first, last + 1, COPY_ALIGN):
            at = copy_at - first
            if buf[at : at + len(_COPY_MAGIC)] != _COPY_MAGIC:
                continue
            fields = _copy_block_fields(buf, at, copy_at, segment)
            if fields is not None and fields[0] <= offset <= fields[1] and _copy_place_valid(copy_at, fields[1], ahead):
                return fields[0], fields[1], copy_at, fields[2]
        return None

    @staticmethod
    def _may_be_torn(handle: FileHandle, offset: int, size: int, unsynced_max: int, marks: bool,
                     copies: bool, ahead: bool) -> bool:
        """Could the bytes from ``offset`` to the end be a write a power cut interrupted?

        Only the unsynced tail can be torn, and it is at most ``unsynced_max``
        bytes or a single record (an append larger than the bound syncs what
        came before it, and writes the record after a mark record), in which
        case the bad record reaches the end of file (``size``: where the zeros
        written ahead of the records begin, if the file ends with them). With
        ``copies``, the batch's copy record and copy may follow it; ``ahead``
        (version 5), copies of it and of the batch before lie up to
        :data:`_COPY_AHEAD_MAX` further.
        """
        if ahead:
            slack = (COPY_RECORD_BYTES + MARK_RECORD_BYTES + 2 * COPY_ALIGN + _COPY_AHEAD_MAX
                     + COPY_HEADER_BYTES + COPY_BYTES_MAX)
            if size - offset <= unsynced_max + slack:
                return True
        else:
            slack = COPY_RECORD_BYTES + COPY_ALIGN + COPY_HEADER_BYTES + MARK_RECORD_BYTES if copies else 0
            if size - offset <= unsynced_max * (2 if copies else 1) + slack:
                return True
        header = handle.pread(offset, MARK_RECORD_BYTES + RECORD_HEADER_BYTES)
        if marks and len(header) >= RECORD_HEADER_BYTES and _RECORD.unpack_from(header)[0] == _MARK_LENGTH:
            offset += MARK_RECORD_BYTES
            header = header[MARK_RECORD_BYTES:]
        if len(header) < RECORD_HEADER_BYTES:
            return True
        length = _RECORD.unpack_from(header)[0]
        if length > PAYLOAD_BYTES_MAX:
            return False
        reach = RECORD_HEADER_BYTES + length
        if ahead:
            return offset + reach + slack >= size
        return offset + reach + (reach + slack if copies else 0) >= size

    # ------------------------------------------------------------------ term, vote, commit hint
    def store_term_vote(self, term: int, vote: str | None) -> None:
        """Make term and vote durable before returning (Raft §5.1), with the commit hint."""
        self.meta.store(term, vote, self._stored_commit_hint())

    def set_commit_hint(self, index: int) -> None:
        """Remember how far the log is known committed; stored by :meth:`store_commit_hint`
        (and with every term or vote), never past what is synced."""
        self._commit_index = index

    @property
    def commit_hint(self) -> int:
        """How far the log was known committed, never past the journal's end (0: nothing known)."""
        return max(0, min(self._commit_index, self._last_index))

    def _stored_commit_hint(self) -> int:
        # A commit hint past what is synced could outlive the entries after a power cut.
        hint = min(self._commit_index, self._synced_index) if self._synced_index else self._commit_stored
        self._commit_stored = hint
        return hint

    def store_commit_hint(self) -> None:
        """Store the commit hint now if it changed (durably; see :mod:`.meta`).

        Each store is two fsyncs (file and directory) that force a file-system journal
        commit, which the journals' own fdatasyncs then wait behind; the hint only saves a
        restarted replica from waiting for its leader before applying, so the replica
        stores it only now and then.
        """
        if min(self._commit_index, self._synced_index) != self._commit_stored:
            state = self.meta.state
            self.meta.store(state.term, state.voted_for, self._stored_commit_hint())


class SyncBatcher:
    """Coalesces the syncs of every journal that wrote in one loop iteration.

    Shoal keeps one journal per partition (a partition's log is read back and
    compacted on its own), so a node-wide single fdatasync is not possible;
    instead each journal that wrote calls :meth:`mark`, and the node calls
    :meth:`sync_all` once per loop iteration, after the iteration's writes and
    before any reply leaves. Each dirty journal is synced once however many
    entries it got. ``sync_all`` runs the fdatasyncs one after the other; the
    kernel (ext4's jbd2) may merge concurrent ones, which
    :meth:`sync_all_threads` exploits — see docs/benchmarks.md for both.
    """

    def __init__(self) -> None:
        self._dirty: dict[int, Journal] = {}
        self._lazy: dict[int, Journal] = {}
        self._leader: dict[int, Journal] = {}

    def mark(self, journal: Journal) -> None:
        """``journal`` wrote something not yet synced."""
        self._dirty[id(journal)] = journal

    def mark_leader(self, journal: Journal) -> None:
        """``journal`` took a leader's entry: sync it once the entry is sent (:meth:`sync_leader`)."""
        self._leader[id(journal)] = journal

    @property
    def pending_leader(self) -> int:
        """Journals waiting for :meth:`sync_leader`."""
        return len(self._leader)

    def sync_leader(self, executor: Executor | None = None) -> dict[Journal, int]:
        """Sync each journal that took a leader's entry (concurrently on ``executor`` if given)."""
        dirty, self._leader = self._leader, {}
        journals = [j for j in dirty.values() if j.dirty]
        if executor is None or len(journals) < 2:
            return {j: j.sync() for j in journals}
        return dict(zip(journals, executor.map(Journal.sync, journals), strict=True))

    def mark_lazy(self, journal: Journal) -> None:
        """``journal`` wrote something that may wait for :meth:`sync_lazy` (the disk class)."""
        self._lazy[id(journal)] = journal

    def sync_lazy(self) -> int:
        """Sync every journal holding lazily written data that no sync covered since; return how many."""
        lazy, self._lazy = self._lazy, {}
        done = 0
        for journal in lazy.values():
            if journal.dirty:
                journal.sync()
                done += 1
        return done

    @property
    def pending(self) -> int:
        """Journals waiting for a sync."""
        return len(self._dirty)

    def unsynced(self) -> int:
        """Journals holding written data that no sync has covered yet, whatever their class."""
        marked = {**self._dirty, **self._lazy, **self._leader}
        return sum(1 for journal in marked.values() if journal.dirty)

    def sync_all(self) -> dict[Journal, int]:
        """Sync each dirty journal once; map each to its new durable index."""
        dirty, self._dirty = self._dirty, {}
        return {j: j.sync() for j in dirty.values()}

    def sync_all_threads(self, executor: Executor) -> dict[Journal, int]:
        """Like :meth:`sync_all`, with the fdatasyncs issued concurrently on ``executor``.

        fdatasync releases the GIL, and ext4 commits concurrent ones together.
        No journal may be written to or truncated while this runs.
        """
        dirty, self._dirty = self._dirty, {}
        journals = list(dirty.values())
        results = list(executor.map(Journal.sync, journals))
        return dict(zip(journals, results, strict=True))
