"""Dedupe and debounce entries kept by the hash of (queue, id) in packed tables, as the snapshot
lists them; the table against a dict as a hypothesis state machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import msgpack
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shoal.cluster.codec import raw_of
from shoal.node.state import PartitionEngine
from shoal.node.state._dedupe import DEBOUNCE, DEDUPE
from shoal.node.state._dedupe_table import DedupeTable
from shoal.node.state._key_table import key_hash


def _hashed(entries: list[tuple[str, str, str, int, int, int]]) -> list[list[object]]:
    """The snapshot's list of ``entries`` ``(queue, id, kind, seq, expires, first)``: by hash."""
    return sorted([*key_hash(q, i), kind, seq, exp, first] for q, i, kind, seq, exp, first in entries)


def test_the_snapshot_lists_live_entries_by_hash_and_a_tick_gives_back_their_tables() -> None:
    e = PartitionEngine(0)
    for queue, dedupe_id, ttl in [("b", "z", 10_000), ("a", "y", 500), ("b", "x", 500), ("a", "w", 10_000)]:
        e.apply({"cmd": "PUSH", "queue": queue, "data": raw_of(dedupe_id), "dedupe": {"id": dedupe_id, "ttlMs": ttl}},
                1_000)
    e.apply({"cmd": "PUSH", "queue": "c", "data": raw_of(0), "debounce": {"id": "v", "delayMs": 700}}, 1_000)
    assert e.dedupe_state() == _hashed([("a", "w", DEDUPE, 4, 11_000, 1_000), ("a", "y", DEDUPE, 2, 1_500, 1_000),
                                        ("b", "x", DEDUPE, 3, 1_500, 1_000), ("b", "z", DEDUPE, 1, 11_000, 1_000),
                                        ("c", "v", DEBOUNCE, 5, 1_700, 1_000)])
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.dedupe_state() == e.dedupe_state() and restored.digest() == e.digest()
    for engine in (e, restored):
        engine.apply({"cmd": "_Tick"}, 2_000)
        assert engine.dedupe_state() == _hashed([("a", "w", DEDUPE, 4, 11_000, 1_000),
                                                 ("b", "z", DEDUPE, 1, 11_000, 1_000)])
        for now in range(12_000, 12_000 + 256 * 250 + 1, 250):  # a sweep per 250 ms looks at every table
            engine.apply({"cmd": "_Tick"}, now)
        assert engine.dedupe_state() == [] and engine.dedupe.slots() == 0
    assert restored.snapshot() == e.snapshot()


def test_an_engine_state_of_version_2_loads_its_entries_by_string() -> None:
    """A version-2 snapshot lists ``[queue, id, kind, seq, expires, first]``: hashed as it loads."""
    e = PartitionEngine(0)
    e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(1), "dedupe": {"id": "k", "ttlMs": 5_000}}, 1_000)
    e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(2), "debounce": {"id": "d", "delayMs": 900}}, 1_000)
    fresh = PartitionEngine(0)
    fresh.now_ms = 1_000
    fresh.load_dedupe([["q", "d", DEBOUNCE, 2, 1_900, 1_000], ["q", "k", DEDUPE, 1, 6_000, 1_000]], hashed=False)
    assert fresh.dedupe_state() == e.dedupe_state()


def test_an_entry_over_is_not_answered_and_its_slot_is_taken_again() -> None:
    t = DedupeTable()
    t.put(5, 1, False, 9, 100, 0, 0)
    assert t.get(5, 1, 99) == (False, 9, 100, 0) and t.get(5, 1, 100) is None and t.get(5, 2, 50) is None
    t.put(5 + 256, 1, True, 10, 300, 150, 150)  # the same table and probe start: takes the over slot
    assert t.get(5, 1, 150) is None and t.get(5 + 256, 1, 150) == (True, 10, 300, 150)
    assert t.entries(150) == [(5 + 256, 1, True, 10, 300, 150)] and t.slots() == 8


class TableAgainstADict(RuleBasedStateMachine):
    """Puts, lookups and sweeps with time moving on, on few hashes (so probes collide and slots
    over are taken again) and small tables (so they grow and shrink): the table answers as a
    dict of every entry put, read through its expiry."""

    def __init__(self) -> None:
        super().__init__()
        self.table = DedupeTable(sweep_every_ms=0)
        self.model: dict[tuple[int, int], tuple[bool, int, int, int]] = {}
        self.now = 0

    hashes = st.tuples(st.integers(1, 2**64 - 1) | st.sampled_from([1, 257, 513, 2, 258, 7 << 8 | 3]),
                       st.integers(0, 3))

    @rule(key=hashes, debounce=st.booleans(), seq=st.integers(0, 2**40), ttl=st.integers(1, 50))
    def put(self, key: tuple[int, int], debounce: bool, seq: int, ttl: int) -> None:
        self.table.put(*key, debounce, seq, self.now + ttl, self.now, self.now)
        self.model[key] = (debounce, seq, self.now + ttl, self.now)

    @rule(key=hashes)
    def get(self, key: tuple[int, int]) -> None:
        want = self.model.get(key)
        assert self.table.get(*key, self.now) == (want if want is not None and want[2] > self.now else None)

    @rule(step=st.integers(0, 30))
    def tick(self, step: int) -> None:
        self.now += step
        self.table.sweep(self.now)

    @invariant()
    def lists_the_live_entries(self) -> None:
        live = sorted((*k, *v) for k, v in self.model.items() if v[2] > self.now)
        assert self.table.entries(self.now) == live


TableAgainstADict.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_the_table_answers_as_a_dict = TableAgainstADict.TestCase


def test_a_table_grows_half_to_three_quarters_full_and_sweeps_give_back_every_table() -> None:
    t = DedupeTable(sweep_every_ms=0)
    for i in range(1, 20_001):
        t.put(i * 7919, 0, False, i, 10, 0, 0)
    assert 20_000 * 4 // 3 <= t.slots() <= 20_000 * 2 + 256 * 8
    for _ in range(255):
        t.sweep(9)
    assert len(t.entries(9)) == 20_000
    for _ in range(256):
        t.sweep(10)
    assert t.slots() == 0 and t.entries(10) == []


def test_a_version_2_state_written_by_release_0842a63_answers_as_that_release_did() -> None:
    """``tests/fixtures/engine-state-v2``: the entries, listed by string there, are hashed as the
    state loads, and every later add is absorbed or not as the release that wrote it decided."""
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "engine-state-v2"
    spec = importlib.util.spec_from_file_location("make_engine_state_v2", fixture / "make_fixture.py")
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    state = (fixture / "state.msgpack").read_bytes()
    assert msgpack.unpackb(state, raw=False, strict_map_key=False)[0] == 2
    engine = PartitionEngine.restore(state)
    assert len(engine.dedupe_state()) == 40 + 4  # an entry per dedupe add (25 ids, two queues), 4 bursts
    expected = json.loads((fixture / "expected.json").read_text())
    assert [json.loads(json.dumps(answer)) for answer in maker.answers(engine)] == expected
    again = PartitionEngine.restore(PartitionEngine.restore(state).snapshot())
    assert again.dedupe_state() == PartitionEngine.restore(state).dedupe_state()
