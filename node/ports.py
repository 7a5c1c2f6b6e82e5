"""What the dispatcher needs of the rest of the node, as small protocols.

The dispatcher sits below the connections and the server: it is handed these
and never imports them. :class:`~shoal.node.connection.ClientConnection` and
:class:`~shoal.node.http.conn.HttpConnection` are :class:`Replier` s; the
server's ``Node`` is the :class:`PartitionDirectory` and the :class:`NodeInfo`;
its ``NodeMetrics`` the :class:`Metrics`; :class:`~shoal.node.clock.WallClock`
the clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from shoal.cluster.codec import FrameDecoder, PlainBulk, PlainPush, decode_response
from shoal.cluster.errors import CommandError, ErrorCode, ProtocolError

from .clock import Clock

if TYPE_CHECKING:
    from shoal.cluster.config import ClusterConfig
    from shoal.cluster.topology import Topology

    from .locator import JobLocator
    from .partition import Partition
    from .sessions import SessionTable

__all__ = ["Clock", "Replier", "DecodingReplier", "PartitionDirectory", "NodeInfo", "Metrics", "FlowHandler",
           "EventListener", "CommandHandler", "error_of_reply", "error_of", "answer_guarded"]

log = logging.getLogger(__name__)

#: Receives published job events (the dashboard's and the HTTP streams' listeners).
EventListener = Callable[[list[dict[str, Any]]], None]


class Replier(Protocol):
    """One client link as the dispatcher sees it: who it is, and how to answer it.

    ``wants_forwarding``: commands for partitions this node does not lead go to their leader
    through the relay (a client that does not route for itself); otherwise they are refused
    with ``NOT_LEADER``. ``subscriptions``: the queues of Shoal's ``Subscribe`` (None: none);
    ``bunqueue_subscriptions``: the queues of bunqueue's ``SubscribeEvents``;
    ``bunqueue_envelope``: its adds are read as bunqueue's server reads them, a job's name from
    its data when the add names none (:func:`~.bunqueue.open_envelope`; bunqueue's clients).
    """

    conn_id: int
    peer_host: str
    session: str
    authed: bool
    closed: bool
    protocol_version: int
    subscriptions: set[str] | None
    wants_forwarding: bool
    bunqueue_subscriptions: set[str] | None
    bunqueue_envelope: bool

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        """Answer one command with its reply fields."""

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        """Answer one command with an error."""

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        """Answer commands that completed together (per command a reply dict or a CommandError)."""

    def reply_encoded(self, req_id: Any, body: bytes) -> None:
        """Answer one command with a reply frame encoded elsewhere (by the leader it was forwarded to)."""

    def send_frame(self, frame: dict[str, Any]) -> None:
        """Send a frame that answers no command (an event)."""

    def send_encoded(self, data: bytes) -> None:
        """Send frames encoded once for many links (events): one or more, each length-prefixed."""

    def upgrade(self, version: int) -> None:
        """Switch to the protocol version ``Hello`` agreed on."""


def error_of_reply(body: bytes) -> CommandError:
    """The error an encoded error reply carries (``INTERNAL`` if it cannot be read)."""
    try:
        frame = decode_response(body)
    except (ProtocolError, ValueError):
        return CommandError(ErrorCode.INTERNAL, "undecodable reply from the leader")
    return error_of(frame)


def error_of(frame: dict[str, Any]) -> CommandError:
    """The error an error reply (decoded) carries (``INTERNAL`` if its code is unknown)."""
    try:
        code = ErrorCode(frame.get("code", ErrorCode.INTERNAL.value))
    except ValueError:
        return CommandError(ErrorCode.INTERNAL, "undecodable reply from the leader")
    extra = {k: v for k, v in frame.items() if k not in ("ok", "code", "error", "reqId")}
    return CommandError(code, str(frame.get("error", "")), **extra)


def answer_guarded(handle: Callable[[Any, dict[str, Any]], None], conn: Replier, frame: dict[str, Any],
                   req_id: Any) -> None:
    """Run ``handle(conn, frame)`` (the dispatcher's, or a peer command's handler); a refusal is
    answered to ``conn`` as ``req_id``'s error reply, and anything unexpected is logged and
    answered ``INTERNAL``: a bug in one command must not take a connection, a peer's link or
    the HTTP server down."""
    try:
        handle(conn, frame)
    except CommandError as exc:
        conn.reply_error(req_id, exc)
    except Exception as exc:
        log.exception("command %s failed", frame.get("cmd"))
        conn.reply_error(req_id, CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))


class DecodingReplier:
    """The encoded half of :class:`Replier` for a link that takes reply dicts and event dicts
    only (HTTP, a command a peer forwarded): encoded frames are decoded and handed to
    ``reply``/``reply_error``/``send_frame``."""

    __slots__ = ()

    wants_forwarding = False
    bunqueue_subscriptions: set[str] | None = None
    bunqueue_envelope = False

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        raise NotImplementedError

    def send_frame(self, frame: dict[str, Any]) -> None:
        raise NotImplementedError

    def reply_encoded(self, req_id: Any, body: bytes) -> None:
        """Decode ``body`` and answer with it (its own ``reqId`` is dropped for ``req_id``)."""
        frame = decode_response(body)
        if frame.get("ok") is False:
            self.reply_error(req_id, error_of_reply(body))
            return
        frame.pop("ok", None)
        frame.pop("reqId", None)
        self.reply(req_id, frame)

    def send_encoded(self, data: bytes) -> None:
        """Decode the frames of ``data`` and send each."""
        for frame in FrameDecoder(requests=False).drain(data):
            self.send_frame(frame)


class CommandHandler(Protocol):
    """What the relay needs of the dispatcher: it answers the commands peers forward here,
    keeps the sessions, and learns where custom job ids live."""

    @property
    def sessions(self) -> SessionTable: ...

    @property
    def directory(self) -> PartitionDirectory: ...

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def locator(self) -> JobLocator: ...

    def handle(self, conn: Replier, frame: dict[str, Any]) -> None:
        """Answer ``frame`` now or later through ``conn``."""

    def handle_pushes(self, conn: Replier, frames: list[PlainPush]) -> None:
        """Answer a block of plain PUSHes to one queue, each through ``conn``."""

    def handle_bulk(self, conn: Replier, bulk: PlainBulk) -> None:
        """Answer a plain PUSHB (its jobs carry only ``data`` and maybe an ``idempotencyKey``) through ``conn``."""


class PartitionDirectory(Protocol):
    """The partitions this node hosts (each with its replica, write path and parked commands),
    and who leads the others."""

    @property
    def partitions(self) -> Mapping[int, Partition]: ...

    def not_leader_error(self, p: int) -> CommandError:
        """The refusal for a command on partition ``p``, which this node does not lead."""
        ...

    def leads(self, p: int) -> bool:
        """This node's replica of partition ``p`` leads its group now (the topology may still
        name this node after it stopped, or not yet once it started)."""
        ...


class NodeInfo(Protocol):
    """What the node-level commands report or start."""

    @property
    def node_id(self) -> str: ...

    @property
    def incarnation(self) -> str:
        """This node's incarnation (:mod:`shoal.node.identity`)."""
        ...

    @property
    def topology(self) -> Topology: ...

    @property
    def event_listeners(self) -> list[EventListener]: ...

    def local_stats(self, partition: Any = None) -> dict[str, Any]:
        """Diagnostics of every hosted replica (``Stats {local: true}``)."""
        ...

    def events_wanted(self) -> None:
        """A subscriber came: the led engines record job events from now on."""


class Metrics(Protocol):
    """Where command latencies go, and the ``Prometheus`` command's text."""

    def observe(self, cmd: str, seconds: float, n: int = 1) -> None:
        """Record the latency of ``n`` commands answered together."""

    def exposition(self) -> str:
        """The Prometheus text exposition of the node's metrics."""
        ...


class FlowHandler(Protocol):
    """The node's flow service: the commands it answers and how it takes one."""

    @property
    def commands(self) -> frozenset[str]:
        """The command names the dispatcher hands to :meth:`handle`."""
        ...

    def handle(self, conn: Replier, frame: dict[str, Any]) -> None:
        """Answer ``frame`` (now or later) through ``conn``."""
