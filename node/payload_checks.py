"""Checksums of payload files: a CRC32C per 16 KiB block, kept in memory and checked on every
read from the disk.

Payload files are never synced and a restart rebuilds them from the snapshot and the journal,
which carry their own checksums; what these guard against is damage while the node runs: a block
the disk gives back changed, a file cut short or written over by something else. Without them a
pull would hand such bytes to a consumer as its job's data, and a snapshot would copy them into a
file whose checksums then vouch for them.

A file is written from its start in order (appends, or a compaction's copy), so each block's
CRC32C is extended as its bytes are written, and a read takes the whole blocks around the bytes
asked for (a pull reads 64 KiB ahead anyway) and checks each one. A block that a failed write
left unknown (the disk full: the bytes stayed in memory) is not checked. The cost is 4 bytes of
memory per block, 256 KiB per GiB of job data held, and about 4 µs of CPU per 64 KiB read.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import google_crc32c

__all__ = ["BLOCK_BYTES", "BlockChecks", "PayloadDamaged", "read_checked"]

#: Bytes covered by one checksum.
BLOCK_BYTES = 16 << 10


class PayloadDamaged(OSError):
    """Bytes of a payload file fail their checksum; names the file and the block's offset in it."""

    def __init__(self, path: Path, offset: int, length: int) -> None:
        super().__init__(f"payload file {path}: the {length} bytes at offset {offset} fail their checksum")
        self.path = path
        self.offset = offset


class BlockChecks:
    """The CRC32C of each block of one file, written from its start in order (:meth:`wrote`)."""

    __slots__ = ("crcs", "written", "unknown")

    def __init__(self) -> None:
        self.crcs = array("I")
        self.written = 0                  # bytes of the file the checksums cover, or skip
        self.unknown: set[int] = set()    # blocks a failed write left: not checked

    def wrote(self, at: int, data: bytes | bytearray | memoryview) -> None:
        """``data`` was written at ``at``, at or past every byte written before (a gap is a
        failed write's: its blocks are not checked)."""
        if at < self.written:
            raise ValueError(f"payload checks: a write at {at} goes back before {self.written}")
        view = memoryview(data)
        if at > self.written:
            self._skip(at)
        crcs, done, total = self.crcs, 0, len(view)
        while done < total:
            k, into = divmod(at + done, BLOCK_BYTES)
            n = min(BLOCK_BYTES - into, total - done)
            piece = bytes(view[done:done + n])  # one copy per block: google_crc32c takes bytes, not views
            if into:
                crcs[k] = google_crc32c.extend(crcs[k], piece)
            else:
                crcs.append(google_crc32c.value(piece))
            done += n
        self.written = at + total

    def _skip(self, at: int) -> None:
        """Bytes ``written .. at`` are not known: every block they touch goes unchecked."""
        first, last = self.written // BLOCK_BYTES, (at - 1) // BLOCK_BYTES
        self.unknown.update(range(first, last + 1))
        while len(self.crcs) <= last:
            self.crcs.append(0)
        self.written = at

    def check(self, at: int, data: bytes, path: Path) -> None:
        """``data`` was read at block boundary ``at``: raise :class:`PayloadDamaged` at the first
        block in it that fails its checksum (bytes past what was written are not checked)."""
        crcs, unknown, written = self.crcs, self.unknown, self.written
        upto = min(at + len(data), written)
        pos = at
        while pos < upto:
            end = min(pos + BLOCK_BYTES, upto)
            k = pos // BLOCK_BYTES
            # A block cut short by the read's end is not checked: the caller sees the short read.
            if k not in unknown and (end - pos == BLOCK_BYTES or end == written):
                if google_crc32c.value(data[pos - at:end - at]) != crcs[k]:
                    raise PayloadDamaged(path, pos, end - pos)
            pos = end


def read_checked(fd: int, path: Path, checks: BlockChecks | None, start: int, end: int) -> bytes:
    """Bytes ``start .. end`` of file ``fd`` (fewer at its end), read with the whole blocks around
    them and checked against ``checks`` (None: not checked)."""
    if checks is None:
        return os.pread(fd, end - start, start)
    lo = start - start % BLOCK_BYTES
    hi = max(end, min(-(-end // BLOCK_BYTES) * BLOCK_BYTES, checks.written))
    data = os.pread(fd, hi - lo, lo)
    checks.check(lo, data, path)
    return data[start - lo:end - lo]
