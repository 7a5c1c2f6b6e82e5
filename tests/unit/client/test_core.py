"""The client's sans-I/O core: routing, retry policy, request building, sharding."""

from __future__ import annotations

import msgpack
import pytest

from shoal.client import (CommandTimeout, ConnectionLost, InvalidCommand, LeaseMismatch, NodeTimeout, NoLeader,
                          NotLeader)
from shoal.client._core import (Action, IdempotencyKeys, KeyedPackedPush, Router, ShardPicker, budget_s, exhausted_error,
                                group_by_partition, is_retry_safe, job_fields, ms, retry_action, retry_pause_s)
from shoal.client.exceptions import error_from_reply
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.partitioning import partition_for, shard_queue_name, stable_hash
from shoal.cluster.topology import Topology


def _topology(partitions: int = 8) -> Topology:
    cfg = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1", 21000), NodeSpec("n2", "127.0.0.1", 21002),
                               NodeSpec("n3", "127.0.0.1", 21004)), partitions=partitions)
    topo = cfg.initial_topology()
    for p in range(partitions):
        topo = topo.with_leader(p, f"n{p % 3 + 1}", 1)
    return topo


# --- routing -----------------------------------------------------------------------------------

def test_routes_by_queue_name_to_the_partition_leader() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    p = partition_for("emails", 8)
    assert router.partition_of({"cmd": "PUSH", "queue": "emails", "data": 1}) == p
    assert router.address_for({"cmd": "PUSH", "queue": "emails", "data": 1}) == \
        f"127.0.0.1:{21000 + 2 * (p % 3)}"


def test_routes_by_the_partition_in_a_job_id() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    assert router.partition_of({"cmd": "ACK", "id": "5-17"}) == 5
    assert router.partition_of({"cmd": "ACKB", "ids": ["7-1", "7-2"]}) == 7
    assert router.address_for({"cmd": "GetJob", "id": "4-1"}) == "127.0.0.1:21002"  # n2 leads 4 (4 % 3 + 1)


def test_node_commands_turn_through_every_node() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    seen = {router.address_for({"cmd": "Ping"}) for _ in range(6)}
    assert seen == {"127.0.0.1:21000", "127.0.0.1:21002", "127.0.0.1:21004"}


def test_partition_routed_commands_use_the_partition_field() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    assert router.partition_of({"cmd": "ListQueues", "partition": 3}) == 3
    with pytest.raises(InvalidCommand):
        router.partition_of({"cmd": "ListQueues", "partition": 99})


def test_a_custom_job_id_goes_to_any_node() -> None:
    """A custom id names no partition: the node that gets it finds the partition of its queue."""
    router = Router(["127.0.0.1:21000"], _topology())
    assert router.partition_of({"cmd": "ACK", "id": "order-17"}) is None
    assert router.partition_of({"cmd": "ACK", "id": "3-17"}) == 3


def test_no_known_leader_gives_no_address() -> None:
    topo = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1", 21000),), partitions=2).initial_topology()
    router = Router(["127.0.0.1:21000"], topo)
    topo_no_leader = topo.with_leader(0, None, 5)
    router.learn(topo_no_leader)
    assert router.address_for({"cmd": "GetJob", "id": "0-1"}) is None


def test_newer_terms_win_and_older_views_never_undo_them() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    assert router.learn(router.topology.with_leader(2, "n1", 7))
    stale = _topology()  # a paused node's view: term 1 everywhere
    assert not router.learn(stale)
    assert router.topology.partition_map[2].leader == "n1"


def test_a_topology_event_on_the_wire_updates_routing() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    wire = router.topology.with_leader(0, "n3", 9).to_wire()
    assert router.learn_wire(wire)
    assert router.address_for({"cmd": "GetJob", "id": "0-1"}) == "127.0.0.1:21004"


