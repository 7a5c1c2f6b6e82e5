"""The node's HTTP port (aiohttp): health, metrics, REST jobs, SSE events, WebSocket, push workers.

Every job command runs through the binary protocol's dispatcher via an
:class:`~shoal.node.http_conn.HttpConnection`, so validation, routing, group
commit and sessions are the same. A request for a partition this node does not
lead is **redirected (307)** to the leader's HTTP port (the ``Location`` keeps
path and query), so clients need no cluster map. Job data and results are JSON
over HTTP; the node converts them to MessagePack once at this edge.

Auth: when the node has tokens, every endpoint but ``/healthz`` and ``/ready``
needs ``Authorization: Bearer <token>`` (compared in constant time).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from shoal.cluster.codec import Raw, raw_of, unraw

from .http_conn import HttpConnection

if TYPE_CHECKING:
    from .server import Node

__all__ = ["start_http", "build_app", "STATUS_BY_CODE"]

STATUS_BY_CODE = {
    "INVALID": 400, "UNKNOWN_COMMAND": 400, "PROTOCOL_ERROR": 400, "FRAME_TOO_LARGE": 413,
    "AUTH_REQUIRED": 401, "AUTH_FAILED": 403, "NOT_FOUND": 404, "LEASE_MISMATCH": 409, "INVALID_STATE": 409,
    "QUEUE_FULL": 429, "PAUSED": 409, "OVERLOADED": 503, "NO_LEADER": 503, "SHUTTING_DOWN": 503,
    "TIMEOUT": 504, "INTERNAL": 500,
}
OPEN_PATHS = frozenset({"/healthz", "/ready"})
WORK_MAX = 1_000
_OPENAPI = Path(__file__).with_name("openapi.yaml")


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$base64": base64.b64encode(value).decode()}
    if isinstance(value, Raw):
        return unraw(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(unraw(body), status=status, headers=headers,
                             dumps=lambda v: json.dumps(v, default=_json_default))


def _error(code: str, message: str, status: int | None = None) -> web.Response:
    return _json({"ok": False, "error": message, "code": code}, status or STATUS_BY_CODE.get(code, 500))


class HttpApi:
    """Handlers bound to one node."""

    def __init__(self, node: "Node") -> None:
        self.node = node
        self.tokens = [t.encode() for t in node.config.tokens]
        self.started = time.time()
        self.streams: dict[str, asyncio.Event] = {}  # token -> its /work stream's wake-up

    # --- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.tokens and request.path not in OPEN_PATHS:
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                return _error("AUTH_REQUIRED", "send Authorization: Bearer <token>")
            given = header[7:].encode()
            matched = False
            for token in self.tokens:  # every token, so timing does not tell which matched
                matched |= hmac.compare_digest(given, token)
            if not matched:
                return _error("AUTH_FAILED", "invalid token")
        return await handler(request)

    async def run(self, request: web.Request, frame: dict[str, Any]) -> web.Response:
        """Run a command; redirect to the leader on NOT_LEADER; map errors to statuses."""
        conn = HttpConnection(self.node.dispatcher)
        try:
            reply = await conn.call(frame)
        finally:
            conn.close(keep_leases=True)
        return self.respond(request, reply)

    def respond(self, request: web.Request, reply: dict[str, Any]) -> web.Response:
        if reply.get("ok"):
            reply.pop("reqId", None)
            return _json(reply)
        if reply.get("code") == "NOT_LEADER" and reply.get("leader"):
            node = self.node.topology.nodes.get(reply["leader"]["nodeId"])
            if node is not None and node.http_port:
                location = f"http://{node.host}:{node.http_port}{request.path_qs}"
                return web.Response(status=307, headers={"Location": location})
        reply.pop("reqId", None)
        return _json(reply, STATUS_BY_CODE.get(str(reply.get("code")), 500))

    @staticmethod
    async def body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise web.HTTPBadRequest(text=json.dumps({"ok": False, "code": "INVALID",
                                                      "error": f"body: not JSON ({exc})"}),
                                     content_type="application/json") from exc
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text=json.dumps({"ok": False, "code": "INVALID",
                                                      "error": "body: must be a JSON object"}),
                                     content_type="application/json")
        return body

    # --- health, metrics ----------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        return _json({"ok": True})

    async def ready(self, _: web.Request) -> web.Response:
        node = self.node
        # A follower cut off from every peer never starts an election and keeps naming its old
        # leader, so "has a leader" also needs a connected majority (pysyncobj's hasQuorum).
        missing = [p.id for p in node.topology.partition_map if p.id in node.replicas
                   and (p.leader is None or not node.replicas[p.id].hasQuorum)]
        lagging = [p for p, r in node.replicas.items() if r.raftCommitIndex > r.raftLastApplied]
        ok = not missing and not lagging and not node.stopping
        return _json({"ready": ok, "partitionsWithoutLeader": missing, "partitionsCatchingUp": lagging},
                     200 if ok else 503)

    async def health(self, _: web.Request) -> web.Response:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        node = self.node
        return _json({"ok": True, "nodeId": node.node_id, "uptimeS": round(time.time() - self.started, 1),
                      "memory": {"maxRssBytes": usage.ru_maxrss * 1024},
                      "connections": len(node.dispatcher.connections),
                      "partitions": sorted(node.replicas),
                      "leading": sorted(p for p, r in node.replicas.items() if r.is_leader())})

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(text=self.node.metrics.exposition(), content_type="text/plain", charset="utf-8")

    async def stats(self, _: web.Request) -> web.Response:
        node = self.node
        now = node.now_ms()
        queues = {}
        for p, replica in node.replicas.items():
            if replica.is_leader():
                queues.update(replica.read({"cmd": "Stats"}, now)["stats"]["queues"])
        return _json({**node.local_stats(), "queues": queues})

    async def openapi(self, request: web.Request) -> web.Response:
        text = _OPENAPI.read_text()
        if request.path.endswith(".json"):
            import yaml  # deferred: only this endpoint needs it
            return _json(yaml.safe_load(text))
        return web.Response(text=text, content_type="application/yaml")

    # --- REST jobs ----------------------------------------------------------------------------

    async def add_job(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        if "data" not in body:
            return _error("INVALID", "data: required")
        frame = {**body, "cmd": "PUSH", "queue": request.match_info["queue"], "data": raw_of(body["data"])}
        return await self.run(request, frame)

    async def pull_job(self, request: web.Request) -> web.Response:
        try:
            timeout = int(request.query.get("timeout", "0"))
            count = int(request.query.get("count", "0"))
        except ValueError:
            return _error("INVALID", "timeout and count must be integers (ms, jobs)")
        frame: dict[str, Any] = {"cmd": "PULLB" if count else "PULL", "queue": request.match_info["queue"]}
        if count:
            frame["count"] = count
        if timeout:
            frame["timeout"] = timeout
        return await self.run(request, frame)

    async def get_job(self, request: web.Request) -> web.Response:
        return await self.run(request, {"cmd": "GetJob", "id": request.match_info["id"]})

    async def ack_job(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        frame = {"cmd": "ACK", "id": request.match_info["id"], **{k: v for k, v in body.items() if k == "token"}}
        if body.get("result") is not None:
            frame["result"] = raw_of(body["result"])
        response = await self.run(request, frame)
        self._wake_stream(body.get("token"), response)
        return response

    async def fail_job(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        frame = {**{k: v for k, v in body.items() if k in ("token", "error", "delay")}, "cmd": "FAIL",
                 "id": request.match_info["id"]}
        response = await self.run(request, frame)
        self._wake_stream(body.get("token"), response)
        return response

    def _wake_stream(self, token: Any, response: web.Response) -> None:
        event = self.streams.pop(str(token), None) if token is not None else None
        if event is not None and response.status == 200:
            event.set()

    # --- streams ------------------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events of job state changes on the partitions this node leads."""
        queue = request.query.get("queue")
        buffer: asyncio.Queue[dict[str, Any]] = asyncio.Queue(10_000)

        def listener(events: list[dict[str, Any]]) -> None:
            for ev in events:
                if (queue is None or ev.get("queue") == queue) and not buffer.full():
                    buffer.put_nowait(ev)

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        self.node.event_listeners.append(listener)
        try:
            await response.write(b": connected\n\n")
            while True:
                try:
                    ev = await asyncio.wait_for(buffer.get(), 15)
                except asyncio.TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                await response.write(f"event: {ev.get('event', 'job')}\ndata: {json.dumps(ev)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.node.event_listeners.remove(listener)
        return response

    async def work(self, request: web.Request) -> web.StreamResponse:
        """Push-mode worker (seed 004): keep up to ``max`` jobs leased to this stream.

        Each job arrives as ``event: job`` with its token; acking or failing it through
        ``POST /jobs/{id}/ack|fail`` with that token leases a replacement. When the stream
        disconnects, every lease it holds is released at once.
        """
        queue = request.match_info.get("queue") or request.query.get("queue")
        try:
            limit = max(1, min(WORK_MAX, int(request.query.get("max", "1"))))
            ttr = int(request.query["ttr"]) if "ttr" in request.query else None
        except ValueError:
            return _error("INVALID", "max and ttr must be integers")
        if not queue:
            return _error("INVALID", "queue: required")
        conn = HttpConnection(self.node.dispatcher)
        probe = await conn.call({"cmd": "Count", "queue": queue})
        if not probe.get("ok"):
            conn.close(keep_leases=True)
            return self.respond(request, probe)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        held: dict[str, asyncio.Event] = {}
        try:
            await response.write(f": session {conn.session}\n\n".encode())
            while True:
                for token in [t for t, ev in held.items() if ev.is_set()]:
                    del held[token]
                if len(held) < limit:
                    frame: dict[str, Any] = {"cmd": "PULLB", "queue": queue, "count": limit - len(held),
                                             "timeout": 1_000}
                    if ttr:
                        frame["ttr"] = ttr
                    reply = await conn.call(frame)
                    if not reply.get("ok"):
                        await response.write(f"event: error\ndata: {json.dumps(unraw(reply))}\n\n".encode())
                        await asyncio.sleep(0.5)
                        continue
                    for job, token in zip(reply["jobs"], reply["tokens"]):
                        held[token] = self.streams[token] = asyncio.Event()
                        payload = json.dumps({"job": unraw(job), "token": token}, default=_json_default)
                        await response.write(f"event: job\ndata: {payload}\n\n".encode())
                    if not reply["jobs"]:
                        await response.write(b": idle\n\n")  # notices a gone client within a second
                    continue
                waits = [asyncio.ensure_future(ev.wait()) for ev in held.values()]
                done, pending = await asyncio.wait(waits, timeout=1, return_when=asyncio.FIRST_COMPLETED)
                for w in pending:
                    w.cancel()
                if not done:
                    await response.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            for token in held:
                self.streams.pop(token, None)
            conn.close(release_now=True)  # the stream's leases go back to the queue now
        return response

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        """The binary protocol's commands over a WebSocket: JSON text frames in, JSON out
        (binary frames carry MessagePack maps and get MessagePack replies)."""
        ws = web.WebSocketResponse(heartbeat=30)
        await ws.prepare(request)
        import msgpack

        async def forward(frame: dict[str, Any]) -> None:
            if not ws.closed:
                await ws.send_str(json.dumps(unraw(frame), default=_json_default))

        conn = HttpConnection(self.node.dispatcher,
                              on_event=lambda f: asyncio.get_running_loop().create_task(forward(f)))
        try:
            async for msg in ws:
                binary = msg.type == WSMsgType.BINARY
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    continue
                try:
                    frame = msgpack.unpackb(msg.data, raw=False) if binary else json.loads(msg.data)
                    if not isinstance(frame, dict) or not isinstance(frame.get("cmd"), str):
                        raise ValueError("a frame is a map with a string cmd")
                except ValueError as exc:
                    reply: dict[str, Any] = {"ok": False, "code": "PROTOCOL_ERROR", "error": str(exc)}
                else:
                    req_id = frame.get("reqId")
                    if "data" in frame:  # JSON or decoded MessagePack: pack once, like a client would
                        frame["data"] = raw_of(frame["data"])
                    reply = await conn.call(frame)
                    if req_id is not None:
                        reply["reqId"] = req_id
                    else:
                        reply.pop("reqId", None)
                if binary:
                    await ws.send_bytes(msgpack.packb(unraw(reply), use_bin_type=True))
                else:
                    await ws.send_str(json.dumps(unraw(reply), default=_json_default))
        finally:
            conn.close()
        return ws


def build_app(node: "Node") -> web.Application:
    api = HttpApi(node)
    app = web.Application(middlewares=[api.auth], client_max_size=node.config.frame_bytes_max)
    r = app.router
    r.add_get("/healthz", api.healthz)
    r.add_get("/ready", api.ready)
    r.add_get("/health", api.health)
    r.add_get("/prometheus", api.prometheus)
    r.add_get("/stats", api.stats)
    r.add_get("/openapi.yaml", api.openapi)
    r.add_get("/openapi.json", api.openapi)
    r.add_post("/queues/{queue}/jobs", api.add_job)
    r.add_get("/queues/{queue}/jobs", api.pull_job)
    r.add_get("/queues/{queue}/work", api.work)
    r.add_get("/work", api.work)
    r.add_get("/jobs/{id}", api.get_job)
    r.add_post("/jobs/{id}/ack", api.ack_job)
    r.add_post("/jobs/{id}/fail", api.fail_job)
    r.add_get("/events", api.events)
    r.add_get("/ws", api.websocket)
    return app


async def start_http(node: "Node", host: str, port: int) -> web.AppRunner:
    # Open SSE streams must not hold a graceful stop for aiohttp's default 60 s.
    # handler_cancellation: a /work stream's leases are released the moment its client goes away.
    runner = web.AppRunner(build_app(node), access_log=None, shutdown_timeout=2.0, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner
