"""The write-ahead journal on real files: recovery, segments, reads from disk, batching."""

from __future__ import annotations

import logging
import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.raft._io import RealIO, SimIO
from shoal.node.raft.journal import (
    COPY_BATCH_BYTES,
    COPY_BYTES_MAX,
    COPY_HEADER_BYTES,
    COPY_RECORD_BYTES,
    MARK_RECORD_BYTES,
    MARK_WRITE_EVERY,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    ZEROS_AHEAD_BYTES,
    Journal,
    JournalCorrupt,
    SyncBatcher,
    SyncMark,
    quarantine_journal,
    read_sync_mark,
)

from journal_layout import copy_of, entry_offset, layout, records_end


def real() -> RealIO:
    return RealIO(disk_free_min_bytes=0)


def fill(j: Journal, first: int, last: int, term: int = 1, size: int = 100) -> None:
    for i in range(first, last + 1):
        j.append(i, term, i.to_bytes(4, "big") * (size // 4))


def payload(i: int, size: int = 100) -> bytes:
    return i.to_bytes(4, "big") * (size // 4)


def segment_files(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".wal"))


def test_entries_survive_a_reopen(tmp_path) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 50)
    assert j.sync() == 50 and j.synced_index == 50
    j.close()
    j = Journal(real(), str(tmp_path))
    assert (j.first_index, j.last_index, len(j)) == (1, 50, 50)
    assert j.entries(1, 2) == [(payload(1), 1, 1)] and j.entries(50, 51) == [(payload(50), 50, 1)]
    assert [e[1] for e in j.entries(11, 14)] == [11, 12, 13]


def crash(j: Journal) -> None:
    """The process dies: what was written stays in the page cache, nothing more is synced."""
    j._active.close()
    if j._mark_handle is not None:
        j._mark_handle.close()


def test_torn_tail_is_cut_and_the_cut_is_logged(tmp_path, caplog) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 9)
    j.sync()
    fill(j, 10, 10)  # never synced: a power cut may tear it
    crash(j)
    (name,) = segment_files(tmp_path)
    path = tmp_path / name
    full = records_end(path.read_bytes())  # copies written ahead lie past it
    record = RECORD_HEADER_BYTES + 100
    with open(path, "r+b") as f:  # the last record only half written
        f.truncate(full - record // 2)
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = Journal(real(), str(tmp_path))
    assert j.last_index == 9
    cut_at = full - record
    assert f"torn tail cut at offset {cut_at}" in caplog.text and str(path) in caplog.text
    assert f"({record - record // 2} bytes dropped" in caplog.text
    assert path.stat().st_size == cut_at
    fill(j, 10, 12)  # appends continue where the cut was
    j.sync()
    j.close()
    assert Journal(real(), str(tmp_path)).last_index == 12


@pytest.mark.parametrize("damage", ["zeros", "flip"])
def test_damaged_unsynced_last_record_of_the_last_segment_is_a_torn_tail(tmp_path, damage) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 4)
    j.sync()
    fill(j, 5, 5)
    crash(j)
    path = tmp_path / segment_files(tmp_path)[0]
    raw = bytearray(path.read_bytes())
    end = records_end(raw)  # the copy of the synced batch lies past it
    if damage == "zeros":
        raw[end - 60 : end] = bytes(60)
    else:
        raw[end - 1] ^= 0x01
    path.write_bytes(bytes(raw))
    assert Journal(real(), str(tmp_path)).last_index == 4


def test_corrupt_record_in_a_sealed_segment_stops_with_file_and_offset(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), segment_bytes=2_000)
    fill(j, 1, 60)
    j.sync()
    j.close()
    names = segment_files(tmp_path)
    assert len(names) > 3
    victim = tmp_path / names[1]
    raw = bytearray(victim.read_bytes())
    offset = SEGMENT_HEADER_BYTES + 2 * (RECORD_HEADER_BYTES + 100)  # third record
    raw[offset + RECORD_HEADER_BYTES + 7] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(JournalCorrupt) as err:
        Journal(real(), str(tmp_path))
    assert (err.value.path, err.value.offset) == (str(victim), offset)
    assert str(err.value) == f"{victim} at offset {offset}: checksum mismatch in a sealed segment"


def test_missing_middle_segment_is_refused(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), segment_bytes=2_000)
    fill(j, 1, 60)
    j.sync()
    j.close()
    os.unlink(tmp_path / segment_files(tmp_path)[1])
    with pytest.raises(JournalCorrupt, match="segment starts at index"):
        Journal(real(), str(tmp_path))


