"""One command table (``shoal.cluster.commands``): each spec says whether its command runs before
authentication, long-polls, adds jobs or takes disk space; node commands are checked by the same
``validate()`` as every other; and every link the dispatcher answers declares what it can do."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster.commands import (COMMANDS, LONG_POLL_COMMANDS, NEW_JOB_COMMANDS, NODE_COMMANDS,
                                    PRE_AUTH_COMMANDS, SPACE_TAKING_COMMANDS, normalize, validate)
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.connection import ClientConnection
from shoal.node.dispatch import Dispatcher
from shoal.node.http.conn import HttpConnection
from shoal.node.ports import Replier
from shoal.node.relay import _Call

from test_dispatch_ports import FixedClock, Flows, Info, Link, Metrics, NoPartitions

ROOT = Path(__file__).resolve().parents[2]


def test_the_sets_come_from_the_specs() -> None:
    assert PRE_AUTH_COMMANDS == {"Hello", "Auth", "Ping"}
    assert LONG_POLL_COMMANDS == {"PULL", "PULLB"}
    assert NEW_JOB_COMMANDS == {"PUSH", "PUSHB", "PushFlow"}
    assert {"PUSH", "PUSHB", "PushFlow", "CreateQueue", "AddLog", "Progress", "Cron", "Update"} <= SPACE_TAKING_COMMANDS
    assert not SPACE_TAKING_COMMANDS & {"PULL", "ACK", "GetJob", "Ping"}
    assert PRE_AUTH_COMMANDS <= NODE_COMMANDS
    for name in NODE_COMMANDS:
        assert COMMANDS[name].routing == "node"


@pytest.fixture
def dispatcher() -> Any:
    loop = asyncio.new_event_loop()
    config = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1"),), partitions=2)
    d = Dispatcher(config, loop, clock=FixedClock(1_700_000_000_000), directory=NoPartitions(), info=Info(config),
                   metrics=Metrics(), flows=Flows())
    yield d
    loop.close()


@pytest.mark.parametrize("frame, field", [
    ({"cmd": "Hello", "protocolVersion": 0}, "protocolVersion"),
    ({"cmd": "Hello", "protocolVersion": 2, "capabilities": "routing"}, "capabilities"),
    ({"cmd": "Hello"}, "protocolVersion"),
    ({"cmd": "Identify", "session": 7}, "session"),
    ({"cmd": "Subscribe", "queue": ["q"]}, "queue"),
    ({"cmd": "SubscribeEvents"}, "queue"),
    ({"cmd": "RegisterWorker", "name": "w", "colour": "red"}, "colour"),
    ({"cmd": "RegisterWorker", "queues": "q"}, "queues"),
    ({"cmd": "Heartbeat"}, "workerId"),
    ({"cmd": "Ping", "extra": 1}, "extra"),
])
def test_node_commands_are_validated_like_every_other(dispatcher: Any, frame: dict[str, Any], field: str) -> None:
    with pytest.raises(CommandError) as caught:
        dispatcher.handle(Link(), {**frame, "reqId": 1})
    assert caught.value.code is ErrorCode.INVALID
    assert field in str(caught.value)


def test_a_node_command_that_passes_is_answered(dispatcher: Any) -> None:
    link = Link()
    dispatcher.handle(link, {"cmd": "Hello", "protocolVersion": 2, "capabilities": ["routing"], "reqId": 1})
    assert link.replies[0][1]["protocolVersion"] == 2
    assert link.wants_forwarding is False
    dispatcher.handle(link, {"cmd": "RegisterWorker", "name": "w", "queues": ["q"], "workerId": "w1",
                             "concurrency": 4, "hostname": "h", "pid": 12, "startedAt": 1, "reqId": 2})
    # bunqueue's worker names itself ``id`` in its heartbeat and reports its counts
    dispatcher.handle(link, normalize({"cmd": "Heartbeat", "id": "w1", "activeJobs": 3, "processed": 10,
                                       "failed": 1, "reqId": 3}))
    assert link.replies[-1] == (3, {"data": {"ok": True}})
    dispatcher.handle(link, {"cmd": "ListWorkers", "reqId": 4})
    (worker,) = link.replies[-1][1]["workers"]
    assert (worker["concurrency"], worker["activeJobs"], worker["processed"], worker["failed"]) == (4, 3, 10, 1)


def test_commands_before_auth_are_the_tables(dispatcher: Any) -> None:
    link = Link()
    link.authed = False
    with pytest.raises(CommandError) as caught:
        dispatcher.handle(link, {"cmd": "ListWorkers", "reqId": 1})
    assert caught.value.code is ErrorCode.AUTH_REQUIRED
    dispatcher.handle(link, {"cmd": "Ping", "reqId": 2})
    assert link.replies[-1][1]["pong"] is True


def test_validate_takes_every_node_command_through_its_spec() -> None:
    validate({"cmd": "SubscribeEvents", "queue": "emails"})
    with pytest.raises(CommandError):
        validate({"cmd": "SubscribeEvents", "queue": ""})


@pytest.mark.parametrize("link", [ClientConnection, HttpConnection, _Call, Link], ids=lambda c: c.__name__)
def test_every_link_the_dispatcher_answers_declares_the_replier_protocol(link: type) -> None:
    members = {name for name in dir(Replier) if not name.startswith("_")} | set(Replier.__annotations__)
    declared = set(dir(link)) | set(getattr(link, "__annotations__", {}))
    for cls in link.__mro__:
        declared |= set(getattr(cls, "__slots__", ()))
    # attributes set in __init__ are found in the constructor's source
    source = ast.parse(Path(__import__("inspect").getsourcefile(link)).read_text())
    for node in ast.walk(source):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            declared.add(node.attr)
    assert members - declared == set()


@pytest.mark.parametrize("module", ["node/dispatch.py", "node/relay.py"])
def test_dispatch_and_relay_read_no_connection_attribute_through_getattr(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    calls = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in ("getattr", "hasattr", "setattr")]
    assert calls == []
