"""The node's HTTP port (aiohttp): health, metrics, REST jobs, SSE events, WebSocket, push workers.

Every job command runs through the binary protocol's dispatcher via an
:class:`~shoal.node.http.conn.HttpConnection`, so validation, routing, group commit, long polls
and sessions are the same. A request for a partition this node does not lead is **forwarded**
to the leader (:mod:`shoal.node.http.forward` says why not a redirect), so HTTP clients need no
cluster map and may talk to any node. Job data and results
are JSON over HTTP; the node converts them to MessagePack once at this edge.

Auth: when the node has tokens, every endpoint but ``/healthz`` and ``/ready`` needs
``Authorization: Bearer <token>`` (compared in constant time). ``/ws`` also accepts a socket
without the header that then sends ``Auth {token}`` like a binary client (browsers cannot set
headers on a WebSocket).

The streaming endpoints (``/events``, ``/work``, ``/ws``) live in :mod:`shoal.node.http.streams`;
the port's connection cap and header deadline in :mod:`shoal.node.http.guard`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from shoal.cluster.codec import raw_of
from shoal.cluster.commands import route_key
from shoal.cluster.errors import CommandError, ProtocolError
from shoal.cluster.partitioning import partition_for

from .conn import HttpConnection
from .dashboard import DASHBOARD_OPEN_PATHS, add_dashboard_routes
from .forward import LEADER_HEADER, Forwarder
from .guard import GuardedSite, HttpGuard
from .streams import StreamHandlers
from .admin import add_admin_routes
from .util import STATUS_BY_CODE, error_response, json_response, loads_bounded
from ..raft.replica import FOLLOWER_APPLY_BATCH

#: Committed but not yet applied entries a ready node may have on a partition.
READY_APPLY_LAG_MAX = 4 * FOLLOWER_APPLY_BATCH

if TYPE_CHECKING:
    from ..view import NodeView

__all__ = ["start_http", "build_app", "STATUS_BY_CODE", "HttpApi"]

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/ready"}) | DASHBOARD_OPEN_PATHS  # the page shell holds no data
#: Paths that authenticate themselves (a WebSocket may send Auth after the upgrade instead).
SELF_AUTH_PATHS = frozenset({"/ws"})
STREAM_ROUTES = frozenset({"/events", "/work", "/queues/{queue}/work", "/ws", "/cluster/stream"})
_METHODS = frozenset({"GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"})
_OPENAPI = Path(__file__).resolve().parent.parent / "openapi.yaml"
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: aiohttp's bounds on a request's head, stated here so they are part of the node's documented limits
#: (a Bearer token of auth_token_chars_max fits in one field).
HTTP_LINE_BYTES_MAX = 8190
HTTP_FIELD_BYTES_MAX = 8190
HTTP_HEADERS_MAX = 128
HTTP_LINGER_S = 2.0


def _digest(token: bytes) -> bytes:
    # Hash both sides so compare_digest sees equal lengths: not even a token's length leaks.
    return hashlib.sha256(token).digest()


def _durability(node: Any) -> dict[str, Any]:
    """The durability classes of the queues this node holds (the fsync class is ``durable: true``)."""
    classes = {"fsync": 0, "disk": 0}
    for part in node.partitions.values():
        for q in part.replica.application.view.queue_figures():
            classes["fsync" if q.durable else "disk"] += 1
    return {"default": "fsync", "queues": classes, "syncIntervalMs": node.config.sync_interval_ms}


class HttpApi(StreamHandlers):
    """Handlers bound to one node (REST and health here, streams in :class:`StreamHandlers`)."""

    def __init__(self, node: "NodeView") -> None:
        self.node = node
        self.token_digests = [_digest(t.encode()) for t in node.config.tokens]
        self.started = time.time()
        self.forwarder = Forwarder(node)

    # --- plumbing ---------------------------------------------------------------------------

    def token_ok(self, header: str) -> bool | None:
        """None: no Bearer header; else whether its token is one of the node's."""
        if not header.startswith("Bearer "):
            return None
        given = _digest(header[7:].strip().encode())
        matched = False
        for token in self.token_digests:  # every token, so timing does not tell which matched
            matched |= hmac.compare_digest(given, token)
        return matched

    @web.middleware
    async def errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Count and time every request; give aiohttp's own errors (404, 405, 413) a JSON body."""
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400 or exc.content_type == "application/json":
                raise
            code = {404: "NOT_FOUND", 413: "FRAME_TOO_LARGE"}.get(exc.status, "INVALID")
            response = json_response({"ok": False, "error": exc.reason, "code": code}, exc.status)
        except ConnectionResetError:
            raise
        except Exception as exc:  # a bug in a handler: answer like the binary protocol, keep serving
            log.exception("HTTP %s %s failed", request.method, request.path)
            response = error_response("INTERNAL", f"internal error: {type(exc).__name__}")
        stream = route in STREAM_ROUTES and response.status < 300
        self.node.metrics.observe_http(method, route, response.status,
                                       None if stream else time.perf_counter() - started)
        return response

    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.token_digests and request.path not in OPEN_PATHS:
            matched = self.token_ok(request.headers.get("Authorization", ""))
            if matched is None and request.path not in SELF_AUTH_PATHS:
                return error_response("AUTH_REQUIRED", "send Authorization: Bearer <token>")
            if matched is False:
                return error_response("AUTH_FAILED", "invalid token")
        return await handler(request)

    async def run(self, request: web.Request, frame: dict[str, Any]) -> web.StreamResponse:
        """Run one command for a REST request (a partition led elsewhere: over the node link)."""
        return await self.answer(request, await self.command(frame), frame)

    def led_elsewhere(self, frame: dict[str, Any]) -> str | None:
        """The leader of ``frame``'s partition when another node leads it (else None)."""
        try:
            key = route_key(frame)
        except CommandError:
            return None
        if key is None:
            return None
        p = key if type(key) is int else partition_for(str(key), self.node.config.partitions)
        part = self.node.partitions.get(p)
        if part is not None and part.replica.is_leader():
            return None
        infos = self.node.topology.partition_map
        return infos[p].leader if 0 <= p < len(infos) else None

    async def command(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Run one command on a connection of its own; the reply frame. A command for a partition
        another node leads goes to that leader over the node-to-node link (the relay)."""
        conn = HttpConnection(self.node.dispatcher, self.node.metrics, kept_leases=True, forwards=True)
        try:
            reply = await conn.call(frame)
        except BaseException:
            # The client went away (handler cancelled) while the command ran: a job a pull
            # leased for it goes straight back to the queue instead of waiting out its ttr.
            conn.close(release_now=True)
            raise
        # A REST pull hands its lease to a client that acks on a later request: keep it to its ttr.
        conn.close(keep_leases=True)
        return reply

    async def answer(self, request: web.Request, reply: dict[str, Any],
                     frame: dict[str, Any] | None = None) -> web.StreamResponse:
        """The HTTP response to a reply frame: 200, the error code's status, or (a stream's first
        reply at a node that does not lead its partition) the leader's answer, relayed over HTTP."""
        reply.pop("reqId", None)
        if reply.get("ok"):
            response = json_response(reply)
            leader = self.led_elsewhere(frame) if frame is not None else None
            if leader is not None:
                response.headers[LEADER_HEADER] = leader  # the node that answered it
            return response
        if reply.get("code") == "NOT_LEADER":
            return await self.forwarder.forward(request, reply)
        return json_response(reply, STATUS_BY_CODE.get(str(reply.get("code")), 500))

    async def body(self, request: web.Request) -> dict[str, Any]:
        """The request's JSON object (empty when there is no body); 400 INVALID otherwise, 408
        TIMEOUT when it does not arrive whole within ``limits.frame_timeout_ms``."""
        if not request.can_read_body:
            return {}
        timeout_s = self.node.config.limits.frame_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                text = await request.text()
        except TimeoutError as exc:
            self.node.metrics.http_refusals["body_timeout"] += 1
            refusal = web.HTTPRequestTimeout(
                text=json.dumps({"ok": False, "code": "TIMEOUT", "error": f"the request body did not arrive "
                                 f"within {timeout_s:g} s (limits.frame_timeout_ms)"}),
                content_type="application/json")
            refusal.force_close()  # the rest of the body may still be on its way
            raise refusal from exc
        if not text.strip():
            return {}
        try:
            body = loads_bounded(text)
        except ProtocolError as exc:  # the nesting limit
            raise _bad_request(f"body: {exc}") from exc
        except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError from text()
            raise _bad_request(f"body: not valid JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise _bad_request("body: must be a JSON object")
        return body

    # --- health, metrics ----------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        """Liveness: the event loop answers."""
        return json_response({"ok": True})

    def readiness(self) -> dict[str, Any]:
        node = self.node
        # A follower cut off from every peer never starts an election and keeps naming its old
        # leader, so "has a leader" also needs a connected majority (the replica's has_quorum).
        hosted = node.partitions
        missing = [p.id for p in node.topology.partition_map if p.id in hosted
                   and (p.leader is None or not hosted[p.id].replica.has_quorum())]
        # A follower applies committed entries a few at a time (FOLLOWER_APPLY_BATCH), and a socket
        # read may append several before its tick runs: a lag of that order is its normal state.
        # Catching up after a restart is a far larger one.
        lagging = [p for p, part in sorted(hosted.items())
                   if part.replica.commit_index() - part.replica.applied_index() > READY_APPLY_LAG_MAX
                   or (part.replica.is_leader() and not part.replica.read_ready())]
        storage = node.storage
        space_low = storage is not None and storage.space_low()
        no_space = sorted(storage.no_space) if storage is not None else []
        ok = not missing and not lagging and not node.stopping and not space_low and not no_space
        body = {"ready": ok, "stopping": node.stopping, "partitionsWithoutLeader": missing,
                "partitionsCatchingUp": lagging}
        if space_low or no_space:
            body["diskSpaceLow"] = space_low
            body["partitionsWithoutSpace"] = no_space
            body["reason"] = ("free space on the data directory is below disk_free_min_bytes: new data is "
                              "refused with NO_SPACE; reads, pulls and acks are served")
        return body

    async def ready(self, _: web.Request) -> web.Response:
        """Readiness: every hosted partition has a leader and this node has applied what is committed."""
        body = self.readiness()
        return json_response(body, 200 if body["ready"] else 503)

    async def health(self, _: web.Request) -> web.Response:
        """Health and memory figures."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        node = self.node
        memory: dict[str, Any] = {"maxRssBytes": usage.ru_maxrss * 1024}
        try:  # current RSS (Linux); max RSS alone never goes down
            with open("/proc/self/statm") as f:
                memory["rssBytes"] = int(f.read().split()[1]) * _PAGE_SIZE
        except (OSError, ValueError, IndexError):
            pass
        jobs = sum(part.replica.application.view.job_count() for part in node.partitions.values())
        readiness = self.readiness()
        return json_response({
            "ok": True, "status": "ok" if readiness["ready"] else "degraded", "ready": readiness["ready"],
            "nodeId": node.node_id, "clusterId": node.config.cluster_id, "incarnation": node.incarnation,
            "pid": os.getpid(), "uptimeS": round(time.time() - self.started, 1),
            "memory": {**memory, **node.guard.memory()},
            "jobsHeld": jobs, "connections": len(node.dispatcher.connections),
            "httpConnections": node.metrics.http_connections,
            "httpStreams": dict(node.metrics.http_streams), "sessions": node.dispatcher.sessions.active,
            "partitions": sorted(node.partitions),
            "storage": node.storage.status() if node.storage is not None else None,
            "durability": _durability(node),
            "leading": sorted(p for p, part in node.partitions.items() if part.replica.is_leader())})

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(text=self.node.metrics.exposition(), content_type="text/plain", charset="utf-8")

    async def stats(self, _: web.Request) -> web.Response:
        """Replicas of this node (leader or not), the queues of the partitions it leads, and the moves
        it runs as their leader."""
        node = self.node
        now = node.now_ms()
        queues: dict[str, Any] = {}
        for _p, part in sorted(node.partitions.items()):
            replica = part.replica
            if replica.is_leader():
                queues.update(replica.application.view.read({"cmd": "Stats"}, now)["stats"]["queues"])
        return json_response({**node.local_stats(), "clusterId": node.config.cluster_id,
                              "incarnation": node.incarnation, "pid": os.getpid(), "queues": queues,
                              "connections": len(node.dispatcher.connections),
                              "httpStreams": dict(node.metrics.http_streams),
                              "commandsTotal": node.dispatcher.commands_total,
                              "moves": node.moves.moves(), "moveCounters": node.moves.counters()})

    async def openapi(self, request: web.Request) -> web.Response:
        text = _OPENAPI.read_text()
        if request.path.endswith(".json"):
            import yaml  # deferred: only this endpoint needs it
            return json_response(yaml.safe_load(text))
        return web.Response(text=text, content_type="application/yaml")

    # --- REST jobs ----------------------------------------------------------------------------

    async def add_job(self, request: web.Request) -> web.StreamResponse:
        """PUSH: the body's fields are PUSH's fields (unknown ones are refused, not ignored)."""
        body = await self.body(request)
        if "data" not in body:
            return error_response("INVALID", "data: required")
        frame = {**body, "cmd": "PUSH", "queue": request.match_info["queue"], "data": raw_of(body["data"])}
        return await self.run(request, frame)

    async def pull_job(self, request: web.Request) -> web.StreamResponse:
        """PULL (or PULLB with ``count``), long-polling up to ``timeout`` ms."""
        try:
            params = {k: int(request.query[k]) for k in ("timeout", "count", "ttr") if k in request.query}
        except ValueError:
            return error_response("INVALID", "timeout, count and ttr: must be integers (ms, jobs, ms)")
        count = params.pop("count", 0)
        frame: dict[str, Any] = {"cmd": "PULLB" if count else "PULL", "queue": request.match_info["queue"],
                                 **params}
        if count:
            frame["count"] = count
        if "group" in request.query:  # only this group's jobs (checked with the command)
            frame["group"] = request.query["group"]
        if "ungrouped" in request.query:
            if request.query["ungrouped"] not in ("true", "1"):
                return error_response("INVALID", "ungrouped: must be true (only jobs without a group)")
            frame["ungrouped"] = True
        return await self.run(request, frame)

    async def get_job(self, request: web.Request) -> web.StreamResponse:
        reply = await self.command({"cmd": "GetJob", "id": request.match_info["id"]})
        if reply.get("ok") and reply.get("job") is None:  # REST: an unknown resource is a 404
            return error_response("NOT_FOUND", f"no job {request.match_info['id']}")
        return await self.answer(request, reply, {"cmd": "GetJob", "id": request.match_info["id"]})

    async def ack_job(self, request: web.Request) -> web.StreamResponse:
        """ACK ``{token?, result?}``: unknown fields are refused, so a misspelt token is never ignored."""
        body = await self.body(request)
        frame = {**body, "cmd": "ACK", "id": request.match_info["id"]}
        if body.get("result") is not None:
            frame["result"] = raw_of(body["result"])
        else:
            frame.pop("result", None)
        return await self.run(request, frame)

    async def fail_job(self, request: web.Request) -> web.StreamResponse:
        """FAIL ``{token?, error?, delay?}``."""
        body = await self.body(request)
        return await self.run(request, {**body, "cmd": "FAIL", "id": request.match_info["id"]})


    async def push_flow(self, request: web.Request) -> web.StreamResponse:
        """PushFlow ``{parent, children, idempotencyKey?}`` (any node coordinates it)."""
        return await self.run(request, {**await self.body(request), "cmd": "PushFlow"})

    async def children_values(self, request: web.Request) -> web.StreamResponse:
        """GetChildrenValues: a flow parent's children's results (and errors by policy)."""
        return await self.run(request, {"cmd": "GetChildrenValues", "id": request.match_info["id"]})


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"ok": False, "code": "INVALID", "error": message}),
                              content_type="application/json")


API_KEY = web.AppKey("api", HttpApi)


def build_app(node: "NodeView", guard: HttpGuard | None = None) -> web.Application:
    """The node's aiohttp application (every route of the OpenAPI description)."""
    api = HttpApi(node)
    middlewares = [api.errors, api.auth] if guard is None else [guard.middleware, api.errors, api.auth]
    app = web.Application(middlewares=middlewares, client_max_size=node.config.frame_bytes_max)
    app[API_KEY] = api

    async def close_forwarder(_: web.Application) -> None:
        await api.forwarder.close()

    app.on_cleanup.append(close_forwarder)
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
    r.add_post("/flows", api.push_flow)
    r.add_get("/jobs/{id}/children", api.children_values)
    r.add_get("/events", api.events)
    r.add_get("/ws", api.websocket)
    add_dashboard_routes(app, api)  # the page at / and the endpoints only it needs
    add_admin_routes(app, node)
    return app


async def start_http(node: "NodeView", host: str, port: int) -> web.AppRunner:
    """Serve the HTTP API on ``host:port``; the caller cleans the runner up on stop."""
    # Open SSE streams must not hold a graceful stop for aiohttp's default 60 s.
    # handler_cancellation: a /work stream's leases are released the moment its client goes away.
    # keepalive_timeout also closes a connection that never sends a request. lingering_time bounds
    # how long the unread rest of a refused body is drained before the close.
    limits = node.config.limits
    guard = HttpGuard(limits, node.metrics)
    runner = web.AppRunner(build_app(node, guard), access_log=None, shutdown_timeout=2.0,
                           handler_cancellation=True, keepalive_timeout=limits.http_keepalive_timeout_ms / 1000,
                           max_line_size=HTTP_LINE_BYTES_MAX, max_field_size=HTTP_FIELD_BYTES_MAX,
                           max_headers=HTTP_HEADERS_MAX, lingering_time=HTTP_LINGER_S)
    await runner.setup()
    await GuardedSite(runner, host, port, guard,
                      ssl_context=node.config.tls.server_context() if node.config.tls else None).start()
    return runner
