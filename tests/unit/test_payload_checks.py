"""Checksums of payload files: a changed byte anywhere on the disk is named (file, offset) when
read, never handed out as job data and never copied by a compaction; the node is told."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shoal.node.payload_checks import BLOCK_BYTES, BlockChecks, PayloadDamaged, read_checked
from shoal.node.partition.payload_files import FileSpace
from damage import flip_byte


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.integers(1, 3 * BLOCK_BYTES), min_size=1, max_size=8), data=st.data())
def test_a_changed_byte_fails_every_read_of_its_block_and_no_other(tmp_path_factory: Any, writes: list[int],
                                                                   data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("checks") / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        checks, at, content = BlockChecks(), 0, bytearray()
        for n in writes:
            blob = os.urandom(n)
            os.pwrite(fd, blob, at)
            checks.wrote(at, blob)
            content += blob
            at += n
        flipped = data.draw(st.integers(0, at - 1), label="flipped")
        start = data.draw(st.integers(0, at - 1), label="start")
        end = data.draw(st.integers(start + 1, at), label="end")
        assert read_checked(fd, path, checks, start, end) == content[start:end]
        flip_byte(path, flipped)
        block = flipped // BLOCK_BYTES
        if start // BLOCK_BYTES <= block <= (end - 1) // BLOCK_BYTES:
            with pytest.raises(PayloadDamaged) as caught:
                read_checked(fd, path, checks, start, end)
            assert caught.value.offset == block * BLOCK_BYTES and str(path) in str(caught.value)
        else:
            assert read_checked(fd, path, checks, start, end) == content[start:end]
    finally:
        os.close(fd)


def test_blocks_a_failed_write_left_are_not_checked(tmp_path: Path) -> None:
    checks = BlockChecks()
    checks.wrote(0, b"a" * 100)
    checks.wrote(BLOCK_BYTES + 10, b"b" * 100)    # bytes 100 .. BLOCK_BYTES + 10 were not written
    assert checks.unknown == {0, 1}
    checks.wrote(BLOCK_BYTES + 110, b"c" * 2 * BLOCK_BYTES)
    assert checks.unknown == {0, 1} and checks.written == 3 * BLOCK_BYTES + 110
    with pytest.raises(ValueError, match="goes back"):
        checks.wrote(5, b"x")


def _space_with_jobs(tmp_path: Path, told: list[OSError], jobs: int = 40, size: int = 1000) -> FileSpace:
    space = FileSpace(tmp_path / "s", file_bytes=1 << 20, buffer_bytes=1, read_ahead=4096,
                      on_damage=told.append)
    for k in range(jobs):
        space.append(bytes([k]) * size)
    space.flush()
    return space


def test_a_damaged_block_is_named_counted_and_told(tmp_path: Path) -> None:
    told: list[OSError] = []
    space = _space_with_jobs(tmp_path, told)
    flip_byte(space.directory / "00000000.pay", 25_000)
    with pytest.raises(PayloadDamaged, match=r"payload file .*00000000\.pay: the 16384 bytes at offset 16384 "
                                             r"fail their checksum"):
        space.read(25_000, 26_000)
    assert space.read(1000, 2000) == bytes([1]) * 1000   # another block reads back
    # Told of every read that failed: the one with the read-ahead, then the job's own bytes.
    assert space.stats()["readErrors"] == len(told) == 2 and isinstance(told[0], PayloadDamaged)


def test_a_file_cut_short_is_told(tmp_path: Path) -> None:
    told: list[OSError] = []
    space = _space_with_jobs(tmp_path, told)
    os.truncate(space.directory / "00000000.pay", 20_000)
    with pytest.raises(OSError, match="could not be read"):
        space.read(30_000, 31_000)
    assert told and len(told) == space.stats()["readErrors"]


def test_a_compaction_never_copies_a_damaged_block(tmp_path: Path) -> None:
    """The copy would get checksums of its own, vouching for the damaged bytes."""
    told: list[OSError] = []
    space = FileSpace(tmp_path / "s", file_bytes=100_000, buffer_bytes=1, on_damage=told.append)
    for k in range(200):                       # files 0 and 1
        space.append(bytes([k]) * 1000)
    for k in range(100):
        if k % 10:
            space.release(k * 1000, k * 1000 + 1000)   # file 0 keeps jobs 0, 10, .., 90
    space.collect()
    flip_byte(space.directory / "00000000.pay", 50_500)    # job 50's bytes
    space.collect()                                    # starts compacting file 0
    for _ in range(100):
        if not space.compact():
            break
    assert space.compactions == 0 and told and isinstance(told[0], PayloadDamaged)
    assert sorted(os.listdir(space.directory)) == ["00000000.pay", "00000001.pay"]
    assert space.read(10_000, 11_000) == bytes([10]) * 1000
    with pytest.raises(PayloadDamaged):
        space.read(50_000, 51_000)


def test_a_compacted_file_is_checked_too(tmp_path: Path) -> None:
    told: list[OSError] = []
    space = FileSpace(tmp_path / "s", file_bytes=100_000, buffer_bytes=1, on_damage=told.append)
    for k in range(200):
        space.append(bytes([k]) * 1000)
    for k in range(100):
        if k % 10:
            space.release(k * 1000, k * 1000 + 1000)
    for _ in range(2):
        space.collect()
        for _ in range(100):
            if not space.compact():
                break
    assert space.compactions == 1 and "00000000.1.pay" in os.listdir(space.directory)
    assert space.read(90_000, 91_000) == bytes([90]) * 1000
    flip_byte(space.directory / "00000000.1.pay", 100)     # job 0's copy
    with pytest.raises(PayloadDamaged, match=r"00000000\.1\.pay"):
        space.read(0, 1000)
    assert told


def test_a_file_written_out_of_order_goes_unchecked_and_the_write_stands(tmp_path: Path) -> None:
    space = FileSpace(tmp_path / "s", file_bytes=1 << 20, buffer_bytes=1)
    space.append(b"a" * 100)
    space._pwrite(10, b"b" * 10)  # noqa: SLF001 - no path of the space does this; were one to, no apply fails
    assert space.read(0, 30) == b"a" * 10 + b"b" * 10 + b"a" * 10
    space.append(b"c" * 100)
    assert space.read(100, 200) == b"c" * 100
