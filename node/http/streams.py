"""Long-lived HTTP endpoints: ``/events`` (SSE of job state changes), ``/work`` (push-mode
workers) and ``/ws`` (the binary protocol's commands over a WebSocket).

All three run their commands through the dispatcher on an
:class:`~shoal.node.http.conn.HttpConnection`, like REST requests do.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from shoal.cluster.codec import FRAME_BYTES_MAX_DEFAULT, Raw, check_depth, decode_request, encode, raw_of
from shoal.cluster.commands import validate
from shoal.cluster.errors import CommandError, ErrorCode, ProtocolError
from shoal.cluster.guard import AUTH_FAIL_DELAYS_S, AUTH_FAILURES_MAX, PRE_AUTH_FRAME_BYTES_MAX
from shoal.cluster.partitioning import partition_for

from .conn import HttpConnection
from .forward import Forwarder
from .util import dumps, error_response, json_response, loads_bounded, sse

if TYPE_CHECKING:
    from ..view import NodeView

__all__ = ["StreamHandlers", "WORK_MAX", "EVENTS_BUFFER_MAX", "WS_PENDING_MAX"]

WORK_MAX = 1_000
WORK_POLL_MS = 5_000          # one long poll at a time; also how often an idle stream says ": hb"
EVENTS_BUFFER_MAX = 10_000    # events queued for one slow /events reader before it is told it lost some
WS_PENDING_MAX = 10_000       # unsent frames (events, replies) of one /ws before it is closed
HEARTBEAT_S = 15.0
RETRY_MS = 2_000              # EventSource reconnect delay we suggest
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: Errors after which a /work stream ends (the client reconnects and is routed afresh).
_WORK_FATAL = frozenset({"NOT_LEADER", "NO_LEADER", "SHUTTING_DOWN", "TIMEOUT", "INVALID", "NOT_FOUND",
                         "AUTH_REQUIRED", "AUTH_FAILED", "INTERNAL"})


def _rawify(frame: dict[str, Any]) -> dict[str, Any]:
    """Job data of a JSON frame as MessagePack, where the binary decoder would keep it raw."""
    if "data" in frame and type(frame["data"]) is not Raw:
        frame["data"] = raw_of(frame["data"])
    jobs = frame.get("jobs")
    if isinstance(jobs, list):
        frame["jobs"] = [{**j, "data": raw_of(j["data"])} if isinstance(j, dict) and "data" in j
                         and type(j["data"]) is not Raw else j for j in jobs]
    return frame


class StreamHandlers:
    """Mixed into :class:`~shoal.node.http.HttpApi` (which provides ``node``, ``forwarder``,
    ``answer``, ``token_ok``)."""

    node: "NodeView"
    forwarder: Forwarder

    async def answer(self, request: web.Request, reply: dict[str, Any]) -> web.StreamResponse:  # pragma: no cover
        raise NotImplementedError

    def token_ok(self, header: str) -> bool | None:  # pragma: no cover
        raise NotImplementedError

    async def _stream_route(self, request: web.Request, queue: str) -> web.StreamResponse | None:
        """400 for a bad queue name, the leader's answer when this node does not lead it, else None."""
        try:
            validate({"cmd": "Count", "queue": queue})
        except CommandError as exc:
            return error_response(exc.code.value, str(exc))
        p = partition_for(queue, self.node.config.partitions)
        part = self.node.partitions.get(p)
        if part is not None and part.replica.is_leader():
            return None
        err = self.node.not_leader_error(p)
        reply = err.to_reply()
        if err.code is ErrorCode.NOT_LEADER:
            return await self.forwarder.forward(request, reply)
        return json_response(reply, 503)

    # --- /events --------------------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events of job state changes.

        With ``?queue=q`` the stream comes from the queue's leader (other nodes relay it);
        without it, by any node, carrying the events of the partitions that node leads.
        """
        queue = request.query.get("queue") or None
        if queue is not None:
            refused = await self._stream_route(request, queue)
            if refused is not None:
                return refused
        buffer: asyncio.Queue[dict[str, Any]] = asyncio.Queue(EVENTS_BUFFER_MAX)
        lost = [0]

        def listener(events: list[dict[str, Any]]) -> None:
            # Called synchronously after each applied batch: filter and queue, never block.
            for ev in events:
                if queue is None or ev.get("queue") == queue:
                    if buffer.full():
                        lost[0] += 1
                    else:
                        buffer.put_nowait(ev)

        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        metrics = self.node.metrics
        metrics.http_streams["events"] += 1
        self.node.event_listeners.append(listener)
        self.node.events_wanted()
        seq = 0
        try:
            await response.write(f"retry: {RETRY_MS}\n: connected to {self.node.node_id}\n\n".encode())
            while not self.node.stopping:
                try:
                    async with asyncio.timeout(HEARTBEAT_S):  # not wait_for: it can lose a cancellation
                        ev = await buffer.get()
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if lost[0]:
                    # A reader too slow for the event rate: say how many it missed, never block the node.
                    seq += 1
                    await response.write(sse("lost", {"count": lost[0]}, event_id=seq))
                    lost[0] = 0
                seq += 1
                await response.write(sse(str(ev.get("event", "job")), ev, event_id=seq))
        except ConnectionResetError:
            pass
        finally:
            self.node.event_listeners.remove(listener)
            metrics.http_streams["events"] -= 1
        return response

    # --- /work ----------------------------------------------------------------------------------

    async def work(self, request: web.Request) -> web.StreamResponse:
        """Push-mode worker: keep up to ``max`` jobs leased to this stream.

        Each job arrives as ``event: job`` with ``{job, token}``. When a job of the stream
        leaves the active state -- acked or failed by anyone (REST, binary, /ws), or its lease
        lapsed -- the stream leases a replacement. When the stream disconnects, every lease it
        holds is released at once (its session ends without grace).
        """
        queue = request.match_info.get("queue") or request.query.get("queue")
        if not queue:
            return error_response("INVALID", "queue: required")
        try:
            limit = int(request.query.get("max", "1"))
            ttr = int(request.query["ttr"]) if "ttr" in request.query else None
        except ValueError:
            return error_response("INVALID", "max and ttr: must be integers")
        if not 1 <= limit <= WORK_MAX:
            return error_response("INVALID", f"max: must be 1..{WORK_MAX}")
        node = self.node
        conn = HttpConnection(node.dispatcher, node.metrics)
        held: set[str] = set()            # ids of the jobs this stream holds leased
        changed = asyncio.Event()

        def listener(events: list[dict[str, Any]]) -> None:
            for ev in events:
                if ev.get("prev") == "active" and ev.get("state") != "active" and ev.get("id") in held:
                    held.discard(ev["id"])
                    changed.set()

        def pull(count: int, timeout: int) -> dict[str, Any]:
            frame: dict[str, Any] = {"cmd": "PULLB", "queue": queue, "count": count}
            if timeout:
                frame["timeout"] = timeout
            if ttr is not None:
                frame["ttr"] = ttr
            return frame

        node.event_listeners.append(listener)
        node.events_wanted()
        response: web.StreamResponse | None = None
        seq = 0
        try:
            # The first pull runs before the stream starts, so a bad field, a paused or unknown
            # partition or a follower is answered with a real status (400, 503) or forwarded.
            reply = await conn.call(pull(limit, 0))
            if not reply.get("ok"):
                return await self.answer(request, reply)
            response = web.StreamResponse(headers=_SSE_HEADERS)
            node.metrics.http_streams["work"] += 1
            await response.prepare(request)
            await response.write(f"retry: {RETRY_MS}\n: session {conn.session}\n\n".encode())
            idle_since = time.monotonic()
            while not node.stopping:
                if not reply.get("ok"):
                    await response.write(sse("error", reply))
                    if reply.get("code") in _WORK_FATAL:
                        break  # the client reconnects and is routed to the current leader
                    await asyncio.sleep(0.5)  # OVERLOADED and the like: back off, keep the stream
                else:
                    for job, token in zip(reply.get("jobs", ()), reply.get("tokens", ())):
                        held.add(job["id"])
                        seq += 1
                        await response.write(sse("job", {"job": job, "token": token}, event_id=seq))
                        idle_since = time.monotonic()
                if time.monotonic() - idle_since >= HEARTBEAT_S / 3:
                    await response.write(b": hb\n\n")  # lets proxies and a half-open peer show up
                    idle_since = time.monotonic()
                if len(held) >= limit:
                    changed.clear()
                    try:
                        async with asyncio.timeout(HEARTBEAT_S / 3):
                            await changed.wait()
                    except TimeoutError:
                        pass
                    reply = {"ok": True}
                    continue
                reply = await conn.call(pull(limit - len(held), WORK_POLL_MS))
        except ConnectionResetError:
            pass
        finally:
            node.event_listeners.remove(listener)
            if response is not None:
                node.metrics.http_streams["work"] -= 1
            conn.close(release_now=True)  # the stream's leases go back to the queue now
        return response

    # --- /ws ------------------------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        """The binary protocol's commands over a WebSocket.

        Text frames carry JSON maps (job data as JSON); binary frames carry MessagePack maps and
        get MessagePack replies. Like a binary connection: protocol v1 (one command at a time)
        until ``Hello {protocolVersion: 2}``, then up to the node's in-flight limit at once,
        replies matched by ``reqId``; ``Subscribe`` events arrive as frames without ``reqId``.
        """
        node = self.node
        authed = not node.config.tokens or bool(self.token_ok(request.headers.get("Authorization", "")))
        # A socket that authenticates with an Auth message (browsers) keeps the pre-Auth frame
        # limit for its life: aiohttp reads a whole message before the node sees any of it.
        max_msg = node.config.frame_bytes_max if authed else PRE_AUTH_FRAME_BYTES_MAX
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=max_msg)
        await ws.prepare(request)
        node.metrics.http_streams["ws"] += 1
        frame_max = node.config.frame_bytes_max or FRAME_BYTES_MAX_DEFAULT
        inflight = asyncio.Semaphore(max(1, node.config.inflight_per_connection))
        tasks: set[asyncio.Task[None]] = set()
        binary_events = [False]  # events go out in the format the client last used

        async def send(frame: dict[str, Any], binary: bool) -> None:
            if ws.closed:
                return
            try:
                if binary:
                    await ws.send_bytes(encode(frame, frame_bytes_max=frame_max)[4:])
                else:
                    await ws.send_str(dumps(frame))
            except ProtocolError as exc:  # a reply over the frame limit: say so, keep the socket
                err = {"ok": False, "code": exc.code.value, "error": f"reply could not be sent: {exc}",
                       "reqId": frame.get("reqId")}
                await (ws.send_bytes(encode(err)[4:]) if binary else ws.send_str(dumps(err)))
            except ConnectionResetError:
                pass

        def on_event(frame: dict[str, Any]) -> None:
            if len(tasks) >= WS_PENDING_MAX:
                # Events outpace a client that does not read: close it rather than queue without end.
                if not ws.closed:
                    asyncio.get_running_loop().create_task(
                        ws.close(code=1008, message=b"too many unsent events (client not reading)"))
                return
            task = asyncio.get_running_loop().create_task(send(frame, binary_events[0]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        conn = HttpConnection(node.dispatcher, node.metrics, authed=authed, protocol_version=1, on_event=on_event)
        auth_failures = [0]

        async def run(frame: dict[str, Any], binary: bool) -> None:
            req_id = frame.get("reqId")
            try:
                reply = await conn.call(frame)
            finally:
                inflight.release()
            if req_id is not None:
                reply["reqId"] = req_id
            if reply.get("code") == "AUTH_FAILED" and frame.get("cmd") == "Auth":
                auth_failures[0] += 1  # as on the binary port: a growing delay, the third closes
                await asyncio.sleep(AUTH_FAIL_DELAYS_S[min(auth_failures[0], len(AUTH_FAIL_DELAYS_S)) - 1])
                await send(reply, binary)
                if auth_failures[0] >= AUTH_FAILURES_MAX:
                    await ws.close(code=1008, message=b"too many wrong tokens")
                return
            await send(reply, binary)

        try:
            idle_s = node.config.limits.unauthenticated_idle_ms / 1000
            while True:
                try:  # like a binary connection: silent this long before Auth, and it is closed
                    msg = await ws.receive(timeout=None if conn.authed else idle_s)
                except asyncio.TimeoutError:
                    await ws.close(code=1008, message=b"no Auth in time (limits.unauthenticated_idle_ms)")
                    break
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    break
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    continue
                binary = msg.type == WSMsgType.BINARY
                binary_events[0] = binary
                try:
                    if binary:  # the binary protocol's own decoder: job data stays raw bytes
                        check_depth(msg.data)
                        frame = decode_request(msg.data, raw_data=True)
                    else:
                        frame = loads_bounded(msg.data)
                        if not isinstance(frame, dict) or not isinstance(frame.get("cmd"), str) or not frame["cmd"]:
                            raise ProtocolError("a frame is a JSON object with a non-empty string cmd")
                        _rawify(frame)
                except (ValueError, ProtocolError) as exc:
                    code = exc.code.value if isinstance(exc, ProtocolError) else "PROTOCOL_ERROR"
                    err: dict[str, Any] = {"ok": False, "code": code, "error": str(exc)}
                    if isinstance(exc, ProtocolError) and exc.req_id is not None:
                        err["reqId"] = exc.req_id
                    await send(err, binary)
                    continue
                await inflight.acquire()
                if conn.protocol_version >= 2:
                    task = asyncio.get_running_loop().create_task(run(frame, binary))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                else:
                    await run(frame, binary)  # v1: strictly in order, like a binary connection
        finally:
            for task in list(tasks):
                task.cancel()
            conn.close()  # the node's session grace applies, as for a binary connection
            node.metrics.http_streams["ws"] -= 1
        return ws
