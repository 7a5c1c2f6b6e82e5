"""Forwarding between nodes (``shoal.node.relay``) without sockets: the relay channel is a list
of sent messages, time a manual clock, the node's sessions the real table. Covers where a
command goes, what happens when the leader moves, is lost or does not answer, the limits,
serving a peer's commands, bunqueue's events of queues led elsewhere, the job locator, and
the session audits that adopt or release the sessions holding leases here."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from shoal.cluster.codec import Raw, decode_request, decode_response, encode_body
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.partitioning import partition_for
from shoal.node import relay as relay_module
from shoal.node.audits import AUDIT_ANSWER_TIMEOUT_S
from shoal.node.locator import JobLocator
from shoal.node.partition import Partition, PartitionView
from shoal.node.ports import DecodingReplier
from shoal.node.relay import FORWARD_TIMEOUT_S, RETRY_DELAY_S, Relay
from shoal.node.sessions import SessionTable
from shoal.node.state import PartitionEngine, SessionPull
from shoal.node.state._model import FORWARDED_AGAIN_PREFIX, FORWARDED_KEY_PREFIX

from manual_clock import ManualLoop

EVENTS_QUEUE = "events"  # in partition 0 of 2
assert partition_for(EVENTS_QUEUE, 2) == 0


class Info:
    """The node's identity and its view of the leaders."""

    node_id = "n1"

    def __init__(self) -> None:
        config = ClusterConfig(nodes=tuple(NodeSpec(f"n{i}", "127.0.0.1") for i in (1, 2, 3)), partitions=2)
        self.topology = config.initial_topology().with_leader(0, "n2", 1)
        self.events_asked = 0

    def lead(self, p: int, node: str | None) -> None:
        self.topology = self.topology.with_leader(p, node, self.topology.partition_map[p].term + 1)

    def events_wanted(self) -> None:
        self.events_asked += 1


class Config:
    session_grace_ms = 0


class Directory:
    """The hosted partitions; a partition's replica here leads while the node's view names this
    node, unless a test says it stepped down (``not_leading``)."""

    def __init__(self, info: Info) -> None:
        self.partitions: dict[int, Partition] = {}
        self.info = info
        self.not_leading: set[int] = set()

    def leads(self, p: int) -> bool:
        return self.info.topology.partition_map[p].leader == self.info.node_id and p not in self.not_leading


class Dispatcher:
    """Answers what the relay hands it by recording it; a test replies through the call."""

    config = Config()

    def __init__(self, loop: ManualLoop, info: Info) -> None:
        self.released: list[tuple[str, set[int]]] = []
        self.sessions = SessionTable("n1", loop, 0, self._release)  # type: ignore[arg-type]
        self.directory = Directory(info)
        self.locator = JobLocator()
        self.handled: list[tuple[Any, dict[str, Any]]] = []
        self.raises: Exception | None = None

    def _release(self, session: str, partitions: set[int]) -> None:
        self.released.append((session, set(partitions)))

    def handle(self, conn: Any, frame: dict[str, Any]) -> None:
        if self.raises is not None:
            raise self.raises
        self.handled.append((conn, frame))


class Client:
    """A client connection of this node (binary protocol: takes encoded replies)."""

    bunqueue_envelope = False

    def __init__(self, conn_id: int = 5, session: str = "s5") -> None:
        self.conn_id = conn_id
        self.session = session
        self.closed = False
        self.answers: list[tuple[Any, Any]] = []
        self.events: list[bytes] = []

    def reply_encoded(self, req_id: Any, body: bytes) -> None:
        self.answers.append((req_id, decode_response(body)))

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self.answers.append((req_id, exc.code.value))

    def send_encoded(self, data: bytes) -> None:
        self.events.append(data)


class HttpClient(DecodingReplier):
    """A link that takes reply dicts only (the HTTP API)."""

    conn_id = 6
    session = "s6"
    closed = False

    def __init__(self) -> None:
        self.answers: list[tuple[Any, Any]] = []
        self.frames: list[dict[str, Any]] = []

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        self.answers.append((req_id, body))

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self.answers.append((req_id, exc.code.value))

    def send_frame(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)