def test_segments_roll_and_a_prefix_delete_drops_whole_segments_only(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), segment_bytes=2_000)
    fill(j, 1, 100)
    names = segment_files(tmp_path)
    per_segment = (2_000 - SEGMENT_HEADER_BYTES) // (RECORD_HEADER_BYTES + 100)
    assert len(names) == -(-100 // per_segment)
    assert names[1] == f"{per_segment + 1:020d}.wal"
    j.delete_to(per_segment + 3)  # inside the second segment
    j.sync()
    assert j.first_index == per_segment + 3 and next(iter(j))[1] == per_segment + 3
    assert segment_files(tmp_path) == names[1:]
    j.close()
    j = Journal(real(), str(tmp_path), segment_bytes=2_000)
    assert j.first_index == per_segment + 3 and j.last_index == 100  # the start is durable


def test_the_entries_kept_below_a_snapshot_are_bounded_by_their_segments_bytes(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), segment_bytes=2_000)
    fill(j, 1, 100)
    per_segment = (2_000 - SEGMENT_HEADER_BYTES) // (RECORD_HEADER_BYTES + 100)
    at = 5 * per_segment + 3  # in the sixth segment
    assert j.first_within(at, 10**9) == 1  # a budget for all of them
    assert j.first_within(at, 0) == 5 * per_segment + 1  # the segment holding the index, always
    assert j.first_within(at, 2 * 2_000) == 4 * per_segment + 1  # whole segments within the budget
    j.delete_to(3 * per_segment + 5)
    assert j.first_within(at, 10**9) == 3 * per_segment + 5  # never below the first entry
    j.close()


def test_old_entries_are_read_back_from_disk_with_a_bounded_cache(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), segment_bytes=4_000, cache_entries_max=8)
    fill(j, 1, 300)
    assert len(j._cache) == 8
    before = j.disk_reads
    assert j.entries(295, 301) == [(payload(i), i, 1) for i in range(295, 301)]
    assert j.disk_reads == before  # the tail is in the cache
    got = j.entries(3, 250)
    assert got == [(payload(i), i, 1) for i in range(3, 250)]
    assert j.disk_reads == before + 1
    j.close()
    j = Journal(real(), str(tmp_path), segment_bytes=4_000, cache_entries_max=8)
    assert len(j._cache) == 8 and j.entries(6, 7) == [(payload(6), 6, 1)]


def test_term_changes_are_kept_compactly(tmp_path) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 10, term=1)
    fill(j, 11, 20, term=3)
    fill(j, 21, 25, term=4)
    assert [j.term_at(i) for i in (1, 10, 11, 20, 21, 25, 26)] == [1, 1, 3, 3, 4, 4, None]
    assert len(j._run_term) == 3
    j.delete_from(15)
    assert j.last_term == 3 and j.last_index == 14
    j.close()
    j = Journal(real(), str(tmp_path))
    assert [j.term_at(i) for i in (1, 11, 14)] == [1, 3, 3] and j.last_index == 14


def test_append_refuses_gaps_and_term_regressions(tmp_path) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 3, term=2)
    with pytest.raises(ValueError, match="does not follow"):
        j.append(5, 2, b"x")
    with pytest.raises(ValueError, match="below last term"):
        j.append(4, 1, b"x")


def test_suffix_delete_is_durable_before_it_returns() -> None:
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=2_000)
    fill(j, 1, 40, term=1)
    j.sync()
    j.delete_from(12)  # across segment boundaries
    fill(j, 12, 13, term=2)
    io.power_cut()
    j = Journal(io, "/j", segment_bytes=2_000)
    assert j.last_index == 11 and j.last_term == 1


def test_sync_batcher_syncs_each_dirty_journal_once(tmp_path) -> None:
    batcher = SyncBatcher()
    journals = [Journal(real(), str(tmp_path / f"p{k}"), batcher=batcher) for k in range(3)]
    for j in journals[:2]:
        fill(j, 1, 20)
    assert batcher.pending == 2
    before = [j.syncs for j in journals]
    done = batcher.sync_all()
    assert {j.directory: idx for j, idx in done.items()} == {journals[0].directory: 20, journals[1].directory: 20}
    assert [j.syncs - b for j, b in zip(journals, before)] == [1, 1, 0]  # its data, with its copy
    assert batcher.pending == 0 and batcher.sync_all() == {}
    from concurrent.futures import ThreadPoolExecutor

    fill(journals[2], 1, 5)
    with ThreadPoolExecutor(2) as pool:
        assert list(batcher.sync_all_threads(pool).values()) == [5]


