"""The delayed heap (a run of keys added in order beside a heap of the rest) against ``heapq``."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

import shoal.node.state._due_heap as due_heap
from shoal.node.state._due_heap import NEVER, DueHeap
from shoal.node.state._model import due_key

_steps = st.lists(st.one_of(st.tuples(st.just("push"), st.integers(0, 50), st.integers(1, 2**40)),
                            st.tuples(st.just("pop"), st.just(0), st.just(0))), max_size=300)


def _check(steps: list[tuple[str, int, int]]) -> None:
    heap, model, now = DueHeap(), [], 1_000
    for op, delay, seq in steps:
        if op == "push":
            now += delay % 3  # time moves on slowly: mostly in order, now and then not
            key = due_key(now + delay, seq)
            heap.push(key)
            heapq.heappush(model, key)
        elif model:
            assert heap.top() == model[0] and heap.due_ms == model[0] >> 48
            assert heap.pop() == heapq.heappop(model)
        assert len(heap) == len(model) and bool(heap) == bool(model)
        assert heap.due_ms == (model[0] >> 48 if model else NEVER)
        assert sorted(heap) == sorted(model)
    while model:
        assert heap.pop() == heapq.heappop(model)
    assert not heap and heap.due_ms == NEVER


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_keys_come_out_as_from_a_heap(steps: list[tuple[str, int, int]]) -> None:
    _check(steps)


@settings(max_examples=100, deadline=None)
@given(_steps)
def test_keys_come_out_as_from_a_heap_when_the_run_trims_often(steps: list[tuple[str, int, int]]) -> None:
    trim = due_heap._TRIM_AT
    due_heap._TRIM_AT = 2
    try:
        _check(steps)
    finally:
        due_heap._TRIM_AT = trim


def test_keys_added_in_order_take_16_bytes_each() -> None:
    heap = DueHeap()
    for seq in range(1, 100_001):
        heap.push(due_key(1_700_000_000_000 + seq, seq))
    assert not heap._heap and len(heap) == 100_000
    assert heap._run_ats.itemsize + heap._seqs.itemsize == 16
    for seq in range(1, 60_001):
        assert heap.pop() == due_key(1_700_000_000_000 + seq, seq)
    assert len(heap._seqs) <= 60_000  # the taken front was given back
