"""Runs of consecutive decimal strings equal their ``str(int)`` spelling, across every stem boundary."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.state._decimal import decimal_run, joined_decimal_run

firsts = st.one_of(st.integers(0, 3000), st.integers(0, 10**19), st.sampled_from([999, 1000, 99_999, 999_999]))


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["", "3-", "12.", "x"]), firsts, st.integers(0, 2500))
def test_runs_spell_each_number(prefix: str, first: int, count: int) -> None:
    expected = [f"{prefix}{n}" for n in range(first, first + count)]
    assert decimal_run(prefix, first, count) == expected
    assert joined_decimal_run(prefix, first, count) == "\n".join(expected)
    assert joined_decimal_run(prefix, first, count, ",") == ",".join(expected)
