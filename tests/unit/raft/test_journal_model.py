"""Hypothesis: the journal against reference models.

1. pysyncobj's own in-memory journal is the reference for the raft-log
   interface pysyncobj uses (positions, negative indexes, slices, deletes).
2. Power cuts of the simulated disk: for any interleaving of appends, syncs,
   prefix deletes, suffix deletes and power cuts, recovery yields a prefix of
   the log as it was at the cut that holds every synced entry and nothing
   deleted.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.journal import MemoryJournal

from shoal.node.raft._io import SimIO
from shoal.node.raft.journal import Journal

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
def test_raft_log_interface_matches_pysyncobj_memory_journal(ops) -> None:
    ref = MemoryJournal()
    j = Journal(SimIO(), "/j", segment_bytes=600, cache_entries_max=5)
    for op in ops:
        if op[0] == "add":
            _, count, dterm, size = op
            for _ in range(count):
                idx = ref[-1][1] + 1 if len(ref) else 1
                term = (ref[-1][2] if len(ref) else 1) + (dterm if _ == 0 else 0)
                entry = (_payload(idx, term, size), idx, term)
                ref.add(*entry)
                j.add(*entry)
        elif op[0] == "delete_from" and len(ref):
            pos = op[1] % (len(ref) + 1)
            ref.deleteEntriesFrom(pos)
            j.deleteEntriesFrom(pos)
        elif op[0] == "delete_to" and len(ref):
            pos = op[1] % len(ref)  # pysyncobj always keeps at least one entry
            ref.deleteEntriesTo(pos)
            j.deleteEntriesTo(pos)
        elif op[0] == "clear":
            ref.clear()
            j.clear()
        n = len(ref)
        assert len(j) == n
        if n:
            assert j[0] == ref[0] and j[-1] == ref[-1] and j[n // 2] == ref[n // 2]
            assert j[-min(n, 3)] == ref[-min(n, 3)]
            assert j[1:] == ref[1:] and j[n // 3 : n // 3 + 4] == ref[n // 3 : n // 3 + 4]
            assert j[:] == ref[:] and j[n + 5 :] == []


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_recovery_after_power_cuts_keeps_every_synced_entry_and_nothing_deleted(ops) -> None:
    io = SimIO()
    j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4)
    model: list[tuple[bytes, int, int]] = []  # the log as the journal holds it now
    first = 1  # the model's first index
    durable_last = 0  # every index in [first, durable_last] must survive a cut
    for op in ops:
        kind = op[0]
        if kind == "add":
            _, count, dterm, size = op
            for k in range(count):
                idx = model[-1][1] + 1 if model else first
                term = (model[-1][2] if model else 1) + (dterm if k == 0 else 0)
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
            j = Journal(io, "/j", segment_bytes=700, cache_entries_max=4)
            got = list(j)
            if got:
                assert got[0][1] == first, "the durable first index moved"
            assert got == model[: len(got)], "recovered log is not a prefix of the log at the cut"
            assert (got[-1][1] if got else first - 1) >= durable_last, "a synced entry was lost"
            model = got
            durable_last = got[-1][1] if got else first - 1  # what recovery kept is on disk now
        assert j.last_index == (model[-1][1] if model else j.first_index - 1)