def test_a_sync_is_one_flush_of_the_batch_with_its_copy(tmp_path, monkeypatch) -> None:
    calls: list[str] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def named(kind: str, fd: int) -> str:
        return f"{kind} {os.path.basename(os.readlink(f'/proc/self/fd/{fd}'))}"

    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(named("fdatasync", fd)), real_fdatasync(fd))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(named("fsync", fd)), real_fsync(fd))[1])
    j = Journal(real(), str(tmp_path))
    calls.clear()  # a new journal writes its mark file durably, once
    fill(j, 1, 10)
    assert calls == []  # append is write-only
    assert j.sync() == 10
    segment = f"{1:020d}.wal"
    # the data with its copy, the directory naming the new segment; the mark is written, not flushed
    assert calls == [f"fdatasync {segment}", f"fsync {tmp_path.name}"]
    assert read_sync_mark(real(), str(tmp_path)) == SyncMark(10, 1, j._segments[-1].size)
    raw = open(tmp_path / segment, "rb").read()
    assert [k for k, _, _ in layout(raw)] == ["entry"] * 10 + ["copy"]
    calls.clear()
    fill(j, 11, 20)
    assert j.sync() == 20  # the hot path: one fdatasync
    assert calls == [f"fdatasync {segment}"]
    assert j.synced_mark.index == 20
    assert read_sync_mark(real(), str(tmp_path)).index == 10  # written once in MARK_WRITE_EVERY copied syncs
    j.sync()  # nothing new: no sync call
    assert len(calls) == 1
    for index in range(21, 21 + MARK_WRITE_EVERY - 2):
        fill(j, index, index)
        j.sync()
    assert read_sync_mark(real(), str(tmp_path)).index == 10
    last = 21 + MARK_WRITE_EVERY - 2
    fill(j, last, last)
    j.sync()
    assert read_sync_mark(real(), str(tmp_path)).index == last == j.synced_mark.index
    calls.clear()
    # A batch too large to copy: its mark is flushed after it. It reaches the copy of the batch
    # before, ahead of the records, so the mark naming that batch is flushed before it, too.
    fill(j, last + 1, last + 3, size=COPY_BYTES_MAX // 2)
    assert j.sync() == last + 3
    assert calls == ["fdatasync synced", f"fdatasync {segment}", "fdatasync synced"]
    j.close()


def test_clear_then_add_at_any_index(tmp_path) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 10)
    j.sync()
    j.clear()
    assert len(j) == 0
    j.append(500, 3, b"snap-prev")
    j.append(501, 3, b"snap")
    j.sync()
    j.close()
    j = Journal(real(), str(tmp_path))
    assert list(j) == [(b"snap-prev", 500, 3), (b"snap", 501, 3)]
    assert segment_files(tmp_path) == [f"{500:020d}.wal"]


@pytest.mark.parametrize("copy_too", [False, True])
def test_a_flipped_byte_in_synced_entries_is_refused_with_file_and_offset(tmp_path, copy_too) -> None:
    """Entry 50 of 100 synced entries (and, or not, the same byte of the batch's copy): the
    ``synced`` file (exact after a process crash) names the batch, so this is damage, not a torn
    tail, and no copy stands in for a record the mark vouches for."""
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 100)
    j.sync()
    crash(j)
    path = tmp_path / segment_files(tmp_path)[0]
    raw = bytearray(path.read_bytes())
    offset = entry_offset(bytes(raw), 50)
    if copy_too:
        raw[copy_of(bytes(raw), offset + RECORD_HEADER_BYTES + 10)] ^= 0x01
    raw[offset + RECORD_HEADER_BYTES + 10] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(JournalCorrupt) as err:
        Journal(real(), str(tmp_path))
    assert (err.value.path, err.value.offset) == (str(path), offset)
    assert str(err.value).startswith(f"{path} at offset {offset}: checksum mismatch in synced data")
    assert len(path.read_bytes()) == len(raw), "a refused journal is left as it was"


def test_a_synced_journal_cut_short_at_a_record_boundary_is_refused(tmp_path) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 100)
    j.sync()
    j.close()
    path = tmp_path / segment_files(tmp_path)[0]
    offset = SEGMENT_HEADER_BYTES + 60 * (RECORD_HEADER_BYTES + 100)
    with open(path, "r+b") as f:
        f.truncate(offset)
    with pytest.raises(JournalCorrupt, match="segment ends, but its first") as err:
        Journal(real(), str(tmp_path))
    assert (err.value.path, err.value.offset) == (str(path), offset)


def test_a_missing_last_segment_that_was_synced_is_refused(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), segment_bytes=2_000)
    fill(j, 1, 60)
    j.sync()
    j.close()
    last = tmp_path / segment_files(tmp_path)[-1]
    os.unlink(last)
    with pytest.raises(JournalCorrupt, match="segment missing") as err:
        Journal(real(), str(tmp_path), segment_bytes=2_000)
    assert err.value.path == str(last)


def _roll_back(io: SimIO, path: str, content: bytes) -> None:
    """Put ``content`` back in ``path``, durably (a file restored from an older copy)."""
    h = io.open(path, create=False)
    h.pwrite(0, content)
    h.datasync()


def test_with_a_lagging_mark_damage_beyond_the_unsynced_bound_from_the_end_is_still_refused() -> None:
    """The synced file lags (put back as it was before the first sync) and the batch's copy is
    damaged too: the mark records after the damage (or the bound on unsynced bytes) refuse it."""
    io = SimIO()
    j = Journal(io, "/j", unsynced_bytes_max=1_000)
    stale = io.read_all("/j/synced")
    fill(j, 1, 40)
    j.sync()
    io.power_cut()
    _roll_back(io, "/j/synced", stale)
    (name,) = [n for n in io.listdir("/j") if n.endswith(".wal")]
    path = f"/j/{name}"
    h = io.open(path, create=False)
    raw = io.read_all(path)
    offset = entry_offset(raw, 6)  # the sixth of 40 records
    for at in (offset + RECORD_HEADER_BYTES + 1, copy_of(raw, offset + RECORD_HEADER_BYTES + 1)):
        h.pwrite(at, bytes([h.pread(at, 1)[0] ^ 0x10]))
    with pytest.raises(JournalCorrupt) as err:
        Journal(io, "/j")
    assert (err.value.path, err.value.offset) == (path, offset)
    assert "checksum mismatch" in str(err.value)
    assert "not a torn write" in str(err.value) or "says the bytes before it were synced" in str(err.value)


