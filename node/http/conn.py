"""A pseudo-connection so HTTP requests, WebSockets and push streams run every command through
the same :class:`~shoal.node.dispatch.Dispatcher` as the binary protocol (validation, routing,
group commit, long polls, sessions): no second implementation of any command.

It offers what the dispatcher uses of :class:`~shoal.node.connection.ClientConnection`
(``reply``, ``reply_error``, ``send_frame``, ``upgrade`` and the attributes ``session``,
``conn_id``, ``authed``, ``closed``, ``subscriptions``, ``protocol_version``); each
:meth:`HttpConnection.call` parks an asyncio future that the reply resolves.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shoal.cluster.errors import CommandError, ErrorCode

from ..ports import DecodingReplier, answer_guarded

if TYPE_CHECKING:
    from ..dispatch import Dispatcher
    from ..metrics import NodeMetrics

__all__ = ["HttpConnection"]

_ids = itertools.count(1 << 40)  # far from the binary connections' ids, so logs never mix them up


class HttpConnection(DecodingReplier):
    """Implements what the dispatcher needs of a connection; replies resolve futures.

    One instance serves one REST request, one ``/work`` stream or one WebSocket. It has a
    session of its own, so the leases it takes are its own (see :meth:`close`).
    """

    def __init__(self, dispatcher: "Dispatcher", metrics: "NodeMetrics", *, authed: bool = True,
                 protocol_version: int = 2,
                 on_event: Callable[[dict[str, Any]], None] | None = None, kept_leases: bool = False,
                 forwards: bool = False) -> None:
        """``kept_leases``: a REST request, whose pulled leases live to their ttr (see :meth:`close`);
        ``forwards``: commands for partitions led elsewhere go to their leader over the node link
        (a REST request's; streams are relayed by :mod:`.forward`)."""
        self.dispatcher = dispatcher
        self.conn_id = next(_ids)
        #: REST requests are limited per address by the HTTP guard; the dispatcher does not count them.
        self.peer_host = ""
        self.session = dispatcher.sessions.new_session_id(kept=kept_leases)
        # REST authenticates each request in a middleware before it gets here; a WebSocket
        # opened without a header starts unauthenticated and sends Auth like a binary client.
        self.authed = authed
        self.closed = False
        self.subscriptions: set[str] | None = None
        self.protocol_version = protocol_version
        self.on_event = on_event
        self.wants_forwarding = forwards
        self._metrics = metrics
        self._waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next = itertools.count(1)
        dispatcher.sessions.attach(self.session, self.conn_id)

    def upgrade(self, version: int) -> None:
        """``Hello`` over a WebSocket: v2 lets its commands run concurrently."""
        self.protocol_version = max(1, min(2, version))

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Run one command; returns the reply frame (``ok`` true or false, no ``reqId``)."""
        if self.closed:
            return CommandError(ErrorCode.SHUTTING_DOWN, "connection closed").to_reply()
        req_id = next(self._next)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[req_id] = fut
        metrics = self._metrics
        metrics.http_inflight += 1
        started = time.perf_counter()
        try:
            answer_guarded(self.dispatcher.handle, self, {**frame, "reqId": req_id}, req_id)  # type: ignore[arg-type]
            return await fut
        finally:
            metrics.http_inflight -= 1
            self._waiters.pop(req_id, None)
            metrics.observe_http_command(str(frame.get("cmd")), time.perf_counter() - started)

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        fut = self._waiters.pop(req_id, None)
        if fut is not None and not fut.done():
            fut.set_result({"ok": True, **body})

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        fut = self._waiters.pop(req_id, None)
        if fut is not None and not fut.done():
            fut.set_result(exc.to_reply())

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        """Answer commands that completed together (per command a reply dict or a CommandError)."""
        for req_id, result in zip(req_ids, results, strict=True):
            if isinstance(result, CommandError):
                self.reply_error(req_id, result)
            else:
                self.reply(req_id, result)

    def send_frame(self, frame: dict[str, Any]) -> None:
        """Unsolicited frames (``Subscribe`` events) go to ``on_event``; replies never come here."""
        if self.on_event is not None and not self.closed:
            self.on_event(frame)

    def close(self, *, release_now: bool = False, keep_leases: bool = False) -> None:
        """Detach from the session.

        ``release_now`` ends it at once (push streams, and requests whose client went away:
        their leases go back to the queue immediately); ``keep_leases`` leaves its leases to
        their ttr (a REST pull hands the lease to a client that acks later on another request);
        otherwise the node's usual session grace applies (WebSockets, like binary connections).
        """
        if self.closed:
            return
        self.closed = True
        self.dispatcher.subscribers.discard(self)  # type: ignore[arg-type]
        sessions = self.dispatcher.sessions
        if release_now:
            sessions.end_now(self.session, self.conn_id)
        elif keep_leases:
            sessions.forget(self.session, self.conn_id)
        else:
            sessions.detach(self.session, self.conn_id)
        relay = self.dispatcher.relay
        if self.wants_forwarding and relay is not None:  # the same ending at the leaders it forwarded to
            relay.connection_closed(self, "now" if release_now else "kept" if keep_leases else None)
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_result(CommandError(ErrorCode.SHUTTING_DOWN, "request cancelled").to_reply())
        self._waiters.clear()
