"""Dedupe and debounce entries packed into one int each, kept per queue, as the snapshot lists them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.codec import raw_of
from shoal.node.state import PartitionEngine
from shoal.node.state._dedupe import DEBOUNCE, DEDUPE, _pack_entry, _unpack_entry

_U64 = st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([DEDUPE, DEBOUNCE]), _U64, _U64, _U64)
def test_an_entry_packs_and_unpacks(kind: str, seq: int, expires: int, first: int) -> None:
    assert _unpack_entry(_pack_entry(kind, seq, expires, first)) == (kind, seq, expires, first)


def test_the_snapshot_lists_entries_by_queue_then_id_and_drops_a_queue_whose_entries_expired() -> None:
    e = PartitionEngine(0)
    for queue, dedupe_id, ttl in [("b", "z", 10_000), ("a", "y", 500), ("b", "x", 500), ("a", "w", 10_000)]:
        e.apply({"cmd": "PUSH", "queue": queue, "data": raw_of(dedupe_id), "dedupe": {"id": dedupe_id, "ttlMs": ttl}},
                1_000)
    e.apply({"cmd": "PUSH", "queue": "c", "data": raw_of(0), "debounce": {"id": "v", "delayMs": 700}}, 1_000)
    assert e.dedupe_state() == [["a", "w", DEDUPE, 4, 11_000, 1_000], ["a", "y", DEDUPE, 2, 1_500, 1_000],
                                ["b", "x", DEDUPE, 3, 1_500, 1_000], ["b", "z", DEDUPE, 1, 11_000, 1_000],
                                ["c", "v", DEBOUNCE, 5, 1_700, 1_000]]
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.dedupe_state() == e.dedupe_state() and restored.digest() == e.digest()
    for engine in (e, restored):
        engine.apply({"cmd": "_Tick"}, 2_000)
        assert engine.dedupe_state() == [["a", "w", DEDUPE, 4, 11_000, 1_000], ["b", "z", DEDUPE, 1, 11_000, 1_000]]
        engine.apply({"cmd": "_Tick"}, 12_000)
        assert engine.dedupe == {} and engine.dedupe_state() == []
    assert restored.snapshot() == e.snapshot()
