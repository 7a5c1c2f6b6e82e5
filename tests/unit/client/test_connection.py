"""Protocol-level edge cases of one connection, against a tiny in-test server.

The server here only speaks enough of the wire protocol to script what a real
node cannot be made to do on cue (stop answering while the socket stays up,
answer out of order, refuse connections). Behaviour against real nodes is in
tests/integration/test_client_*.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from shoal.client import AsyncClient, ConnectionLost, ConnectionOptions, ConnState, RetryPolicy
from shoal.client._connection import Connection
from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.config import ClusterConfig, NodeSpec

from waiting import eventually_async

Reply = Callable[[dict[str, Any]], "dict[str, Any] | None"]


class ScriptedNode:
    """Answers Hello/Identify/Ping/Auth; ``mute`` stops all replies (a half-open link);
    ``handler`` may answer other commands (``None`` = never answer)."""

    def __init__(self, handler: Reply | None = None) -> None:
        self.handler = handler
        self.mute = False
        self.frames: list[dict[str, Any]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        cfg = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1", 1),), partitions=2)
        self.topology = cfg.initial_topology().with_leader(0, "n1", 1).with_leader(1, "n1", 1)

    async def start(self) -> "ScriptedNode":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        self.topology = self.topology.__class__(self.topology.cluster_id, 2,
                                                {"n1": self.topology.nodes["n1"].__class__("n1", "127.0.0.1",
                                                                                           self.port)},
                                                self.topology.partition_map, 1)
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        decoder = FrameDecoder(requests=False)
        try:
            while data := await reader.read(65536):
                decoder.feed(data)
                for frame in decoder:
                    self.frames.append(frame)
                    if self.mute:
                        continue
                    reply = self._reply(frame)
                    if reply is not None:
                        writer.write(encode({**reply, "reqId": frame["reqId"]}))
        except (ConnectionError, OSError):
            pass

    def _reply(self, frame: dict[str, Any]) -> dict[str, Any] | None:
        cmd = frame["cmd"]
        if cmd == "Hello":
            return {"ok": True, "protocolVersion": min(2, frame["protocolVersion"]), "nodeId": "n1",
                    "clusterId": "c", "topology": self.topology.to_wire(), "capabilities": []}
        if cmd in ("Ping", "Auth"):
            return {"ok": True, "pong": True}
        if cmd == "Identify":
            return {"ok": True, "session": frame.get("session")}
        return self.handler(frame) if self.handler else None

    def push(self, frame: dict[str, Any]) -> None:
        for w in self.writers:
            if not w.is_closing():
                w.write(encode(frame))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_failed_pings_reject_in_flight_commands_at_once() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()
        opts = ConnectionOptions(ping_interval=0.1, max_ping_failures=2, command_timeout=30,
                                 reconnect=RetryPolicy(base_s=5.0, max_s=5.0))
        conn = Connection(node.address, opts)
        await conn.ensure_connected()
        node.mute = True  # the socket stays up; nothing answers
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost, match="2 consecutive failed pings"):
            await conn.call({"cmd": "PULL", "queue": "q", "timeout": 20_000}, 30.0)
        assert time.monotonic() - t0 < 2.0
        assert conn.state is ConnState.RECONNECTING and conn.dead_links == 1
        await conn.close()
        await node.stop()
    run(main())


def test_consecutive_command_timeouts_declare_the_link_dead() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()  # answers Hello/Ping, never anything else
        opts = ConnectionOptions(ping_interval=0, max_command_timeouts=3,
                                 reconnect=RetryPolicy(base_s=5.0, max_s=5.0))
        conn = Connection(node.address, opts)
        await conn.ensure_connected()
        slow = asyncio.ensure_future(conn.call({"cmd": "PULL", "queue": "q", "timeout": 9000}, 30.0))
        await eventually_async(lambda: conn.in_flight == 1, "the long poll sent", 2, poll_s=0.001)
        for _ in range(3):
            with pytest.raises(Exception) as info:
                await conn.call({"cmd": "GetJob", "id": "0-1"}, 0.1)
            assert type(info.value).__name__ == "CommandTimeout"
        assert conn.state is ConnState.RECONNECTING
        with pytest.raises(ConnectionLost):  # the slow one was in flight: rejected at once
            await slow
        await conn.close()
        await node.stop()
    run(main())


def test_a_reply_resets_the_timeout_count() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()
        conn = Connection(node.address, ConnectionOptions(ping_interval=0, max_command_timeouts=2))
        await conn.ensure_connected()
        for _ in range(3):
            with pytest.raises(Exception):
                await conn.call({"cmd": "GetJob", "id": "0-1"}, 0.05)
            await conn.call({"cmd": "Ping"}, 1.0)
        assert conn.state is ConnState.CONNECTED and conn.dead_links == 0
        await conn.close()
        await node.stop()
    run(main())


def test_replies_out_of_order_are_matched_by_req_id() -> None:
    async def main() -> None:
        held: list[dict[str, Any]] = []

        def handler(frame: dict[str, Any]) -> dict[str, Any] | None:
            held.append(frame)
            if len(held) < 3:
                return None
            for f in reversed(held):  # answer all three, newest first
                node.push({"ok": True, "reqId": f["reqId"], "id": f["id"]})
            return None

        node = await ScriptedNode(handler).start()
        conn = Connection(node.address, ConnectionOptions(ping_interval=0))
        replies = await asyncio.gather(*(conn.call({"cmd": "GetJob", "id": f"0-{i}"}, 5.0) for i in range(3)))
        assert [r["id"] for r in replies] == ["0-0", "0-1", "0-2"]
        await conn.close()
        await node.stop()
    run(main())


def test_v1_mode_says_hello_v1_and_sends_one_command_at_a_time() -> None:
    async def main() -> None:
        in_flight = 0
        peak = 0

        def handler(frame: dict[str, Any]) -> dict[str, Any] | None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)

            def answer() -> None:
                nonlocal in_flight
                in_flight -= 1
                node.push({"ok": True, "reqId": frame["reqId"]})
            asyncio.get_running_loop().call_later(0.01, answer)
            return None

        node = await ScriptedNode(handler).start()
        conn = Connection(node.address, ConnectionOptions(pipelining=False, ping_interval=0))
        await asyncio.gather(*(conn.call({"cmd": "GetJob", "id": f"0-{i}"}, 5.0) for i in range(10)))
        hello = next(f for f in node.frames if f["cmd"] == "Hello")
        assert hello["protocolVersion"] == 1 and hello["capabilities"] == ["routing"]
        assert peak == 1
        await conn.close()
        await node.stop()
    run(main())


def test_in_flight_is_capped_locally_below_the_nodes_limit() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()  # never answers GetJob
        conn = Connection(node.address, ConnectionOptions(ping_interval=0, max_command_timeouts=0))
        calls = [asyncio.ensure_future(conn.call({"cmd": "GetJob", "id": f"0-{i}"}, 0.5)) for i in range(130)]
        # the 100th node slot stays free for pings
        await eventually_async(lambda: conn.in_flight == 99, "99 commands in flight", 2, poll_s=0.01)
        await asyncio.sleep(0.05)
        assert conn.in_flight == 99  # and no more
        await asyncio.gather(*calls, return_exceptions=True)
        await conn.close()
        await node.stop()
    run(main())


def test_connect_sequence_and_reconnect_with_session_after_the_node_drops_the_link() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()
        opts = ConnectionOptions(ping_interval=0, reconnect=RetryPolicy(base_s=0.05, max_s=0.2))
        conn = Connection(node.address, opts, token="t0k", session="worker-1")
        await conn.ensure_connected()
        assert [f["cmd"] for f in node.frames] == ["Hello", "Auth", "Identify"]
        for w in node.writers:
            w.transport.abort()  # the node drops the connection
        # reconnected in the background, nobody called
        await eventually_async(lambda: node.connections >= 2 and conn.state is ConnState.CONNECTED,
                               "the connection made again in the background", 5, poll_s=0.02)
        identifies = [f for f in node.frames if f["cmd"] == "Identify"]
        assert [f["session"] for f in identifies] == ["worker-1", "worker-1"]
        await conn.close()
        await node.stop()
    run(main())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reconnect_attempts_back_off_and_respect_the_callers_deadline() -> None:
    async def main() -> None:
        opts = ConnectionOptions(ping_interval=0, reconnect=RetryPolicy(base_s=0.2, factor=2.0, max_s=1.0,
                                                                        jitter=0.0))
        conn = Connection(f"127.0.0.1:{_closed_port()}", opts)
        t0 = time.monotonic()
        with pytest.raises(ConnectionLost):
            await conn.ensure_connected()
        assert conn.state is ConnState.RECONNECTING
        with pytest.raises(ConnectionLost, match="next reconnect attempt"):  # 0.2 s away, deadline 0.05 s
            await conn.ensure_connected(time.monotonic() + 0.05)
        with pytest.raises(ConnectionLost):
            await conn.ensure_connected()  # waits the 0.2 s backoff, fails again
        with pytest.raises(ConnectionLost):
            await conn.ensure_connected()  # waits 0.4 s
        assert 0.55 <= time.monotonic() - t0 < 2.0
        await conn.close()
    run(main())


def test_a_topology_event_updates_the_clients_routing_at_once() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()
        opts = ConnectionOptions(ping_interval=0, topology_refresh=0)
        async with AsyncClient([node.address], options=opts, session="s") as client:
            await client.ping()
            assert client.topology is not None and client.topology.partition_map[1].term == 1
            node.push({"event": "topology", "topology": node.topology.with_leader(1, "n1", 42).to_wire()})
            await eventually_async(lambda: client.topology.partition_map[1].term == 42,
                                   "the pushed topology adopted", 2, poll_s=0.01)
        await node.stop()
    run(main())


def test_clients_on_one_loop_share_reference_counted_pools() -> None:
    async def main() -> None:
        node = await ScriptedNode().start()
        opts = ConnectionOptions(ping_interval=0, topology_refresh=0)
        a = await AsyncClient([node.address], options=opts, session="s").connect()
        b = await AsyncClient([node.address], options=opts, session="s").connect()
        assert a._pool(node.address) is b._pool(node.address) and a._pool(node.address).refs == 2
        await a.close()
        assert (await b.ping())["pong"]
        pool = b._pool(node.address)
        await b.close()
        assert pool.refs == 0 and all(c.state is ConnState.DISCONNECTED for c in pool.connections)
        await node.stop()
    run(main())


def test_a_call_cancelled_in_the_iteration_its_reply_arrives_stays_cancelled() -> None:
    """A stop that cancels a worker's task must stop it, even when the reply came just then."""
    async def main() -> None:
        node = await ScriptedNode().start()  # never answers the PULL: the test hands its reply in
        conn = Connection(node.address, ConnectionOptions(ping_interval=0))
        await conn.ensure_connected()
        task = asyncio.ensure_future(conn.call({"cmd": "PULL", "queue": "q", "timeout": 9000}, 30.0))
        await eventually_async(lambda: conn._waiters, "the PULL waiting for its reply", 2, poll_s=0.001)
        req_id = next(iter(conn._waiters))
        conn._on_frame(conn._protocol, {"ok": True, "job": None, "reqId": req_id})  # the reply comes in
        task.cancel()  # and in the same iteration its caller is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.close()
        await node.stop()
    run(main())
