"""A queue's ready heap and the partition's delayed heap hold one int per job
(``node/state/_model.py``: ``ready_key``, ``due_key``): the ints order as the pairs they stand for
(``(-priority, seq)``, ``(run_at_ms, seq)``) and give both back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.cluster.limits import PRIORITY_MAX, PRIORITY_MIN
from shoal.node.state._model import SEQ_BITS, SEQ_MASK, due_key, ready_key

_seqs = st.integers(1, (1 << SEQ_BITS) - 1)


@given(st.lists(st.tuples(st.integers(PRIORITY_MIN, PRIORITY_MAX), _seqs), min_size=2, max_size=50))
def test_ready_keys_order_as_priority_then_seq(entries: list[tuple[int, int]]) -> None:
    by_pair = sorted(entries, key=lambda e: (-e[0], e[1]))
    by_key = sorted(entries, key=lambda e: ready_key(*e))
    assert [(-p, s) for p, s in by_pair] == [(-p, s) for p, s in by_key]
    for priority, seq in entries:
        key = ready_key(priority, seq)
        assert (key & SEQ_MASK, key >> SEQ_BITS) == (seq, -priority)


@given(st.lists(st.tuples(st.integers(0, 1 << 50), _seqs), min_size=2, max_size=50))
def test_due_keys_order_as_run_at_then_seq(entries: list[tuple[int, int]]) -> None:
    assert sorted(entries) == sorted(entries, key=lambda e: due_key(*e))
    for run_at, seq in entries:
        key = due_key(run_at, seq)
        assert (key >> SEQ_BITS, key & SEQ_MASK) == (run_at, seq)


def test_a_priority_0_entry_is_the_seq_itself() -> None:
    seq = 10**12 + 7
    assert ready_key(0, seq) is seq
