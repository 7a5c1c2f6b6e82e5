"""One TCP connection to one node: pipelining, health checks, dead-link detection.

States follow seed 001: DISCONNECTED → CONNECTING → CONNECTED, and
RECONNECTING after a failure. The connect sequence is TCP connect → Hello →
Auth (when a token is set) → Identify (when a session is set) → ping timer →
ready. Two independent signals declare a half-open link dead: ``max_ping_failures``
consecutive failed pings, and ``max_command_timeouts`` consecutive command
timeouts with no success in between. Then the socket is torn down, every
in-flight command fails at once with :class:`ConnectionLost`, and the next
call reconnects after the backoff of :class:`RetryPolicy`.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import random
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.errors import ProtocolError as WireProtocolError

from .exceptions import AuthError, ClientClosed, CommandTimeout, ConnectionLost, ProtocolError, error_from_reply
from .options import ConnectionOptions

__all__ = ["ConnState", "Connection"]


class ConnState(str, enum.Enum):
    DISCONNECTED = "DISCONNECTED"
    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    RECONNECTING = "RECONNECTING"


class _Protocol(asyncio.Protocol):
    def __init__(self, conn: "Connection") -> None:
        self.conn = conn
        self.decoder = FrameDecoder(requests=False)

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
            for frame in self.decoder:
                self.conn._on_frame(self, frame)
        except WireProtocolError as exc:
            self.conn._lost(self, ProtocolError(f"bad frame from {self.conn.address}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._lost(self, ConnectionLost(f"connection to {self.conn.address} closed"
                                             + (f": {exc}" if exc else "")))


class Connection:
    """A pipelined connection that heals itself; see the module docstring."""

    def __init__(self, address: str, options: ConnectionOptions, *, token: str | None = None,
                 session: str | None = None, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.host, self.port = host.strip("[]"), int(port)
        self.options = options
        self.token = token
        self.session = session
        self.on_event = on_event
        self.state = ConnState.DISCONNECTED
        self.hello: dict[str, Any] = {}
        self._transport: Any = None
        self._protocol: _Protocol | None = None
        self._waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._slots = asyncio.Semaphore(options.max_in_flight if options.pipelining else 1)
        self._connect_lock = asyncio.Lock()
        self._failures = 0
        self._next_attempt = 0.0
        self._timeouts = 0
        self._ping_task: asyncio.Task[None] | None = None
        self._closed = False
        self._rng = random.Random()

    @property
    def connected(self) -> bool:
        return self.state is ConnState.CONNECTED

    # --- connect --------------------------------------------------------------------------------

    async def ensure_connected(self) -> None:
        if self._closed:
            raise ClientClosed("the connection is closed")
        if self.state is ConnState.CONNECTED:
            return
        async with self._connect_lock:
            if self.state is ConnState.CONNECTED:
                return
            wait = self._next_attempt - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self.state = ConnState.CONNECTING if self._failures == 0 else ConnState.RECONNECTING
            try:
                await asyncio.wait_for(self._open(), self.options.connect_timeout)
            except AuthError:
                self._teardown(ConnectionLost("authentication failed"))
                raise
            except (OSError, asyncio.TimeoutError, ConnectionLost, ProtocolError, CommandTimeout) as exc:
                self._teardown(ConnectionLost(f"cannot connect to {self.address}: {exc}"))
                self._failures += 1
                self._next_attempt = time.monotonic() + self.options.reconnect.delay_s(self._failures - 1, self._rng)
                self.state = ConnState.RECONNECTING
                raise ConnectionLost(f"cannot connect to {self.address}: {exc}") from exc
            self._failures = 0
            self.state = ConnState.CONNECTED

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        ctx = ssl.create_default_context() if self.options.tls else None
        transport, protocol = await loop.create_connection(lambda: _Protocol(self), self.host, self.port, ssl=ctx)
        self._transport, self._protocol = transport, protocol
        self._timeouts = 0
        if self.options.pipelining:
            self.hello = await self._request({"cmd": "Hello", "protocolVersion": 2, "capabilities": ["pipelining"]},
                                             self.options.connect_timeout)
        if self.token:
            await self._request({"cmd": "Auth", "token": self.token}, self.options.connect_timeout)
        if self.session:
            await self._request({"cmd": "Identify", "session": self.session}, self.options.connect_timeout)
        if self.options.ping_interval > 0:
            self._ping_task = loop.create_task(self._ping_loop(protocol))

    # --- commands -------------------------------------------------------------------------------

    async def call(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``frame`` and return the ``ok`` reply; raise the typed error otherwise."""
        await self.ensure_connected()
        async with self._slots:
            return await self._request(frame, timeout_s)

    async def _request(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._transport is None:
            raise ConnectionLost(f"not connected to {self.address}")
        req_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[req_id] = fut
        try:
            self._transport.write(encode({**frame, "reqId": req_id}))
            reply = await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            self._waiters.pop(req_id, None)
            self._timeouts += 1
            limit = self.options.max_command_timeouts
            if limit and self._timeouts >= limit:
                self.force_reconnect(f"{self._timeouts} consecutive command timeouts")
            raise CommandTimeout(f"{frame.get('cmd')} to {self.address}: no reply within {timeout_s:.1f}s") from None
        except WireProtocolError as exc:
            self._waiters.pop(req_id, None)
            raise ProtocolError(str(exc)) from exc
        self._timeouts = 0
        if not reply.get("ok"):
            raise error_from_reply(reply)
        return reply

    def _on_frame(self, protocol: _Protocol, frame: dict[str, Any]) -> None:
        if protocol is not self._protocol:
            return
        req_id = frame.get("reqId")
        if req_id is None:
            if self.on_event is not None and "event" in frame:
                self.on_event(frame)
            return
        fut = self._waiters.pop(req_id, None)
        if fut is not None and not fut.done():
            fut.set_result(frame)

    # --- health ---------------------------------------------------------------------------------

    async def _ping_loop(self, protocol: _Protocol) -> None:
        failures = 0
        interval = self.options.ping_interval
        while self._protocol is protocol:
            await asyncio.sleep(interval)
            if self._protocol is not protocol:
                return
            try:
                await self._request({"cmd": "Ping"}, min(interval, self.options.command_timeout))
                failures = 0
            except (CommandTimeout, ConnectionLost, ProtocolError):
                failures += 1
                if self.options.max_ping_failures and failures >= self.options.max_ping_failures:
                    self.force_reconnect(f"{failures} consecutive failed pings")
                    return
            except Exception:  # an error reply still proves the link is alive
                failures = 0

    def force_reconnect(self, reason: str) -> None:
        """Declare the link dead: close it and fail every in-flight command now."""
        self._teardown(ConnectionLost(f"link to {self.address} declared dead: {reason}"))
        self.state = ConnState.RECONNECTING

    def _lost(self, protocol: _Protocol, error: Exception) -> None:
        if protocol is self._protocol:
            self._teardown(error)
            self.state = ConnState.DISCONNECTED if self._closed else ConnState.RECONNECTING

    def _teardown(self, error: Exception) -> None:
        transport, self._transport, self._protocol = self._transport, None, None
        if transport is not None:
            transport.abort()
        if self._ping_task is not None and self._ping_task is not asyncio.current_task():
            self._ping_task.cancel()
        self._ping_task = None
        waiters, self._waiters = self._waiters, {}
        for fut in waiters.values():
            if not fut.done():
                fut.set_exception(error)

    async def close(self) -> None:
        self._closed = True
        self._teardown(ConnectionLost("connection closed by the client"))
        self.state = ConnState.DISCONNECTED
