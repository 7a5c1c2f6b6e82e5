"""Forwarding HTTP requests to the leader of their partition.

A follower does not answer with a redirect because HTTP clients drop ``Authorization`` when
they follow a redirect to another origin (another port is another origin): with auth on, a
307 would turn into a 401 at the leader. So the follower repeats the request to the leader
with the same method, path, query, body and ``Authorization``, and relays the answer; streams
(``/events``, ``/work``) are relayed chunk by chunk. When the client goes away the relay is
cancelled (aiohttp handler cancellation) and closes its upstream connection, so the leader
sees the disconnect too -- a ``/work`` stream's leases are released just the same.

A forwarded request carries ``X-Shoal-Forwarded-By``; a node that receives one and does not
lead the partition either (leadership moved in between) answers 503 ``NOT_LEADER`` with
``Retry-After`` instead of forwarding again, so a request never loops.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from .util import STATUS_BY_CODE, json_response

if TYPE_CHECKING:
    from ..view import NodeView

__all__ = ["Forwarder", "FORWARDED_HEADER", "LEADER_HEADER"]

FORWARDED_HEADER = "X-Shoal-Forwarded-By"
LEADER_HEADER = "X-Shoal-Leader"
CONNECT_TIMEOUT_S = 2.0
#: Response headers worth relaying (hop-by-hop ones and lengths are aiohttp's business).
_RELAYED = ("Content-Type", "Retry-After", "Cache-Control", "X-Accel-Buffering")


class Forwarder:
    """Relays requests to other nodes' HTTP ports over one pooled client session."""

    def __init__(self, node: "NodeView") -> None:
        self.node = node
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None  # peers speak HTTPS when this node does

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            tls = self.node.config.tls
            self._ssl = tls.client_context() if tls else None
            # No total timeout: a forwarded long poll or stream lasts as long as its client wants
            # (the client's disconnect cancels it); only connecting is bounded.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl or False), auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(self, request: web.Request, reply: dict[str, Any]) -> web.StreamResponse:
        """Repeat ``request`` at the leader named in the NOT_LEADER ``reply``; relay its answer."""
        leader = reply.get("leader") if isinstance(reply.get("leader"), dict) else {}
        info = self.node.topology.nodes.get(str(leader.get("nodeId", "")))
        if info is None or not info.http_port or FORWARDED_HEADER in request.headers \
                or info.id == self.node.node_id:
            return json_response(reply, STATUS_BY_CODE["NOT_LEADER"])
        host = f"[{info.host}]" if ":" in info.host else info.host
        session = self.session()
        url = f"{'https' if self._ssl else 'http'}://{host}:{info.http_port}{request.path_qs}"
        headers = {FORWARDED_HEADER: self.node.node_id}
        for name in ("Authorization", "Content-Type", "Accept", "Last-Event-ID"):
            if name in request.headers:
                headers[name] = request.headers[name]
        body = await request.read() or None  # cached by aiohttp if the handler read it already
        self.node.metrics.http_forwarded += 1
        try:
            upstream = await session.request(request.method, url, data=body, headers=headers,
                                                    allow_redirects=False)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            return json_response({**reply, "error": f"{reply.get('error')}; forwarding to {info.id} "
                                  f"failed: {type(exc).__name__}"}, STATUS_BY_CODE["NOT_LEADER"])
        async with upstream:
            out_headers = {k: upstream.headers[k] for k in _RELAYED if k in upstream.headers}
            out_headers[LEADER_HEADER] = info.id
            if upstream.content_type != "text/event-stream":
                return web.Response(status=upstream.status, body=await upstream.read(), headers=out_headers)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):
                pass  # either side went away: the stream ends, the client reconnects
            return response
