"""Reading a journal segment's bytes in tests: its records, and where each batch's copy lies."""

from __future__ import annotations

import struct

from shoal.node.raft.journal import (
    COPY_HEADER_BYTES,
    COPY_RECORD_BYTES,
    MARK_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
)

MARK = 0xFFFFFFFF
COPY = 0xFFFFFFFE


def layout(raw: bytes) -> list[tuple[str, int, int]]:
    """``(kind, offset, index)`` of the whole records of a segment's bytes, in order: entries
    with their index, mark records with the index they name, copy records with the index of the
    entry before them."""
    out: list[tuple[str, int, int]] = []
    offset = SEGMENT_HEADER_BYTES
    last = 0
    while offset + RECORD_HEADER_BYTES <= len(raw):
        length, crc, _, index = struct.unpack_from("<IIQQ", raw, offset)
        if length == crc == 0:  # zeros written ahead of the records
            break
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
            offset = copy_at + COPY_HEADER_BYTES + copied
            continue
        if offset + RECORD_HEADER_BYTES + length > len(raw):
            break
        out.append(("entry", offset, index))
        last = index
        offset += RECORD_HEADER_BYTES + length
    return out


def entry_offset(raw: bytes, index: int) -> int:
    """Where entry ``index`` begins."""
    (offset,) = [o for kind, o, i in layout(raw) if kind == "entry" and i == index]
    return offset


def copy_of(raw: bytes, at: int) -> int | None:
    """Where the copy of the byte at ``at`` lies, if a copy record follows its batch."""
    for kind, offset, _ in layout(raw):
        if kind == "copy" and offset > at:
            copy_at, copied = struct.unpack_from("<QQ", raw, offset + 24)
            start = offset - copied
            return copy_at + COPY_HEADER_BYTES + at - start if start <= at else None
    return None
