"""Snapshot files: streamed in and out, durable (fsync, rename, directory fsync) before compaction."""

from __future__ import annotations

import os
import struct

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.raft._io import NoSpace, RealIO, SimIO
from shoal.node.raft.journal import Journal
from shoal.node.raft.snapshot_file import (
    HEADER_BYTES,
    TRAILER_BYTES,
    SnapshotChecker,
    SnapshotCorrupt,
    SnapshotInfo,
    SnapshotWriter,
    compaction_point,
    file_crc32c,
    read_snapshot,
    read_snapshot_info,
    verify_snapshot,
    write_snapshot,
)


def chunks(n: int, size: int = 1000, tag: bytes = b"n") -> list[bytes]:
    return [tag + bytes([k % 256]) * (size - 1) for k in range(n)]


def test_write_and_stream_back(tmp_path) -> None:
    io = RealIO(disk_free_min_bytes=0)
    path = str(tmp_path / "snap")
    info = write_snapshot(io, path, 42, 3, iter(chunks(50)))
    assert (info.last_index, info.last_term, info.content_bytes, info.durable) == (42, 3, 50_000, True)
    assert read_snapshot_info(io, path) == info
    assert b"".join(read_snapshot(io, path, chunk_bytes=4096)) == b"".join(chunks(50))
    assert not os.path.exists(path + ".tmp")


def test_damage_is_reported_with_file_and_offset(tmp_path) -> None:
    io = RealIO(disk_free_min_bytes=0)
    path = tmp_path / "snap"
    write_snapshot(io, str(path), 1, 1, chunks(10))
    raw = bytearray(path.read_bytes())
    raw[500] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotCorrupt, match=f"{path}: content checksum mismatch"):
        b"".join(read_snapshot(io, str(path)))
    path.write_bytes(bytes(raw[:-10]))
    with pytest.raises(SnapshotCorrupt, match="bad trailer at offset"):
        read_snapshot_info(io, str(path))


class _Cut(Exception):
    pass


def test_power_cut_after_each_step_leaves_the_old_or_the_new_snapshot() -> None:
    steps_total = None
    for cut_after in range(1, 40):
        io = SimIO()
        write_snapshot(io, "/s/snap", 10, 1, chunks(3, tag=b"o"))
        count = [0]

        def hook(what: str) -> None:
            count[0] += 1
            if count[0] == cut_after:
                raise _Cut(what)

        io.step_hook = hook
        finished = False
        try:
            writer = SnapshotWriter(io, "/s/snap", 20, 2)
            for c in chunks(5, tag=b"N"):
                writer.write(c)
            writer.finish()
            finished = True
        except _Cut:
            pass
        io.step_hook = None
        io.power_cut()
        info = read_snapshot_info(io, "/s/snap")
        content = b"".join(read_snapshot(io, "/s/snap"))
        if info.last_index == 10:
            assert content == b"".join(chunks(3, tag=b"o"))
        else:
            assert info.last_index == 20 and content == b"".join(chunks(5, tag=b"N"))
        if finished:
            assert info.last_index == 20, "finish() returned before the snapshot was durable"
            steps_total = cut_after
            break
    assert steps_total is not None


def test_the_journal_prefix_is_dropped_only_after_the_snapshot_is_durable() -> None:
    io = SimIO()
    j = Journal(io, "/p/journal", segment_bytes=1_000)
    for i in range(1, 101):
        j.append(i, 1, b"x" * 50)
    j.sync()
    with pytest.raises(ValueError, match="not yet durable"):
        compaction_point(SnapshotInfo("/p/snap", 80, 1, 0, 0, durable=False))
    info = write_snapshot(io, "/p/snap", 80, 1, chunks(2))
    j.delete_to(compaction_point(info))
    assert j.first_index == 80 and j.term_at(80) == 1
    io.power_cut()
    j = Journal(io, "/p/journal", segment_bytes=1_000)
    assert read_snapshot_info(io, "/p/snap").last_index == 80
    assert j.first_index == 80 and j.last_index == 100


def test_a_full_disk_aborts_the_snapshot_and_keeps_the_old_one() -> None:
    io = SimIO()
    write_snapshot(io, "/s/snap", 5, 1, chunks(2, tag=b"o"))
    io.capacity_bytes = io.used_bytes() + 3_000
    with pytest.raises(NoSpace):
        write_snapshot(io, "/s/snap", 9, 1, chunks(10))
    assert not io.exists("/s/snap.tmp")
    assert read_snapshot_info(io, "/s/snap").last_index == 5


# --- verifying a whole file, and checking one as its chunks arrive ----------------------------


def _snapshot(io, path: str = "/s/snap", content: bytes = bytes(range(256)) * 3) -> bytes:
    write_snapshot(io, path, 77, 5, [content[:100], content[100:]])
    return io.read_all(path)


def test_verify_checks_header_trailer_and_content() -> None:
    io = SimIO()
    raw = _snapshot(io)
    info = verify_snapshot(io, "/s/snap", chunk_bytes=100)
    assert info == read_snapshot_info(io, "/s/snap")
    assert (info.last_index, info.last_term, info.content_bytes) == (77, 5, 768)
    assert file_crc32c(io, "/s/snap", chunk_bytes=50) == google_crc32c.value(raw)


