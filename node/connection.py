"""One client connection on the binary protocol.

Frames are decoded as they arrive; each runs through the node's dispatcher
and its reply is written when ready. Up to ``inflight_max`` commands of a
connection run at once, whatever it negotiated (bunqueue's client never says
``Hello`` and pipelines every command with a ``reqId``): a frame with a ``reqId``
is answered as soon as it completes, matched by its ``reqId``; frames without one
run concurrently too, but their replies leave in the order the frames came
(each holds a place in the connection's reply order). Replies written in one
event-loop iteration leave in a single ``write`` call. ``Hello`` with
``protocolVersion`` 2 adds topology events; with the ``routing`` capability the
client sends each command to its partition's leader itself, and the node
answers ``NOT_LEADER`` instead of forwarding it (:mod:`.relay`).

Limits (``shoal.cluster.guard``): when the node has tokens, a connection that
has not authenticated may send only ``Hello``, ``Auth`` and ``Ping`` in frames
of at most 64 KiB; every other command is answered ``AUTH_REQUIRED`` from its
``cmd`` and ``reqId`` alone, and a wrong token costs a growing delay, the third
one the connection. Once a connection is authenticated (or the node has no
tokens) none of this runs: frames take the decoder's fast path. Reading stops
while a connection's unsent output is above ``output_high_bytes`` or its
decoded-but-undispatched frames pile up, so a client that never reads costs a
bounded amount of memory; above ``output_max_bytes`` it is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from shoal.cluster.codec import (FrameDecoder, PlainBulk, PlainPush, Raw, check_depth, decode_request, decode_response,
                                 encode)
from shoal.cluster.commands import PRE_AUTH_COMMANDS
from shoal.cluster.errors import CommandError, ErrorCode, ProtocolError
from shoal.cluster.guard import AUTH_FAIL_DELAYS_S, AUTH_FAILURES_MAX, PRE_AUTH_FRAME_BYTES_MAX

from .ports import answer_guarded
from .partition.pushes import encode_replies, take_block

if TYPE_CHECKING:
    from .dispatch import Dispatcher

__all__ = ["ClientConnection"]

log = logging.getLogger(__name__)
_conn_ids = itertools.count(1)
_BACKLOG_PAUSE_FRAMES = 2_000
#: The reqId a frame that came without one is given while it runs: its place in the reply order.
#: A client's own string reqId may not start with it (refused INVALID).
ORDER_PREFIX = "\x00"
#: Unfinished frames larger than this count against limits.unfinished_bytes_max (smaller ones
#: are the tail of a pipelined burst: counting them would cost every read).
UNFINISHED_COUNTED_BYTES = 1 << 20


class _Head(msgspec.Struct):
    """A request's ``cmd`` and ``reqId``; every other value is skipped, not built."""

    cmd: str = ""
    reqId: int | str | None = None  # noqa: N815 (wire name)


_head_decode = msgspec.msgpack.Decoder(_Head).decode