def test_appends_sync_on_their_own_past_the_unsynced_bound(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), unsynced_bytes_max=1_000)
    # 124 bytes each after a 20-byte segment header, and a 32-byte mark record ahead of the first
    # entry after each sync: synced before 8 and before 15
    fill(j, 1, 20)
    assert j.syncs == 2 and j.synced_index == 14  # each sync: the data's fdatasync, with its copy
    j.append(21, 1, b"b" * 5_000)  # one record larger than the bound
    j.append(22, 1, b"c")
    assert j.synced_index == 21


def test_a_torn_record_larger_than_the_unsynced_bound_is_a_torn_tail(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), unsynced_bytes_max=1_000)
    fill(j, 1, 3)
    j.sync()
    j.append(4, 1, b"big" * 2_000)
    crash(j)
    path = tmp_path / segment_files(tmp_path)[0]
    raw = bytearray(path.read_bytes())
    end = records_end(raw)
    raw[end - 3_000 : end - 1_000] = bytes(2_000)  # its middle pages never reached the disk
    path.write_bytes(bytes(raw))
    assert Journal(real(), str(tmp_path)).last_index == 3


def test_recovery_makes_page_cache_entries_durable() -> None:
    """The process died without syncing; the machine then loses power after the restart."""
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 5)
    j.sync()
    fill(j, 6, 9)  # written, never synced; the process dies here
    j = Journal(io, "/j")
    assert j.synced_index == 9
    io.power_cut()
    assert Journal(io, "/j").last_index == 9


def test_a_failed_fdatasync_poisons_the_journal_until_it_is_reopened() -> None:
    """A retried fsync may 'succeed' after the kernel dropped the dirty pages: never retry."""
    import errno

    from shoal.node.raft.journal import SyncFailed

    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 5)
    j.sync()
    fill(j, 6, 8)
    io.fail_syncs_errno = errno.EIO
    with pytest.raises(SyncFailed, match="fdatasync of /j/.* failed"):
        j.sync()
    io.fail_syncs_errno = None
    with pytest.raises(SyncFailed):
        j.sync()
    with pytest.raises(SyncFailed):
        j.append(9, 1, b"x")
    assert j.synced_index == 5
    j.close()  # closes without syncing
    io.power_cut()
    j = Journal(io, "/j")
    assert j.last_index == 5
    fill(j, 6, 6)
    assert j.sync() == 6


def test_the_unsynced_bound_of_a_segment_holds_across_a_reopen_with_another_setting(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), unsynced_bytes_max=1_000)
    fill(j, 1, 3)
    j.close()
    j = Journal(real(), str(tmp_path), unsynced_bytes_max=1_000_000)
    fill(j, 4, 30)  # still bounded by the 1,000 bytes its segment's header promises
    assert j.synced_index >= 22


# --- the synced mark ---------------------------------------------------------------------------


def _flip(io, path: str, at: int) -> None:
    """Damage on the disk itself (a power cut does not undo it)."""
    h = io.open(path, create=False)
    h.pwrite(at, bytes([h.pread(at, 1)[0] ^ 0x01]))
    h.datasync()


def test_a_suffix_delete_lowers_the_mark_durably_so_a_later_torn_tail_is_still_cut() -> None:
    """Without the durable lowering the old mark would claim bytes the new, unsynced entries
    occupy, and their torn tail would be refused as damage."""
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 100)
    j.sync()
    j.delete_from(51)
    assert read_sync_mark(io, "/j") == SyncMark(50, 1, SEGMENT_HEADER_BYTES + 50 * (RECORD_HEADER_BYTES + 100))
    fill(j, 51, 60, term=2)  # never synced
    io.power_cut()
    j = Journal(io, "/j")
    assert j.last_index == 50
    fill(j, 51, 60, term=2)
    path = f"/j/{1:020d}.wal"
    h = io.open(path, create=False)
    h.truncate(h.size - 30)  # the last unsynced record torn
    io.power_cut()
    assert Journal(io, "/j").last_index == 50


def test_clear_lowers_the_mark_durably_before_dropping_the_segments() -> None:
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 30)
    j.sync()
    j.clear()
    assert read_sync_mark(io, "/j") == SyncMark(0, 0, 0)
    fill(j, 500, 505)
    io.power_cut(random.Random(3))
    assert Journal(io, "/j").last_index <= 505