def test_every_flipped_bit_is_refused_with_the_file_and_where() -> None:
    """Header (its last index and term too), content and trailer: no single flipped bit passes."""
    io = SimIO()
    raw = _snapshot(io, content=b"x" * 100)
    size = len(raw)
    for at in range(size):
        for bit in (0, 5):
            damaged = bytearray(raw)
            damaged[at] ^= 1 << bit
            io.write_atomic("/s/bad", [bytes(damaged)])
            with pytest.raises(SnapshotCorrupt) as err:
                verify_snapshot(io, "/s/bad", chunk_bytes=7)
            expected = 0 if at < HEADER_BYTES else HEADER_BYTES if at < size - TRAILER_BYTES else size - TRAILER_BYTES
            assert (err.value.path, err.value.offset) == ("/s/bad", expected), (at, bit, str(err.value))
            assert str(err.value).startswith("/s/bad: ") and f"at offset {expected}" in str(err.value)


def test_a_damaged_last_index_in_the_header_is_caught_without_reading_the_content() -> None:
    io = SimIO()
    raw = bytearray(_snapshot(io))
    raw[16] ^= 0x01  # the last index
    io.write_atomic("/s/snap", [bytes(raw)])
    with pytest.raises(SnapshotCorrupt, match="header checksum mismatch") as err:
        read_snapshot_info(io, "/s/snap")
    assert err.value.offset == 0


def test_version_1_files_with_an_unchecked_header_are_still_read() -> None:
    io = SimIO()
    content = b"old format"
    crc = google_crc32c.value(content)
    fields = struct.pack("<QI", len(content), crc)
    raw = (struct.pack("<8sIIQQ", b"SHOALSNP", 1, 0, 9, 2) + content
           + struct.pack("<QII8s", len(content), crc, google_crc32c.value(fields), b"SNPEND\0\0"))
    io.write_atomic("/s/v1", [raw])
    info = verify_snapshot(io, "/s/v1")
    assert (info.last_index, info.last_term, info.content_bytes) == (9, 2, len(content))
    assert b"".join(read_snapshot(io, "/s/v1")) == content


def test_verify_reads_in_bounded_chunks(monkeypatch) -> None:
    from shoal.node.raft import _io

    io = SimIO()
    _snapshot(io, content=b"y" * 10_000)
    reads: list[int] = []
    real_pread = _io._SimFile.pread
    monkeypatch.setattr(_io._SimFile, "pread", lambda self, offset, size: (reads.append(size), real_pread(self, offset, size))[1])
    verify_snapshot(io, "/s/snap", chunk_bytes=512)
    assert reads and max(reads) <= 512


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(0, 700), max_size=12), st.integers(-1, 700))
def test_the_checker_fed_in_any_chunks_agrees_with_verify(content: bytes, cuts: list[int], flip: int) -> None:
    io = SimIO()
    raw = bytearray(_snapshot(io, content=content))
    if 0 <= flip < len(raw):
        raw[flip] ^= 0x40
        io.write_atomic("/s/snap", [bytes(raw)])
    try:
        expected: SnapshotInfo | int | None = verify_snapshot(io, "/s/snap", chunk_bytes=64)
    except SnapshotCorrupt as exc:
        expected = exc.offset
    checker = SnapshotChecker("/s/snap")
    bounds = sorted({0, len(raw), *(c for c in cuts if c < len(raw))})
    try:
        for a, b in zip(bounds, bounds[1:]):
            checker.update(bytes(raw[a:b]))
        got: SnapshotInfo | int | None = checker.finish()
    except SnapshotCorrupt as exc:
        assert exc.path == "/s/snap"
        got = exc.offset
    assert got == expected
    assert checker.file_crc32c == google_crc32c.value(bytes(raw)) or checker.offset < len(raw)  # header refused early


def test_a_transfer_resumed_from_the_file_on_disk_checks_the_same() -> None:
    io = SimIO()
    raw = _snapshot(io, content=b"z" * 5_000)
    io.write_atomic("/r/partial", [raw[:3_000]])  # what a receiver wrote before it stopped
    checker = SnapshotChecker("/r/partial")
    checker.update_from_file(io, "/r/partial", chunk_bytes=700)
    assert checker.offset == 3_000
    checker.update(raw[3_000:4_000])
    checker.update(raw[4_000:])
    info, whole = checker.finish(), verify_snapshot(io, "/s/snap")
    assert (info.path, info.last_index, info.crc32c, info.content_bytes) == (
        "/r/partial", whole.last_index, whole.crc32c, whole.content_bytes)
    assert checker.file_crc32c == file_crc32c(io, "/s/snap")


def test_a_short_or_foreign_stream_is_refused() -> None:
    io = SimIO()
    raw = _snapshot(io)
    short = SnapshotChecker("/r/snap")
    short.update(raw[:-1])
    with pytest.raises(SnapshotCorrupt, match="bad trailer") as err:
        short.finish()
    assert err.value.offset == len(raw) - 1 - TRAILER_BYTES
    tiny = SnapshotChecker("/r/snap")
    tiny.update(raw[:10])
    with pytest.raises(SnapshotCorrupt, match="too short"):
        tiny.finish()
    foreign = SnapshotChecker("/r/snap")
    with pytest.raises(SnapshotCorrupt, match="bad header") as err:
        foreign.update(b"<html>" + bytes(100))  # refused at the first chunk
    assert err.value.offset == 0
