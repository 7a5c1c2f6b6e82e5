"""Node-level calls over the relay channel (``Relay.ask_node``): the one way nodes ask each other
for the dashboard's and the admin API's views. Two relays joined by an in-memory link."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node import relay as relay_module
from shoal.node.relay import Relay

from test_relay_follow import Dispatcher, Info


class Wire:
    """Delivers each relay message to the other node's relay on the next loop turn (None: cut)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.relays: dict[str, Relay] = {}
        self.up = True

    def sender(self, me: str) -> Any:
        def send(peer: str, message: list[Any]) -> bool:
            if not self.up or peer not in self.relays:
                return False
            self.loop.call_soon(self.relays[peer].on_message, me, message)
            return True
        return send


class NamedInfo(Info):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id


@pytest.fixture
def pair() -> Iterator[tuple[asyncio.AbstractEventLoop, Wire]]:
    loop = asyncio.new_event_loop()
    wire = Wire(loop)
    for me in ("n1", "n2"):
        wire.relays[me] = Relay(Dispatcher(loop), NamedInfo(me), loop, wire.sender(me))
    yield loop, wire
    loop.close()


def run(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return loop.run_until_complete(asyncio.wait_for(coro, 10))


def test_a_call_runs_the_peers_handler_and_returns_its_result(pair: Any) -> None:
    loop, wire = pair

    async def view(arg: Any) -> dict[str, Any]:
        return {"nodeId": "n2", "arg": arg}

    wire.relays["n2"].serve_node_calls("dashboard.node", view)
    assert run(loop, wire.relays["n1"].ask_node("n2", "dashboard.node", [1, 2])) == {"nodeId": "n2", "arg": [1, 2]}


def test_an_unknown_call_and_a_failing_handler_are_the_callers_errors(pair: Any) -> None:
    loop, wire = pair

    async def broken(_: Any) -> None:
        raise ValueError("no such thing")

    wire.relays["n2"].serve_node_calls("broken", broken)
    for name, words in (("nothing", "unknown node call"), ("broken", "no such thing")):
        with pytest.raises(CommandError) as caught:
            run(loop, wire.relays["n1"].ask_node("n2", name))
        assert caught.value.code is ErrorCode.INTERNAL and words in str(caught.value)


def test_no_link_a_silent_peer_and_a_lost_link_end_the_call(pair: Any) -> None:
    loop, wire = pair
    asker = wire.relays["n1"]
    with pytest.raises(CommandError) as caught:
        run(loop, asker.ask_node("n9", "dashboard.node"))
    assert caught.value.code is ErrorCode.NO_LEADER
    gate = asyncio.Event()

    async def slow(_: Any) -> str:
        await gate.wait()
        return "late"

    wire.relays["n2"].serve_node_calls("slow", slow)
    with pytest.raises(CommandError) as caught:
        run(loop, asker.ask_node("n2", "slow", timeout_s=0.05))
    assert caught.value.code is ErrorCode.TIMEOUT

    async def lose_link_meanwhile() -> Any:
        call = loop.create_task(asker.ask_node("n2", "slow"))
        await asyncio.sleep(0)
        asker.peer_lost("n2")
        return await call

    with pytest.raises(CommandError) as caught:
        run(loop, lose_link_meanwhile())
    assert caught.value.code is ErrorCode.NO_LEADER
    gate.set()
    assert not asker._node_calls  # nothing left waiting


def test_calls_in_flight_are_bounded(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, wire = pair
    monkeypatch.setattr(relay_module, "NODE_CALLS_MAX", 2)
    gate = asyncio.Event()

    async def slow(_: Any) -> str:
        await gate.wait()
        return "done"

    wire.relays["n2"].serve_node_calls("slow", slow)
    asker = wire.relays["n1"]

    async def three() -> list[Any]:
        first = [loop.create_task(asker.ask_node("n2", "slow")) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(CommandError) as caught:
            await asker.ask_node("n2", "slow")
        assert caught.value.code is ErrorCode.OVERLOADED
        gate.set()
        return await asyncio.gather(*first)

    assert run(loop, three()) == ["done", "done"]


def test_a_message_from_a_peer_a_call_was_not_sent_to_is_ignored(pair: Any) -> None:
    loop, wire = pair
    asker = wire.relays["n1"]
    gate = asyncio.Event()

    async def slow(_: Any) -> str:
        await gate.wait()
        return "from n2"

    wire.relays["n2"].serve_node_calls("slow", slow)

    async def forged_answer_first() -> Any:
        call = loop.create_task(asker.ask_node("n2", "slow"))
        await asyncio.sleep(0)
        (nid,) = asker._node_calls
        asker.on_message("n3", ["m", nid, True, "forged"])  # another node answering n2's call
        gate.set()
        return await call

    assert run(loop, forged_answer_first()) == "from n2"