def test_one_torn_copy_of_the_mark_leaves_the_other() -> None:
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 10)
    j.sync()  # first copy: 10
    fill(j, 11, 20)
    j.sync()  # second copy: 20
    _flip(io, "/j/synced", 4096 + 9)  # the newer copy torn: the older still bounds what is synced
    assert read_sync_mark(io, "/j").index == 10
    _flip(io, "/j/synced", 9)
    assert read_sync_mark(io, "/j") is None


def test_without_a_readable_mark_every_record_counts_as_synced(caplog) -> None:
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 10)
    j.sync()
    fill(j, 11, 11)
    crash(j)
    h = io.open(f"/j/{1:020d}.wal", create=False)
    h.truncate(records_end(io.read_all(f"/j/{1:020d}.wal")) - 30)  # a torn tail...
    io.unlink("/j/synced")  # ...but nothing says it was not synced
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        with pytest.raises(JournalCorrupt, match="synced mark /j/synced is unreadable") as err:
            Journal(io, "/j")
    assert "the synced mark /j/synced is missing" in caplog.text
    # entry 11, the first after a sync, follows the first batch's copy and a mark record
    records = layout(io.read_all(f"/j/{1:020d}.wal"))
    assert [k for k, _, _ in records][10:] == ["copy", "mark"]
    assert err.value.offset == records[-1][1] + MARK_RECORD_BYTES
    h.truncate(err.value.offset)  # an operator cuts it by hand: the mark is written anew
    j = Journal(io, "/j")
    assert j.last_index == 10 and read_sync_mark(io, "/j").index == 10


@pytest.mark.parametrize("failing", ["pwrite", "datasync"])
def test_a_failed_mark_write_fails_the_sync_and_poisons_the_journal(failing) -> None:
    """Batches too large to copy: entries synced without a durable mark naming them are not
    reported durable: the sync fails as a failed fdatasync does, and the reopened journal
    writes the mark anew."""
    import errno

    from shoal.node.raft.journal import SyncFailed

    io = SimIO()
    j = Journal(io, "/j")
    big = COPY_BYTES_MAX // 8
    fill(j, 1, 10, size=big)
    j.sync()
    fill(j, 11, 20, size=big)

    def fail(*args: object) -> None:
        raise OSError(errno.EIO, "EIO")

    setattr(j._mark_handle, failing, fail)
    with pytest.raises(SyncFailed, match="synced" if failing == "pwrite" else "fdatasync of /j/synced"):
        j.sync()
    assert j.synced_index == 10
    with pytest.raises(SyncFailed):
        j.append(21, 1, b"x")
    j.close()
    io.power_cut()
    assert read_sync_mark(io, "/j").index == 10
    j = Journal(io, "/j")  # entries 11-20 were synced: recovery finds them and marks them
    assert j.last_index == 20 and read_sync_mark(io, "/j").index == 20


# --- damage in the last synced batch, and the unsynced tail, after a power cut -----------------


SIM_SEGMENT = f"/j/{1:020d}.wal"


#: Where the newest batch is damaged, and after how many synced batches (the first has no mark record).
_BATCH_DAMAGE = [(damage, batches) for damage in ("payload of its last entry", "header of its first entry",
                                                  "its mark record", "its copy record", "its last 4 KiB block")
                 for batches in (1, 3) if not (damage == "its mark record" and batches == 1)]


@pytest.mark.parametrize("zeros_ahead", [False, True])
@pytest.mark.parametrize("damage, batches", _BATCH_DAMAGE)
def test_damage_in_the_last_synced_batch_after_a_power_cut_is_restored_from_its_copy(
        zeros_ahead, batches, damage, caplog) -> None:
    """The batch a sync returned is vouched for by nothing after it (no append wrote a mark
    record after it, and the ``synced`` file was written without a flush of its own): its copy,
    flushed with it, restores it whatever one block of it a medium damaged."""
    io = SimIO()
    j = Journal(io, "/j", zeros_ahead=zeros_ahead)
    for k in range(batches):
        fill(j, 10 * k + 1, 10 * k + 10)
        assert j.sync() == 10 * k + 10
    last = 10 * batches
    offsets = list(j._segments[-1].offsets)
    end = j._segments[-1].size
    io.power_cut()  # every write not synced is lost, the lazily written mark with them
    assert read_sync_mark(io, "/j") == SyncMark(0, 0, 0)
    raw = io.read_all(SIM_SEGMENT)
    records = layout(raw)
    if damage == "payload of its last entry":
        offset = offsets[last - 1]
        io.flip_bits(SIM_SEGMENT, offset + RECORD_HEADER_BYTES + 60, 0x08)
    elif damage == "header of its first entry":
        offset = offsets[last - 10]
        io.flip_bits(SIM_SEGMENT, offset + 9, 0x40)  # the term
    elif damage == "its mark record":
        offset = offsets[last - 10] - MARK_RECORD_BYTES
        io.flip_bits(SIM_SEGMENT, offset + 20, 0x02)
    elif damage == "its copy record":
        offset = records[-1][1]
        io.flip_bits(SIM_SEGMENT, offset + 12, 0x01)
    else:
        offset = (records[-1][1] - 1) // 4096 * 4096
        for at in range(max(offset, offsets[last - 10]), records[-1][1] + COPY_RECORD_BYTES):
            io.flip_bits(SIM_SEGMENT, at, 0xFF)
        offset = max(offset, offsets[last - 10])
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = Journal(io, "/j", zeros_ahead=zeros_ahead)
    assert "restored from their copy" in caplog.text
    assert j.entries(1, last + 1) == [(payload(i), i, 1) for i in range(1, last + 1)]
    assert io.read_all(SIM_SEGMENT) == raw[:end], "the batch is put back byte for byte"


