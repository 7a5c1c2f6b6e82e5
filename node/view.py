"""The node as its edge modules see it: one protocol, so nothing below the server imports it.

The HTTP package, the memory guard, the metrics collector and the worker simulation read
the node's parts through :class:`NodeView`; the server's ``Node`` is the one implementation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from shoal.cluster.config import ClusterConfig
    from shoal.cluster.errors import CommandError
    from shoal.cluster.topology import Topology

    from .cluster_map import ClusterMap
    from .dispatch import Dispatcher
    from .moves import MoveService
    from .metrics import NodeMetrics
    from .partition import Partition
    from .ports import EventListener
    from .raft.storage import NodeStorage
    from .raft.transport import RaftNetwork
    from .relay import Relay

__all__ = ["NodeView", "MemoryReport"]


class MemoryReport(Protocol):
    """The memory guard, as ``/stats`` reads it."""

    def memory(self) -> dict[str, Any]:
        """The node's memory figures (RSS, budget, whether new jobs are refused)."""
        ...


class NodeView(Protocol):
    """One running node: its configuration, partitions, dispatcher, metrics and clock."""

    config: "ClusterConfig"
    loop: asyncio.AbstractEventLoop
    node_id: str
    incarnation: str
    topology: "Topology"
    partitions: "Mapping[int, Partition]"
    dispatcher: "Dispatcher"
    metrics: "NodeMetrics"
    event_listeners: "list[EventListener]"
    stopping: bool
    storage: "NodeStorage | None"
    guard: MemoryReport
    cluster_map: "ClusterMap"
    moves: "MoveService"
    #: The links to the other nodes (None before the node starts them), and the relay that
    #: forwards commands over them (None on a node that forwards nothing).
    raft_network: "RaftNetwork | None"
    relay: "Relay | None"

    def now_ms(self) -> int:
        """The node's clock (see :mod:`~shoal.node.clock`)."""
        ...

    def local_stats(self, partition: Any = None) -> dict[str, Any]:
        """Diagnostics of every hosted replica."""
        ...

    def not_leader_error(self, p: int) -> "CommandError":
        """The refusal for a command on partition ``p``, which this node does not lead."""
        ...

    def events_wanted(self) -> None:
        """A listener came: the led engines record job events from now on."""