class Node:
    """One relay with its fakes; ``links`` says which peers the channel reaches."""

    def __init__(self) -> None:
        self.loop = ManualLoop()
        self.info = Info()
        self.dispatcher = Dispatcher(self.loop, self.info)
        self.sent: list[tuple[str, list[Any]]] = []
        self.links = {"n2", "n3"}
        self.relay = Relay(self.dispatcher, self.info, self.loop, self._send)  # type: ignore[arg-type]

    def _send(self, peer: str, message: list[Any]) -> bool:
        if peer not in self.links:
            return False
        self.sent.append((peer, message))
        return True

    def requests(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(peer, rid, decoded frame) of every request sent."""
        return [(peer, m[1], decode_request(m[3], raw_data=True)) for peer, m in self.sent if m[0] == "q"]


@pytest.fixture
def node() -> Node:
    return Node()


def ok(req_id: Any, **body: Any) -> bytes:
    return encode_body({"ok": True, **({"reqId": req_id} if req_id is not None else {}), **body})


def error(req_id: Any, code: ErrorCode) -> bytes:
    return encode_body({"ok": False, "code": code.value, "error": "refused", "reqId": req_id})


# --- where a command goes -------------------------------------------------------------------------------


def test_a_command_goes_to_its_partitions_leader_and_the_answer_to_the_client_once(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-1", "reqId": 7}, 0)
    assert len(node.sent) == 1
    peer, message = node.sent[0]
    assert peer == "n2" and message[0] == "q" and message[2] == "s5"
    assert decode_request(message[3], raw_data=True) == {"cmd": "GetJob", "id": "0-1", "reqId": 7}
    rid = message[1]
    node.relay.on_message("n3", ["r", rid, ok(7, job=None), None, None])  # not where it was sent: ignored
    assert client.answers == []
    node.relay.on_message("n2", ["r", rid, ok(7, job=None), None, None])
    node.relay.on_message("n2", ["r", rid, ok(7, job=None), None, None])
    assert client.answers == [(7, {"ok": True, "reqId": 7, "job": None})]
    assert node.relay.stats()["forwarding"] == 0 and node.relay.stats()["forwarded"] == 1


def test_a_command_without_a_known_leader_waits_and_goes_once_one_is_known(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "GetJob", "id": "1-1", "reqId": 1}, 1)  # partition 1: no leader yet
    assert node.sent == []
    node.loop.advance(RETRY_DELAY_S * 3)
    assert node.sent == [] and node.relay.stats()["retried"] >= 3
    node.info.lead(1, "n3")
    node.loop.advance(RETRY_DELAY_S)
    assert [(peer, frame["cmd"]) for peer, _, frame in node.requests()] == [("n3", "GetJob")]


def test_a_command_for_a_partition_this_node_came_to_lead_is_answered_here(node: Node) -> None:
    client = Client()
    node.info.lead(1, "n1")
    node.relay.forward(client, {"cmd": "GetJob", "id": "1-1", "reqId": 1}, 1)
    assert node.sent == [] and node.dispatcher.handled == [(client, {"cmd": "GetJob", "id": "1-1", "reqId": 1})]
    assert node.relay.stats()["forwarding"] == 0


def test_a_command_for_a_partition_this_node_is_named_to_lead_but_does_not_waits(node: Node) -> None:
    """The view names this node while its replica no longer leads (it just stepped down): running
    the command here would hand it straight back to the relay, again and again."""
    client = Client()
    node.info.lead(1, "n1")
    node.dispatcher.directory.not_leading.add(1)
    node.relay.forward(client, {"cmd": "GetJob", "id": "1-1", "reqId": 1}, 1)
    assert node.dispatcher.handled == [] and node.sent == [] and client.answers == []
    node.info.lead(1, "n3")
    node.loop.advance(RETRY_DELAY_S)
    assert [(peer, frame["id"]) for peer, _, frame in node.requests()] == [("n3", "1-1")]


def test_a_command_refused_here_on_leaving_the_lead_goes_to_the_next_leader_first(node: Node) -> None:
    client = Client()
    node.info.lead(1, "n1")  # this node's view still names itself
    node.relay.forward(client, {"cmd": "GetJob", "id": "1-1", "reqId": 1}, 1, away=True)
    assert node.dispatcher.handled == [] and node.sent == []
    node.info.lead(1, "n3")
    node.loop.advance(RETRY_DELAY_S)
    assert [peer for peer, _, _ in node.requests()] == ["n3"]
    # Still this node's after a retry: then it runs here.
    node.info.lead(1, "n1")
    node.relay.forward(client, {"cmd": "GetJob", "id": "1-2", "reqId": 2}, 1, away=True)
    node.loop.advance(RETRY_DELAY_S)
    assert [frame["id"] for _, frame in node.dispatcher.handled] == ["1-2"]


def test_a_leader_that_moved_gets_the_command_sent_on_to_the_new_one(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "ACK", "id": "0-1", "reqId": 3}, 0)  # not safe to repeat
    rid = node.sent[0][1][1]
    node.info.lead(0, "n3")
    node.relay.on_message("n2", ["r", rid, error(3, ErrorCode.NOT_LEADER), ErrorCode.NOT_LEADER.value, None])
    assert client.answers == []  # not proposed there: safe to send on, whatever the command
    node.loop.advance(RETRY_DELAY_S)
    assert [(peer, r) for peer, r, _ in node.requests()] == [("n2", rid), ("n3", rid)]
    node.relay.on_message("n3", ["r", rid, ok(3), None, None])
    assert client.answers == [(3, {"ok": True, "reqId": 3})]


def test_an_unknown_outcome_goes_again_only_for_a_command_safe_to_repeat(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "ACK", "id": "0-1", "reqId": 1}, 0)
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-1", "reqId": 2}, 0)
    (_, ack_rid, _), (_, get_rid, _) = node.requests()
    lost = ErrorCode.TIMEOUT
    node.relay.on_message("n2", ["r", ack_rid, error(1, lost), lost.value, None])
    node.relay.on_message("n2", ["r", get_rid, error(2, lost), lost.value, None])
    assert client.answers == [(1, {"ok": False, "code": "TIMEOUT", "error": "refused", "reqId": 1})]
    node.loop.advance(RETRY_DELAY_S)
    assert [r for _, r, _ in node.requests()] == [ack_rid, get_rid, get_rid]


def test_a_lost_link_sends_safe_commands_again_and_answers_the_others_timeout(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "ACK", "id": "0-1", "reqId": 1}, 0)
    node.relay.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(1)), "reqId": 2}, 0)
    (_, _, _), (_, push_rid, first) = node.requests()
    node.links.discard("n2")
    node.info.lead(0, "n3")
    node.relay.peer_lost("n2")
    assert client.answers == [(1, "TIMEOUT")]
    node.loop.advance(RETRY_DELAY_S)
    (peer, rid, again) = node.requests()[-1]
    # The add went again to the new leader, its key in the form the engine looks up.
    assert (peer, rid) == ("n3", push_rid)
    assert first["idempotencyKey"].startswith(FORWARDED_KEY_PREFIX)
    assert again["idempotencyKey"] == FORWARDED_AGAIN_PREFIX + first["idempotencyKey"][len(FORWARDED_KEY_PREFIX):]


def test_no_link_to_any_leader_answers_when_the_deadline_comes(node: Node) -> None:
    client = Client()
    node.links.clear()
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-1", "reqId": 1}, 0)
    node.loop.advance(FORWARD_TIMEOUT_S - 1)
    assert client.answers == []
    node.loop.advance(2)
    assert client.answers == [(1, "NO_LEADER")] and node.relay.stats()["forwarding"] == 0


def test_an_unanswered_command_times_out_at_its_deadline_a_long_poll_after_its_wait(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-1", "reqId": 1}, 0)
    node.relay.forward(client, {"cmd": "PULL", "queue": "events", "timeout": 20_000, "reqId": 2}, 0)
    node.loop.advance(FORWARD_TIMEOUT_S)
    node.relay._sweep(node.loop.time())
    assert client.answers == [(1, "TIMEOUT")]
    node.loop.advance(20)
    node.relay._sweep(node.loop.time())
    assert client.answers == [(1, "TIMEOUT"), (2, "TIMEOUT")]


def test_commands_in_flight_are_bounded(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "FORWARDED_MAX", 2)
    client = Client()
    for i in range(2):
        node.relay.forward(client, {"cmd": "GetJob", "id": f"0-{i}", "reqId": i}, 0)
    with pytest.raises(CommandError) as refused:
        node.relay.forward(client, {"cmd": "GetJob", "id": "0-9", "reqId": 9}, 0)
    assert refused.value.code is ErrorCode.OVERLOADED and len(node.sent) == 2


def test_a_client_gone_drops_its_commands_and_ends_its_session_at_the_leaders(node: Node) -> None:
    client = Client()
    other = Client(conn_id=8, session="s8")
    node.relay.forward(client, {"cmd": "PULL", "queue": "events", "timeout": 5000, "reqId": 1}, 0)
    node.relay.forward(other, {"cmd": "GetJob", "id": "0-1", "reqId": 1}, 0)
    rid = node.sent[0][1][1]
    node.sent.clear()
    client.closed = True
    node.relay.connection_closed(client)
    assert node.sent == [("n2", ["c", rid]), ("n2", ["x", "s5"])]
    node.relay.on_message("n2", ["r", rid, ok(1, job=None), None, None])
    assert client.answers == [] and node.relay.stats()["forwarding"] == 1


def test_a_link_that_takes_reply_dicts_gets_the_decoded_answer(node: Node) -> None:
    client = HttpClient()
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-1", "reqId": 1}, 0)
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-2", "reqId": 2}, 0)
    (_, r1, _), (_, r2, _) = node.requests()
    node.relay.on_message("n2", ["r", r1, ok(1, job=None), None, None])
    node.relay.on_message("n2", ["r", r2, error(2, ErrorCode.NOT_FOUND), ErrorCode.NOT_FOUND.value, None])
    assert client.answers == [(1, {"job": None}), (2, "NOT_FOUND")]


# --- keys that make an add safe to send again ---------------------------------------------------------------


def test_each_job_of_a_batch_without_key_or_custom_id_gets_a_key_and_keeps_it_when_sent_again(node: Node) -> None:
    client = Client()
    jobs = [{"data": Raw(msgpack.packb(0))}, {"data": Raw(msgpack.packb(1)), "customId": "c1"},
            {"data": Raw(msgpack.packb(2)), "idempotencyKey": "theirs"}, {"data": Raw(msgpack.packb(3))}]
    node.relay.forward(client, {"cmd": "PUSHB", "queue": "q", "jobs": jobs, "reqId": 1}, 0)
    _, rid, first = node.requests()[0]
    keys = [job.get("idempotencyKey") for job in first["jobs"]]
    own = node.relay._key_prefix
    assert keys[0] == f"{own}{rid:x}.0" and keys[3] == f"{own}{rid:x}.3"
    assert keys[1] is None and keys[2] == "theirs"
    # Every job has a key or a custom id now: a lost link sends the batch again.
    node.info.lead(0, "n3")
    node.relay.peer_lost("n2")
    node.loop.advance(RETRY_DELAY_S)
    _, again_rid, again = node.requests()[-1]
    assert again_rid == rid
    assert [job.get("idempotencyKey") for job in again["jobs"]] == [
        f"{node.relay._again_prefix}{rid:x}.0", None, "theirs", f"{node.relay._again_prefix}{rid:x}.3"]
    assert [job["data"] for job in again["jobs"]] == [job["data"] for job in first["jobs"]]


def _bulk_body(jobs: list[dict[str, Any]], req_id: Any = 1, queue: str = "q") -> tuple[dict[str, Any], bytes]:
    """A client's PUSHB as the node's decoder hands it on: its decoded form and its bytes."""
    body = msgpack.packb({"cmd": "PUSHB", "queue": queue, "jobs": jobs, "reqId": req_id}, use_bin_type=True)
    return decode_request(body, raw_data=True), body


def test_a_bulk_add_goes_on_as_its_client_sent_it_with_a_key_base_kept_when_sent_again(node: Node) -> None:
    client = Client()
    client.bunqueue_envelope = True
    frame, body = _bulk_body([{"data": 0}, {"data": 1, "jobId": "c1"}, {"data": 2, "customId": "c2"}], req_id=4)
    node.relay.forward_received(client, frame, body, 0, True)
    ((peer, message),) = node.sent
    kind, rid, session, sent, base, dialect = message
    assert (peer, kind, session, dialect) == ("n2", "k", "s5", True)
    assert sent is body  # the client's bytes, not decoded and encoded again
    assert base == f"{node.relay._key_prefix}{rid:x}."
    # Its custom ids (Shoal's name and bunqueue's) are placed before the leader answers.
    assert node.dispatcher.locator.get("c1") == 0 and node.dispatcher.locator.get("c2") == 0
    # A lost link sends the same bytes again, with the key base in its again form.
    node.info.lead(0, "n3")
    node.relay.peer_lost("n2")
    node.loop.advance(RETRY_DELAY_S)
    peer, (kind, again_rid, _, again_body, again_base, _) = node.sent[-1]
    assert (peer, kind, again_rid, again_body) == ("n3", "k", rid, body)
    assert again_base == f"{node.relay._again_prefix}{rid:x}."
    node.relay.on_message("n3", ["r", rid, ok(4, ids=["0-1", "c1", "c2"]), None, None])
    assert client.answers == [(4, {"ok": True, "reqId": 4, "ids": ["0-1", "c1", "c2"]})]


def test_a_bulk_add_sent_as_received_runs_here_keyed_when_this_node_came_to_lead(node: Node) -> None:
    client = Client()
    frame, body = _bulk_body([{"data": 0}, {"data": 1, "idempotencyKey": "theirs"}], queue="other")
    node.info.lead(1, "n1")
    node.relay.forward_received(client, frame, body, 1, False)
    ((conn, handled),) = node.dispatcher.handled
    assert conn is client and node.sent == []
    first, theirs = (job.get("idempotencyKey") for job in handled["jobs"])
    assert first.startswith(node.relay._key_prefix) and first.endswith(".0") and theirs == "theirs"
    assert node.relay.stats()["forwarding"] == 0


def test_a_peers_bulk_add_as_its_client_sent_it_gets_the_forwarding_nodes_keys_here(node: Node) -> None:
    _, body = _bulk_body([{"data": 0}, {"data": 1, "customId": "c"}, {"data": 2, "jobId": "j"},
                          {"data": 3, "idempotencyKey": "theirs"}, {"data": 4, "idempotencyKey": None}], req_id=8)
    base = f"{FORWARDED_KEY_PREFIX}n2.abc:1f."
    node.relay.on_message("n2", ["k", 31, "remote-s", body, base, True])
    ((call, frame),) = node.dispatcher.handled
    assert call.bunqueue_envelope is True and call.wants_forwarding is False and call.req_id == 8
    assert [job.get("idempotencyKey") for job in frame["jobs"]] == [f"{base}0", None, None, "theirs", f"{base}4"]
    assert type(frame["jobs"][0]["data"]) is Raw  # job data stays raw
    # Without the dialect flag, the jobs are read in Shoal's own names.
    again = f"{FORWARDED_AGAIN_PREFIX}n2.abc:1f."
    node.relay.on_message("n2", ["k", 32, None, body, again, False])
    call, frame = node.dispatcher.handled[-1]
    assert call.bunqueue_envelope is False and frame["jobs"][0]["idempotencyKey"] == f"{again}0"
    call.reply(8, {"ids": ["0-1"]})
    peer, (kind, rid, reply, code, _) = node.sent[-1]
    assert (peer, kind, rid, code) == ("n2", "r", 32, None) and decode_response(reply)["ids"] == ["0-1"]


@pytest.mark.parametrize("jobs", [
    [{"data": i} for i in range(300)],                                  # the usual bulk add: every job keyed
    [{"data": 0}, {"data": 1, "idempotencyKey": None}, {"data": 2, "jobId": "j"}],
    [{"data": 0}, "not a map", {"data": 2}],
])
def test_keys_for_a_bulk_add_sent_as_received_name_each_unkeyed_job_by_its_index(jobs: list[Any]) -> None:
    frame = {"cmd": "PUSHB", "queue": "q", "jobs": [dict(j) if type(j) is dict else j for j in jobs]}
    relay_module.key_jobs(frame, "~fwd:n2.x:7.")
    for i, (job, given) in enumerate(zip(frame["jobs"], jobs)):
        if type(given) is not dict:
            assert job == given
        elif given.get("idempotencyKey") is None and given.get("jobId") is None:
            assert job == {**given, "idempotencyKey": f"~fwd:n2.x:7.{i:x}"}
        else:
            assert job == given


def test_whether_a_command_is_safe_to_repeat() -> None:
    safe = relay_module._safe_to_repeat
    spec = relay_module.COMMANDS
    assert safe({"cmd": "GetJob"}, spec["GetJob"]) and not safe({"cmd": "ACK"}, spec["ACK"])
    assert not safe({"cmd": "PUSH"}, spec["PUSH"])
    assert safe({"cmd": "PUSH", "customId": "c"}, spec["PUSH"]) and safe({"cmd": "PUSH", "idempotencyKey": "k"},
                                                                        spec["PUSH"])
    assert not safe({"cmd": "PUSHB", "jobs": [{"customId": "c"}, {}]}, spec["PUSHB"])
    assert safe({"cmd": "PUSHB", "jobs": [{"customId": "c"}, {"idempotencyKey": "k"}]}, spec["PUSHB"])
    assert not safe({"cmd": "Nope"}, None)


# --- serving what peers forward ---------------------------------------------------------------------------


def serve(node: Node, peer: str, rid: int, session: str | None, frame: dict[str, Any]) -> Any:
    node.relay.on_message(peer, ["q", rid, session, encode_body(frame)])
    return node.dispatcher.handled[-1][0] if node.dispatcher.handled else None


def test_a_peers_command_is_handled_here_and_answered_on_the_link(node: Node) -> None:
    call = serve(node, "n2", 41, "remote-s", {"cmd": "PULL", "queue": "q", "reqId": 9})
    assert call.authed and call.wants_forwarding is False and call.peer_host == "n2" and call.req_id == 9
    # The peer's session is attached here under a connection id no client connection has.
    assert call.conn_id < 0 and not node.dispatcher.sessions.held_here("remote-s")
    assert serve(node, "n2", 42, "remote-s", {"cmd": "GetJob", "id": "1-1", "reqId": 10}).conn_id == call.conn_id
    job = {"id": "1-5", "customId": "mine", "data": 1}
    call.reply(9, {"job": job})
    peer, (kind, rid, body, code, ids) = node.sent[-1]
    assert (peer, kind, rid, code, ids) == ("n2", "r", 41, None, ["1-5"])
    assert decode_response(body) == {"ok": True, "job": job, "reqId": 9}
    call.reply(9, {"job": job})  # answered already: the call is no longer served
    assert node.relay.stats()["serving"] == 1


def test_a_peers_command_that_fails_is_answered_with_its_error(node: Node) -> None:
    node.dispatcher.raises = CommandError(ErrorCode.NOT_LEADER, "not here")
    serve(node, "n2", 1, None, {"cmd": "GetJob", "id": "1-1", "reqId": 4})
    node.dispatcher.raises = RuntimeError("a bug")
    serve(node, "n2", 2, None, {"cmd": "GetJob", "id": "1-1", "reqId": 5})
    codes = [(m[1], m[3], decode_response(m[2])["reqId"]) for _, m in node.sent]
    assert codes == [(1, "NOT_LEADER", 4), (2, "INTERNAL", 5)]
    assert node.relay.stats()["serving"] == 0


def test_a_peers_client_gone_drops_its_command_here(node: Node) -> None:
    call = serve(node, "n2", 7, "rs", {"cmd": "PULL", "queue": "q", "timeout": 5000, "reqId": 1})
    node.relay.on_message("n2", ["c", 7])
    assert call.closed
    call.reply(1, {"job": None})
    assert node.sent == []


def test_a_peers_session_ending_releases_its_leases_here(node: Node) -> None:
    call = serve(node, "n2", 7, "rs", {"cmd": "PULL", "queue": "q", "reqId": 1})
    node.dispatcher.sessions.used_partition("rs", 1)
    node.relay.on_message("n2", ["x", "rs"])
    assert node.dispatcher.released == [("rs", {1})]
    # A new command of the same session attaches it anew.
    assert serve(node, "n2", 8, "rs", {"cmd": "PULL", "queue": "q", "reqId": 2}).conn_id != call.conn_id


def test_a_lost_peer_ends_what_it_forwarded_here(node: Node) -> None:
    call = serve(node, "n2", 7, "rs", {"cmd": "PULL", "queue": "q", "reqId": 1})
    node.dispatcher.sessions.used_partition("rs", 0)
    node.relay.on_message("n2", ["s", EVENTS_QUEUE])
    assert node.relay.wants_events(EVENTS_QUEUE)
    node.relay.peer_lost("n2")
    assert call.closed and node.dispatcher.released == [("rs", {0})]
    assert not node.relay.wants_events(EVENTS_QUEUE)


def test_commands_served_for_peers_are_bounded(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "SERVED_MAX", 1)
    serve(node, "n2", 1, None, {"cmd": "PULL", "queue": "q", "timeout": 5000, "reqId": 1})
    node.relay.on_message("n2", ["q", 2, None, encode_body({"cmd": "GetJob", "id": "1-1", "reqId": 2})])
    assert len(node.dispatcher.handled) == 1
    assert node.sent == [("n2", ["r", 2, node.sent[0][1][2], "OVERLOADED", None])]


def test_malformed_messages_are_ignored(node: Node) -> None:
    for message in ({"q": 1}, [], [1, 2], ["z"], ["q", 1], ["r", 1, b"", None], ["w", "aid", [], False],
                    ["q", 1, None, "not bytes"], ["k", 1, None, b"\x80", 5, False],
                    ["k", 1, None, b"\x80", "not a node's key base", False]):
        node.relay.on_message("n2", message)
    assert node.dispatcher.handled == [] and node.sent == []


def test_a_forwarded_body_that_does_not_decode_is_answered_invalid(node: Node) -> None:
    node.relay.on_message("n2", ["q", 1, None, b"\xc1not msgpack"])
    ((peer, (kind, rid, body, code, ids)),) = node.sent
    assert (peer, kind, rid, code, ids) == ("n2", "r", 1, "INVALID", None)
    assert decode_response(body)["error"].startswith("undecodable MessagePack frame")
    assert node.dispatcher.handled == []


# --- bunqueue's events of queues led elsewhere ------------------------------------------------------------


def test_events_of_a_queue_led_elsewhere_are_subscribed_at_its_leader_and_follow_it(node: Node) -> None:
    client = Client()
    other = Client(conn_id=9)
    node.relay.subscribe(client, EVENTS_QUEUE)
    node.relay.subscribe(other, EVENTS_QUEUE)
    assert node.sent == [("n2", ["s", EVENTS_QUEUE])]
    node.relay.on_message("n2", ["e", EVENTS_QUEUE, b"frames"])
    assert client.events == [b"frames"] and other.events == [b"frames"]
    node.info.lead(0, "n3")
    node.relay._place_subscription(EVENTS_QUEUE)
    assert node.sent[1:] == [("n2", ["u", EVENTS_QUEUE]), ("n3", ["s", EVENTS_QUEUE])]
    node.relay.connection_closed(client)
    assert len(node.sent) == 3  # another connection still wants them
    node.relay.connection_closed(other)
    assert node.sent[3:] == [("n3", ["u", EVENTS_QUEUE])]


def test_a_leader_sends_each_event_once_per_subscribed_peer(node: Node) -> None:
    node.relay.on_message("n2", ["s", EVENTS_QUEUE])
    node.relay.on_message("n3", ["s", "other"])
    assert node.info.events_asked == 2
    built: list[int] = []

    def build() -> bytes:
        built.append(1)
        return b"encoded"

    node.relay.publish_to_peers(EVENTS_QUEUE, build)
    node.relay.publish_to_peers("nobody-wants", build)
    assert node.sent == [("n2", ["e", EVENTS_QUEUE, b"encoded"])] and built == [1]
    node.relay.on_message("n2", ["u", EVENTS_QUEUE])
    assert not node.relay.wants_events(EVENTS_QUEUE) and node.relay.wants_events("other")


def test_the_queues_relayed_for_clients_are_bounded(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "SUBSCRIBED_QUEUES_MAX", 1)
    node.relay.subscribe(Client(), EVENTS_QUEUE)
    with pytest.raises(CommandError) as refused:
        node.relay.subscribe(Client(), "another")
    assert refused.value.code is ErrorCode.OVERLOADED


# --- the job locator ------------------------------------------------------------------------------------


def test_the_locator_learns_custom_ids_from_requests_and_replies() -> None:
    node = Node()
    client = Client()
    node.relay.forward(client, {"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(1)), "customId": "a",
                                "reqId": 1}, 0)
    node.relay.forward(client, {"cmd": "PULL", "queue": "q", "reqId": 2}, 0)
    pull_rid = node.requests()[1][1]
    node.relay.on_message("n2", ["r", pull_rid, ok(2, job=None), None, ["0-7", 3]])
    locator = node.relay.locator
    assert locator.get("a") == 0 and locator.get("0-7") == 0 and locator.get("nope") is None
    locator.forget("a")
    assert locator.get("a") is None


def test_the_locator_forgets_its_oldest_half_when_full() -> None:
    locator = JobLocator(size_max=4)
    for i in range(4):
        locator.learn(f"j{i}", i)
    locator.learn("j1", 9)  # known: no eviction
    assert [locator.get(f"j{i}") for i in range(4)] == [0, 9, 2, 3]
    locator.learn("j4", 4)
    assert [locator.get(f"j{i}") for i in range(5)] == [None, None, 2, 3, 4]


def test_custom_ids_of_a_reply() -> None:
    of = relay_module._custom_ids_of
    assert of({"job": {"id": "0-1", "customId": "c"}}) == ["0-1"]
    assert of({"jobs": [{"id": "0-1"}, {"id": "0-2", "customId": "c"}, "junk"]}) == ["0-2"]
    assert of({"job": None}) is None and of({"jobs": [{"id": "0-1"}]}) is None


# --- the node's own calls ----------------------------------------------------------------------------------


def test_a_call_of_the_nodes_own_returns_the_leaders_reply_or_raises_its_error() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        sent: list[tuple[str, list[Any]]] = []
        info = Info()
        r = Relay(Dispatcher(ManualLoop(), info), info, loop, lambda peer, m: sent.append((peer, m)) or True)

        def answer(body: bytes, code: str | None) -> None:
            peer, message = sent[-1]
            r.on_message(peer, ["r", message[1], body, code, None])

        loop.call_soon(answer, ok(None, found=True), None)
        assert await r.call(0, {"cmd": "Locate", "id": "x"}) == {"ok": True, "found": True}
        loop.call_soon(answer, error(None, ErrorCode.NOT_FOUND), ErrorCode.NOT_FOUND.value)
        with pytest.raises(CommandError) as refused:
            await r.call(0, {"cmd": "Locate", "id": "y"})
        assert refused.value.code is ErrorCode.NOT_FOUND
        assert [m[0] for _, m in sent] == ["q", "q"] and all(peer == "n2" for peer, _ in sent)
        r.close()

    asyncio.run(scenario())


def test_closing_the_relay_answers_every_command_in_flight(node: Node) -> None:
    client = Client()
    node.relay.forward(client, {"cmd": "GetJob", "id": "0-1", "reqId": 1}, 0)
    node.relay.close()
    assert client.answers == [(1, "SHUTTING_DOWN")] and node.relay.stats()["forwarding"] == 0


# --- the session audit's questions --------------------------------------------------------------------------


def test_a_leaders_audit_learns_which_sessions_this_node_holds_and_is_told_when_they_go(node: Node) -> None:
    sessions = node.dispatcher.sessions
    sessions.attach("held", 1)
    sessions.attach("forwarded", -1)
    node.relay.on_message("n3", ["w", 12, ["held", "forwarded", "unknown", 5, "x" * 500], False])
    assert node.sent == [("n3", ["w", 12, ["held"], True])]
    sessions.detach("held", 1)  # its last client connection here: the watching leader hears it
    assert node.sent[-1] == ("n3", ["x", "held"])


class LedReplica:
    """The replica of a partition this node leads, caught up: its applied state read through the real view."""

    def __init__(self, engine: PartitionEngine) -> None:
        self.application = SimpleNamespace(view=PartitionView(lambda: engine))

    def is_leader(self) -> bool:
        return True

    def read_ready(self) -> bool:
        return True


def led_partition(engine: PartitionEngine) -> Partition:
    # The audit reads and releases through the dispatcher: the partition's group commit is not used.
    return Partition(0, LedReplica(engine), None)  # type: ignore[arg-type]


def leases(engine: PartitionEngine, *sessions: str) -> None:
    for k, session in enumerate(sessions):
        engine.apply({"cmd": "PUSH", "queue": "audited", "data": b"x"}, 1_000 + k)
        engine.apply(SessionPull({"cmd": "PULL", "queue": "audited", "ttr": 600_000}, session), 1_000 + k)


def test_an_audit_adopts_sessions_other_nodes_hold_and_releases_those_none_holds(node: Node) -> None:
    engine = PartitionEngine(0)
    leases(engine, "orphan", "elsewhere", "here", "kept.rest")
    node.dispatcher.directory.partitions[0] = led_partition(engine)
    node.dispatcher.sessions.attach("here", 3)  # a client connection of this node holds it
    node.relay._audit_step(node.loop.time())
    asked = [(peer, m) for peer, m in node.sent if m[0] == "w"]
    assert [peer for peer, _ in asked] == ["n2", "n3"]
    aid, sessions = asked[0][1][1], asked[0][1][2]
    assert sorted(sessions) == ["elsewhere", "orphan"]  # "here" is accounted for, "kept." never asked
    assert node.dispatcher.sessions.accounts("here", 0)
    node.relay.on_message("n2", ["w", aid, ["elsewhere"], True])
    assert node.dispatcher.released == []  # n3 has not answered yet
    node.relay.on_message("n3", ["w", aid, [], True])
    # n2 holds "elsewhere": adopted, as if n2 had forwarded it; nobody holds "orphan": released.
    assert node.dispatcher.released == [("orphan", {0})]
    assert node.dispatcher.sessions.accounts("elsewhere", 0)
    assert node.relay.stats()["sessionsAdopted"] == 2 and node.relay.stats()["sessionsReleased"] == 1


def test_an_audit_a_node_does_not_answer_releases_nothing(node: Node) -> None:
    engine = PartitionEngine(0)
    leases(engine, "orphan")
    node.dispatcher.directory.partitions[0] = led_partition(engine)
    node.links.discard("n3")  # no link: it cannot answer
    node.relay._audit_step(node.loop.time())
    (_, (_, aid, _, _)), = [(peer, m) for peer, m in node.sent if m[0] == "w"]
    node.relay.on_message("n2", ["w", aid, [], True])
    node.loop.advance(AUDIT_ANSWER_TIMEOUT_S)
    node.relay._audit_step(node.loop.time())
    assert node.dispatcher.released == [] and node.relay.audit.round is None