def test_a_copy_larger_than_this_journal_writes_still_restores_its_batch(caplog) -> None:
    """Batches past :data:`COPY_BATCH_BYTES` are synced with a durable mark, not copied; a journal
    whose writer copied larger batches (up to :data:`COPY_BYTES_MAX`) is still restored from them."""
    size = COPY_BATCH_BYTES // 4  # ten entries: a batch between the two bounds
    assert COPY_BATCH_BYTES < 10 * size <= COPY_BYTES_MAX
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 10, size=size)
    assert j.sync() == 10
    assert not j._copied, "a batch past COPY_BATCH_BYTES is not copied"
    io.power_cut()
    assert read_sync_mark(io, "/j").index == 10, "its mark is flushed before the sync returns"

    io = SimIO()
    j = Journal(io, "/j")
    j.copy_bytes_max = COPY_BYTES_MAX  # a writer that copied batches of up to 256 KiB
    fill(j, 1, 10, size=size)
    assert j.sync() == 10 and j._copied
    offsets = list(j._segments[-1].offsets)
    end = j._segments[-1].size
    io.power_cut()
    raw = io.read_all(SIM_SEGMENT)
    io.flip_bits(SIM_SEGMENT, offsets[9] + RECORD_HEADER_BYTES + 60, 0x08)
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = Journal(io, "/j")
    assert "restored from their copy" in caplog.text
    assert j.entries(1, 11) == [(payload(i, size), i, 1) for i in range(1, 11)]
    assert io.read_all(SIM_SEGMENT) == raw[:end]


@pytest.mark.parametrize("zeros_ahead", [False, True])
@pytest.mark.parametrize("torn", ["inside the mark record", "inside the first entry", "inside a later entry",
                                  "a flipped byte in a later entry", "zeros where the entries were"])
def test_an_unsynced_torn_tail_after_a_power_cut_is_still_cut(zeros_ahead, torn, caplog) -> None:
    """The converse: the bytes past the durable mark were never reported synced, and whatever a
    power cut left of them is cut where it fails, not refused."""
    io = SimIO()
    j = Journal(io, "/j", zeros_ahead=zeros_ahead)
    fill(j, 1, 10)
    j.sync()
    fill(j, 11, 15)  # never synced: a mark record ahead of entry 11, then the entries
    seg = j._segments[-1]
    synced_end, offsets, size = seg.synced_size, list(seg.offsets), seg.size
    written = io.read_all(SIM_SEGMENT)[:size]
    io.power_cut()
    kept, flip, keep_index = {
        "inside the mark record": (synced_end + 10, None, 10),
        "inside the first entry": (offsets[10] + 30, None, 10),
        "inside a later entry": (offsets[13] + 30, None, 13),
        "a flipped byte in a later entry": (size, offsets[12] + 40, 12),
        "zeros where the entries were": (size, None, 10),
    }[torn]
    tail = bytearray(written[synced_end:kept])
    if flip is not None:
        tail[flip - synced_end] ^= 0x01
    if torn.startswith("zeros"):
        tail = bytearray(len(tail))
    h = io.open(SIM_SEGMENT, create=False)
    h.truncate(synced_end)
    h.append(bytes(tail))
    h.datasync()
    with caplog.at_level(logging.INFO, logger="shoal.node.raft.journal"):
        j = Journal(io, "/j", zeros_ahead=zeros_ahead)
    assert j.last_index == keep_index
    assert [e[1] for e in j.entries(1, 20)] == list(range(1, keep_index + 1))
    assert "cut at offset" in caplog.text


# --- moving a damaged journal aside -----------------------------------------------------------


def _damaged(io, directory: str) -> None:
    j = Journal(io, directory)
    j.store_term_vote(7, "node-b")
    fill(j, 1, 40)
    j.sync()
    j.close()
    path = f"{directory}/{1:020d}.wal"
    at = entry_offset(io.read_all(path), 21) + 40
    copy = copy_of(io.read_all(path), at)  # a clean close cut the copy with the zeros ahead
    for where in (at,) if copy is None else (at, copy):  # nothing restores it
        _flip(io, path, where)


