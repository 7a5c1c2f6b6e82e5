"""Mark records in journal segments: damage to synced records near the end of the last segment
is refused even when the ``synced`` file lags (put back as it was earlier, as damage to its
copies can leave it), a torn tail is still cut, and the log reads, deletes and reopens the same
with mark records between its entries."""

from __future__ import annotations

import logging
import os
import random
import struct

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.raft._io import RealIO, SimIO
from shoal.node.raft.storage import DeferredIO
from shoal.node.raft.journal import (
    MARK_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    Journal,
    JournalCorrupt,
    encode_record,
    read_sync_mark,
)

from journal_layout import copy_of, entry_offset, layout, records_end

RECORD = RECORD_HEADER_BYTES + 100


def real() -> RealIO:
    return RealIO(disk_free_min_bytes=0)


def payload(i: int) -> bytes:
    return i.to_bytes(4, "big") * 25


def fill(j: Journal, first: int, last: int, term: int = 1) -> None:
    for i in range(first, last + 1):
        j.append(i, term, payload(i))


def crash(j: Journal) -> None:
    """The process dies: what was written stays in the page cache, nothing more is synced."""
    if j._active is not None:
        j._active.close()
    if j._mark_handle is not None:
        j._mark_handle.close()


def segment(directory) -> str:
    (name,) = sorted(n for n in os.listdir(directory) if n.endswith(".wal"))
    return os.path.join(directory, name)


