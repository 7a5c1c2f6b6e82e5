"""The leader's dispatcher learns the partition of the custom ids an add names once the add is
answered, for a later read by custom id to go straight to it; a refused add teaches nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from shoal.cluster.codec import Raw
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.dispatch import Dispatcher
from shoal.node.partition import Partition

from test_dispatch_ports import FixedClock, Flows, Info, Link, Metrics
from test_dispatch_refused import Leading


class Answering:
    """A group commit that answers every entry at once, or refuses it when ``refuse`` is set."""

    refuse = False

    def submit(self, cmd: Any, done: Any) -> None:
        if self.refuse:
            done(CommandError(ErrorCode.QUEUE_FULL, "queue is full"))
        else:
            done({"ok": True})


class Directory:
    def __init__(self) -> None:
        self.partitions = {0: Partition(0, Leading(), Answering())}  # type: ignore[arg-type]

    def leads(self, p: int) -> bool:
        return p in self.partitions

    def not_leader_error(self, p: int) -> CommandError:
        return CommandError(ErrorCode.NOT_LEADER, f"not leader of {p}")


@pytest.fixture
def dispatcher() -> Iterator[tuple[Dispatcher, Partition]]:
    loop = asyncio.new_event_loop()
    config = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1"),), partitions=1)
    directory = Directory()
    d = Dispatcher(config, loop, clock=FixedClock(1_700_000_000_000), directory=directory, info=Info(config),
                   metrics=Metrics(), flows=Flows())
    part = directory.partitions[0]
    part.serving = d
    yield d, part
    loop.close()


def _data(n: int) -> Raw:
    return Raw(msgpack.packb(n))


def test_an_answered_add_teaches_its_custom_ids_and_only_those(dispatcher: Any) -> None:
    d, _ = dispatcher
    conn = Link()
    d.handle(conn, {"cmd": "PUSH", "queue": "q", "data": _data(0), "customId": "one", "reqId": 1})
    d.handle(conn, {"cmd": "PUSHB", "queue": "q", "reqId": 2,
                    "jobs": [{"data": _data(1)}, {"data": _data(2), "customId": "two"},
                             {"data": _data(3), "jobId": "three"}]})
    d.handle(conn, {"cmd": "PUSHB", "queue": "q", "reqId": 3, "jobs": [{"data": _data(4), "name": "n"}]})
    assert [r for _, r in conn.replies] == [{"ok": True}] * 3
    assert [d.locator.get(c) for c in ("one", "two", "three")] == [0, 0, 0]
    assert d.locator.get("n") is None


def test_a_refused_add_teaches_nothing(dispatcher: Any) -> None:
    d, part = dispatcher
    part.group_commit.refuse = True
    conn = Link()
    d.handle(conn, {"cmd": "PUSH", "queue": "q", "data": _data(0), "customId": "one", "reqId": 1})
    d.handle(conn, {"cmd": "PUSHB", "queue": "q", "reqId": 2, "jobs": [{"data": _data(1), "customId": "two"}]})
    assert [r for _, r in conn.replies] == [ErrorCode.QUEUE_FULL] * 2
    assert d.locator.get("one") is None and d.locator.get("two") is None