def test_a_damaged_journal_is_moved_aside_keeping_term_and_vote(tmp_path) -> None:
    io = real()
    directory = str(tmp_path / "p3.raft")
    _damaged(io, directory)
    with pytest.raises(JournalCorrupt):
        Journal(io, directory)
    moved = quarantine_journal(io, directory, clock=lambda: 0.0)
    assert moved == str(tmp_path / "p3.raft.damaged-19700101T000000Z")
    assert segment_files(moved) == [f"{1:020d}.wal"]
    assert sorted(os.listdir(directory)) == ["meta"]
    j = Journal(io, directory)
    assert (len(j), j.meta.state.term, j.meta.state.voted_for) == (0, 7, "node-b")
    j.store_term_vote(8, None)
    j.close()
    again = quarantine_journal(io, directory, clock=lambda: 0.0)  # same second: a counter tells them apart
    assert again == moved + "-1"
    assert Journal(io, directory).meta.state.term == 8
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".kept")]


class _Cut(Exception):
    pass


def test_a_power_cut_at_any_step_of_the_move_keeps_term_and_vote() -> None:
    """Every state a cut leaves opens with the vote kept: the damaged log (refused again, so
    the move is redone) or an empty one."""
    for cut_at in range(1, 60):
        io = SimIO()
        _damaged(io, "/d/p3.raft")
        steps = [0]

        def hook(what: str) -> None:
            steps[0] += 1
            if steps[0] == cut_at:
                raise _Cut(what)

        io.step_hook = hook
        try:
            quarantine_journal(io, "/d/p3.raft", clock=lambda: 0.0)
            done = True
        except _Cut:
            done = False
        io.step_hook = None
        io.power_cut(random.Random(cut_at))
        try:
            j = Journal(io, "/d/p3.raft")
        except JournalCorrupt:
            assert not done, "quarantine_journal returned before the move was durable"
            quarantine_journal(io, "/d/p3.raft", clock=lambda: 0.0)
            j = Journal(io, "/d/p3.raft")
        assert (len(j), j.meta.state.term, j.meta.state.voted_for) == (0, 7, "node-b"), cut_at
        assert not io.exists("/d/p3.raft.meta.kept")
        if done:
            break
    assert done


def test_an_emptied_journal_takes_any_next_entry_without_breaking_recovery() -> None:
    """A prefix drop keeps a partly covered segment; an entry that cannot follow what it still
    holds (here a lower term) starts a new segment instead of continuing it."""
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 2, term=2)
    j.delete_to(2)
    j.delete_from(2)  # empty now; entry 1 (term 2) still sits in the segment
    j.append(2, 1, b"x")
    j.sync()
    io.power_cut()
    assert list(Journal(io, "/j")) == [(b"x", 2, 1)]
def test_the_commit_hint_is_nothing_until_something_committed() -> None:
    # A new leader's first entry is not committed until a majority holds it: a replica restarted
    # on a journal holding only that entry must not apply it on the strength of a default hint.
    io = SimIO()
    journal = Journal(io, "/d/p0.raft")
    assert journal.commit_hint == 0
    journal.append(1, 1, b"\x02", check_space=False)
    journal.store_term_vote(1, "a")  # a vote stores the hint beside term and vote
    journal.close()
    assert Journal(io, "/d/p0.raft").commit_hint == 0


def test_zeros_ahead_keep_the_active_file_longer_than_its_records(tmp_path) -> None:
    """``zeros_ahead``: the active segment reaches ZEROS_AHEAD_BYTES past its records, in zeros
    the records are written over; entries read back whole, and a clean close cuts the zeros."""
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    fill(j, 1, 50)
    j.sync()
    (name,) = segment_files(tmp_path)
    path = tmp_path / name
    end = j._segments[-1].size  # noqa: SLF001
    assert end < path.stat().st_size <= end + 2 * COPY_BYTES_MAX + ZEROS_AHEAD_BYTES + RECORD_HEADER_BYTES + 100
    raw = path.read_bytes()
    copy_at, copied = struct.unpack_from("<QQ", raw, end - COPY_RECORD_BYTES + 24)
    ahead = bytearray(raw[end:])  # zeros, but for the batch's copy
    ahead[copy_at - end : copy_at - end + COPY_HEADER_BYTES + copied] = bytes(COPY_HEADER_BYTES + copied)
    assert copy_at >= end and not any(ahead)
    assert [e[0] for e in j.entries(1, 51)] == [payload(i) for i in range(1, 51)]
    fill(j, 51, 60)  # over the zeros: the file does not grow
    size = path.stat().st_size
    j.sync()
    assert path.stat().st_size == size
    j.close()
    assert path.stat().st_size == j._segments[-1].size  # noqa: SLF001
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    assert (j.first_index, j.last_index) == (1, 60)