def flip(path: str, at: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


#: The first segment of a journal in ``/j`` on the simulated disk.
SIM_SEGMENT = f"/j/{1:020d}.wal"


def sim_flip(io: SimIO, path: str, at: int, mask: int = 0x01) -> None:
    """Flip bits ``mask`` of the byte at ``at`` of ``path`` on the simulated disk."""
    h = io.open(path, create=False)
    h.pwrite(at, bytes([h.pread(at, 1)[0] ^ mask]))


def sim_three_synced_batches_cut() -> SimIO:
    """On the simulated disk: entries 1-10, 11-20 and 21-30, each batch synced, then a power cut,
    and the ``synced`` file put back as it was before the first sync: only the mark records in
    the segment tell what was synced."""
    io = SimIO()
    j = Journal(io, "/j")
    stale = io.read_all("/j/synced")
    for first in (1, 11, 21):
        fill(j, first, first + 9)
        j.sync()
    io.power_cut()
    h = io.open("/j/synced", create=False)
    h.pwrite(0, stale)
    h.datasync()
    return io


def three_synced_batches(directory: str) -> bytes:
    """Entries 1-10, 11-20 and 21-30, each batch synced; returns the ``synced`` file as it was
    after the first sync (to put back: a ``synced`` file that lags)."""
    j = Journal(real(), directory)
    fill(j, 1, 10)
    j.sync()
    stale = open(os.path.join(directory, "synced"), "rb").read()
    fill(j, 11, 20)
    j.sync()
    fill(j, 21, 30)
    j.sync()
    crash(j)
    return stale


# --- the layout ---------------------------------------------------------------------------------


def test_the_first_entry_after_each_sync_carries_a_mark_record_naming_its_own_offset(tmp_path) -> None:
    three_synced_batches(str(tmp_path))
    raw = open(segment(tmp_path), "rb").read()
    marks = [(o, i) for kind, o, i in layout(raw) if kind == "mark"]
    assert marks == [(entry_offset(raw, 11) - MARK_RECORD_BYTES, 10), (entry_offset(raw, 21) - MARK_RECORD_BYTES, 20)]
    batch = ["entry"] * 10 + ["copy"]
    assert [kind for kind, _, _ in layout(raw)] == batch + ["mark"] + batch + ["mark"] + batch
    assert entry_offset(raw, 1) == SEGMENT_HEADER_BYTES
    for offset, _ in marks:
        assert struct.unpack_from("<Q", raw, offset + 16)[0] == offset  # the offset it names is its own


@pytest.mark.parametrize("cut", [None, 15, 11, 9])
def test_a_copy_made_from_the_records_as_written_is_the_copy_read_back(tmp_path, cut) -> None:
    """The copy of a batch is made from its records as appended; a cut inside the batch (or
    below it) makes the journal read the batch back instead. The segments come out the same."""
    segments = []
    for name, read_back in (("kept", False), ("read", True)):
        j = Journal(real(), str(tmp_path / name))
        fill(j, 1, 10)
        j.sync()
        fill(j, 11, 20)
        if cut is not None:
            j.delete_from(cut)
            fill(j, cut, 24)
        if read_back:
            j._batch_seg = None  # as if the records were not kept: the copy reads them back
        j.sync()
        j.close()
        segments.append(open(segment(tmp_path / name), "rb").read())
    kept, read = segments
    assert kept == read
    assert [kind for kind, _, _ in layout(kept)][-1] == "copy"


def test_a_copy_under_the_power_cut_test_io_is_written_as_on_a_disk(tmp_path) -> None:
    """The node's power-cut test mode holds unsynced bytes in memory: the copy goes through it
    too (not past it), so a synced journal's file is the same as on real I/O."""
    files = []
    for name, io in (("real", real()), ("deferred", DeferredIO(disk_free_min_bytes=0))):
        j = Journal(io, str(tmp_path / name), zeros_ahead=True)
        fill(j, 1, 10)
        j.sync()
        fill(j, 11, 20)
        j.sync()
        crash(j)
        files.append(open(segment(tmp_path / name), "rb").read())
    assert files[0] == files[1]
    assert [kind for kind, _, _ in layout(files[1])][-1] == "copy"


def test_the_mark_record_costs_no_write_call_and_no_sync_of_its_own(tmp_path, monkeypatch) -> None:
    j = Journal(real(), str(tmp_path))
    fill(j, 1, 10)
    j.sync()
    calls: list[str] = []
    real_pwrite, real_pwritev, real_fdatasync = os.pwrite, os.pwritev, os.fdatasync
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: (calls.append("pwrite"), real_pwrite(fd, data, at))[1])
    monkeypatch.setattr(os, "pwritev", lambda fd, parts, at: (calls.append("pwritev"), real_pwritev(fd, parts, at))[1])
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append("fdatasync"), real_fdatasync(fd))[1])
    fill(j, 11, 20)
    j.sync()
    # one write per entry (the first with the mark record ahead of it), two of the batch's copy
    # (the copy ahead, from the entries as written, and its record after them) and the
    # segment's fdatasync; the ``synced`` file is written once in MARK_WRITE_EVERY such syncs
    assert calls == ["pwrite"] * 10 + ["pwritev", "pwritev", "fdatasync"]
    j.close()


# --- damage to synced records near the end of the last segment ---------------------------------


def test_a_flipped_byte_in_synced_records_near_the_end_is_refused_though_the_synced_file_lags(tmp_path) -> None:
    """Entry 15 was synced by the second sync, and is damaged with the batch's copy; the
    ``synced`` file lags (an old copy is put back), but the mark record written with entry 21
    vouches for it."""
    d = str(tmp_path)
    stale = three_synced_batches(d)
    with open(os.path.join(d, "synced"), "wb") as f:
        f.write(stale)
    assert read_sync_mark(real(), d).index == 10
    path = segment(d)
    raw = open(path, "rb").read()
    offset = entry_offset(raw, 15)
    flip(path, offset + RECORD_HEADER_BYTES + 7)
    flip(path, copy_of(raw, offset + RECORD_HEADER_BYTES + 7))  # and its copy: nothing restores it
    with pytest.raises(JournalCorrupt) as err:
        Journal(real(), d)
    assert (err.value.path, err.value.offset) == (path, offset)
    mark_at = entry_offset(raw, 21) - MARK_RECORD_BYTES
    assert str(err.value) == (f"{path} at offset {offset}: checksum mismatch in synced data "
                              f"(the mark record at offset {mark_at} says the bytes before it were synced)")
    assert os.path.getsize(path) == len(raw), "a refused journal is left as it was"


