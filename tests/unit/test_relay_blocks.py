"""A block of plain PUSHes forwarded as one relay message (``shoal.node.relay``, ``b``/``B``),
without sockets: what the forwarding node sends, how each push's answer reaches the client,
what goes again (and with which keys) when the leader moves, is lost or does not answer, and
how the leader serves a block: checked and committed as its own client's block would be."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest

from shoal.cluster.codec import PlainPush
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node import relay as relay_module
from shoal.node.relay import FORWARD_TIMEOUT_S, RETRY_DELAY_S
from shoal.node.state._model import FORWARDED_AGAIN_PREFIX, FORWARDED_KEY_PREFIX

from test_relay import Client, Node


class BlockClient(Client):
    """A client connection that also takes answers of several pushes at once."""

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        assert cmd == "PUSH" and seconds >= 0
        for req_id, result in zip(req_ids, results):
            self.answers.append((req_id, result.code.value if isinstance(result, CommandError) else result))


class PushNode(Node):
    """A node whose dispatcher records the blocks of pushes the relay hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[tuple[Any, list[PlainPush]]] = []
        self.dispatcher.handle_pushes = self._handle_pushes  # type: ignore[attr-defined]

    def _handle_pushes(self, conn: Any, frames: list[PlainPush]) -> None:
        self.blocks.append((conn, frames))

    def sent_blocks(self) -> list[tuple[str, int, str | None, list[Any]]]:
        return [(peer, m[1], m[2], m[3]) for peer, m in self.sent if m[0] == "b"]


@pytest.fixture
def node() -> PushNode:
    return PushNode()


def push(req_id: Any, value: Any = 1, key: str | None = None, name: str | None = None) -> PlainPush:
    return PlainPush(queue="q", data=msgspec.Raw(msgpack.packb(value)), reqId=req_id, idempotencyKey=key, name=name)


def refused(code: ErrorCode) -> dict[str, Any]:
    return {"ok": False, "code": code.value, "error": "refused"}


def test_a_block_goes_to_the_leader_as_one_message_every_push_keyed(node: PushNode) -> None:
    client = BlockClient()
    node.relay.forward_pushes(client, [push(1, "a"), push(2, "b", key="mine"), push(3, "c", name="email")], 0)
    [(peer, rid, session, (queue, datas, keys, names))] = node.sent_blocks()
    assert (peer, session, queue) == ("n2", "s5", "q")
    assert datas == [msgpack.packb(v) for v in "abc"]  # the data as the client encoded it
    assert keys[1] == "mine" and keys[0].startswith(FORWARDED_KEY_PREFIX) and keys[2].startswith(FORWARDED_KEY_PREFIX)
    assert len(set(keys)) == 3 and names == [None, None, "email"]
    node.relay.on_message("n2", ["B", rid, [{"id": "0-1"}, refused(ErrorCode.INVALID), {"id": "0-3"}]])
    assert client.answers == [(1, {"id": "0-1"}), (2, "INVALID"), (3, {"id": "0-3"})]
    stats = node.relay.stats()
    assert stats["forwarding"] == 0 and stats["forwarded"] == 3
    node.relay.on_message("n2", ["B", rid, [{"id": "0-1"}] * 3])  # answered already: ignored
    assert len(client.answers) == 3


def test_pushes_the_old_leader_did_not_take_go_to_the_new_one_with_keys_sent_again(node: PushNode) -> None:
    client = BlockClient()
    node.relay.forward_pushes(client, [push(1), push(2), push(3, key="mine")], 0)
    [(_, rid, _, (_, _, first_keys, _))] = node.sent_blocks()
    node.info.lead(0, "n3")
    node.relay.on_message("n2", ["B", rid, [{"id": "0-1"}, refused(ErrorCode.NOT_LEADER),
                                            refused(ErrorCode.TIMEOUT)]])
    assert client.answers == [(1, {"id": "0-1"})]  # the others wait for the new leader
    node.loop.advance(RETRY_DELAY_S)
    (peer, again_rid, _, (_, datas, keys, _)) = node.sent_blocks()[-1]
    assert (peer, again_rid, len(datas)) == ("n3", rid, 2)
    assert keys == [FORWARDED_AGAIN_PREFIX + first_keys[1][len(FORWARDED_KEY_PREFIX):], "mine"]
    node.relay.on_message("n2", ["B", rid, [{"id": "x"}] * 2])  # from where it no longer waits: ignored
    node.relay.on_message("n3", ["B", rid, [{"id": "0-2"}, {"id": "0-3"}]])
    assert client.answers == [(1, {"id": "0-1"}), (2, {"id": "0-2"}), (3, {"id": "0-3"})]


def test_a_lost_link_or_a_frozen_leader_sends_the_block_again_a_deadline_answers_it(node: PushNode) -> None:
    client = BlockClient()
    node.relay.forward_pushes(client, [push(1), push(2)], 0)
    node.links.discard("n2")
    node.info.lead(0, "n3")
    node.relay.peer_lost("n2")
    node.loop.advance(RETRY_DELAY_S)
    assert [peer for peer, *_ in node.sent_blocks()] == ["n2", "n3"]
    node.info.lead(0, "n2")  # n3 froze; this node's view names n2 again
    node.links.add("n2")
    node.relay._sweep(node.loop.time())
    assert [peer for peer, *_ in node.sent_blocks()] == ["n2", "n3", "n2"] and ("n3", ["c", 1]) in node.sent
    assert client.answers == []
    node.loop.advance(FORWARD_TIMEOUT_S)
    node.relay._sweep(node.loop.time())
    assert client.answers == [(1, "TIMEOUT"), (2, "TIMEOUT")] and node.relay.stats()["forwarding"] == 0


