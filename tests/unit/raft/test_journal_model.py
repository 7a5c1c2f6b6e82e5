"""Hypothesis: the journal against reference models.

1. A plain list of ``(payload, index, term)`` is the reference for what the
   Raft core reads (:class:`~shoal.node.raft.raft_log.LogStorage`: first and
   last index, terms, ranges of entries) through appends and deletes.
2. Power cuts of the simulated disk: for any interleaving of appends, syncs,
   prefix deletes, suffix deletes and power cuts, recovery yields a prefix of
   the log as it was at the cut that holds every synced entry and nothing
   deleted.
3. Damage: a byte flipped in any record the journal reported synced (the
   entries up to its ``synced_index``, and the mark records among them) is
   refused with its file and offset wherever anything on disk vouches for it, and
   restored from its batch's copy where nothing does (the newest batch), after a
   process crash and after power cuts at any I/O step.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from journal_layout import copy_of, layout

from shoal.node.raft._io import SimIO
from shoal.node.raft.journal import (
    MARK_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    Journal,
    JournalCorrupt,
    _mark_record_index,
    read_sync_mark,
)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 12), st.integers(0, 2), st.integers(0, 300)),
        st.tuples(st.just("sync")),
        st.tuples(st.just("delete_from"), st.integers(0, 40)),
        st.tuples(st.just("delete_to"), st.integers(0, 40)),
        st.tuples(st.just("clear")),
        st.tuples(st.just("cut"), st.integers(0, 2**32), st.booleans()),
    ),
    max_size=40,
)


def _payload(index: int, term: int, size: int) -> bytes:
    return f"{index}:{term}:".encode() * (size // 8 + 1)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_log_the_core_reads_matches_a_list(ops) -> None:
    """Reads match the model after every step, mark records between the entries once synced,
    and a journal reopened after the process died holds the same list."""
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=600, cache_entries_max=5, unsynced_bytes_max=500)
    model: list[tuple[bytes, int, int]] = []
    first = 1  # the model's first index
    for op in ops:
        if op[0] == "add":
            _, count, dterm, size = op
            for k in range(count):
                idx = model[-1][1] + 1 if model else first
                term = (model[-1][2] if model else 1) + (dterm if k == 0 else 0)
                entry = (_payload(idx, term, size), idx, term)
                j.append(idx, term, entry[0])
                model.append(entry)
        elif op[0] == "sync":
            j.sync()
        elif op[0] == "delete_from" and model:
            index = first + op[1] % (len(model) + 1)
            j.delete_from(index)
            del model[index - first:]
        elif op[0] == "delete_to" and model:
            index = first + op[1] % len(model)
            j.delete_to(index)
            del model[: index - first]
            first = index
        elif op[0] == "clear":
            j.clear()
            first = model[-1][1] + 1 if model else first
            model = []
        last = model[-1][1] if model else first - 1
        assert (j.first_index, j.last_index) == (first, last)
        assert j.entries(first, last + 1) == model
        n = len(model)
        if n:
            lo, hi = first + n // 3, first + min(n, n // 3 + 4)
            assert j.entries(lo, hi) == model[lo - first: hi - first]
            assert [j.term_at(i) for i in (first, first + n // 2, last)] == \
                [model[0][2], model[n // 2][2], model[-1][2]]
        assert j.term_at(last + 1) is None and j.term_at(first - 1) is None
    j = Journal(io, "/j", segment_bytes=600, cache_entries_max=5, unsynced_bytes_max=500)  # the process died
    assert list(j) == model


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_recovery_after_power_cuts_keeps_every_synced_entry_and_nothing_deleted(ops) -> None:
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
    model: list[tuple[bytes, int, int]] = []  # the log as the journal holds it now
    first = 1  # the model's first index
    durable_last = 0  # every index in [first, durable_last] must survive a cut
    top_term = 1  # Raft's terms never go down, not even after deletes or a cut
    for op in ops:
        kind = op[0]
        if kind == "add":
            _, count, dterm, size = op
            for k in range(count):
                idx = model[-1][1] + 1 if model else first
                term = top_term = top_term + (dterm if k == 0 else 0)
                entry = (_payload(idx, term, size), idx, term)
                j.append(idx, term, entry[0])
                model.append(entry)
        elif kind == "sync":
            assert j.sync() == (model[-1][1] if model else j.synced_index)
            durable_last = model[-1][1] if model else durable_last
        elif kind == "delete_from" and model:
            index = first + op[1] % (len(model) + 1)
            j.delete_from(index)
            del model[index - first :]
            durable_last = min(durable_last, index - 1)
        elif kind == "delete_to" and model:
            index = first + op[1] % len(model)
            j.delete_to(index)
            del model[: index - first]
            first = index
        elif kind == "clear":
            j.clear()
            first = model[-1][1] + 1 if model else first
            model = []
            durable_last = first - 1
        elif kind == "cut":
            _, seed, torn = op
            io.power_cut(random.Random(seed) if torn else None)
            j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
            got = list(j)
            if got:
                assert got[0][1] == first, "the durable first index moved"
            assert got == model[: len(got)], "recovered log is not a prefix of the log at the cut"
            assert (got[-1][1] if got else first - 1) >= durable_last, "a synced entry was lost"
            model = got
            durable_last = got[-1][1] if got else first - 1  # what recovery kept is on disk now
        assert j.last_index == (model[-1][1] if model else j.first_index - 1)


class _Cut(Exception):
    """Raised from the simulated disk's step hook: the power fails in the middle of an operation."""