@pytest.mark.parametrize("where", ["length", "crc", "term", "index", "payload"])
def test_damage_anywhere_in_a_vouched_record_after_a_power_cut_is_refused(where) -> None:
    """The ``synced`` file put back as it was before the first sync: only the mark records in the
    segment tell what was synced."""
    io = sim_three_synced_batches_cut()
    assert read_sync_mark(io, "/j").index == 0
    path = SIM_SEGMENT
    offset = entry_offset(io.read_all(path), 12)
    at = offset + {"length": 1, "crc": 4, "term": 9, "index": 17, "payload": RECORD_HEADER_BYTES + 50}[where]
    for damaged in (at, copy_of(io.read_all(path), at)):  # the record and its copy
        sim_flip(io, path, damaged, 0x10)
    with pytest.raises(JournalCorrupt) as err:
        Journal(io, "/j")
    assert (err.value.path, err.value.offset) == (path, offset)
    assert "in synced data" in str(err.value)


def test_a_damaged_mark_record_in_synced_data_is_refused_by_its_offset() -> None:
    io = sim_three_synced_batches_cut()
    path = SIM_SEGMENT
    mark_at = entry_offset(io.read_all(path), 11) - MARK_RECORD_BYTES
    for damaged in (mark_at + 20, copy_of(io.read_all(path), mark_at + 20)):  # in the offset it names, twice
        sim_flip(io, path, damaged, 0x04)
    with pytest.raises(JournalCorrupt) as err:
        Journal(io, "/j")
    assert (err.value.path, err.value.offset) == (path, mark_at)
    assert "mark record fails its checks in synced data" in str(err.value)


def test_a_process_crash_keeps_the_mark_record_written_with_the_next_append(tmp_path) -> None:
    """The last synced batch is vouched for as soon as the next append wrote its mark record."""
    d = str(tmp_path)
    stale = three_synced_batches(d)
    j = Journal(real(), d)
    fill(j, 31, 31)  # never synced: its mark record (naming the end of entry 30) is in the page cache
    crash(j)
    with open(os.path.join(d, "synced"), "wb") as f:
        f.write(stale)
    path = segment(d)
    raw = open(path, "rb").read()
    offset = entry_offset(raw, 28)
    flip(path, offset + RECORD_HEADER_BYTES)
    copy = copy_of(raw, offset + RECORD_HEADER_BYTES)
    if copy is not None:  # a clean close cut it with the zeros ahead
        flip(path, copy)
    with pytest.raises(JournalCorrupt) as err:
        Journal(real(), d)
    assert (err.value.path, err.value.offset) == (path, offset)


def test_with_the_synced_file_lagging_damage_in_the_last_synced_batch_is_restored_from_its_copy() -> None:
    """With the ``synced`` file put back to an older mark, and no append after the last sync to
    write a mark record naming its end, the batch's copy restores it."""
    io = sim_three_synced_batches_cut()
    offset = entry_offset(io.read_all(SIM_SEGMENT), 25)
    sim_flip(io, SIM_SEGMENT, offset + 40)
    j = Journal(io, "/j")
    assert j.entries(1, 31) == [(payload(i), i, 1) for i in range(1, 31)]


def test_with_the_synced_file_lagging_damage_in_the_last_batch_and_its_copy_passes_for_a_torn_tail() -> None:
    """What the module docstring leaves (*What is left*): two damaged blocks, the batch's and its
    copy's, with nothing after them, look like a write a power cut tore."""
    io = sim_three_synced_batches_cut()
    raw = io.read_all(SIM_SEGMENT)
    offset = entry_offset(raw, 25)
    sim_flip(io, SIM_SEGMENT, offset + 40)
    sim_flip(io, SIM_SEGMENT, copy_of(raw, offset + 40))
    assert Journal(io, "/j").last_index == 24


