"""One TCP connection to one node: pipelining, health checks, dead-link detection.

States: DISCONNECTED → CONNECTING → CONNECTED, and
RECONNECTING after a failure. The connect sequence is TCP connect (SO_KEEPALIVE,
TCP_NODELAY) → ``Hello`` (protocol v2 with pipelining, or v1 when pipelining is
off) → ``Auth`` (when a token is set) → ``Identify`` (when a session is set) →
replayed ``Subscribe`` frames → ping timer → ready.

Two independent signals declare a half-open link dead: ``max_ping_failures``
consecutive failed pings, and ``max_command_timeouts`` consecutive command
timeouts with no reply in between. Then the socket is torn down, every in-flight
command fails at once with :class:`ConnectionLost`, and a background task
reconnects with the backoff of :class:`RetryPolicy` (a caller that needs the
connection meanwhile waits for the next attempt, never past its own deadline).

In v2 at most ``options.in_flight_per_connection`` commands are on the wire at
once; excess commands wait locally for a slot. The ping bypasses that limit, and
the limit leaves one of the node's slots free, so a ping is never stuck behind
long-poll PULLs parked on the node.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.errors import ProtocolError as WireProtocolError

from .exceptions import (AuthError, ClientClosed, CommandError, CommandTimeout, ConnectionLost, ProtocolError,
                         ShoalError, error_from_reply)
from .options import ConnectionOptions

__all__ = ["ConnState", "Connection", "split_address"]

_LATENCY_WEIGHT = 0.2


class ConnState(str, enum.Enum):
    """The connection's states."""

    DISCONNECTED = "DISCONNECTED"
    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    RECONNECTING = "RECONNECTING"


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class _Protocol(asyncio.Protocol):
    """The asyncio side of one socket; hands whole frames to its :class:`Connection`."""

    def __init__(self, conn: "Connection") -> None:
        self.conn = conn
        self.decoder = FrameDecoder(requests=False)

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
            for frame in self.decoder:
                self.conn._on_frame(self, frame)
        except WireProtocolError as exc:
            error = ConnectionLost(f"connection to {self.conn.address} dropped: bad frame: {exc}")
            error.__cause__ = ProtocolError(str(exc))
            self.conn._lost(self, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._lost(self, ConnectionLost(f"connection to {self.conn.address} closed"
                                             + (f": {exc}" if exc else "")))


class Connection:
    """A pipelined connection to one node that heals itself; see the module docstring."""

    def __init__(self, address: str, options: ConnectionOptions, *, token: str | None = None,
                 session: str | None = None, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.options = options
        self.token = token
        self.session = session
        self.on_event = on_event
        self.state = ConnState.DISCONNECTED
        #: The last ``Hello`` reply (nodeId, protocolVersion, topology, session).
        self.hello: dict[str, Any] = {}
        #: Health: smoothed reply latency (s), error count, dead-link declarations.
        self.latency_s = 0.0
        self.errors = 0
        self.dead_links = 0
        self._replay: list[dict[str, Any]] = []  # Subscribe frames re-sent after every reconnect
        self._transport: Any = None
        self._protocol: _Protocol | None = None
        self._waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._slots = asyncio.Semaphore(options.in_flight_per_connection)
        self._connect_lock = asyncio.Lock()
        self._failures = 0
        self._next_attempt = 0.0
        self._timeouts = 0
        self._ping_task: asyncio.Task[None] | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._closed = False
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state.value} in_flight={len(self._waiters)}>"

    @property
    def connected(self) -> bool:
        return self.state is ConnState.CONNECTED

    @property
    def in_flight(self) -> int:
        """Commands sent and not yet answered."""
        return len(self._waiters)

    # --- connect --------------------------------------------------------------------------------

    async def ensure_connected(self, deadline: float | None = None) -> None:
        """Connect if needed (waiting out the reconnect backoff, but never past ``deadline``,
        a ``time.monotonic()`` value): raises :class:`ConnectionLost` when that fails."""
        if self._closed:
            raise ClientClosed("the connection is closed")
        if self.state is ConnState.CONNECTED:
            return
        wait = self._next_attempt - time.monotonic()
        if wait > 0:
            if deadline is not None:
                # A command does not wait out the backoff of a node that just failed: the
                # caller re-routes (a new leader is usually elected meanwhile), and the
                # background loop reconnects. Waiting here held writes for seconds after a
                # leader died (found by `shoal chaos run leader-kill`).
                raise ConnectionLost(f"{self.address} is down; next reconnect attempt in {wait:.2f}s")
            await asyncio.sleep(wait)  # the background reconnect loop, outside the lock
        async with self._connect_lock:
            if self.state is ConnState.CONNECTED:
                return
            if self._closed:
                raise ClientClosed("the connection is closed")
            self.state = ConnState.CONNECTING if self._failures == 0 else ConnState.RECONNECTING
            budget = self.options.connect_timeout
            if deadline is not None:
                budget = max(0.001, min(budget, deadline - time.monotonic()))
            try:
                async with asyncio.timeout(budget):  # not wait_for: it can lose a cancellation
                    await self._open()
            except AuthError:
                self._teardown(ConnectionLost("authentication failed"))
                self.state = ConnState.DISCONNECTED
                raise
            except (OSError, asyncio.TimeoutError, ShoalError) as exc:
                self._teardown(ConnectionLost(f"cannot connect to {self.address}: {exc}"))
                self._failures += 1
                self._next_attempt = time.monotonic() + self.options.reconnect.delay_s(self._failures - 1, self._rng)
                self.state = ConnState.RECONNECTING
                raise ConnectionLost(f"cannot connect to {self.address}: {exc or type(exc).__name__}") from exc
            self._failures = 0
            self.state = ConnState.CONNECTED

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(lambda: _Protocol(self), self.host, self.port,
                                                           ssl=self.options.ssl_context())
        self._transport, self._protocol = transport, protocol
        self._timeouts = 0
        timeout = self.options.connect_timeout
        hello: dict[str, Any] = {"cmd": "Hello", "protocolVersion": 2 if self.options.pipelining else 1}
        # "routing": this client sends each command to its partition's leader itself (the node
        # answers NOT_LEADER rather than forwarding it).
        hello["capabilities"] = ["pipelining", "routing"] if self.options.pipelining else ["routing"]
        self.hello = await self._request(hello, timeout)
        if self.token:
            # A node with tokens keeps its topology and our session id for the Auth reply.
            auth = await self._request({"cmd": "Auth", "token": self.token}, timeout)
            self.hello = {**self.hello, **{k: auth[k] for k in ("topology", "session") if k in auth}}
        if self.on_event is not None and isinstance(self.hello.get("topology"), dict):
            self.on_event({"event": "topology", "topology": self.hello["topology"]})
        if self.session:
            await self._request({"cmd": "Identify", "session": self.session}, timeout)
        for frame in list(self._replay):
            await self._request(frame, timeout)
        if self.options.ping_interval > 0:
            self._ping_task = loop.create_task(self._ping_loop(protocol))

    def _schedule_reconnect(self) -> None:
        """After a loss: reconnect in the background (with backoff) so the next caller finds a link."""
        if self._closed or (self._reconnect_task is not None and not self._reconnect_task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._reconnect_task = loop.create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        while not self._closed and self.state is not ConnState.CONNECTED:
            try:
                await self.ensure_connected()
            except AuthError:
                return
            except (ShoalError, OSError):
                continue
            except asyncio.CancelledError:
                return

    # --- commands -------------------------------------------------------------------------------

    async def call(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``frame`` and return its ``ok`` reply within ``timeout_s`` (connecting first if
        needed); raise the typed error otherwise."""
        deadline = time.monotonic() + timeout_s
        await self.ensure_connected(deadline)
        async with self._slots:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"{frame.get('cmd')} to {self.address}: no free slot within {timeout_s:.1f}s")
            if self.state is not ConnState.CONNECTED:
                await self.ensure_connected(deadline)
            return await self._request(frame, deadline - time.monotonic())

    def subscribe(self, frame: dict[str, Any]) -> None:
        """Remember ``frame`` (a ``Subscribe``) to send again after every reconnect."""
        if frame not in self._replay:
            self._replay.append(frame)

    async def _request(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        transport = self._transport
        if transport is None:
            raise ConnectionLost(f"not connected to {self.address}")
        req_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[req_id] = fut
        started = time.monotonic()
        try:
            transport.write(encode({**frame, "reqId": req_id}))
        except WireProtocolError as exc:  # e.g. a frame over the maximum size: nothing was sent
            self._waiters.pop(req_id, None)
            raise CommandError(f"{frame.get('cmd')}: {exc}", exc.code.value) from exc
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns a reply that came in the
            # iteration its task was cancelled, and the cancellation is lost.
            async with asyncio.timeout(max(timeout_s, 0.001)):
                reply = await fut
        except TimeoutError:
            self._waiters.pop(req_id, None)
            self._timeouts += 1
            self.errors += 1
            limit = self.options.max_command_timeouts
            if limit and self._timeouts >= limit and self._transport is transport:
                self.force_reconnect(f"{self._timeouts} consecutive command timeouts")
            raise CommandTimeout(f"{frame.get('cmd')} to {self.address}: no reply within {timeout_s:.1f}s") from None
        finally:
            self._waiters.pop(req_id, None)
        # Any reply, even an error, proves the link is alive.
        self._timeouts = 0
        elapsed = time.monotonic() - started
        self.latency_s = elapsed if not self.latency_s else \
            (1 - _LATENCY_WEIGHT) * self.latency_s + _LATENCY_WEIGHT * elapsed
        if not reply.get("ok"):
            self.errors += 1
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
            except CommandError:
                failures = 0  # an error reply still proves the link is alive
            except (CommandTimeout, ConnectionLost):
                if self._protocol is not protocol:
                    return
                failures += 1
                if self.options.max_ping_failures and failures >= self.options.max_ping_failures:
                    self.force_reconnect(f"{failures} consecutive failed pings")
                    return

    def force_reconnect(self, reason: str) -> None:
        """Declare the link dead: close it, fail every in-flight command now, reconnect in the background."""
        if self._closed:
            return
        self.dead_links += 1
        self._teardown(ConnectionLost(f"link to {self.address} declared dead: {reason}"))
        self.state = ConnState.RECONNECTING
        self._failures = max(self._failures, 1)
        self._next_attempt = time.monotonic() + self.options.reconnect.delay_s(0, self._rng)
        self._schedule_reconnect()

    def _lost(self, protocol: _Protocol, error: Exception) -> None:
        if protocol is not self._protocol:
            return
        self._teardown(error)
        if self._closed:
            self.state = ConnState.DISCONNECTED
            return
        was_connected = self.state is ConnState.CONNECTED
        self.state = ConnState.RECONNECTING
        if was_connected:
            self._schedule_reconnect()

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
        """Close for good: in-flight commands fail with :class:`ConnectionLost`."""
        self._closed = True
        if self._reconnect_task is not None and self._reconnect_task is not asyncio.current_task():
            self._reconnect_task.cancel()
        self._teardown(ConnectionLost("connection closed by the client"))
        self.state = ConnState.DISCONNECTED
