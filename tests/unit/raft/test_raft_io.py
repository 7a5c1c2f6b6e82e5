"""The I/O layer: real files and the simulated disk's power cuts and full disk."""

from __future__ import annotations

import os
import random
import threading

import pytest
from waiting import eventually

from shoal.node.raft._io import NoSpace, PowerCut, RealIO, SimIO


def test_sim_power_cut_keeps_synced_bytes_and_durable_names_only() -> None:
    io = SimIO()
    f = io.open("/d/a")
    f.append(b"hello")
    f.datasync()
    f.append(b" world")
    io.fsync_dir("/d")
    g = io.open("/d/b")
    g.append(b"never named durably")
    g.datasync()
    io.power_cut()
    assert io.read_all("/d/a") == b"hello"
    assert not io.exists("/d/b")
    with pytest.raises(PowerCut):
        f.append(b"x")


def test_sim_torn_tail_is_a_prefix_of_the_unsynced_bytes_or_zeros() -> None:
    for seed in range(50):
        io = SimIO()
        f = io.open("/d/a")
        io.fsync_dir("/d")
        f.append(b"A" * 10)
        f.datasync()
        f.append(b"B" * 100)
        io.power_cut(random.Random(seed))
        data = io.read_all("/d/a")
        assert data.startswith(b"A" * 10) and len(data) <= 110
        assert set(data[10:]) <= {ord("B"), 0}


def test_sim_rename_and_unlink_revert_without_a_directory_fsync() -> None:
    io = SimIO()
    io.write_atomic("/d/m", [b"old"])
    t = io.open("/d/m.tmp")
    t.append(b"new")
    t.fsync()
    io.rename("/d/m.tmp", "/d/m")
    io.unlink("/d/gone")
    io.power_cut()
    assert io.read_all("/d/m") == b"old"


def test_sim_damage_reaches_synced_bytes_and_outlives_a_power_cut() -> None:
    io = SimIO()
    f = io.open("/d/a")
    io.fsync_dir("/d")
    f.append(b"abcdef")
    f.datasync()
    f.append(b"ghij")  # not synced
    io.flip_bits("/d/a", 1, 0x20)
    io.cut_file("/d/a", 8)
    assert io.read_all("/d/a") == b"aBcdefgh"
    io.power_cut()
    assert io.read_all("/d/a") == b"aBcdef"
    io.cut_file("/d/a", 3)
    io.power_cut()
    assert io.read_all("/d/a") == b"aBc"
    with pytest.raises(FileNotFoundError):
        io.flip_bits("/d/missing", 0)


def test_append_on_a_full_disk_is_all_or_nothing_and_works_after_space_returns() -> None:
    io = SimIO(capacity_bytes=100)
    f = io.open("/d/a")
    f.append(b"x" * 60)
    with pytest.raises(NoSpace):
        f.append(b"y" * 50)
    assert f.size == 60 and io.read_all("/d/a") == b"x" * 60
    io.capacity_bytes = 1000
    f.append(b"y" * 50)
    assert f.size == 110


def test_free_space_minimum_is_checked_from_an_estimate_not_per_write() -> None:
    calls = []

    class CountingIO(SimIO):
        def free_bytes(self, directory: str) -> int:
            calls.append(directory)
            return super().free_bytes(directory)

    now = [0.0]
    io = CountingIO(capacity_bytes=10_000, disk_free_min_bytes=5_000, space_recheck_bytes=4_000,
                    space_recheck_s=1.0, clock=lambda: now[0])
    io.watch_space("/d")
    f = io.open("/d/a")
    for _ in range(41):
        f.append(b"z" * 100, check_space=True)
    assert len(calls) == 2  # once at the start, once after 4,000 bytes
    with pytest.raises(NoSpace, match="disk_free_min_bytes"):
        for _ in range(20):
            f.append(b"z" * 100, check_space=True)
    with pytest.raises(NoSpace):
        io.check_space(100)
    size = f.size
    f.truncate(1000)  # space comes back; noticed at the next recheck
    assert size > 1000
    now[0] += 2.0
    assert not io.space_low()
    f.append(b"z" * 100, check_space=True)