def _mark_is_whole(raw: bytes, offset: int, segment: int) -> bool:
    if offset + MARK_RECORD_BYTES > len(raw):
        return False
    sentinel, crc, magic, named, index = struct.unpack_from("<II8sQQ", raw, offset)
    body = struct.pack("<I8sQQQ", sentinel, magic, named, index, segment)
    return magic == b"SHOALMRK" and named == offset and google_crc32c.value(body) == crc


BATCHES = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 150), st.booleans()), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(BATCHES, st.integers(0, 2**32))
def test_after_any_power_cut_damage_before_a_whole_mark_record_is_refused(batches, seed) -> None:
    """Batches of appends, each synced or not, then a power cut that tears what was unsynced:
    recovery never refuses the undamaged journal, and a byte flipped in any entry before a whole
    mark record of the last segment (with its batch's copy, or not) is refused by file and
    offset."""
    io = SimIO()
    options = {"segment_bytes": 1_500, "unsynced_bytes_max": 600}
    j = Journal(io, "/j", **options)
    index = 0
    for count, size, sync in batches:
        for _ in range(count):
            index += 1
            j.append(index, 1, bytes([index % 251]) * size)
        if sync:
            j.sync()
    synced = j.synced_index
    io.power_cut(random.Random(seed))
    names = sorted(n for n in io.listdir("/j") if n.endswith(".wal"))  # none if the first sync never ran
    path = f"/j/{names[-1]}" if names else ""
    raw = io.read_all(path) if names else b""
    records = layout(raw)
    marks = [o for kind, o, _ in records if kind == "mark" and _mark_is_whole(raw, o, int(names[-1][:-4]))]
    covered = [o for kind, o, _ in records if kind == "entry" and marks and o < max(marks)]
    if not covered:
        assert Journal(io, "/j", **options).last_index >= synced
        return
    rng = random.Random(seed)
    offset = rng.choice(covered)
    end = offset + RECORD_HEADER_BYTES + struct.unpack_from("<I", raw, offset)[0]
    at = rng.randrange(offset, end)
    mask = 1 << rng.randrange(8)
    copy = copy_of(raw, at)
    sim_flip(io, path, at, mask)
    if copy is not None and rng.random() < 0.5:
        sim_flip(io, path, copy, mask)
    with pytest.raises(JournalCorrupt) as err:
        Journal(io, "/j", **options)
    assert (err.value.path, err.value.offset) == (path, offset), str(err.value)


# --- torn tails are still cut -------------------------------------------------------------------


@pytest.mark.parametrize("torn_at", ["inside the mark record", "inside the entry after it", "a later entry"])
def test_a_torn_unsynced_batch_is_cut_where_it_is_torn(tmp_path, torn_at) -> None:
    d = str(tmp_path)
    stale = three_synced_batches(d)
    j = Journal(real(), d)
    fill(j, 31, 35)  # never synced
    crash(j)
    with open(os.path.join(d, "synced"), "wb") as f:
        f.write(stale)  # the ``synced`` file lagging too
    path = segment(d)
    raw = open(path, "rb").read()
    mark_at = entry_offset(raw, 31) - MARK_RECORD_BYTES
    cut, kept = {
        "inside the mark record": (mark_at + 10, 30),
        "inside the entry after it": (mark_at + MARK_RECORD_BYTES + 30, 30),
        "a later entry": (entry_offset(raw, 34) + 50, 33),
    }[torn_at]
    with open(path, "r+b") as f:
        f.truncate(cut)
    j = Journal(real(), d)
    assert j.last_index == kept
    assert [e[1] for e in j.entries(1, 100)] == list(range(1, kept + 1))