class ClientConnection(asyncio.Protocol):
    """Protocol instance per accepted socket."""

    def __init__(self, dispatcher: "Dispatcher", frame_bytes_max: int, inflight_max: int) -> None:
        self.dispatcher = dispatcher
        self.conn_id = next(_conn_ids)
        self.decoder = FrameDecoder(frame_bytes_max, requests=True, raw_data=True, plain_push=True)
        self.frame_bytes_max = frame_bytes_max
        self.inflight_v2_max = inflight_max
        self.inflight_max = inflight_max
        self.protocol_version = 1
        #: True until Hello names the ``routing`` capability: commands for partitions led
        #: elsewhere are forwarded to their leader (:mod:`.relay`) instead of refused NOT_LEADER.
        self.wants_forwarding = True
        #: True until Hello names the ``routing`` capability (Shoal's own clients): a client that
        #: does not route speaks bunqueue's dialect, whose adds may carry a job's name in its data.
        self.bunqueue_envelope = True
        self.bunqueue_subscriptions: set[str] | None = None  # SubscribeEvents queues (bunqueue's events)
        self.authed = not dispatcher.auth_required
        self.session: str = dispatcher.sessions.new_session_id()
        self.subscriptions: set[str] | None = None  # None = not subscribed; "" = every queue
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._backlog: deque[dict[str, Any] | PlainPush | PlainBulk] = deque()
        self._inflight = 0
        self._out: list[bytes] = []
        self._deferred: list[tuple[list[Any], list[Any]]] = []
        self._flush_scheduled = False
        self._close_after_flush = False
        self._paused = False          # reading paused (backlog or output over its high-water mark)
        self._write_paused = False    # the transport's unsent output is over output_high_bytes
        self._out_bytes = 0           # bytes in _out (frames of this iteration not yet written)
        self._backlog_bytes = 0       # bytes received while frames waited in the backlog
        self._pumping = False
        self.loop = dispatcher.loop
        limits = dispatcher.limits
        self._output_high = limits.output_high_bytes
        self._output_max = limits.output_max_bytes
        self.peer_host = ""
        self.opened_at = self.last_frame_at = self.loop.time()
        self.partial_since = 0.0      # loop time the pending unfinished frame began (0: none)
        self.refused = False          # turned away at connect (connection limits)
        self.unfinished_bytes = 0     # this connection's share of the node's unfinished-frame budget
        self._pre_buf = bytearray()   # bytes before Auth (only used while not authed)
        # Frames that came without a reqId: the next place to give, the next to send, and the
        # encoded replies that wait for an earlier one.
        self._order_given = 0
        self._order_sent = 0
        self._order_held: dict[int, bytes] = {}
        self._auth_failures = 0
        self._auth_wait = False

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self.peer_host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        refusal = self.dispatcher.connection_opened(self)
        if refusal is not None:
            self.refused = True
            self._backlog.clear()
            self.send_frame(refusal.to_reply())
            self._close_after_flush = True
            self._flush()
            self.closed = True  # nothing it sends before the close is read
            return
        transport.set_write_buffer_limits(high=self._output_high)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.unfinished_bytes:
            self.dispatcher.unfinished_add(-self.unfinished_bytes)
            self.unfinished_bytes = 0
        self._backlog.clear()
        self._pre_buf.clear()
        self.dispatcher.connection_closed(self)

    def pause_writing(self) -> None:
        """The transport holds more than ``output_high_bytes`` unsent: stop reading this client."""
        self._write_paused = True
        self._set_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._set_reading()
        if self._backlog:
            self._pump()

    def _set_reading(self) -> None:
        """Pause or resume reading: paused while output is over its mark or the backlog is full."""
        backlog = self._backlog
        full = len(backlog) > _BACKLOG_PAUSE_FRAMES or (bool(backlog) and self._backlog_bytes > self._output_high)
        want = self._write_paused or self._auth_wait or full
        if want != self._paused and self.transport is not None and not self.closed:
            self._paused = want
            if want:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if not self.authed:
            self._pre_auth_received(data)
            return
        decoder = self.decoder
        try:
            frames = decoder.drain(data)
        except ProtocolError:
            return  # decoder already broken; the connection is closing
        buffered = decoder.buffered_bytes
        if buffered:
            if frames or not self.partial_since:
                self.partial_since = self.loop.time()  # a new unfinished frame began in this chunk
            if buffered > UNFINISHED_COUNTED_BYTES or self.unfinished_bytes:
                if not self._count_unfinished(buffered):
                    return
        else:
            if self.partial_since:
                self.partial_since = 0.0
            if self.unfinished_bytes:
                self._count_unfinished(0)
        backlog = self._backlog
        if backlog:
            self._backlog_bytes += len(data)
        for frame in frames:
            if type(frame) is ProtocolError:
                self._protocol_error(frame)
                if frame.fatal:
                    return
                continue
            backlog.append(frame)
        self._pump()
        if backlog:
            if not self._paused and (len(backlog) > _BACKLOG_PAUSE_FRAMES or self._backlog_bytes > self._output_high):
                self._set_reading()
        else:
            self._backlog_bytes = 0

    def _count_unfinished(self, buffered: int) -> bool:
        """Account this connection's large unfinished frame in the node's budget; False (and
        the connection refused) when it would pass ``unfinished_bytes_max``."""
        counted = buffered if buffered > UNFINISHED_COUNTED_BYTES else 0
        dispatcher = self.dispatcher
        if not dispatcher.unfinished_add(counted - self.unfinished_bytes):
            dispatcher.unfinished_add(-self.unfinished_bytes)
            self.unfinished_bytes = 0
            self._refuse_and_close(ErrorCode.OVERLOADED, "the node holds too many unfinished frames "
                                   "(limits.unfinished_bytes_max): send this frame again later")
            return False
        self.unfinished_bytes = counted
        return True

    # --- before Auth ----------------------------------------------------------------------------

    def _pre_auth_received(self, data: bytes) -> None:
        """Frames of a connection that has not authenticated: small, and only Hello/Auth/Ping."""
        if self.closed:
            return
        self._pre_buf += data
        self._pre_auth_pump()

    def _pre_auth_pump(self) -> None:
        buf = self._pre_buf
        while not self.authed and not self.closed and not self._auth_wait and len(buf) >= 4:
            length = int.from_bytes(buf[:4], "big")
            if length > PRE_AUTH_FRAME_BYTES_MAX:
                # Refused from the length header alone: nothing of the body is read or kept.
                buf.clear()
                self._protocol_error(ProtocolError(
                    f"frame of {length} bytes before Auth; until it authenticates a connection may send "
                    f"frames of at most {PRE_AUTH_FRAME_BYTES_MAX} bytes", ErrorCode.AUTH_REQUIRED, fatal=True))
                return
            if len(buf) < 4 + length:
                if not self.partial_since:
                    self.partial_since = self.loop.time()
                return
            payload = bytes(buf[4:4 + length])
            del buf[:4 + length]
            self.partial_since = 0.0
            self.last_frame_at = self.loop.time()
            self._pre_auth_frame(payload)
        if self.authed and buf and not self.closed:
            rest = bytes(buf)
            buf.clear()
            self.data_received(rest)  # authenticated mid-chunk: the rest takes the normal path

    def _pre_auth_frame(self, payload: bytes) -> None:
        frame: dict[str, Any] | None = None
        try:
            check_depth(payload)
            head = _head_decode(payload)
            cmd, req_id = head.cmd, head.reqId
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        except (msgspec.MsgspecError, RecursionError):
            try:
                frame = decode_request(payload)  # at most 64 KiB: says exactly what is wrong
            except ProtocolError as exc:
                self._protocol_error(exc)
                return
            cmd, req_id = frame["cmd"], frame.get("reqId")
        if cmd not in PRE_AUTH_COMMANDS:
            reply: dict[str, Any] = {"ok": False, "code": ErrorCode.AUTH_REQUIRED.value,
                                     "error": "authenticate with Auth {token} first"}
            if req_id is not None:
                reply["reqId"] = req_id
            self.send_frame(reply)
            return
        if frame is None:
            try:
                frame = decode_request(payload)
            except ProtocolError as exc:
                self._protocol_error(exc)
                return
        self._inflight += 1
        try:
            self.dispatcher.handle(self, frame)
        except CommandError as exc:
            if exc.code is ErrorCode.AUTH_FAILED:
                self._auth_failed(req_id, exc)
            else:
                self.reply_error(req_id, exc)

    def _auth_failed(self, req_id: Any, exc: CommandError) -> None:
        """A wrong token: answer after a growing delay (reading paused meanwhile); the last closes."""
        self._auth_failures += 1
        failures = self._auth_failures
        self._auth_wait = True
        self._set_reading()

        def answer() -> None:
            if self.closed:
                return
            self._auth_wait = False
            if failures >= AUTH_FAILURES_MAX:
                self.reply_error(req_id, CommandError(
                    ErrorCode.AUTH_FAILED, f"invalid token ({failures} wrong tokens: closing the connection)"))
                self._close_after_flush = True
                self._flush()
                return
            self.reply_error(req_id, exc)
            self._set_reading()
            self._pre_auth_pump()

        delay = AUTH_FAIL_DELAYS_S[min(failures, len(AUTH_FAIL_DELAYS_S)) - 1]
        self.loop.call_later(delay, answer)

    def check_deadlines(self, now: float, frame_timeout_s: float, idle_s: float) -> None:
        """Close this connection if a frame has been arriving for too long, or if it has stayed
        unauthenticated and silent for too long (called by the node's guard every ~0.5 s)."""
        if self.closed:
            return
        if self.partial_since and now - self.partial_since > frame_timeout_s:
            self._refuse_and_close(ErrorCode.TIMEOUT, f"a frame did not arrive whole within {frame_timeout_s:g} s "
                                                      "of its first byte (limits.frame_timeout_ms)")
        elif not self.authed and now - self.last_frame_at > idle_s:
            self._refuse_and_close(ErrorCode.AUTH_REQUIRED, f"no Auth within {idle_s:g} s "
                                                            "(limits.unauthenticated_idle_ms)")

    def _refuse_and_close(self, code: ErrorCode, message: str) -> None:
        self._backlog.clear()
        self.send_frame({"ok": False, "code": code.value, "error": message})
        self._close_after_flush = True
        self._flush()
        self.closed = True  # nothing read after this is dispatched

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
        # Output over its high-water mark stops dispatch too: replies a read answers at once (GetJob
        # of a large job) would otherwise pile up in memory before the transport can say so.
        while (backlog and self._inflight < self.inflight_max and not self.closed
               and not self._write_paused and self._out_bytes < self._output_high):
            frame = backlog.popleft()
            kind = type(frame)
            if kind is PlainPush:
                if self.authed:
                    self._pump_pushes(frame)
                    continue
                frame = frame.to_frame(Raw)  # the general path answers AUTH_REQUIRED
            elif kind is PlainBulk:
                if self.authed:
                    self._pump_bulk(frame)
                    continue
                frame = frame.to_frame(Raw)
            self._inflight += 1
            req_id = frame.get("reqId")
            if req_id is None:
                req_id = frame["reqId"] = f"{ORDER_PREFIX}{self._order_given}"
                self._order_given += 1
            elif type(req_id) is str and req_id[:1] == ORDER_PREFIX:
                self.reply_error(req_id[1:], CommandError(ErrorCode.INVALID, "reqId: may not start with NUL"))
                continue
            answer_guarded(self.dispatcher.handle, self, frame, req_id)
        if not backlog:
            self._backlog_bytes = 0
        if self._paused and len(backlog) < _BACKLOG_PAUSE_FRAMES // 2 and not self._write_paused:
            self._set_reading()

    def _pump_bulk(self, bulk: PlainBulk) -> None:
        """Dispatch a plain PUSHB (:meth:`~shoal.node.dispatch.Dispatcher.handle_bulk`)."""
        self._inflight += 1
        req_id = bulk.reqId
        if req_id is None:
            req_id = bulk.reqId = f"{ORDER_PREFIX}{self._order_given}"
            self._order_given += 1
        elif type(req_id) is str and req_id[:1] == ORDER_PREFIX:
            self.reply_error(req_id[1:], CommandError(ErrorCode.INVALID, "reqId: may not start with NUL"))
            return
        try:
            self.dispatcher.handle_bulk(self, bulk)
        except CommandError as exc:
            self.reply_error(req_id, exc)
        except Exception as exc:
            log.exception("dispatch failed for a PUSHB")
            self.reply_error(req_id, CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))

    def _pump_pushes(self, frame: PlainPush) -> None:
        """Dispatch ``frame`` with the plain PUSHes to its queue right behind it, as free slots allow."""
        block = take_block(frame, self._backlog, self.inflight_max - self._inflight - 1)
        self._inflight += len(block)
        for push in block:
            req_id = push.reqId
            if req_id is None:
                push.reqId = f"{ORDER_PREFIX}{self._order_given}"
                self._order_given += 1
            elif type(req_id) is str and req_id[:1] == ORDER_PREFIX:
                # Refused through the dispatcher's own check path: an id no reply can carry.
                push.reqId = f"{ORDER_PREFIX}{self._order_given}"
                self._order_given += 1
        try:
            self.dispatcher.handle_pushes(self, block)
        except Exception as exc:
            log.exception("dispatch failed for a block of %d PUSH", len(block))
            error = CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            for f in block:
                self.reply_error(f.reqId, error)

    def upgrade(self, version: int) -> None:
        """``Hello``: protocol v2 adds topology events."""
        if version >= 2:
            self.protocol_version = 2

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        """Send a successful reply to one command and let the next one run."""
        frame = {"ok": True, **body}
        if req_id is not None:
            frame["reqId"] = req_id
        self._finish(frame)

    def reply_encoded(self, req_id: Any, body: bytes) -> None:
        """Send a reply encoded elsewhere (by the leader a command was forwarded to), and let
        the next command run. ``body`` carries ``req_id`` already, unless it holds a place in
        the reply order, which is stripped here."""
        self._inflight -= 1
        if self.closed:
            return
        if type(req_id) is str and req_id[:1] == ORDER_PREFIX:
            frame = decode_response(body)
            frame.pop("reqId", None)
            self._send_ordered(req_id, encode(frame, frame_bytes_max=self.frame_bytes_max))
        else:
            self._out.append(len(body).to_bytes(4, "big") + body)
            self._out_bytes += len(body) + 4
            self._schedule_flush()
        if self._backlog:
            self._pump()

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        """Answer commands that completed together: per command a reply dict or a CommandError."""
        self.dispatcher.metrics.observe(cmd, seconds, len(req_ids))
        self._inflight -= len(req_ids)
        if self.closed:
            return
        # Encoded at flush time, so the pump below dispatches the next commands waiting
        # here (into the partition's next entry) before these replies are built.
        self._deferred.append((req_ids, results))
        self._schedule_flush()
        if self._backlog:
            self._pump()

    def _encode_replies(self, req_ids: list[Any], results: list[Any]) -> None:
        ordered = [i for i, r in enumerate(req_ids) if type(r) is str and r[:1] == ORDER_PREFIX]
        if ordered:
            for i in ordered:
                result = results[i]
                frame = {"ok": True, **result} if type(result) is dict else result.to_reply()
                self._send_ordered(req_ids[i], self._encode_frame(frame))
            keep = set(ordered)
            req_ids = [r for i, r in enumerate(req_ids) if i not in keep]
            results = [r for i, r in enumerate(results) if i not in keep]
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
            req_id = frame.get("reqId")
            if type(req_id) is str and req_id[:1] == ORDER_PREFIX:
                del frame["reqId"]
                self._send_ordered(req_id, self._encode_frame(frame))
            else:
                self.send_frame(frame)
            if self._backlog:
                self._pump()

    def _send_ordered(self, place: str, data: bytes) -> None:
        """Send the reply of the frame at ``place`` in the reply order once every earlier one has
        gone (frames without a reqId are answered in the order they came)."""
        n = int(place[1:])
        held = self._order_held
        if n != self._order_sent:
            held[n] = data
            return
        self._out.append(data)
        self._out_bytes += len(data)
        n += 1
        while n in held:
            data = held.pop(n)
            self._out.append(data)
            self._out_bytes += len(data)
            n += 1
        self._order_sent = n
        self._schedule_flush()

    def _encode_frame(self, frame: dict[str, Any]) -> bytes:
        try:
            return encode(frame, frame_bytes_max=self.frame_bytes_max)
        except ProtocolError as exc:
            return encode({"ok": False, "error": f"reply could not be sent: {exc}", "code": exc.code.value})

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
        self._out_bytes += len(data)
        self._schedule_flush()

    def send_encoded(self, data: bytes) -> None:
        """Queue frames encoded once for many connections (events): one or more length-prefixed frames."""
        if self.closed:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.dispatcher.writes.add(self)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            if not self.closed:
                for req_ids, results in deferred:
                    self._encode_replies(req_ids, results)
        if self._out and self.transport is not None and not self.closed:
            out, self._out = self._out, []
            self._out_bytes = 0
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
            if self._write_paused and self.transport.get_write_buffer_size() > self._output_max:
                # Replies and events keep coming for a client that does not read: cut it off.
                log.warning("connection %d from %s: %d bytes unsent (limits.output_max_bytes): closing",
                            self.conn_id, self.peer_host, self.transport.get_write_buffer_size())
                self.closed = True
                self.transport.abort()
                return
        if self._close_after_flush and self.transport is not None:
            self.transport.close()
        elif self._backlog and not self._write_paused and not self.closed:
            self._pump()  # dispatch had stopped at the output mark; the transport took it

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
