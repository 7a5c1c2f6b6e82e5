"""A partition another node leads, as the dispatcher sees it: :class:`RemotePartition`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from shoal.cluster.codec import Raw

if TYPE_CHECKING:
    from shoal.cluster.codec import PlainBulk, PlainPush

__all__ = ["RemotePartition", "Forwarder"]


class Forwarder(Protocol):
    """What takes commands to a partition's leader on another node (the node's
    :class:`~shoal.node.relay.Relay`); ``conn`` is a :class:`~shoal.node.ports.Replier`."""

    def forward(self, conn: Any, frame: dict[str, Any], p: int, away: bool = False) -> None: ...

    def forward_pushes(self, conn: Any, frames: list[PlainPush], p: int, away: bool = False) -> None: ...

    def forward_received(self, conn: Any, frame: dict[str, Any], body: bytes, p: int, custom_ids: bool) -> None: ...


class RemotePartition:
    """Partition ``id``, led by another node: what is submitted goes to its leader.

    It takes what :class:`~.partition.Partition` takes, with the same calls, so the dispatcher
    routes a command without asking where its partition is led: the relay sends it to the
    leader it knows (and on to the next one after a leadership change, or back to this node's
    own partition if this node comes to lead it), and the leader's reply goes to the
    connection as the leader encoded it.
    """

    __slots__ = ("id", "_forwarder")

    def __init__(self, p: int, forwarder: Forwarder) -> None:
        self.id = p
        self._forwarder = forwarder

    def submit(self, conn: Any, frame: dict[str, Any], away: bool = False) -> None:
        """Send a validated command of this partition to its leader; its reply goes to ``conn``.

        ``away``: this node refused it unproposed as it stopped leading the partition (see
        :meth:`~shoal.node.relay.Relay.forward`). Raises ``CommandError`` when it cannot be
        sent at all (too many forwarded commands in flight, a frame that cannot be encoded)."""
        self._forwarder.forward(conn, frame, self.id, away)

    def submit_pushes(self, conn: Any, frames: list[PlainPush], away: bool = False) -> None:
        """Send a block of plain PUSHes to one queue of this partition to its leader as one
        message; each push's reply goes to ``conn``."""
        self._forwarder.forward_pushes(conn, frames, self.id, away)

    def submit_received(self, conn: Any, frame: dict[str, Any], body: bytes, custom_ids: bool) -> None:
        """Send a command to this partition's leader as its client sent it (``body``; ``frame``
        is its decoded, unchecked form): the leader checks it, and gives each job of an add
        without a key or custom id the forwarding node's key. ``custom_ids``: some job may carry
        one, which this node then learns the partition of."""
        self._forwarder.forward_received(conn, frame, body, self.id, custom_ids)

    def submit_bulk(self, conn: Any, bulk: PlainBulk, batch: object = None) -> None:
        """Send a plain PUSHB to this partition's leader as its client sent it (the leader checks
        it and makes its own ``batch``); its reply goes to ``conn``."""
        self._forwarder.forward_received(conn, bulk.to_frame(Raw), bulk.body, self.id, False)
