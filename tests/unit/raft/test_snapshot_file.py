"""Snapshot files: streamed in and out, durable (fsync, rename, directory fsync) before compaction."""

from __future__ import annotations

import os

import pytest

from shoal.node.raft._io import NoSpace, RealIO, SimIO
from shoal.node.raft.journal import Journal
from shoal.node.raft.snapshot_file import (
    SnapshotCorrupt,
    SnapshotInfo,
    SnapshotWriter,
    compaction_point,
    read_snapshot,
    read_snapshot_info,
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
