"""Runs of consecutive decimal strings equal their ``str(int)`` spelling, across every stem boundary."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.state._decimal import consecutive_decimals, decimal_run, decimals_after, joined_decimal_run

firsts = st.one_of(st.integers(0, 3000), st.integers(0, 10**19), st.sampled_from([999, 1000, 99_999, 999_999]))


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["", "3-", "12.", "x"]), firsts, st.integers(0, 2500))
def test_runs_spell_each_number(prefix: str, first: int, count: int) -> None:
    expected = [f"{prefix}{n}" for n in range(first, first + count)]
    assert decimal_run(prefix, first, count) == expected
    assert joined_decimal_run(prefix, first, count) == "\n".join(expected)
    assert joined_decimal_run(prefix, first, count, ",") == ",".join(expected)


texts = st.lists(st.one_of(st.integers(0, 10**20).map(str), st.sampled_from(["", "007", "1e3", "٣", "12\n13", " 1"])),
                 min_size=0, max_size=30)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["3-", "12."]), firsts, st.integers(0, 40), texts, st.integers(0, 40))
def test_consecutive_decimals_reads_runs_and_leaves_the_rest_to_decimals_after(
        prefix: str, first: int, count: int, others: list[str], cut: int) -> None:
    run = decimal_run(prefix, first, count)
    if count:
        fits = first + count - 1 < 10**19  # every number of 19 digits at most, as decimals_after reads
        assert consecutive_decimals(prefix, run) == (range(first, first + count) if fits else None)
    mixed = run[:cut] + [prefix + t for t in others] + run[cut:]
    got = consecutive_decimals(prefix, mixed)
    if got is not None:  # only ever a run, and then what decimals_after reads too
        assert list(got) == decimals_after(prefix, mixed) == list(range(got.start, got.stop))
    assert consecutive_decimals(prefix, [1, 2]) is None and consecutive_decimals(prefix, []) is None