@pytest.mark.parametrize("garbage", ["zeros", "noise"])
def test_garbage_after_the_last_sync_is_a_torn_tail(garbage) -> None:
    """A power cut keeps the size of the unsynced writes but not their data."""
    io = SimIO()
    j = Journal(io, "/j")
    for first in (1, 11):
        fill(j, first, first + 9)
        j.sync()
    fill(j, 21, 25)  # never synced
    path = SIM_SEGMENT
    h = io.open(path, create=False)
    mark_at = entry_offset(io.read_all(path), 21) - MARK_RECORD_BYTES
    size = h.size
    tail = bytes(size - mark_at) if garbage == "zeros" else os.urandom(size - mark_at)
    io.power_cut()
    h = io.open(path, create=False)
    h.append(tail)
    j = Journal(io, "/j")
    assert j.last_index == 20 and h.size == mark_at


def test_a_torn_record_larger_than_the_unsynced_bound_after_its_mark_record_is_a_torn_tail(tmp_path) -> None:
    j = Journal(real(), str(tmp_path), unsynced_bytes_max=1_000)
    fill(j, 1, 3)
    j.sync()
    j.append(4, 1, b"big" * 2_000)  # a mark record, then one record larger than the bound
    crash(j)
    path = segment(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(records_end(open(path, "rb").read()) - 500)
    assert Journal(real(), str(tmp_path)).last_index == 3


def test_a_mark_record_copied_into_a_payload_vouches_for_nothing(tmp_path) -> None:
    """A payload holding a well-formed mark record (for another offset) does not turn a torn
    tail into refused damage: a mark record counts only at the offset it names."""
    d = str(tmp_path)
    j = Journal(real(), d)
    fill(j, 1, 10)
    j.sync()
    raw = open(segment(d), "rb").read()
    forged_for = len(raw) + 1_000  # beyond the bytes the torn write below keeps
    body = struct.pack("<I8sQQQ", 0xFFFFFFFF, b"SHOALMRK", forged_for, 12, 1)
    forged = struct.pack("<II8sQQ", 0xFFFFFFFF, google_crc32c.value(body), b"SHOALMRK", forged_for, 12)
    j.append(11, 1, b"x" * 40 + forged + b"y" * 40)
    j.append(12, 1, payload(12))
    crash(j)
    path = segment(d)
    offset = entry_offset(open(path, "rb").read(), 11)
    flip(path, offset + 8)  # entry 11 torn: its checksum fails
    assert Journal(real(), d).last_index == 10


# --- the log reads, deletes and reopens the same ------------------------------------------------


def test_reads_deletes_and_reopen_with_mark_records_between_entries(tmp_path) -> None:
    d = str(tmp_path)
    j = Journal(real(), d, segment_bytes=3_000, cache_entries_max=2)
    for first in range(1, 60, 3):
        fill(j, first, first + 2)
        j.sync()
    assert j.memory_bytes() == 8 * 60 + 16 + 2 * 100  # offsets of entries only, one term, the cache
    assert j.entries(1, 61) == [(payload(i), i, 1) for i in range(1, 61)]
    j.delete_from(44)  # the first entry of a batch: right after a mark record, which stays
    j.delete_from(42)  # inside a batch
    fill(j, 42, 50, term=2)
    j.sync()
    expected = [(payload(i), i, 1) for i in range(1, 42)] + [(payload(i), i, 2) for i in range(42, 51)]
    assert j.entries(1, 100) == expected
    j.delete_to(20)
    j.close()
    j = Journal(real(), d, segment_bytes=3_000, cache_entries_max=2)
    assert (j.first_index, j.last_index) == (20, 50)
    assert j.entries(1, 100) == expected[19:]
    assert [e[1] for e in j.entries(20, 51)[::5]] == list(range(20, 51, 5))
    fill(j, 51, 51, term=2)
    assert j.sync() == 51
    j.close()


def test_after_a_suffix_delete_the_next_mark_record_names_the_cut() -> None:
    io = SimIO()
    j = Journal(io, "/j")
    fill(j, 1, 10)
    j.sync()
    fill(j, 11, 20)
    j.sync()
    j.delete_from(8)  # the mark record written with entry 11 goes with the cut
    fill(j, 8, 12, term=2)
    j.sync()
    fill(j, 13, 14, term=2)
    j.sync()
    raw = io.read_all(SIM_SEGMENT)
    marks = [(o, i) for kind, o, i in layout(raw) if kind == "mark"]
    assert marks == [(entry_offset(raw, 8) - MARK_RECORD_BYTES, 7), (entry_offset(raw, 13) - MARK_RECORD_BYTES, 12)]
    io.power_cut()
    offset = entry_offset(raw, 10)
    sim_flip(io, SIM_SEGMENT, offset + 30, 0x02)
    sim_flip(io, SIM_SEGMENT, copy_of(raw, offset + 30), 0x02)
    with pytest.raises(JournalCorrupt) as err:
        Journal(io, "/j")
    assert err.value.offset == offset


# --- segments of format version 2 ---------------------------------------------------------------


def _v2_segment(path: str, first: int, last: int) -> None:
    body = struct.pack("<8sII", b"SHOALWAL", 2, 8 * 1024 * 1024)
    header = body + struct.pack("<I", google_crc32c.value(body))
    with open(path, "wb") as f:
        f.write(header + b"".join(encode_record(i, 1, payload(i)) for i in range(first, last + 1)))


def test_a_version_2_segment_is_read_and_sealed_at_the_first_append(tmp_path, caplog) -> None:
    d = str(tmp_path)
    path = os.path.join(d, f"{1:020d}.wal")
    _v2_segment(path, 1, 20)
    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.journal"):
        j = Journal(real(), d)  # no ``synced`` file: it is written anew
    assert j.entries(1, 100) == [(payload(i), i, 1) for i in range(1, 21)]
    fill(j, 21, 25)
    j.sync()
    fill(j, 26, 30)
    j.sync()
    j.close()
    assert sorted(n for n in os.listdir(d) if n.endswith(".wal")) == [f"{1:020d}.wal", f"{21:020d}.wal"]
    assert struct.unpack_from("<I", open(path, "rb").read(), 8)[0] == 2  # left as it was
    assert not [k for k, _, _ in layout(open(path, "rb").read()) if k == "mark"]
    newer = os.path.join(d, f"{21:020d}.wal")
    assert struct.unpack_from("<I", open(newer, "rb").read(), 8)[0] == 5
    j = Journal(real(), d)
    assert j.entries(1, 100) == [(payload(i), i, 1) for i in range(1, 31)]


def test_a_torn_tail_of_a_version_2_last_segment_is_cut(tmp_path) -> None:
    d = str(tmp_path)
    _v2_segment(os.path.join(d, f"{1:020d}.wal"), 1, 20)
    j = Journal(real(), d)
    j.close()  # the ``synced`` file names all 20
    path = os.path.join(d, f"{1:020d}.wal")
    with open(path, "ab") as f:
        f.write(encode_record(21, 1, payload(21))[:70])  # a torn append of the old format
    assert Journal(real(), d).last_index == 20


def test_a_whole_segment_header_of_an_unknown_version_is_refused_not_rewritten(tmp_path) -> None:
    d = str(tmp_path)
    path = os.path.join(d, f"{1:020d}.wal")
    body = struct.pack("<8sII", b"SHOALWAL", 9, 1_000)
    with open(path, "wb") as f:
        f.write(body + struct.pack("<I", google_crc32c.value(body)) + b"\x00" * 50)
    with pytest.raises(JournalCorrupt, match="unknown format .*version 9") as err:
        Journal(real(), d)
    assert (err.value.path, err.value.offset) == (path, 0)
    assert os.path.getsize(path) == SEGMENT_HEADER_BYTES + 50
