"""One client connection on the binary protocol.

Frames are decoded as they arrive; each runs through the node's dispatcher
and its reply is written when ready. Before ``Hello`` a connection is
protocol v1: one command at a time, replies strictly in order. After
``Hello {protocolVersion: 2}`` up to ``inflight_max`` commands run at once and
replies go out as they complete, matched by ``reqId``. Replies written in one
event-loop iteration leave in a single ``write`` call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from shoal.cluster.codec import FrameDecoder, PlainPush, Raw, encode, encode_body
from shoal.cluster.errors import CommandError, ErrorCode, ProtocolError

if TYPE_CHECKING:
    from .dispatch import Dispatcher

__all__ = ["ClientConnection"]

log = logging.getLogger(__name__)
_conn_ids = itertools.count(1)
_BACKLOG_PAUSE_FRAMES = 2_000
_pack = msgspec.msgpack.Encoder().encode
_PUSH_REPLY_HEAD = b"\x83\xa2ok\xc3\xa2id"  # map of 3: "ok": true, "id": (the id follows)
_PUSH_REPLY_REQ = b"\xa5reqId"
_PUSH_REPLY_FIXED = len(_PUSH_REPLY_HEAD) + len(_PUSH_REPLY_REQ)
_PUSH_REPLY_SIZE = struct.Struct(">I").pack


def encode_replies(out: list[bytes], req_ids: list[Any], results: list[Any]) -> list[dict[str, Any]]:
    """Append the length-prefixed replies to ``out`` (pieces to join); per command a reply dict
    or a CommandError. Returns the reply frames that could not be encoded.
    """
    add = out.append
    failed: list[dict[str, Any]] = []
    for req_id, result in zip(req_ids, results):
        job_id = result.get("id") if type(result) is dict and len(result) == 1 else None
        if type(job_id) is str and (type(req_id) is int or type(req_id) is str):
            # A plain push's reply, {"ok": true, "id": ..., "reqId": ...}, spliced from its two
            # encoded values: half the cost of building and encoding a dict per reply.
            packed_id = _pack(job_id)
            packed_req = _pack(req_id)
            add(_PUSH_REPLY_SIZE(_PUSH_REPLY_FIXED + len(packed_id) + len(packed_req)))
            add(_PUSH_REPLY_HEAD)
            add(packed_id)
            add(_PUSH_REPLY_REQ)
            add(packed_req)
            continue
        frame = {"ok": True, **result} if type(result) is dict else result.to_reply()
        if req_id is not None:
            frame["reqId"] = req_id
        try:
            body = encode_body(frame)  # a short reply: well under any frame limit
        except ProtocolError:
            failed.append(frame)
            continue
        add(len(body).to_bytes(4, "big") + body)
    return failed


class ClientConnection(asyncio.Protocol):
    """Protocol instance per accepted socket."""

    def __init__(self, dispatcher: "Dispatcher", frame_bytes_max: int, inflight_max: int) -> None:
        self.dispatcher = dispatcher
        self.conn_id = next(_conn_ids)
        self.decoder = FrameDecoder(frame_bytes_max, requests=True, raw_data=True, plain_push=True)
        self.frame_bytes_max = frame_bytes_max
        self.inflight_v2_max = inflight_max
        self.inflight_max = 1  # v1 until Hello
        self.protocol_version = 1
        self.authed = not dispatcher.auth_required
        self.session: str = dispatcher.sessions.new_session_id()
        self.subscriptions: set[str] | None = None  # None = not subscribed; "" = every queue
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._backlog: deque[dict[str, Any] | PlainPush] = deque()
        self._inflight = 0
        self._out: list[bytes] = []
        self._deferred: list[tuple[list[Any], list[Any]]] = []
        self._flush_scheduled = False
        self._close_after_flush = False
        self._paused = False
        self._pumping = False
        self.loop = dispatcher.loop

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.dispatcher.connection_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._backlog.clear()
        self.dispatcher.connection_closed(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.drain(data)
        except ProtocolError:
            return  # decoder already broken; the connection is closing
        backlog = self._backlog
        for frame in frames:
            if type(frame) is ProtocolError:
                self._protocol_error(frame)
                if frame.fatal:
                    return
                continue
            backlog.append(frame)
        self._pump()
        if len(backlog) > _BACKLOG_PAUSE_FRAMES and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()

    # --- command flow -------------------------------------------------------------------------

    def _pump(self) -> None:
        if self._pumping:
            return  # a reply sent synchronously from inside the loop below; the loop continues
        self._pumping = True
        try:
            self._pump_backlog()
        finally:
            self._pumping = False

    def _pump_backlog(self) -> None:
        backlog = self._backlog
        while backlog and self._inflight < self.inflight_max and not self.closed:
            frame = backlog.popleft()
            if type(frame) is PlainPush:
                if self.authed:
                    self._pump_pushes(frame)
                    continue
                frame = frame.to_frame(Raw)  # the general path answers AUTH_REQUIRED
            self._inflight += 1
            try:
                self.dispatcher.handle(self, frame)
            except CommandError as exc:
                self.reply_error(frame.get("reqId"), exc)
            except Exception as exc:
                log.exception("dispatch failed for %s", frame.get("cmd"))
                self.reply_error(frame.get("reqId"),
                                 CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))
        if self._paused and len(backlog) < _BACKLOG_PAUSE_FRAMES // 2 and self.transport and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def _pump_pushes(self, frame: PlainPush) -> None:
        """Dispatch ``frame`` with the plain PUSHes to its queue right behind it, as free slots allow."""
        backlog = self._backlog
        block = [frame]
        queue = frame.queue
        room = self.inflight_max - self._inflight - 1
        while room > 0 and backlog:
            nxt = backlog[0]
            if type(nxt) is not PlainPush or nxt.queue != queue:
                break
            block.append(backlog.popleft())
            room -= 1
        self._inflight += len(block)
        try:
            self.dispatcher.handle_pushes(self, block)
        except Exception as exc:
            log.exception("dispatch failed for a block of %d PUSH", len(block))
            error = CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            for f in block:
                self.reply_error(f.reqId, error)

    def upgrade(self, version: int) -> None:
        """Switch to protocol v2 (pipelined, out-of-order replies)."""
        if version >= 2:
            self.protocol_version = 2
            self.inflight_max = self.inflight_v2_max

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        """Send a successful reply to one command and let the next one run."""
        frame = {"ok": True, **body}
        if req_id is not None:
            frame["reqId"] = req_id
        self._finish(frame)

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        """Answer commands that completed together: per command a reply dict or a CommandError."""
        self.dispatcher.node.metrics.observe(cmd, seconds, len(req_ids))
        self._inflight -= len(req_ids)
        if self.closed:
            return
        if self.protocol_version >= 2:
            # Encoded at flush time, so the pump below dispatches the next commands waiting
            # here (into the partition's next entry) before these replies are built.
            self._deferred.append((req_ids, results))
        else:
            self._encode_replies(req_ids, results)  # v1 answers strictly in order
        self._schedule_flush()
        if self._backlog:
            self._pump()

    def _encode_replies(self, req_ids: list[Any], results: list[Any]) -> None:
        for frame in encode_replies(self._out, req_ids, results):
            self.send_frame(frame)  # says why it could not be sent, as every reply does

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        frame = exc.to_reply()
        if req_id is not None:
            frame["reqId"] = req_id
        self._finish(frame)

    def _finish(self, frame: dict[str, Any]) -> None:
        self._inflight -= 1
        if not self.closed:
            self.send_frame(frame)
            if self._backlog:
                self._pump()

    def _protocol_error(self, exc: ProtocolError) -> None:
        frame: dict[str, Any] = {"ok": False, "error": str(exc), "code": exc.code.value}
        if exc.req_id is not None:
            frame["reqId"] = exc.req_id
        self.send_frame(frame)
        if exc.fatal:
            self._backlog.clear()
            self._close_after_flush = True
            self._flush()

    # --- output -------------------------------------------------------------------------------

    def send_frame(self, frame: dict[str, Any]) -> None:
        """Queue a frame (reply or event); all frames of one loop iteration go out in one write."""
        if self.closed:
            return
        try:
            data = encode(frame, frame_bytes_max=self.frame_bytes_max)
        except ProtocolError as exc:
            # e.g. a PULLB whose jobs add up to more than the maximum frame: say so, keep the link.
            data = encode({"ok": False, "error": f"reply could not be sent: {exc}",
                           "code": exc.code.value, "reqId": frame.get("reqId")})
        self._out.append(data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            if not self.closed:
                for req_ids, results in deferred:
                    self._encode_replies(req_ids, results)
        if self._out and self.transport is not None and not self.closed:
            out, self._out = self._out, []
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        if self._close_after_flush and self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
