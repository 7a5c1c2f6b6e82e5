"""The dispatcher runs on what it is handed (ports.py): a clock, a partition directory, the
node's identity, metrics and flows; no ``Node``, no socket. And the node's one clock."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.topology import Topology
from shoal.node.clock import WallClock
from shoal.node.dispatch import Dispatcher, _custom_ids
from shoal.node.ports import DecodingReplier, Replier, answer_guarded


class FixedClock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


class NoPartitions:
    """A directory of a node that hosts nothing: every partition is led elsewhere."""

    partitions: dict[int, Any] = {}

    def not_leader_error(self, p: int) -> CommandError:
        return CommandError(ErrorCode.NO_LEADER, f"partition {p} has no leader yet; retry")


class Info:
    node_id = "n1"
    incarnation = "0f1e2d3c4b5a6978"

    def __init__(self, config: ClusterConfig) -> None:
        self.topology: Topology = config.initial_topology()
        self.event_listeners: list[Any] = []
        self.wanted = 0

    def local_stats(self, partition: Any = None) -> dict[str, Any]:
        return {"nodeId": self.node_id}

    def events_wanted(self) -> None:
        self.wanted += 1


class Metrics:
    def __init__(self) -> None:
        self.observed: list[tuple[str, int]] = []

    def observe(self, cmd: str, seconds: float, n: int = 1) -> None:
        self.observed.append((cmd, n))

    def exposition(self) -> str:
        return "# nothing\n"


class Flows:
    commands = frozenset({"PushFlow"})

    def __init__(self) -> None:
        self.handled: list[dict[str, Any]] = []

    def handle(self, conn: Replier, frame: dict[str, Any]) -> None:
        self.handled.append(frame)


class Link(DecodingReplier):
    """A :class:`~shoal.node.ports.Replier` that keeps what it was answered."""

    conn_id = 1
    peer_host = "127.0.0.1"
    session = "s1"
    authed = True
    closed = False
    protocol_version = 1
    subscriptions: set[str] | None = None

    def __init__(self) -> None:
        self.replies: list[tuple[Any, Any]] = []

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        self.replies.append((req_id, body))

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self.replies.append((req_id, exc.code))

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        self.replies.extend(zip(req_ids, results))

    def send_frame(self, frame: dict[str, Any]) -> None:
        self.replies.append((None, frame))

    def upgrade(self, version: int) -> None:
        self.protocol_version = version


@pytest.fixture
def parts() -> Any:
    loop = asyncio.new_event_loop()
    config = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1"),), partitions=2)
    info, metrics, flows = Info(config), Metrics(), Flows()
    dispatcher = Dispatcher(config, loop, clock=FixedClock(1_700_000_000_123), directory=NoPartitions(),
                            info=info, metrics=metrics, flows=flows)
    yield dispatcher, info, flows
    loop.close()


def test_node_commands_answer_from_the_injected_clock_and_identity(parts: Any) -> None:
    dispatcher, info, _ = parts
    link = Link()
    assert dispatcher.connection_opened(link) is None
    dispatcher.handle(link, {"cmd": "Ping", "reqId": 1})
    dispatcher.handle(link, {"cmd": "RegisterWorker", "reqId": 2, "name": "w"})
    dispatcher.handle(link, {"cmd": "Hello", "reqId": 3, "protocolVersion": 2})
    dispatcher.handle(link, {"cmd": "Subscribe", "reqId": 4})
    assert link.replies[0] == (1, {"pong": True, "time": 1_700_000_000_123.0, "data": {"pong": True, "time": 1_700_000_000_123.0}})
    assert link.replies[1][1]["workerId"] == "n1-w1" and link.replies[1][1]["data"]["workerId"] == "n1-w1"
    assert dispatcher.workers["n1-w1"]["registeredAt"] == 1_700_000_000_123
    assert link.replies[2][1]["nodeId"] == "n1" and link.protocol_version == 2
    assert link.replies[2][1]["incarnation"] == info.incarnation
    assert info.wanted == 1 and link in dispatcher.subscribers


def test_commands_for_a_partition_led_elsewhere_get_the_directory_s_refusal(parts: Any) -> None:
    dispatcher, _, flows = parts
    link = Link()
    dispatcher.connection_opened(link)
    with pytest.raises(CommandError) as refused:
        dispatcher.handle(link, {"cmd": "GetJob", "id": "1-5"})
    assert refused.value.code is ErrorCode.NO_LEADER
    dispatcher.handle(link, {"cmd": "PushFlow", "reqId": 9})
    assert flows.handled == [{"cmd": "PushFlow", "reqId": 9}]


def test_every_caller_of_the_dispatcher_answers_a_refusal_and_survives_a_bug(parts: Any,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """``answer_guarded`` (the client connections', the relay's and HTTP's way to run a command):
    a refusal becomes the command's error reply, an unexpected exception an ``INTERNAL`` reply and
    a logged traceback, and nothing propagates."""
    dispatcher, _, _ = parts
    link = Link()
    dispatcher.connection_opened(link)
    answer_guarded(dispatcher.handle, link, {"cmd": "GetJob", "id": "1-5", "reqId": 7}, 7)
    assert link.replies == [(7, ErrorCode.NO_LEADER)]

    def broken(conn: Any, frame: dict[str, Any]) -> None:
        raise KeyError("a bug")

    answer_guarded(broken, link, {"cmd": "Ping", "reqId": 8}, 8)
    assert link.replies[-1] == (8, ErrorCode.INTERNAL)
    assert "command Ping failed" in caplog.text
    answer_guarded(dispatcher.handle, link, {"cmd": "Ping", "reqId": 9}, 9)
    assert link.replies[-1][0] == 9 and link.replies[-1][1]["pong"] is True


def test_the_wall_clock_never_goes_back() -> None:
    readings = iter([10.0, 12.5, 11.0, 12.0, 13.0])
    clock = WallClock(lambda: next(readings))
    assert [clock.now_ms() for _ in range(5)] == [10_000, 12_500, 12_500, 12_500, 13_000]


def test_an_add_names_its_custom_ids_only() -> None:
    assert _custom_ids({"cmd": "PUSHB", "queue": "q",
                        "jobs": [{"data": 1}, {"data": 2, "customId": "c2"}, {"data": 3}]}) == ["c2"]
    assert _custom_ids({"cmd": "PUSH", "queue": "q", "data": 4, "customId": "c4"}) == ["c4"]
    assert _custom_ids({"cmd": "PUSH", "queue": "q", "data": 4}) is None
    assert _custom_ids({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 5}, {"data": 6, "name": "n"}]}) is None
    assert _custom_ids({"cmd": "ACK", "id": "0-1", "token": "0.1"}) is None


class Forwarder:
    """A relay that keeps what the dispatcher sends on (``RemotePartition``'s port)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes, int, bool]] = []
        self.forwarded: list[tuple[dict[str, Any], int]] = []

    def forward(self, conn: Any, frame: dict[str, Any], p: int, away: bool = False) -> None:
        self.forwarded.append((frame, p))

    def forward_received(self, conn: Any, frame: dict[str, Any], body: bytes, p: int, custom_ids: bool) -> None:
        self.received.append((frame["cmd"], body, p, custom_ids))

    def connection_closed(self, conn: Any, how: str | None = None) -> None:
        pass


class LedElsewhere(NoPartitions):
    def leads(self, p: int) -> bool:
        return False


def test_a_command_for_a_partition_led_elsewhere_goes_on_as_its_client_sent_it(parts: Any) -> None:
    """The node a client talks to reads a command only as far as its partition: the client's
    bytes go on to the leader, which checks them once (a field no command has is the leader's
    to refuse); a node's command is answered here."""
    from shoal.cluster.codec import FrameDecoder

    dispatcher, _, _ = parts
    dispatcher.directory = LedElsewhere()
    relay = dispatcher.relay = Forwarder()  # type: ignore[assignment]
    link = Link()
    link.wants_forwarding = True  # type: ignore[attr-defined]
    dispatcher.connection_opened(link)
    decoder = FrameDecoder(1 << 20, requests=True, raw_data=True, plain_push=True)
    frames = [
        {"cmd": "PULLB", "queue": "q", "count": 10, "reqId": 1},
        {"cmd": "ACK", "id": "1-7", "token": "t", "reqId": 2, "bogus": True},
        {"cmd": "PUSH", "queue": "q", "data": {"x": 1}, "priority": 3, "reqId": 3},
        {"cmd": "GetJobCounts", "queue": "q", "reqId": 4},
        {"cmd": "Ping", "reqId": 6},
    ]
    stream = b"".join(len(b).to_bytes(4, "big") + b for b in (msgpack.packb(f) for f in frames))
    for frame in decoder.drain(stream):
        try:
            dispatcher.handle(link, frame)
        except CommandError as exc:
            link.reply_error(frame.get("reqId"), exc)
    sent = {cmd: (body, p, custom_ids) for cmd, body, p, custom_ids in relay.received}
    assert set(sent) == {"PULLB", "ACK", "PUSH", "GetJobCounts"}
    for f in frames[:4]:
        body, p, _ = sent[f["cmd"]]
        assert msgpack.unpackb(body) == f, "the client's bytes, unchecked and unchanged"
    assert sent["ACK"][1] == 1 and sent["PUSH"][2] is True
    assert relay.forwarded == [] and link.replies == [(6, link.replies[0][1])] and link.replies[0][1]["pong"]
