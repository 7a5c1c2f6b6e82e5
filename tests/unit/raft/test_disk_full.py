"""A full disk: NoSpace, a consistent journal, no crash, and writes again once space is back.

The real-filesystem case mounts a 2 MiB tmpfs (needs root; skipped otherwise).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

from shoal.node.raft._io import NoSpace, RealIO, SimIO
from shoal.node.raft.journal import Journal
from shoal.node.raft.meta import RaftMeta
from shoal.node.raft.snapshot_file import read_snapshot_info, write_snapshot

PAYLOAD = b"j" * 8_000


@contextlib.contextmanager
def small_tmpfs(path, size: str = "2m") -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill_until_no_space(j: Journal, *, check_space: bool) -> int:
    for _ in range(10_000):  # bounded: 2 MiB / 8 KB is ~260 appends
        try:
            j.append(j.last_index + 1, 1, PAYLOAD, check_space=check_space)
        except NoSpace:
            return j.last_index
    raise AssertionError("the disk never filled")


def test_enospc_on_a_real_small_filesystem(tmp_path) -> None:
    with small_tmpfs(tmp_path / "mnt") as mnt:
        with open(os.path.join(mnt, "filler"), "wb") as f:
            f.write(b"\0" * 300_000)
        io = RealIO(disk_free_min_bytes=0)
        j = Journal(io, os.path.join(mnt, "p0"), segment_bytes=256 * 1024)
        last = fill_until_no_space(j, check_space=False)
        assert last > 100
        with pytest.raises(NoSpace):  # stays refused, stays consistent
            j.append(last + 1, 1, PAYLOAD)
        assert j.last_index == last and j.entries(last, last + 1)[0][0] == PAYLOAD
        with pytest.raises(NoSpace):  # metadata and snapshots fail cleanly as well
            write_snapshot(io, os.path.join(mnt, "snap"), last, 1, [b"s" * 500_000])
        assert not os.path.exists(os.path.join(mnt, "snap.tmp"))
        os.unlink(os.path.join(mnt, "filler"))  # space comes back
        j.append(last + 1, 1, PAYLOAD)
        j.append(last + 2, 1, PAYLOAD)
        assert j.sync() == last + 2
        RaftMeta(io, os.path.join(mnt, "p0", "meta")).store(3, "b")
        j.close()
        j = Journal(io, os.path.join(mnt, "p0"), segment_bytes=256 * 1024)
        assert j.last_index == last + 2 and list(j)[-1] == (PAYLOAD, last + 2, 1)


def test_free_space_minimum_on_a_real_small_filesystem(tmp_path) -> None:
    with small_tmpfs(tmp_path / "mnt") as mnt:
        io = RealIO(disk_free_min_bytes=1024 * 1024, space_recheck_bytes=64 * 1024, space_recheck_s=3600)
        io.watch_space(mnt)
        j = Journal(io, os.path.join(mnt, "p0"), segment_bytes=256 * 1024)
        last = fill_until_no_space(j, check_space=True)
        free = io.free_bytes(mnt)
        assert 1024 * 1024 - 128 * 1024 < free < 1024 * 1024 + 128 * 1024  # refused near the minimum
        with pytest.raises(NoSpace, match="disk_free_min_bytes"):
            j.append(last + 1, 1, PAYLOAD)
        j.append(last + 1, 1, PAYLOAD, check_space=False)  # a replica's own entries are not refused below the minimum
        assert j.last_index == last + 1
        j.delete_to(last)  # a snapshot let the journal drop its prefix: whole segments go
        j.sync()
        io.note_no_space()  # the next check asks the kernel again
        assert not io.space_low()
        j.append(last + 2, 1, PAYLOAD)


def test_failed_appends_leave_the_journal_consistent_on_the_simulated_disk() -> None:
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=40_000)
    for i in range(1, 11):
        j.append(i, 1, PAYLOAD)
    j.sync()
    for room in range(0, 9_000, 700):  # every possible partial write, including the roll-over
        io.capacity_bytes = io.used_bytes() + room
        before = (j.last_index, io.used_bytes())
        try:
            j.append(j.last_index + 1, 1, PAYLOAD)
        except NoSpace:
            assert j.last_index == before[0]
        io.capacity_bytes = None
        j.sync()
        io.power_cut()
        j = Journal(io, "/j", segment_bytes=40_000)
        assert list(j) == [(PAYLOAD, i, 1) for i in range(1, j.last_index + 1)]
    io.fill_disk()
    with pytest.raises(NoSpace):
        j.append(j.last_index + 1, 1, PAYLOAD)
    io.capacity_bytes = None
    j.append(j.last_index + 1, 1, PAYLOAD)


def test_a_full_disk_during_a_snapshot_keeps_the_journal_prefix(tmp_path) -> None:
    io = SimIO()
    j = Journal(io, "/p/journal", segment_bytes=20_000)
    for i in range(1, 30):
        j.append(i, 1, PAYLOAD)
    j.sync()
    io.fill_disk()
    with pytest.raises(NoSpace):
        write_snapshot(io, "/p/snap", 20, 1, [b"s" * 1000])
    assert not io.exists("/p/snap")
    assert j.first_index == 1  # nothing was dropped
    io.capacity_bytes = None
    info = write_snapshot(io, "/p/snap", 20, 1, [b"s" * 1000])
    assert read_snapshot_info(io, "/p/snap") == info
