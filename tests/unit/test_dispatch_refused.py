"""A write this node refused unproposed because it stopped leading (a leadership transfer) goes to
the relay for a client that does not route for itself, its job data as the client sent it;
a client that routes gets the refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import msgspec
import pytest

from shoal.cluster.codec import PlainPush, Raw
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.dispatch import Dispatcher
from shoal.node.partition import Partition

from test_dispatch_ports import FixedClock, Flows, Info, Link, Metrics


class Leading:
    """A replica that still believes it leads."""

    def is_leader(self) -> bool:
        return True

    def read_ready(self) -> bool:
        return True


class Refusing:
    """A group commit whose every entry is refused as the leadership moves."""

    def submit(self, cmd: Any, done: Any) -> None:
        done(CommandError(ErrorCode.NO_LEADER, "the partition's leadership is moving; retry"))


class Directory:
    partitions = {p: Partition(p, Leading(), Refusing()) for p in (0, 1)}  # type: ignore[arg-type]

    def leads(self, p: int) -> bool:
        return p in self.partitions and self.partitions[p].replica.is_leader()

    def not_leader_error(self, p: int) -> CommandError:
        return CommandError(ErrorCode.NOT_LEADER, f"not leader of {p}")


class Relay:
    def __init__(self) -> None:
        self.forwarded: list[tuple[dict[str, Any], int, bool]] = []

    def forward(self, conn: Any, frame: dict[str, Any], p: int, away: bool = False) -> None:
        self.forwarded.append((frame, p, away))

    def forward_pushes(self, conn: Any, frames: list[PlainPush], p: int, away: bool = False) -> None:
        for f in frames:
            self.forwarded.append(({"cmd": "PUSH", "queue": f.queue, "data": Raw(bytes(f.data)), "reqId": f.reqId},
                                   p, away))


@pytest.fixture
def dispatcher() -> Iterator[tuple[Dispatcher, Relay]]:
    loop = asyncio.new_event_loop()
    config = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1"),), partitions=2)
    d = Dispatcher(config, loop, clock=FixedClock(1_700_000_000_000), directory=Directory(), info=Info(config),
                   metrics=Metrics(), flows=Flows())
    relay = Relay()
    d.relay = relay  # type: ignore[assignment]
    for part in Directory.partitions.values():
        part.serving = d
    yield d, relay
    loop.close()


def test_refused_pushes_of_a_client_that_does_not_route_go_to_the_relay(dispatcher: Any) -> None:
    d, relay = dispatcher
    conn = Link()
    conn.wants_forwarding = True  # type: ignore[attr-defined]
    data = msgpack.packb({"n": 1})
    block = [PlainPush("q", msgspec.Raw(data), reqId=i) for i in (1, 2)]
    d.handle_pushes(conn, block)
    d.handle(conn, {"cmd": "PUSH", "queue": "q", "data": Raw(data), "reqId": 3, "priority": 2})
    assert conn.replies == []
    frames = [f for f, _, away in relay.forwarded if away]
    assert [f["reqId"] for f in frames] == [1, 2, 3]
    assert all(type(f["data"]) is Raw and f["data"].packed == data for f in frames)
    assert frames[2]["priority"] == 2


def test_a_client_that_routes_gets_the_refusal(dispatcher: Any) -> None:
    d, relay = dispatcher
    conn = Link()
    conn.wants_forwarding = False  # type: ignore[attr-defined]
    d.handle_pushes(conn, [PlainPush("q", msgspec.Raw(msgpack.packb(1)), reqId=1)])
    assert relay.forwarded == [] and [r.code for _, r in conn.replies] == [ErrorCode.NO_LEADER]
