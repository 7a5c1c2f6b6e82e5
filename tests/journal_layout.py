"""Reading a journal segment's bytes in tests: its records, and where each batch's copy lies."""

from __future__ import annotations

import struct

from shoal.node.raft.journal import (
    COPY_HEADER_BYTES,
    COPY_RECORD_BYTES,
    MARK_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    encode_record,
)

MARK = 0xFFFFFFFF
COPY = 0xFFFFFFFE


def version(raw: bytes) -> int:
    """The format version in a segment's header (0 without one)."""
    return struct.unpack_from("<I", raw, 8)[0] if len(raw) >= SEGMENT_HEADER_BYTES else 0


def layout(raw: bytes) -> list[tuple[str, int, int]]:
    """``(kind, offset, index)`` of the whole records of a segment's bytes, in order: entries
    with their index, mark records with the index they name, copy records with the index of the
    entry before them."""
    out: list[tuple[str, int, int]] = []
    ahead = version(raw) >= 5  # copies lie ahead of the records, not after their copy record
    offset = SEGMENT_HEADER_BYTES
    last = 0
    while offset + RECORD_HEADER_BYTES <= len(raw):
        length, crc, term, index = struct.unpack_from("<IIQQ", raw, offset)
        if length == crc == 0:  # zeros written ahead of the records
            break
        if length in (MARK, COPY) and struct.unpack_from("<Q", raw, offset + 16)[0] != offset:
            break  # a mark or copy record names its own offset: this one is an old copy's
        if length == MARK:
            if offset + MARK_RECORD_BYTES > len(raw):
                break
            out.append(("mark", offset, struct.unpack_from("<Q", raw, offset + 24)[0]))
            offset += MARK_RECORD_BYTES
            continue
        if length == COPY:
            if offset + COPY_RECORD_BYTES > len(raw):
                break
            copy_at, copied = struct.unpack_from("<QQ", raw, offset + 24)
            out.append(("copy", offset, last))
            offset = offset + COPY_RECORD_BYTES if ahead else copy_at + COPY_HEADER_BYTES + copied
            continue
        end = offset + RECORD_HEADER_BYTES + length
        body = bytes(raw[offset + RECORD_HEADER_BYTES : end])
        if end > len(raw) or encode_record(index, term, body) != raw[offset:end]:
            break  # torn, or bytes written ahead of the records (zeros, an old copy)
        if last and index != last + 1:
            break  # an old copy's records
        out.append(("entry", offset, index))
        last = index
        offset += RECORD_HEADER_BYTES + length
    return out


def records_end(raw: bytes) -> int:
    """Where the segment's whole records end (what follows: zeros, copies, a torn write)."""
    kinds = {"entry": None, "mark": MARK_RECORD_BYTES, "copy": COPY_RECORD_BYTES}
    items = layout(raw)
    if not items:
        return SEGMENT_HEADER_BYTES
    kind, offset, _ = items[-1]
    if kind == "entry":
        return offset + RECORD_HEADER_BYTES + struct.unpack_from("<I", raw, offset)[0]
    return offset + kinds[kind]


def entry_offset(raw: bytes, index: int) -> int:
    """Where entry ``index`` begins."""
    (offset,) = [o for kind, o, i in layout(raw) if kind == "entry" and i == index]
    return offset


def copy_of(raw: bytes, at: int) -> int | None:
    """Where the copy of the byte at ``at`` lies, if a copy record follows its batch and the
    copy is still in the file."""
    for kind, offset, _ in layout(raw):
        if kind == "copy" and offset > at:
            copy_at, copied = struct.unpack_from("<QQ", raw, offset + 24)
            start = offset - copied
            where = copy_at + COPY_HEADER_BYTES + at - start
            return where if start <= at and where < len(raw) else None
    return None