def test_real_io_round_trip_and_atomic_replace(tmp_path) -> None:
    io = RealIO(disk_free_min_bytes=0)
    path = str(tmp_path / "f")
    f = io.open(path)
    assert f.append(b"abc") == 0 and f.append(b"def") == 3
    f.datasync()
    assert f.pread(2, 3) == b"cde"
    f.truncate(4)
    assert f.size == 4
    f.close()
    io.write_atomic(path, [b"new", b"content"])
    assert io.read_all(path) == b"newcontent"
    assert io.listdir(str(tmp_path)) == ["f"]
    assert io.free_bytes(str(tmp_path)) > 0


def test_sim_rewrites_in_place_keep_old_or_new_sectors_and_tear_at_most_one() -> None:
    seen = set()
    for seed in range(200):
        io = SimIO()
        io.write_atomic("/d/m", [b"o" * 1024])  # two sectors, durable
        f = io.open("/d/m", create=False)
        f.pwrite(0, b"N" * 1024)  # rewritten in place, never synced
        io.power_cut(random.Random(seed))
        data = io.read_all("/d/m")
        assert len(data) == 1024
        sectors = [data[:512], data[512:]]
        torn = [s for s in sectors if s not in (b"o" * 512, b"N" * 512)]
        assert len(torn) <= 1
        for s in torn:  # a torn sector: a prefix of the new bytes, the rest old
            k = s.count(b"N")
            assert s == b"N" * k + b"o" * (512 - k)
        seen.add(tuple(s[:1] for s in sectors))
    assert len(seen) == 4, "each sector may come back old or new"
    io = SimIO()
    io.write_atomic("/d/m", [b"o" * 10])
    io.open("/d/m", create=False).pwrite(0, b"N" * 10)
    io.power_cut()  # without an rng a cut keeps only what was synced
    assert io.read_all("/d/m") == b"o" * 10


def test_sim_directory_rename_is_durable_after_the_parent_fsync() -> None:
    io = SimIO()
    io.write_atomic("/d/j/meta", [b"m"])
    io.write_atomic("/d/j/seg", [b"s"])
    assert io.listdir("/d") == ["j"]
    io.rename("/d/j", "/d/j.old")
    assert io.listdir("/d") == ["j.old"] and io.read_all("/d/j.old/seg") == b"s"
    io.power_cut()
    assert io.listdir("/d") == ["j"], "not durable before the parent's fsync"
    io.rename("/d/j", "/d/j.old")
    io.fsync_dir("/d")
    io.power_cut()
    assert io.listdir("/d") == ["j.old"] and io.read_all("/d/j.old/meta") == b"m"
    with pytest.raises(FileNotFoundError):
        io.rename("/d/nothing", "/d/x")


def test_a_big_file_replaced_or_removed_is_let_go_off_the_calling_thread(tmp_path, monkeypatch) -> None:
    """The kernel frees a file's blocks as its last reference goes: for a snapshot of gigabytes,
    seconds. A rename over it, or its unlink, returns once the name is gone; a worker thread
    closes the last descriptor."""
    from shoal.node.raft import _io

    monkeypatch.setattr(_io, "RETIRE_BYTES_MIN", 1 << 20)
    closed: list[int] = []
    real_close = os.close

    def close(fd: int) -> None:
        if threading.current_thread().name.startswith("shoal-retire"):
            closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(_io.os, "close", close)  # the retiring thread's close
    io = RealIO(disk_free_min_bytes=0)
    old, new, small = tmp_path / "snap", tmp_path / "snap.next", tmp_path / "small"
    old.write_bytes(b"o" * (2 << 20))
    new.write_bytes(b"n" * 10)
    small.write_bytes(b"s" * 10)
    io.rename(str(new), str(old))
    assert old.read_bytes() == b"n" * 10 and not new.exists()
    eventually(lambda: len(closed) == 1, "the replaced file's descriptor closed")
    big = tmp_path / "big"
    big.write_bytes(b"b" * (2 << 20))
    io.unlink(str(big))
    io.unlink(str(small))  # small files go at once, no descriptor held
    assert not big.exists() and not small.exists()
    eventually(lambda: len(closed) == 2, "the removed file's descriptor closed")
    io.unlink(str(tmp_path / "never-there"))
