"""The client's non-I/O parts: options, backoff, error mapping, job conversion, routing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.partitioning import partition_for
from shoal.client import (AsyncClient, ConnectionOptions, InvalidCommand, LeaseMismatch, NotLeader, QueueFull,
                          RetryPolicy)
from shoal.client.exceptions import CommandError, error_from_reply
from shoal.client.job import Job
from shoal.client.queue import job_fields


def test_defaults_are_seed_001s() -> None:
    o = ConnectionOptions()
    assert (o.pipelining, o.max_in_flight, o.pool_size, o.command_timeout, o.ping_interval,
            o.max_ping_failures, o.max_command_timeouts) == (True, 100, 4, 30.0, 30.0, 3, 3)
    r = o.reconnect
    assert (r.base_s, r.factor, r.max_s, r.jitter) == (0.1, 2.0, 30.0, 0.3)


@pytest.mark.parametrize("kwargs", [{"max_in_flight": 0}, {"pool_size": 0}, {"command_timeout": 0},
                                    {"ping_interval": -1}])
def test_bad_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ConnectionOptions(**kwargs)


@given(st.integers(0, 40), st.integers(0, 2**32))
def test_backoff_stays_within_jitter_of_the_capped_exponential(attempt: int, seed: int) -> None:
    policy = RetryPolicy()
    delay = policy.delay_s(attempt, random.Random(seed))
    nominal = min(30.0, 0.1 * 2 ** attempt)
    assert nominal * 0.7 - 1e-9 <= delay <= nominal * 1.3 + 1e-9


@pytest.mark.parametrize("code,cls", [("INVALID", InvalidCommand), ("LEASE_MISMATCH", LeaseMismatch),
                                      ("QUEUE_FULL", QueueFull), ("NO_LEADER", NotLeader), ("WHATEVER", CommandError)])
def test_error_codes_map_to_typed_exceptions(code: str, cls: type) -> None:
    err = error_from_reply({"ok": False, "code": code, "error": "boom"})
    assert type(err) is cls and err.code == code and str(err) == "boom"


def test_job_options_convert_seconds_to_ms() -> None:
    assert job_fields({"delay": 2.5, "ttr": 1, "priority": 3, "custom_id": "x", "backoff": None}) == \
        {"delay": 2500, "ttr": 1000, "priority": 3, "customId": "x"}
    with pytest.raises(TypeError):
        job_fields({"nope": 1})


def test_job_from_wire() -> None:
    job = Job.from_wire({"id": "3-17", "queue": "q", "data": {"a": 1}, "priority": 2, "state": "active",
                         "attempts": 1, "maxAttempts": 3, "createdAt": 1500, "runAt": 2500, "progress": 0}, "3.9")
    assert (job.id, job.token, job.created_at, job.run_at, job.max_attempts) == ("3-17", "3.9", 1.5, 2.5, 3)


def test_routing_by_queue_and_by_job_id() -> None:
    cfg = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1", 1), NodeSpec("n2", "127.0.0.1", 3)), partitions=16)
    client = AsyncClient(["127.0.0.1:1"])
    client.topology = cfg.initial_topology()
    assert client.partition_of({"cmd": "PUSH", "queue": "emails"}) == partition_for("emails", 16)
    assert client.partition_of({"cmd": "ACK", "id": "11-4"}) == 11
    assert client.partition_of({"cmd": "ACKB", "ids": ["5-1", "5-2"]}) == 5
    assert client.partition_of({"cmd": "Ping"}) is None
    a, b = client.new_idempotency_key(), client.new_idempotency_key()
    assert a != b and a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0]
