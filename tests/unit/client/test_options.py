"""ConnectionOptions and RetryPolicy: the defaults, validation, backoff jitter bounds."""

from __future__ import annotations

import random
import ssl

import pytest
from hypothesis import given, strategies as st

from shoal.client import ConnectionOptions, RetryPolicy
from shoal.client.options import NODE_IN_FLIGHT_MAX


def test_defaults_are_seed_001s() -> None:
    o = ConnectionOptions()
    assert (o.pipelining, o.max_in_flight, o.pool_size, o.command_timeout, o.ping_interval,
            o.max_ping_failures, o.max_command_timeouts, o.tls) == (True, 100, 4, 30.0, 30.0, 3, 3, False)
    r = o.reconnect
    assert (r.base_s, r.factor, r.max_s, r.jitter) == (0.1, 2.0, 30.0, 0.3)


@pytest.mark.parametrize("kwargs", [{"max_in_flight": 0}, {"pool_size": 0}, {"pool_size": 10_000},
                                    {"command_timeout": 0}, {"connect_timeout": -1}, {"ping_interval": -1},
                                    {"max_ping_failures": -1}, {"max_command_timeouts": -2},
                                    {"topology_refresh": -1}])
def test_bad_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ConnectionOptions(**kwargs)


@pytest.mark.parametrize("kwargs", [{"base_s": 0}, {"base_s": 2, "max_s": 1}, {"factor": 0.5}, {"jitter": 1.0},
                                    {"jitter": -0.1}])
def test_bad_backoff_is_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_options_are_frozen_values() -> None:
    o = ConnectionOptions(command_timeout=5.0)
    with pytest.raises(AttributeError):
        o.command_timeout = 1.0  # type: ignore[misc]
    assert o == ConnectionOptions(command_timeout=5.0) and hash(o) == hash(ConnectionOptions(command_timeout=5.0))


def test_in_flight_per_connection_stays_under_the_nodes_limit() -> None:
    assert ConnectionOptions().in_flight_per_connection == NODE_IN_FLIGHT_MAX - 1  # one slot kept for pings
    assert ConnectionOptions(max_in_flight=8).in_flight_per_connection == 8
    assert ConnectionOptions(pipelining=False).in_flight_per_connection == 1


def test_tls_contexts() -> None:
    assert ConnectionOptions().ssl_context() is None
    assert isinstance(ConnectionOptions(tls=True).ssl_context(), ssl.SSLContext)
    ctx = ssl.create_default_context()
    assert ConnectionOptions(tls=ctx).ssl_context() is ctx


@given(st.integers(0, 200), st.integers(0, 2**32))
def test_backoff_stays_within_jitter_of_the_capped_exponential(attempt: int, seed: int) -> None:
    policy = RetryPolicy()
    delay = policy.delay_s(attempt, random.Random(seed))
    nominal = min(30.0, 0.1 * 2 ** min(attempt, 64))
    assert nominal * 0.7 - 1e-9 <= delay <= nominal * 1.3 + 1e-9


def test_backoff_jitter_spreads_both_ways() -> None:
    rng = random.Random(1)
    delays = [RetryPolicy().delay_s(3, rng) for _ in range(500)]
    assert min(delays) < 0.8 * 0.95 and max(delays) > 0.8 * 1.05  # nominal 0.8 s


def test_backoff_doubles_from_100ms_to_30s() -> None:
    p = RetryPolicy()
    assert [p.nominal_s(i) for i in range(4)] == [0.1, 0.2, 0.4, 0.8]
    assert p.nominal_s(9) == 30.0 and p.nominal_s(10**6) == 30.0