OPS_WITH_MID_CUTS = st.lists(
    st.tuples(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 6), st.integers(0, 2), st.integers(0, 300)),
            st.tuples(st.just("sync")),
            st.tuples(st.just("delete_from"), st.integers(0, 40)),
            st.tuples(st.just("delete_to"), st.integers(0, 40)),
            st.tuples(st.just("clear")),
        ),
        st.one_of(st.none(), st.integers(1, 12)),  # cut the power at this I/O step of the operation
        st.integers(0, 2**32),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(OPS_WITH_MID_CUTS)
# A power cut that tears a new segment's header after its magic and version (found by this test).
@example([(("add", 1, 0, 0), None, 0)] * 3 + [(("sync",), 1, 0), (("add", 4, 0, 0), None, 0),
                                              (("delete_to", 1), 6, 123169)])
# Unsynced entries below the durable start lost in a cut; appending at the index where the
# journal then ends must lower the start, or a later recovery hides the new entries.
@example([(("add", 2, 0, 0), None, 0), (("delete_to", 1), None, 0), (("delete_from", 0), 1, 0),
          (("add", 1, 0, 0), None, 0), (("add", 2, 0, 16), 2, 1)])
def test_power_cut_inside_any_operation_recovers_to_the_state_before_or_after_it(ops) -> None:
    """A cut at any I/O step of an operation: recovery holds every entry durable before it,
    nothing not in the log before or after it, and the first index of before or after."""
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
    model: list[tuple[bytes, int, int]] = []
    first = 1
    durable_last = 0
    top_term = 1  # Raft's terms never go down, not even after deletes or a cut
    for op, cut_at, seed in ops:
        steps = [0]

        def hook(what: str) -> None:
            steps[0] += 1
            if steps[0] == cut_at:
                raise _Cut(what)

        io.step_hook = hook if cut_at is not None else None
        kind = op[0]
        after = list(model)
        firsts = {first}
        keep_last = durable_last  # entries up to here must survive whatever happens
        try:
            if kind == "add":
                _, count, dterm, size = op
                for k in range(count):
                    idx = after[-1][1] + 1 if after else first
                    term = top_term = top_term + (dterm if k == 0 else 0)
                    entry = (_payload(idx, term, size), idx, term)
                    after.append(entry)
                    j.append(idx, term, entry[0])
            elif kind == "sync":
                j.sync()
                durable_last = after[-1][1] if after else durable_last
            elif kind == "delete_from" and model:
                index = first + op[1] % (len(model) + 1)
                keep_last = min(durable_last, index - 1)
                del after[index - first :]
                j.delete_from(index)
                durable_last = keep_last
            elif kind == "delete_to" and model:
                index = first + op[1] % len(model)
                firsts.add(index)
                del after[: index - first]
                j.delete_to(index)
                first = index
            elif kind == "clear":
                after = []
                j.clear()
                first = j.first_index
                firsts.add(first)
                durable_last = 0  # nothing is owed after a clear
            model = after
            continue
        except _Cut:
            pass
        io.step_hook = None
        io.power_cut(random.Random(seed))
        j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
        got = list(j)
        last = got[-1][1] if got else j.first_index - 1
        if got:
            assert got[0][1] in firsts, (got[0][1], firsts)
            candidates = [m for m in (model, after) if m and m[0][1] <= got[0][1]]
            assert any(m[got[0][1] - m[0][1] :][: len(got)] == got for m in candidates), (
                "recovered entries are neither the log before nor after the operation"
            )
        if not (kind == "clear" and not got):  # a cut clear may have removed everything
            assert last >= keep_last, f"entry {keep_last} was durable before a cut during {kind} and is lost"
        model = got
        first = got[0][1] if got else j.first_index
        durable_last = last if got else 0  # an empty log owes nothing
    io.step_hook = None


