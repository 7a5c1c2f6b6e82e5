"""The tests' one way to wait for a condition (``tests/waiting.py``): the first true value,
a deadline and a poll count, and a failure that says what was waited for and what was seen."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from waiting import eventually, eventually_async


def test_the_first_true_value_is_returned() -> None:
    values = iter([None, 0, "", {"leader": "n2"}, {"leader": "n3"}])
    assert eventually(lambda: next(values), "a leader", timeout_s=5, poll_s=0.001) == {"leader": "n2"}


def test_a_timeout_names_what_was_waited_for_and_the_last_value() -> None:
    counter = itertools.count()
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        eventually(lambda: [] if next(counter) < 10**9 else [1], "the queue to fill", timeout_s=0.2, poll_s=0.01)
    assert 0.2 <= time.monotonic() - started < 5
    message = str(failed.value)
    assert "the queue to fill" in message and "last value []" in message and "0.2 s" in message


def test_polls_are_bounded_by_count_as_well_as_time() -> None:
    calls = itertools.count(1)
    with pytest.raises(AssertionError, match=r"\(\d+ polls\)"):
        eventually(lambda: next(calls) < 0, "never", timeout_s=0.05, poll_s=0.01)
    assert next(calls) <= 0.05 / 0.01 + 3


def test_ignored_exceptions_count_as_not_yet_and_the_last_one_is_reported() -> None:
    attempts = itertools.count()

    def dial() -> str:
        if next(attempts) < 3:
            raise ConnectionRefusedError("node restarting")
        return "connected"

    assert eventually(dial, "a connection", timeout_s=5, poll_s=0.001, ignoring=(OSError,)) == "connected"

    def refused() -> str:
        raise ConnectionRefusedError("still down")

    with pytest.raises(AssertionError, match="last error ConnectionRefusedError\\('still down'\\)"):
        eventually(refused, "a connection", timeout_s=0.05, poll_s=0.01, ignoring=(OSError,))


def test_other_exceptions_fail_at_once() -> None:
    def broken() -> bool:
        raise KeyError("state")

    started = time.monotonic()
    with pytest.raises(KeyError):
        eventually(broken, "a state", timeout_s=30, ignoring=(OSError,))
    assert time.monotonic() - started < 1


def test_the_async_form_awaits_coroutine_checks_and_takes_plain_ones() -> None:
    async def scenario() -> None:
        box: list[int] = []
        asyncio.get_running_loop().call_later(0.02, box.append, 7)
        assert await eventually_async(lambda: box, "a value", timeout_s=5, poll_s=0.005) == [7]

        async def answer() -> str | None:
            return "ready" if box else None

        assert await eventually_async(answer, "ready", timeout_s=5) == "ready"
        with pytest.raises(AssertionError, match="nothing"):
            await eventually_async(lambda: None, "nothing", timeout_s=0.05, poll_s=0.01)

    asyncio.run(scenario())