def test_a_block_is_split_by_its_data_bytes_and_bounded_in_flight(node: PushNode,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "BLOCK_BYTES_MAX", 2 * len(msgpack.packb("x" * 100)))
    client = BlockClient()
    node.relay.forward_pushes(client, [push(i, "x" * 100) for i in range(5)], 0)
    assert [len(datas) for *_, (_, datas, _, _) in node.sent_blocks()] == [2, 2, 1]
    monkeypatch.setattr(relay_module, "FORWARDED_MAX", 3)
    node.relay.forward_pushes(client, [push(9)], 0)
    assert client.answers == [(9, "OVERLOADED")]


def test_a_block_for_a_partition_this_node_came_to_lead_is_handled_here(node: PushNode) -> None:
    client = BlockClient()
    node.info.lead(1, "n1")
    node.relay.forward_pushes(client, [push(1, key="k"), push(2)], 1)
    [(conn, frames)] = node.blocks
    assert conn is client and node.sent_blocks() == []
    assert [f.reqId for f in frames] == [1, 2] and frames[0].idempotencyKey == "k"
    assert frames[1].idempotencyKey.startswith(FORWARDED_KEY_PREFIX)


def test_a_client_gone_drops_its_block(node: PushNode) -> None:
    client = BlockClient()
    node.relay.forward_pushes(client, [push(1)], 0)
    [(_, rid, _, _)] = node.sent_blocks()
    client.closed = True
    node.relay.connection_closed(client)
    assert ("n2", ["c", rid]) in node.sent
    node.relay.on_message("n2", ["B", rid, [{"id": "0-1"}]])
    assert client.answers == []


# --- at the leader -------------------------------------------------------------------------------------


def test_the_leader_hands_a_peers_block_to_the_dispatcher_and_answers_it_once_whole(node: PushNode) -> None:
    datas = [msgpack.packb(v) for v in (1, 2, 3)]
    node.relay.on_message("n2", ["b", 7, "rs", ["q", datas, ["k0", "k1", "k2"], None]])
    [(call, frames)] = node.blocks
    assert [(f.queue, bytes(f.data), f.reqId, f.idempotencyKey, f.name) for f in frames] == \
        [("q", datas[i], i, f"k{i}", None) for i in range(3)]
    assert call.wants_forwarding is False and call.session == "rs" and call.conn_id < 0
    call.reply_many([0, 2], [{"id": "0-1"}, CommandError(ErrorCode.QUEUE_FULL, "full")], "PUSH", 0.0)
    assert node.sent == []  # one push still unanswered
    call.reply_error(1, CommandError(ErrorCode.INVALID, "bad key"))
    [(peer, (kind, rid, results))] = node.sent
    assert (peer, kind, rid) == ("n2", "B", 7)
    assert results[0] == {"id": "0-1"}
    assert [(r["ok"], r["code"]) for r in results[1:]] == [(False, "INVALID"), (False, "QUEUE_FULL")]
    assert node.relay.stats()["serving"] == 0
    call.reply_error(1, CommandError(ErrorCode.INVALID, "twice"))  # answered already: nothing more is sent
    assert len(node.sent) == 1


def test_the_leader_bounds_what_it_serves_and_ignores_malformed_blocks(node: PushNode,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for block in (None, ["q"], [1, [b"\x01"], ["k"], None], ["q", [], [], None], ["q", [b"\x01"], [], None],
                  ["q", [b"\x01"], ["k"], ["a", "b"]], ["q", ["not bytes"], ["k"], None]):
        node.relay.on_message("n2", ["b", 1, None, block])
    assert node.blocks == [] and node.sent == [] and node.relay.stats()["serving"] == 0
    monkeypatch.setattr(relay_module, "SERVED_MAX", 0)
    node.relay.on_message("n2", ["b", 2, None, ["q", [b"\x01", b"\x02"], ["a", "b"], None]])
    [(_, (kind, rid, results))] = node.sent
    assert (kind, rid) == ("B", 2) and [r["code"] for r in results] == ["OVERLOADED"] * 2


def test_a_failing_dispatcher_answers_every_push_of_the_block_internal(node: PushNode) -> None:
    def fail(conn: Any, frames: list[PlainPush]) -> None:
        conn.reply_many([0], [{"id": "0-1"}], "PUSH", 0.0)
        raise RuntimeError("a bug")

    node.dispatcher.handle_pushes = fail  # type: ignore[attr-defined]
    node.relay.on_message("n2", ["b", 3, None, ["q", [b"\x01", b"\x02"], ["a", "b"], None]])
    [(_, (_, _, results))] = node.sent
    assert results[0] == {"id": "0-1"} and results[1]["code"] == "INTERNAL"