def test_not_leader_hint_reroutes_and_a_later_election_still_wins() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    frame = {"cmd": "GetJob", "id": "0-1"}  # n1 leads partition 0 at term 1
    assert router.apply_hint(frame, {"leader": {"nodeId": "n2", "host": "127.0.0.1", "port": 21002}})
    assert router.address_for(frame) == "127.0.0.1:21002"
    assert not router.apply_hint(frame, {"leader": {"nodeId": "n2"}})   # already there
    assert not router.apply_hint(frame, {})                              # no hint
    router.learn(router.topology.with_leader(0, "n3", 2))   # the very next election still wins
    assert router.address_for(frame) == "127.0.0.1:21004"
    assert not router.apply_hint(frame, {"leader": {"nodeId": "n2", "term": 1}})  # an older hint does not


def test_a_hint_naming_an_unknown_node_adds_it() -> None:
    router = Router(["127.0.0.1:21000"], _topology())
    frame = {"cmd": "GetJob", "id": "1-1"}
    assert router.apply_hint(frame, {"leader": {"nodeId": "n9", "host": "10.0.0.9", "port": 6789}})
    assert router.address_for(frame) == "10.0.0.9:6789"


def test_addresses_are_known_nodes_then_seeds_without_repeats() -> None:
    router = Router(["127.0.0.1:21000", "10.1.1.1:6789"], _topology())
    assert router.addresses() == ["127.0.0.1:21000", "127.0.0.1:21002", "127.0.0.1:21004", "10.1.1.1:6789"]
    assert Router(["a:1"]).addresses() == ["a:1"]
    with pytest.raises(ValueError):
        Router([])


# --- retry policy ------------------------------------------------------------------------------

PUSH_WITH_KEY = {"cmd": "PUSH", "queue": "q", "data": 1, "idempotencyKey": "k-1"}
PUSH_NO_KEY = {"cmd": "PUSH", "queue": "q", "data": 1}


@pytest.mark.parametrize("frame,safe", [
    (PUSH_WITH_KEY, True), (PUSH_NO_KEY, False),
    ({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 1, "idempotencyKey": "a"}]}, True),
    ({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 1, "idempotencyKey": "a"}, {"data": 2}]}, False),
    ({"cmd": "GetJob", "id": "1-1"}, True), ({"cmd": "Touch", "id": "1-1", "ttr": 5}, True),
    ({"cmd": "PULL", "queue": "q"}, False), ({"cmd": "ACK", "id": "1-1"}, False),
    ({"cmd": "FAIL", "id": "1-1"}, False), ({"cmd": "Nope"}, False),
    ({"cmd": "PushFlow", "parent": {}, "children": [], "idempotencyKey": "f"}, True),
    ({"cmd": "PushFlow", "parent": {}, "children": []}, False),
])
def test_which_commands_may_be_repeated(frame: dict, safe: bool) -> None:
    assert is_retry_safe(frame) is safe


def test_a_keyed_pre_packed_pushb_may_be_repeated_and_is_sent_as_a_plain_frame() -> None:
    from shoal.cluster.codec import Raw, decode_request, encode

    jobs = Raw(msgpack.packb([{"data": 1, "idempotencyKey": "w:0:0"}]))
    frame = KeyedPackedPush(cmd="PUSHB", queue="q", jobs=jobs)
    assert is_retry_safe(frame)
    assert retry_action(ConnectionLost("gone"), frame) is Action.RETRY
    sent = decode_request(encode({**frame, "reqId": 1})[4:], raw_data=True)  # what the connection writes
    assert sent["jobs"] == [{"data": Raw(msgpack.packb(1)), "idempotencyKey": "w:0:0"}]


@pytest.mark.parametrize("code", ["NOT_LEADER", "NO_LEADER", "OVERLOADED", "SHUTTING_DOWN"])
def test_never_applied_errors_are_always_retried(code: str) -> None:
    err = error_from_reply({"ok": False, "code": code, "error": "x"})
    assert retry_action(err, PUSH_NO_KEY) is Action.RETRY
    assert retry_action(err, {"cmd": "ACK", "id": "1-1"}) is Action.RETRY


@pytest.mark.parametrize("err", [ConnectionLost("gone"), CommandTimeout("slow"),
                                 error_from_reply({"ok": False, "code": "TIMEOUT", "error": "x"})])