def test_after_a_crash_the_zeros_ahead_are_cut_as_zeros(tmp_path, caplog) -> None:
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    fill(j, 1, 30)
    j.sync()
    end = j._segments[-1].size  # noqa: SLF001
    crash(j)
    (name,) = segment_files(tmp_path)
    path = tmp_path / name
    assert path.stat().st_size > end
    with caplog.at_level(logging.INFO, logger="shoal.node.raft.journal"):
        j = Journal(real(), str(tmp_path), zeros_ahead=True)
    assert j.last_index == 30 and path.stat().st_size == end
    assert "written ahead of the records cut at offset" in caplog.text
    assert "torn tail" not in caplog.text
    fill(j, 31, 40)
    j.sync()
    j.close()
    assert Journal(real(), str(tmp_path)).last_index == 40


def test_an_unsynced_torn_record_before_the_zeros_ahead_is_a_torn_tail(tmp_path, caplog) -> None:
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    fill(j, 1, 20)
    j.sync()
    fill(j, 21, 22)  # never synced
    end = j._segments[-1].size  # noqa: SLF001
    crash(j)
    path = tmp_path / segment_files(tmp_path)[0]
    with open(path, "r+b") as f:  # the last record's payload half lost: zeros where it was
        f.seek(end - 50)
        f.write(bytes(50))
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = Journal(real(), str(tmp_path), zeros_ahead=True)
    assert j.last_index == 21
    assert "torn tail cut at offset" in caplog.text


def test_synced_records_lost_to_zeros_are_refused(tmp_path) -> None:
    """Zeros where the synced mark says records were synced are damage, not zeros ahead."""
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    fill(j, 1, 20)
    j.sync()
    offset = j._segments[-1].offsets[15]  # noqa: SLF001
    crash(j)
    path = tmp_path / segment_files(tmp_path)[0]
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(path.stat().st_size - offset))
    with pytest.raises(JournalCorrupt) as err:
        Journal(real(), str(tmp_path), zeros_ahead=True)
    assert err.value.offset == offset


def test_a_sealed_segment_ends_with_its_last_record(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), zeros_ahead=True, segment_bytes=4_000)
    fill(j, 1, 100)
    j.sync()
    names = segment_files(tmp_path)
    assert len(names) > 2
    sealed = j._segments[:-1]  # noqa: SLF001
    for seg in sealed:
        assert os.path.getsize(seg.path) == seg.size
    assert os.path.getsize(j._segments[-1].path) > j._segments[-1].size  # noqa: SLF001
    crash(j)
    j = Journal(real(), str(tmp_path), zeros_ahead=True, segment_bytes=4_000)
    assert (j.first_index, j.last_index) == (1, 100)


def test_a_suffix_delete_cuts_the_zeros_ahead_and_appends_bring_them_back(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    fill(j, 1, 30)
    j.sync()
    j.delete_from(21)
    path = j._segments[-1].path  # noqa: SLF001
    assert os.path.getsize(path) == j._segments[-1].size  # noqa: SLF001
    fill(j, 21, 25, term=2)
    j.sync()
    assert os.path.getsize(path) > j._segments[-1].size  # noqa: SLF001
    crash(j)
    j = Journal(real(), str(tmp_path), zeros_ahead=True)
    assert j.last_index == 25 and j.entries(25, 26)[0][2] == 2


# --- copies ahead of the records (format version 5) --------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([10, 100, 3_000])), min_size=2, max_size=30),
       st.booleans())
def test_the_copy_vouching_for_the_newest_batch_stays_whole_until_the_next_sync(batches, zeros_ahead) -> None:
    """Batches of 1 – 40 records of 10 to 3,000 bytes (within the 32 KiB a copy holds, and past
    it): until the next batch is synced, nothing it writes touches the copy of the batch before
    (or the mark is flushed first), and the records grow by the copy record alone."""
    io = SimIO()
    j = Journal(io, "/j", zeros_ahead=zeros_ahead)
    fill(j, 1, 1)
    j.sync()
    index = 1
    for count, size_each in batches:
        live = j._copy_live  # noqa: SLF001
        before = io.read_all(SIM_SEGMENT)[live[0] : live[1]] if live else None
        size = j._segments[-1].size  # noqa: SLF001
        fill(j, index + 1, index + count, size=size_each)
        if before is not None and j._copy_live == live:  # noqa: SLF001 (else the mark was flushed first)
            assert io.read_all(SIM_SEGMENT)[live[0] : live[1]] == before
        index += count
        j.sync()
        seg = j._segments[-1]  # noqa: SLF001
        batch = seg.size - size
        if j._copy_live is not None:  # noqa: SLF001
            start, end = j._copy_live  # noqa: SLF001
            raw = io.read_all(SIM_SEGMENT)
            assert start >= seg.size and start % 4096 == 0
            assert raw[start + COPY_HEADER_BYTES : end] == raw[seg.size - batch : seg.size - COPY_RECORD_BYTES]
            assert layout(raw)[-1][0] == "copy"
        else:
            assert read_sync_mark(io, "/j") == j.synced_mark, "an uncopied batch's mark is durable"
    j.close()
    assert len(io.read_all(SIM_SEGMENT)) == j._segments[-1].size  # noqa: SLF001 (the copy went with the zeros)
    assert Journal(io, "/j").last_index == index
