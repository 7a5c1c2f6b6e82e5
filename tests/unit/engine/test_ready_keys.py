"""A queue's ready heap holds one int per waiting job (``node/state/_model.py: ready_key``): the
ints order as the ``(-priority, seq)`` pairs they stand for and give both back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.cluster.limits import PRIORITY_MAX, PRIORITY_MIN
from shoal.node.state._model import READY_SEQ_BITS, READY_SEQ_MASK, ready_key

_entries = st.tuples(st.integers(PRIORITY_MIN, PRIORITY_MAX), st.integers(1, (1 << READY_SEQ_BITS) - 1))


@given(st.lists(_entries, min_size=2, max_size=50))
def test_ready_keys_order_as_priority_then_seq(entries: list[tuple[int, int]]) -> None:
    by_pair = sorted(entries, key=lambda e: (-e[0], e[1]))
    by_key = sorted(entries, key=lambda e: ready_key(*e))
    assert [(-p, s) for p, s in by_pair] == [(-p, s) for p, s in by_key]
    for priority, seq in entries:
        key = ready_key(priority, seq)
        assert (key & READY_SEQ_MASK, key >> READY_SEQ_BITS) == (seq, -priority)


def test_a_priority_0_entry_is_the_seq_itself() -> None:
    seq = 10**12 + 7
    assert ready_key(0, seq) is seq