def test_unknown_outcomes_are_retried_only_when_safe(err: Exception) -> None:
    assert retry_action(err, PUSH_WITH_KEY) is Action.RETRY
    assert retry_action(err, PUSH_NO_KEY) is Action.RAISE
    assert retry_action(err, {"cmd": "PULL", "queue": "q"}) is Action.RAISE


def test_answers_are_raised() -> None:
    for code in ("INVALID", "NOT_FOUND", "LEASE_MISMATCH", "QUEUE_FULL", "AUTH_FAILED"):
        assert retry_action(error_from_reply({"ok": False, "code": code}), PUSH_WITH_KEY) is Action.RAISE


def test_a_long_poll_adds_its_wait_to_the_deadline() -> None:
    assert budget_s({"cmd": "PULL", "queue": "q", "timeout": 2500}, 5.0) == 7.5
    assert budget_s({"cmd": "PULLB", "queue": "q", "count": 2}, 5.0) == 5.0
    assert budget_s({"cmd": "GetJob", "id": "1-1", "timeout": 9000}, 5.0) == 5.0


@pytest.mark.parametrize("attempt", range(1, 30))
@pytest.mark.parametrize("jitter", [0.0, 0.5, 1.0])
def test_retry_pauses_grow_and_stay_bounded(attempt: int, jitter: float) -> None:
    pause = retry_pause_s(attempt, jitter)
    assert 0.01 - 1e-12 <= pause <= 0.75 + 1e-12
    assert retry_pause_s(attempt + 1, jitter) >= pause


def test_running_out_of_time_names_the_last_cause() -> None:
    frame = {"cmd": "PUSH"}
    assert type(exhausted_error(frame, error_from_reply({"ok": False, "code": "NO_LEADER"}), 1.0)) is NoLeader
    assert type(exhausted_error(frame, error_from_reply({"ok": False, "code": "NOT_LEADER"}), 1.0)) is NotLeader
    assert type(exhausted_error(frame, ConnectionLost("x"), 1.0)) is ConnectionLost
    assert type(exhausted_error(frame, None, 1.0)) is CommandTimeout


# --- request building --------------------------------------------------------------------------

def test_seconds_become_milliseconds() -> None:
    assert ms(2.5) == 2500 and ms(0.0004) == 0 and ms(None) is None
    assert job_fields({"delay": 2.5, "ttr": 1, "priority": 3, "custom_id": "x", "backoff": None}) == \
        {"delay": 2500, "ttr": 1000, "priority": 3, "customId": "x"}
    with pytest.raises(TypeError):
        job_fields({"nope": 1})


def test_idempotency_keys_are_unique_per_client_and_fit_the_limit() -> None:
    a, b = IdempotencyKeys(), IdempotencyKeys()
    keys = [a() for _ in range(1000)] + [b() for _ in range(1000)]
    assert len(set(keys)) == 2000 and all(len(k) <= 256 for k in keys)


def test_shards_pick_by_group_or_custom_id_else_round_robin() -> None:
    picker = ShardPicker("jobs", 4)
    assert picker.names == [shard_queue_name("jobs", i) for i in range(4)]
    assert picker.pick(group="g1") == shard_queue_name("jobs", stable_hash("g1") % 4)
    assert picker.pick(custom_id="c7") == shard_queue_name("jobs", stable_hash("c7") % 4)
    assert picker.pick(group="g1", custom_id="c7") == picker.pick(group="g1")
    assert {picker.pick() for _ in range(8)} == set(picker.names)
    assert sorted(picker.rotation()) == sorted(picker.names)
    assert ShardPicker("plain", None).pick(group="x") == "plain"
    with pytest.raises(ValueError):
        ShardPicker("q", 0)


def test_ackb_batches_split_by_partition() -> None:
    assert group_by_partition(["1-1", "2-1", "1-2"]) == {1: [0, 2], 2: [1]}


def test_error_codes_map_to_typed_exceptions() -> None:
    assert type(error_from_reply({"code": "LEASE_MISMATCH", "error": "e"})) is LeaseMismatch
    timeout = error_from_reply({"code": "TIMEOUT"})
    assert isinstance(timeout, NodeTimeout) and isinstance(timeout, CommandTimeout)