def _journal_of_segments() -> tuple[SimIO, Journal, list[tuple[bytes, int, int]]]:
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=500, cache_entries_max=4)
    log = [(_payload(i, 1 + i // 10, 100), i, 1 + i // 10) for i in range(1, 41)]
    for entry in log:
        j.append(entry[1], entry[2], entry[0])
    j.sync()
    assert len(io.listdir("/j")) > 5
    return io, j, log


OPERATIONS = {
    "delete_to across segments": lambda j: j.delete_to(29),  # inside a segment
    "delete_from across segments": lambda j: j.delete_from(9),
    "clear": lambda j: j.clear(),
    "append with roll-overs, then sync": lambda j: [
        j.append(i, 5, _payload(i, 5, 300)) for i in range(41, 47)
    ] and j.sync(),
}


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_a_cut_at_every_io_step_of_an_operation_leaves_the_log_before_or_after_it(name) -> None:
    operation = OPERATIONS[name]
    _, done_j, log = _journal_of_segments()
    operation(done_j)
    after = list(done_j)
    completed = False
    for cut_at in range(1, 200):
        io, j, _ = _journal_of_segments()
        steps = [0]

        def hook(what: str) -> None:
            steps[0] += 1
            if steps[0] == cut_at:
                raise _Cut(what)

        io.step_hook = hook
        try:
            operation(j)
            completed = True
        except _Cut:
            pass
        io.step_hook = None
        io.power_cut()
        got = list(Journal(io, "/j", segment_bytes=500))
        if completed:
            assert got == after, f"{name} returned before its effect was durable"
            break
        if name.startswith("append"):
            assert got == after[: len(got)] and len(got) >= len(log)
        elif name.startswith("delete_from"):  # a prefix of the log before, never shorter than after
            assert got == log[: len(got)] and len(got) >= len(after)
        else:
            assert got in (log, after), f"cut after I/O step {cut_at} of {name}: neither before nor after"
    assert completed


# --- damage in synced records is restored or refused, never cut as a torn tail ---------------


def _vouched(io: SimIO, path: str, offset: int) -> bool:
    """Does anything on disk say the record at ``offset`` was synced: it is in a sealed segment,
    a whole mark record follows it, or the ``synced`` file names its bytes?"""
    names = sorted(n for n in io.listdir(os.path.dirname(path)) if n.endswith(".wal"))
    if os.path.basename(path) != names[-1]:
        return True
    raw, first = io.read_all(path), int(os.path.basename(path)[:-4])
    if any(kind == "mark" and o > offset and _mark_record_index(raw, o, o, first) is not None
           for kind, o, _ in layout(raw)):
        return True
    mark = read_sync_mark(io, os.path.dirname(path))
    return mark is not None and mark.segment == first and offset < mark.offset


def _damage(io: SimIO, record: tuple[str, int, int, int], rng: random.Random,
            opened: Callable[[], Journal], owed: list[tuple[bytes, int, int]]) -> None:
    """Flip a bit of ``record`` (and, or not, of its batch's copy): where anything on disk vouches
    for the record it is refused by file and offset; where nothing does (the newest batch), the
    copy restores it (every owed entry reads back as written), and with the copy damaged too it
    is the one case taken for a torn write (the module docstring's *What is left*): the journal
    then opens with the entries before the record."""
    path, offset, end, index = record
    at, bit = rng.randrange(offset, end), rng.randrange(8)
    raw = io.read_all(path)
    copy = copy_of(raw, at)
    # what vouches for the record is read before the damage: a mark record after it stays on
    # disk, though a walk of the damaged file from its start no longer reaches it
    vouched = _vouched(io, path, offset)
    _flip(io, path, at, bit)
    both = copy is None or rng.random() < 0.5
    if both and copy is not None:
        _flip(io, path, copy, bit)
    if not vouched:
        if not both:
            j = opened()
            if owed:
                assert j.entries(owed[0][1], owed[-1][1] + 1) == owed, "a restored entry differs"
            return
        try:
            j = opened()
        except JournalCorrupt as err:
            assert (err.path, err.offset) == (path, offset), str(err)
            return
        kept = [e for e in owed if e[1] < index]
        assert j.last_index == index - 1 and (not kept or j.entries(kept[0][1], index) == kept)
        return
    with pytest.raises(JournalCorrupt) as err:
        opened()
    assert (err.value.path, err.value.offset) == (path, offset), str(err.value)


def _records(io: SimIO, directory: str) -> list[tuple[str, int, int, int]]:
    """``(segment path, offset, end, index)`` of every intact record recovery reads, in log
    order (segments wholly below the durable start are leftovers it removes unread): entries
    with their index, and mark records with the index of the entry they precede (the sync of
    that entry made them durable)."""
    start = struct.unpack_from("<8sQ", io.read_all(f"{directory}/start"))[1] if io.exists(f"{directory}/start") else 0
    names = sorted(n for n in io.listdir(directory) if n.endswith(".wal"))
    while len(names) > 1 and int(names[1][:-4]) <= start:
        names.pop(0)
    out = []
    for name in names:
        path = f"{directory}/{name}"
        raw = io.read_all(path)
        marks: list[int] = []
        for kind, offset, index in layout(raw):
            if kind == "mark":
                marks.append(offset)
            elif kind == "entry":
                out.extend((path, at, at + MARK_RECORD_BYTES, index) for at in marks)
                out.append((path, offset, offset + RECORD_HEADER_BYTES + struct.unpack_from("<I", raw, offset)[0], index))
                marks = []
    return out


def _flip(io: SimIO, path: str, at: int, bit: int) -> None:
    h = io.open(path, create=False)
    h.pwrite(at, bytes([h.pread(at, 1)[0] ^ (1 << bit)]))


class _Log:
    """The log a journal should hold: its entries, first index, and the highest term used."""

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, int, int]] = []
        self.first = 1
        self.top_term = 1

    def run(self, j: Journal, op: tuple) -> None:
        """Apply one operation to ``j`` and to the model."""
        kind, model = op[0], self.entries
        if kind == "add":
            _, count, dterm, size = op
            for k in range(count):
                idx = model[-1][1] + 1 if model else self.first
                term = self.top_term = self.top_term + (dterm if k == 0 else 0)
                j.append(idx, term, _payload(idx, term, size))
                model.append((_payload(idx, term, size), idx, term))
        elif kind == "sync":
            j.sync()
        elif kind == "delete_from" and model:
            index = self.first + op[1] % (len(model) + 1)
            j.delete_from(index)
            del model[index - self.first :]
        elif kind == "delete_to" and model:
            index = self.first + op[1] % len(model)
            j.delete_to(index)
            del model[: index - self.first]
            self.first = index
        elif kind == "clear":
            j.clear()
            model.clear()
            self.first = j.first_index

    def recovered(self, j: Journal) -> None:
        """After a cut: the model is what recovery found."""
        self.entries, self.first = list(j), j.first_index


@settings(max_examples=300, deadline=None)
@given(OPS_WITH_MID_CUTS, st.integers(0, 2**32))
# Two writes of the mark, then a cut that tore one copy: recovery's own write of the mark went
# to the one whole copy, and the next cut tore it too (recovery now writes the other).
@example([(("add", 1, 0, 0), None, 0)] * 4 + [(("sync",), None, 0), (("add", 3, 0, 112), None, 0),
                                             (("sync",), None, 0), (("add", 1, 0, 0), 1, 4461)], 92138572)
# The last batch a sync returned, with no append after it to write a mark record naming its end.
@example([(("add", 3, 0, 50), None, 0), (("sync",), None, 0)], 0)
# A record and its copy damaged, a later batch's mark record vouching for it: refused, though a
# walk of the damaged file from its start no longer reaches that mark record.
@example([(("add", 1, 0, 0), None, 0)] * 4 + [(("add", 3, 0, 96), None, 0), (("add", 1, 0, 32), None, 0)],
         1_051_987_494)
def test_after_any_power_cut_a_flipped_byte_in_anything_reported_synced_is_restored_or_refused(ops, seed) -> None:
    """Power cuts at any I/O step, torn writes of the log and of the mark: a byte flipped in any
    record the journal reported synced (its ``synced_index`` after each operation, lowered as a
    deletion begins) is refused by file and offset where anything vouches for it and restored
    from its batch's copy where nothing does; no entry it reported synced is lost."""
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
    log = _Log()
    reported = 0  # entries up to here were reported synced, and are owed
    for op, cut_at, op_seed in ops:
        steps = [0]

        def hook(what: str) -> None:
            steps[0] += 1
            if steps[0] == cut_at:
                raise _Cut(what)

        if op[0] == "delete_from" and log.entries:  # what it deletes is owed no more once it begins
            reported = min(reported, log.first + op[1] % (len(log.entries) + 1) - 1)
        elif op[0] == "clear":
            reported = 0
        io.step_hook = hook if cut_at is not None else None
        try:
            log.run(j, op)
            reported = j.synced_index
            continue
        except _Cut:
            pass
        io.step_hook = None
        io.power_cut(random.Random(op_seed))
        j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
        mark = read_sync_mark(io, "/j")
        assert mark is not None and j.last_index >= mark.index
        if reported >= log.first:  # (a clear leaves the index it had synced below the log)
            assert j.last_index >= reported, f"entry {reported} was reported synced and is lost"
        log.recovered(j)
        reported = j.synced_index
    io.step_hook = None
    io.power_cut(random.Random(seed))
    mark = read_sync_mark(io, "/j")
    assert mark is not None, "a power cut left neither copy of the mark readable"
    owed = [r for r in _records(io, "/j") if log.first <= r[3] <= reported]
    assert [r[3] for r in owed][-1:] == ([reported] if reported >= log.first else []), "a synced record is lost"
    if not owed:
        j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
        assert j.last_index >= mark.index
        return
    rng = random.Random(seed)
    entries = [e for e in log.entries if e[1] <= reported]
    _damage(io, rng.choice(owed), rng,
            lambda: Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400), entries)


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(0, 2**32))
def test_after_a_process_crash_every_synced_record_is_refused(ops, seed) -> None:
    """The process dies (the page cache survives): the mark is exact, so damage to any entry a
    sync returned is refused by file and offset."""
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400)
    log = _Log()
    for op in ops:
        if op[0] != "cut":
            log.run(j, op)
    synced = [r for r in _records(io, "/j") if log.first <= r[3] <= j.synced_index]
    if not synced:
        return
    rng = random.Random(seed)
    entries = [e for e in log.entries if e[1] <= j.synced_index]
    _damage(io, rng.choice(synced), rng,
            lambda: Journal(io, "/j", segment_bytes=700, cache_entries_max=4, unsynced_bytes_max=400), entries)
