"""Limits of the HTTP port that aiohttp has no setting for: a connection cap and a header deadline.

aiohttp already bounds the request line and header sizes (``max_line_size``,
``max_field_size``, ``max_headers``), the body (``client_max_size``) and idle keep-alive
connections (``keepalive_timeout``, which also closes a connection that never sends a
request). Two things it leaves open are added here, at the asyncio protocol level, by
wrapping each connection's aiohttp protocol:

- ``limits.http_connections_max``: a connection beyond it is answered ``503`` with the JSON
  error ``OVERLOADED`` and ``Connection: close``, and never reaches aiohttp;
- ``limits.http_header_timeout_ms``: a request line and headers must arrive whole within
  this long of their first byte (a slow-header "slowloris" client is answered ``408``
  ``TIMEOUT`` and closed), whatever the keep-alive timeout.

Refusals are counted in ``shoal_http_refusals{reason}``; open connections in
``shoal_http_connections``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from shoal.cluster.guard import NodeLimits

    from ..metrics import NodeMetrics

__all__ = ["HttpGuard", "GuardedSite", "LINGER_S", "LINGERING_MAX"]

#: How long a refused connection may still send (discarded) before it is closed: closing a socket
#: with unread input resets it, and the reset can destroy the 503 before the client reads it.
LINGER_S = 1.0
#: Refused connections lingering at once; past this they are closed at once (a flood must not
#: hold file descriptors through the linger).
LINGERING_MAX = 64


def _response(status: str, code: str, message: str, retry_after_s: int | None = None) -> bytes:
    body = json.dumps({"ok": False, "code": code, "error": message}).encode()
    retry = f"Retry-After: {retry_after_s}\r\n" if retry_after_s is not None else ""
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n")
    return head.encode() + body


class _Guarded(asyncio.Protocol):
    """One HTTP connection: forwards to aiohttp's protocol, or refuses and lingers."""

    __slots__ = ("guard", "inner", "loop", "transport", "refused", "awaiting_headers", "deadline", "timer")

    def __init__(self, guard: "HttpGuard", inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.refused = False
        # True between requests: the next byte starts the header deadline.
        self.awaiting_headers = True
        self.deadline: float | None = None  # of the request whose headers are arriving
        # At most one timer per connection, rescheduled when it fires early rather than made and
        # cancelled for every request of a keep-alive connection.
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.guard.admit(self):
            self.refused = True
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # lingering: read and dropped
        if self.awaiting_headers and self.deadline is None:
            self.deadline = self.loop.time() + self.guard.header_timeout_s
            if self.timer is None:
                self.timer = self.loop.call_at(self.deadline, self._header_timeout)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.refused:
            return None  # closes the transport
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.refused:
            self.guard.lingering.discard(self)
            return
        self.guard.release(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    def headers_received(self) -> None:
        """A request's headers are in: its deadline no longer applies."""
        self.awaiting_headers = False
        self.deadline = None

    def request_done(self) -> None:
        """The request's handler returned: the next byte starts the next request's deadline."""
        self.awaiting_headers = True

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _header_timeout(self) -> None:
        self.timer = None
        transport = self.transport
        if transport is None or transport.is_closing() or self.deadline is None:
            return  # no request's headers pending: the next one's first byte schedules a timer
        if self.loop.time() < self.deadline:  # set for an earlier request: wait for this one's
            self.timer = self.loop.call_at(self.deadline, self._header_timeout)
            return
        self.guard.metrics.http_refusals["header_timeout"] += 1
        transport.write(_response("408 Request Timeout", "TIMEOUT", "the request line and headers did not "
                                  f"arrive within {self.guard.header_timeout_s:g} s "
                                  "(limits.http_header_timeout_ms)"))
        transport.close()


class HttpGuard:
    """The HTTP port's connection cap and header deadline (see the module docstring)."""

    def __init__(self, limits: "NodeLimits", metrics: "NodeMetrics") -> None:
        self.connections_max = limits.http_connections_max
        self.header_timeout_s = limits.http_header_timeout_ms / 1000
        self.metrics = metrics
        self.open: dict[asyncio.BaseTransport, _Guarded] = {}
        self.lingering: set[_Guarded] = set()

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` that wraps ``inner``'s protocols."""
        return lambda: _Guarded(self, inner())

    def admit(self, conn: _Guarded) -> bool:
        """Count ``conn`` in, or answer it 503 and let it linger briefly before closing."""
        transport = conn.transport
        assert transport is not None
        if len(self.open) < self.connections_max:
            self.open[transport] = conn
            self.metrics.http_connections = len(self.open)
            return True
        self.metrics.http_refusals["connections_max"] += 1
        transport.write(_response("503 Service Unavailable", "OVERLOADED",
                                  f"this node already has {len(self.open)} HTTP connections "
                                  f"(limits.http_connections_max = {self.connections_max})", retry_after_s=1))
        if len(self.lingering) >= LINGERING_MAX or not transport.can_write_eof():
            transport.close()
            return False
        transport.write_eof()
        self.lingering.add(conn)
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        return False

    def release(self, conn: _Guarded) -> None:
        if conn.transport is not None:
            self.open.pop(conn.transport, None)
        self.metrics.http_connections = len(self.open)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Tell the request's connection that its headers are in, and when its handler is done."""
        conn = self.open.get(request.transport) if request.transport is not None else None
        if conn is not None:
            conn.headers_received()
        try:
            return await handler(request)
        finally:
            if conn is not None:
                conn.request_done()


class GuardedSite(web.BaseSite):
    """A TCP site like :class:`aiohttp.web.TCPSite` whose connections pass through an :class:`HttpGuard`."""

    __slots__ = ("_host", "_port", "_guard", "_handshake_timeout_s")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: HttpGuard, *,
                 ssl_context: Any = None, backlog: int = 128) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard
        # A TLS handshake is part of getting the headers in: the same deadline holds it.
        self._handshake_timeout_s = guard.header_timeout_s

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = ({"ssl": self._ssl_context, "ssl_handshake_timeout": self._handshake_timeout_s}
                               if self._ssl_context else {})
        self._server = await loop.create_server(self._guard.protocol_factory(server), self._host, self._port,
                                                backlog=self._backlog, reuse_address=True, **tls)
