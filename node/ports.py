"""What the dispatcher needs of the rest of the node, as small protocols.

The dispatcher sits below the connections and the server: it is handed these
and never imports them. :class:`~shoal.node.connection.ClientConnection` and
:class:`~shoal.node.http.conn.HttpConnection` are :class:`Replier` s; the
server's ``Node`` is the :class:`PartitionDirectory` and the :class:`NodeInfo`;
its ``NodeMetrics`` the :class:`Metrics`; :class:`~shoal.node.clock.WallClock`
the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .clock import Clock

if TYPE_CHECKING:
    from shoal.cluster.errors import CommandError
    from shoal.cluster.topology import Topology

    from .group_commit import GroupCommit
    from .raft import PartitionReplica

__all__ = ["Clock", "Replier", "PartitionDirectory", "NodeInfo", "Metrics", "FlowHandler", "EventListener"]

#: Receives published job events (the dashboard's and the HTTP streams' listeners).
EventListener = Callable[[list[dict[str, Any]]], None]


class Replier(Protocol):
    """One client link as the dispatcher sees it: who it is, and how to answer it."""

    conn_id: int
    peer_host: str
    session: str
    authed: bool
    closed: bool
    protocol_version: int
    subscriptions: set[str] | None

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        """Answer one command with its reply fields."""

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        """Answer one command with an error."""

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        """Answer commands that completed together (per command a reply dict or a CommandError)."""

    def send_frame(self, frame: dict[str, Any]) -> None:
        """Send a frame that answers no command (an event)."""

    def upgrade(self, version: int) -> None:
        """Switch to the protocol version ``Hello`` agreed on."""


class PartitionDirectory(Protocol):
    """The partitions this node hosts: their replicas and write paths, and who leads the others."""

    @property
    def replicas(self) -> Mapping[int, PartitionReplica]: ...

    @property
    def group_commits(self) -> Mapping[int, GroupCommit]: ...

    def not_leader_error(self, p: int) -> CommandError:
        """The refusal for a command on partition ``p``, which this node does not lead."""
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
