"""The relay follows a failover it learns of from its own view of the leaders (``shoal.node.relay``):
a forwarded add gets this node's idempotency key before its first send, goes to the new leader
when the one holding it is replaced, and only the new leader's answer reaches the client, once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from shoal.cluster.codec import Raw, decode_request, encode_body
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError
from shoal.node.locator import JobLocator
from shoal.node.relay import Relay
from shoal.node.sessions import SessionTable
from shoal.node.state._model import FORWARDED_AGAIN_PREFIX, FORWARDED_KEY_PREFIX


class Info:
    node_id = "n1"

    def __init__(self) -> None:
        config = ClusterConfig(nodes=tuple(NodeSpec(f"n{i}", "127.0.0.1") for i in (1, 2, 3)), partitions=2)
        self.topology = config.initial_topology().with_leader(0, "n2", 1)


class Client:
    conn_id = 5
    session = "s5"
    closed = False

    def __init__(self) -> None:
        self.answers: list[tuple[Any, bytes]] = []

    def reply_encoded(self, req_id: Any, body: bytes) -> None:
        self.answers.append((req_id, body))

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self.answers.append((req_id, exc.code.value))


class Dispatcher:
    """The relay's side of the dispatcher: its sessions, the cluster's config, the id locator."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.config = ClusterConfig(nodes=tuple(NodeSpec(f"n{i}", "127.0.0.1") for i in (1, 2, 3)), partitions=2)
        self.sessions = SessionTable("n1", loop, self.config.session_grace_ms, lambda session, partitions: None)
        self.locator = JobLocator()


@pytest.fixture
def relay() -> Iterator[tuple[Relay, Info, list[tuple[str, list[Any]]]]]:
    loop = asyncio.new_event_loop()
    sent: list[tuple[str, list[Any]]] = []
    info = Info()
    yield Relay(Dispatcher(loop), info, loop, lambda peer, message: sent.append((peer, message)) or True), info, sent
    loop.close()


def test_an_add_without_a_key_is_keyed_before_its_first_send(relay: Any) -> None:
    r, _, sent = relay
    client = Client()
    r.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(1)), "reqId": 1}, 0)
    r.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(2)), "reqId": 2,
                       "idempotencyKey": "mine"}, 0)
    r.forward(client, {"cmd": "PUSHB", "queue": "q", "reqId": 3, "jobs": [
        {"data": Raw(msgpack.packb(3))}, {"data": Raw(msgpack.packb(4)), "customId": "c4"}]}, 0)
    bodies = [decode_request(m[3], raw_data=True) for _, m in sent]
    first, second, batch = bodies
    assert first["idempotencyKey"].startswith(f"{FORWARDED_KEY_PREFIX}n1.")
    assert second["idempotencyKey"] == "mine"
    assert batch["jobs"][0]["idempotencyKey"].startswith(f"{FORWARDED_KEY_PREFIX}n1.")
    assert "idempotencyKey" not in batch["jobs"][1]
    keys = {first["idempotencyKey"], batch["jobs"][0]["idempotencyKey"]}
    assert len(keys) == 2 and all(len(k) <= 256 for k in keys)
    # Another process of the same node never makes the same key.
    loop = asyncio.new_event_loop()
    try:
        assert Relay(Dispatcher(loop), Info(), loop, lambda peer, message: True)._key_prefix != r._key_prefix
    finally:
        loop.close()


def test_a_command_waiting_at_a_replaced_leader_goes_to_the_new_one(relay: Any) -> None:
    r, info, sent = relay
    client = Client()
    r.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(1)), "reqId": 1}, 0)
    r.forward(client, {"cmd": "ACK", "id": "0-1", "reqId": 2}, 0)  # could take effect twice: stays
    (peer, (_, rid, _, body)), (_, (_, ack_rid, _, _)) = sent
    assert peer == "n2"
    sent.clear()
    r._sweep(r.loop.time())
    assert sent == []  # still the leader
    info.topology = info.topology.with_leader(0, "n3", 2)
    r._sweep(r.loop.time())
    # the same add, its key in the form the engine looks up (a first copy may have been applied)
    assert sent[0] == ("n2", ["c", rid]) and sent[1][:1] == ("n3",) and sent[1][1][:3] == ["q", rid, "s5"]
    first, again = decode_request(body, raw_data=True), decode_request(sent[1][1][3], raw_data=True)
    assert again["idempotencyKey"] == FORWARDED_AGAIN_PREFIX + first["idempotencyKey"][len(FORWARDED_KEY_PREFIX):]
    assert {k: v for k, v in again.items() if k != "idempotencyKey"} == {
        k: v for k, v in first.items() if k != "idempotencyKey"}
    # The old leader's late answer is ignored; the new leader's reaches the client, once.
    ok = encode_body({"ok": True, "id": "0-1", "reqId": 1})
    r.on_message("n2", ["r", rid, ok, None, None])
    assert client.answers == []
    r.on_message("n3", ["r", rid, ok, None, None])
    r.on_message("n3", ["r", rid, ok, None, None])
    assert client.answers == [(1, ok)]
    assert r.stats()["followed"] == 1 and r._pending.keys() == {ack_rid}
    # A client's own key is sent again as it came.
    r.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(2)), "reqId": 3,
                       "idempotencyKey": "mine"}, 0)
    rid3 = sent[-1][1][1]
    info.topology = info.topology.with_leader(0, "n2", 3)
    r._sweep(r.loop.time())
    assert decode_request(sent[-1][1][3], raw_data=True)["idempotencyKey"] == "mine" and sent[-1][1][1] == rid3


def test_an_add_this_node_refused_keeps_its_key_and_goes_again_in_the_looked_up_form(relay: Any) -> None:
    r, info, sent = relay
    client = Client()
    own = f"{r._key_prefix}7"  # given on an earlier forward, run here, refused as leadership moved
    r.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(1)), "reqId": 1,
                       "idempotencyKey": own}, 0, away=True)
    assert decode_request(sent[-1][1][3], raw_data=True)["idempotencyKey"] == own
    info.topology = info.topology.with_leader(0, "n3", 2)
    r._sweep(r.loop.time())
    assert decode_request(sent[-1][1][3], raw_data=True)["idempotencyKey"] == r._again_prefix + "7"


def test_an_unknown_outcome_of_a_keyed_add_is_tried_again(relay: Any) -> None:
    r, _, sent = relay
    client = Client()
    r.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(1)), "reqId": 1}, 0)
    rid = sent[0][1][1]
    lost = encode_body({"ok": False, "code": "TIMEOUT", "error": "leadership changed", "reqId": 1})
    r.on_message("n2", ["r", rid, lost, "TIMEOUT", None])
    assert client.answers == [] and r.stats()["retried"] == 1
