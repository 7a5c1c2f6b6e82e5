"""The node's Raft port: one authenticated connection per node pair, every partition over it.

:class:`RaftNetwork` listens on the node's one ``raft_port`` and keeps one link
to every peer. Of each pair, the node listed later in the cluster's node list
dials, the other accepts, so a pair never holds two links. A link first runs
the :mod:`.handshake` (nothing else is read before it succeeds, and its frames
are tiny); after it, frames are authenticated (:mod:`._frames`) and carry
MessagePack arrays of ``(partition, message)`` pairs. With TLS configured the
link is mutual TLS first (both sides present a certificate the cluster's CA
signed) and the handshake runs inside it.

Sending queues the message on the peer's link. Queued messages are written,
one frame per peer, at the end of the callback that produced them when that
callback is a proposal or a received frame (:meth:`RaftNetwork.hold` /
:meth:`RaftNetwork.release`: a new entry or an answer leaves at once, since a
pipelined client waits for the round trip), and otherwise once per loop
iteration, so the heartbeats of many partitions that tick together cost one
write. A tick a received frame asks for (an acknowledgement moves the commit
index) runs at the end of that frame, before its answers are written, rather
than in a loop callback of its own. A peer that stops draining gets at most
:data:`SEND_BUFFER_BYTES_MAX` buffered; beyond that messages to it are dropped
(Raft resends what a follower lacks) rather than held, and reading from it goes
on, so two nodes that both fall behind cannot deadlock each other.

:class:`PartitionTransport` is pysyncobj's ``Transport`` extension point for one
partition: it forwards sends to the network and receives the partition's
messages from it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ._frames import FrameError, FrameOpener, FrameSealer, array_header
from ._pysyncobj import Node, Transport
from .handshake import Established, Handshake, HandshakeFailed, RejectReason, Role, SendBytes

__all__ = ["RaftNetwork", "PartitionTransport", "PeerAddress", "FRAME_BYTES_MAX", "SEND_BUFFER_BYTES_MAX"]

log = logging.getLogger(__name__)

#: The largest authenticated frame a link accepts (a batch of entries is at most 8 MiB).
FRAME_BYTES_MAX = 64 * 1024 * 1024
#: A frame is sealed and written early once this much is queued for one peer.
FRAME_SPLIT_BYTES = 4 * 1024 * 1024
#: Above this much unsent data for one peer, further messages to it are dropped.
SEND_BUFFER_BYTES_MAX = 64 * 1024 * 1024
SEND_BUFFER_HIGH_WATER = 8 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 5.0
#: Accepted connections still in their handshake; more are closed at once.
HANDSHAKES_PENDING_MAX = 64
CONNECT_TIMEOUT_S = 2.0
RETRY_MIN_S = 0.1
RETRY_MAX_S = 1.0
#: A refused peer address is logged at most once per this period.
REFUSAL_LOG_PERIOD_S = 10.0
_REFUSAL_ADDRESSES_MAX = 1024

#: (host, port) a peer is dialled at.
PeerAddress = tuple[str, int]

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class _Link(asyncio.Protocol):
    """One TCP connection to a peer: handshake first, then authenticated frames."""

    def __init__(self, network: "RaftNetwork", role: Role, peer_id: str | None) -> None:
        self.network = network
        self.role = role
        self.peer_id = peer_id
        self.node: Any = None
        self.transport: asyncio.Transport | None = None
        self.address = "?"
        self.established = False
        self.closed: asyncio.Future[None] = network.loop.create_future()
        self._handshake: Handshake | None = None
        self._opener: FrameOpener | None = None
        self._sealer: FrameSealer | None = None
        self._timeout: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._paused = False
        self._counted = False

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.network.handshakes_pending -= 1

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's transports are not subclasses)
        peer = transport.get_extra_info("peername")
        self.address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=SEND_BUFFER_HIGH_WATER)
        net = self.network
        if self.role is Role.LISTENER:
            if net.handshakes_pending >= HANDSHAKES_PENDING_MAX:
                net.refused(self.address, None, HandshakeFailed(RejectReason.BAD_FRAME, "too many pending handshakes"))
                transport.close()
                return
            net.handshakes_pending += 1
            self._counted = True
        self._handshake = Handshake(self.role, net.node_id, net.secret, net.cluster_id, peer_id=self.peer_id,
                                    known_peers=net.peer_ids)
        self._timeout = net.loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timed_out)
        self._pump_handshake()

    def data_received(self, data: bytes) -> None:
        opener = self._opener
        if opener is not None:
            try:
                frames = opener.feed(data)
            except FrameError as exc:
                log.warning("raft link %s (%s): %s; closing", self.peer_id, self.address, exc)
                self.close()
                return
            net = self.network
            net.hold()
            try:
                for items in frames:
                    net.deliver(self.node, items)
            finally:
                net.release()  # the ticks this frame asked for run, its answers leave: one frame per peer
            return
        hs = self._handshake
        if hs is None:
            return
        try:
            hs.receive_data(data)
        except HandshakeFailed as exc:
            self._refuse(exc)
            return
        self._pump_handshake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        if self._timeout is not None:
            self._timeout.cancel()
        self._handshake = None
        self._opener = None
        if self.established:
            self.network.link_lost(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False

    # --- handshake -------------------------------------------------------------------------------

    def _pump_handshake(self) -> None:
        hs = self._handshake
        transport = self.transport
        while hs is not None and transport is not None:
            event = hs.next_event()
            if isinstance(event, SendBytes):
                transport.write(event.data)
            elif isinstance(event, Established):
                self._established(event)
                return
            else:
                return

    def _established(self, event: Established) -> None:
        self._uncount()
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        self._handshake = None
        self.peer_id = event.peer_id
        self.node = self.network.node_of(event.peer_id)
        self._sealer = FrameSealer(event.send_key)
        self._opener = FrameOpener(event.recv_key, FRAME_BYTES_MAX, _decode)
        self.established = True
        self.network.link_established(self)
        if event.rest:
            self.data_received(event.rest)

    def _refuse(self, exc: HandshakeFailed) -> None:
        claimed = self.peer_id or (self._handshake.peer_id if self._handshake is not None else None)
        self.network.refused(self.address, claimed, exc)
        if self.transport is not None and not exc.remote and self._handshake is not None:
            self.transport.write(self._handshake.reject_frame(exc.reason))
        self.close()

    def _handshake_timed_out(self) -> None:
        self._timeout = None
        if not self.established:
            self.network.refused(self.address, self.peer_id,
                                 HandshakeFailed(RejectReason.BAD_FRAME, "handshake not finished in time"))
            self.close()

    # --- sending ---------------------------------------------------------------------------------

    def queue(self, partition: int, message: Any) -> bool:
        """Queue one message; written with everything else queued in this loop iteration."""
        if self._paused and self.transport is not None \
                and self.transport.get_write_buffer_size() + self._out_bytes > SEND_BUFFER_BYTES_MAX:
            self.network.dropped += 1
            return False
        data = _encode((partition, message))
        out = self._out
        if not out:
            self.network.queued(self)
        out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FRAME_SPLIT_BYTES:
            self.flush()
        return True

    def flush(self, after: bool = True) -> bool:
        """Seal and write everything queued as one frame; True when one was written.

        ``after=False`` leaves the network's ``after_flush`` to the caller, which writes
        to the other peers first (:meth:`RaftNetwork.flush_queued`).
        """
        out = self._out
        if not out or self._sealer is None or self.transport is None or self.transport.is_closing():
            return False
        barrier = self.network.before_flush
        if barrier is not None:
            barrier()  # answers and entries leave only once the journals they vouch for are synced
        self._out = []
        self._out_bytes = 0
        out.insert(0, array_header(len(out)))
        self.transport.writelines(self._sealer.seal(out))
        self.network.frames_sent += 1
        hook = self.network.after_flush
        if after and hook is not None:
            hook()  # a leader's own copy of what it just sent becomes durable before anything else runs
        return True

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class RaftNetwork:
    """One node's Raft port and its links to every peer (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str, cluster_id: str, secret: bytes,
                 bind: PeerAddress, peers: dict[str, PeerAddress], dial: set[str],
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> None:
        self.loop = loop
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.secret = secret
        self.bind = bind
        self.peers = dict(peers)
        self.peer_ids = frozenset(peers)
        self._dial = set(dial)
        self._nodes = {peer: Node(peer) for peer in peers}
        self.links: dict[str, _Link] = {}
        self._partitions: dict[int, PartitionTransport] = {}
        self._pending: list[_Link] = []
        self._flush_scheduled = False
        #: Above 0 while a caller that flushes when done is running (a received frame, a
        #: proposal): what it queues needs no flush callback of its own.
        self.holding = 0
        self._deferred_ticks: list[Callable[[], None]] = []
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._refusals: dict[str, float] = {}
        self._closed = False
        #: Mutual TLS for the links when set, as (listening side, dialling side) contexts; the
        #: secret's handshake runs inside it either way.
        self.tls = tls
        self.handshakes_pending = 0
        self.frames_sent = 0
        self.dropped = 0
        self.refused_count = 0
        #: Called before any frame is written (the node's journal sync barrier, storage.py).
        self.before_flush: Callable[[], None] | None = None
        #: Called right after a frame is written (the leaders' journal syncs, storage.py).
        self.after_flush: Callable[[], None] | None = None
        #: Side channels (:meth:`register_channel`): name -> (handler, on peer lost).
        self._channels: dict[str, tuple[Callable[[str, Any], None], Callable[[str], None] | None]] = {}

    def node_of(self, peer_id: str) -> Any:
        """The pysyncobj node object that stands for ``peer_id`` in every group."""
        return self._nodes[peer_id]

    @property
    def self_node(self) -> Any:
        return Node(self.node_id)

    async def start(self) -> None:
        """Bind the listener and start dialling the peers this node dials."""
        host, port = self.bind
        tls = {"ssl": self.tls[0], "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S} if self.tls else {}
        self._server = await self.loop.create_server(lambda: _Link(self, Role.LISTENER, None), host, port,
                                                     reuse_address=True, backlog=128, **tls)
        for peer in sorted(self._dial):
            self._tasks.append(self.loop.create_task(self._dial_forever(peer)))
        log.info("raft port listening on %s:%d (peers %s; dialling %s)", host, port, sorted(self.peers),
                 sorted(self._dial))

    def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.flush()
            link.close()

    async def _dial_forever(self, peer: str) -> None:
        host, port = self.peers[peer]
        tls: dict[str, Any] = {}
        if self.tls:
            tls = {"ssl": self.tls[1], "server_hostname": host, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}
        delay = RETRY_MIN_S
        while not self._closed:
            link = _Link(self, Role.DIALER, peer)
            try:
                await asyncio.wait_for(self.loop.create_connection(lambda: link, host, port, **tls),
                                       CONNECT_TIMEOUT_S + (HANDSHAKE_TIMEOUT_S if tls else 0.0))
                await link.closed
                if link.established:
                    delay = RETRY_MIN_S
            except ssl.SSLError as exc:  # the peer's certificate failed, or it refused ours
                self.refused(f"{host}:{port}", peer, HandshakeFailed(RejectReason.BAD_PROOF, f"TLS: {exc}"))
            except (OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    # --- links -----------------------------------------------------------------------------------

    def link_established(self, link: _Link) -> None:
        peer = link.peer_id
        assert peer is not None
        old = self.links.get(peer)
        self.links[peer] = link
        if old is not None:
            old.established = False  # replaced: its loss is not the peer's
            old.close()
        else:
            for transport in list(self._partitions.values()):
                transport.peer_connected(link.node)
        log.info("raft link to %s (%s) authenticated", peer, link.address)

    def link_lost(self, link: _Link) -> None:
        if self.links.get(link.peer_id or "") is not link:
            return
        del self.links[link.peer_id or ""]
        log.info("raft link to %s (%s) lost", link.peer_id, link.address)
        for transport in list(self._partitions.values()):
            transport.peer_disconnected(link.node)
        for _, lost in list(self._channels.values()):
            if lost is not None:
                lost(link.peer_id or "")

    def refused(self, address: str, claimed: str | None, exc: HandshakeFailed) -> None:
        """Log a refused handshake, at most once per address per :data:`REFUSAL_LOG_PERIOD_S`."""
        self.refused_count += 1
        host = address.rpartition(":")[0] or address
        now = time.monotonic()
        if now - self._refusals.get(host, -REFUSAL_LOG_PERIOD_S) < REFUSAL_LOG_PERIOD_S:
            return
        if len(self._refusals) >= _REFUSAL_ADDRESSES_MAX:
            self._refusals.clear()
        self._refusals[host] = now
        who = f" (claims to be {claimed})" if claimed else ""
        side = "refused by" if exc.remote else "refused"
        log.warning("raft handshake %s %s%s: %s (%d refusals so far; next log for this address in %.0fs at most)",
                    side, address, who, exc, self.refused_count, REFUSAL_LOG_PERIOD_S)

    # --- partitions ------------------------------------------------------------------------------

    def attach(self, transport: "PartitionTransport") -> None:
        self._partitions[transport.partition] = transport
        for peer, link in self.links.items():
            transport.peer_connected(link.node)

    def detach(self, transport: "PartitionTransport") -> None:
        if self._partitions.get(transport.partition) is transport:
            del self._partitions[transport.partition]

    def send(self, peer_id: str, partition: int, message: Any) -> bool:
        link = self.links.get(peer_id)
        if link is None:
            return False
        return link.queue(partition, message)

    # --- side channels -----------------------------------------------------------------------------

    def register_channel(self, name: str, handler: Callable[[str, Any], None],
                         lost: Callable[[str], None] | None = None) -> None:
        """Carry ``name``'s messages over the authenticated links: a received item whose first
        element is ``name`` (a str, where Raft's is a partition number) goes to
        ``handler(peer id, message)``; ``lost(peer id)`` is called when a peer's link is lost."""
        self._channels[name] = (handler, lost)

    def send_channel(self, peer_id: str, name: str, message: Any) -> bool:
        """Queue ``message`` on channel ``name`` for ``peer_id``; False when there is no link to
        it or its send buffer is full (the message is dropped)."""
        link = self.links.get(peer_id)
        if link is None:
            return False
        return link.queue(name, message)  # type: ignore[arg-type]  # a channel's name where a partition goes

    def queued(self, link: _Link) -> None:
        """``link`` has its first message queued: write it in :meth:`flush_queued`, this iteration at the latest."""
        self._pending.append(link)
        if not self._flush_scheduled and not self.holding:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_scheduled_links)

    def hold(self) -> None:
        """Until the matching :meth:`release`, sends wait for it and :meth:`defer_tick` ticks too."""
        self.holding += 1

    def release(self) -> None:
        """End a :meth:`hold`; the outermost one runs the deferred ticks, then writes what is queued.

        A received acknowledgement asks its partition for a tick (the commit index moves
        and the entry is applied there): run at the end of the frame rather than in a
        callback of its own, the reply to the client is one loop iteration sooner.
        """
        self.holding -= 1
        if not self.holding and self._deferred_ticks:
            ticks, self._deferred_ticks = self._deferred_ticks, []
            self.holding += 1
            try:
                for tick in ticks:
                    tick()
            finally:
                self.holding -= 1
                late, self._deferred_ticks = self._deferred_ticks, []
                for tick in late:  # asked for by those ticks: not in this call, no loop
                    self.loop.call_soon(tick)
        if not self.holding:
            self.flush_queued()

    def defer_tick(self, tick: Callable[[], None]) -> bool:
        """Run ``tick`` at the end of the current :meth:`hold`; False when nothing holds."""
        if not self.holding:
            return False
        self._deferred_ticks.append(tick)
        return True

    def flush_queued(self) -> None:
        """Write what is queued for every peer now (one frame per peer)."""
        pending = self._pending
        if pending:
            self._pending = []
            written = False
            for link in pending:
                written = link.flush(after=False) or written
            hook = self.after_flush
            if written and hook is not None:
                hook()  # once every peer has its frame: a second follower does not wait for the leader's sync

    def _flush_scheduled_links(self) -> None:
        self._flush_scheduled = False
        self.flush_queued()

    def deliver(self, node: Any, items: Any) -> None:
        """Hand one frame's ``[[partition, message], ...]`` to the partitions."""
        if type(items) is not list:
            log.warning("raft frame from %s is not a list of (partition, message) pairs; ignored", node)
            return
        partitions = self._partitions
        peer = node.id
        for item in items:
            transport = partitions.get(item[0]) if type(item) is list and len(item) == 2 and type(item[0]) is int else None
            if transport is not None and peer in transport.peers:
                transport.on_message(node, item[1])
            elif type(item) is list and len(item) == 2 and type(item[0]) is str:
                channel = self._channels.get(item[0])
                if channel is not None:
                    try:
                        channel[0](peer, item[1])
                    except Exception:  # a channel's fault must not cost the frame's Raft messages
                        log.exception("raft link %s: channel %r failed on a message", peer, item[0])

    def connected_peers(self) -> list[str]:
        return sorted(self.links)


class PartitionTransport(Transport):  # type: ignore[misc]
    """pysyncobj's transport for one partition: its messages ride the node's shared links."""

    def __init__(self, network: RaftNetwork, partition: int, peers: list[str],
                 on_message: Callable[[Any, Any], None], on_connected: Callable[[], None]) -> None:
        super().__init__(None, None, None)
        self.network = network
        self.partition = partition
        self.peers = frozenset(peers)
        #: Called with each message from a peer of this partition (the network checks the peer).
        self.on_message = on_message
        self._on_connected = on_connected
        self._ready = False

    def tryGetReady(self) -> None:  # noqa: N802 (pysyncobj's name)
        if not self._ready:
            self._ready = True
            self.network.attach(self)

    @property
    def ready(self) -> bool:
        return self._ready

    def waitReady(self) -> None:  # noqa: N802 (pysyncobj's name)
        self.tryGetReady()

    def send(self, node: Any, message: Any) -> bool:
        return self.network.send(node.id, self.partition, message)

    def destroy(self) -> None:
        self.network.detach(self)
        self._ready = False

    def hold(self) -> None:
        """Messages sent until :meth:`release` wait for it (one write per peer, no callback)."""
        self.network.hold()

    def release(self) -> None:
        """End a :meth:`hold`: deferred ticks run and what was queued is written."""
        self.network.release()

    def defer_tick(self, tick: Callable[[], None]) -> bool:
        """Run ``tick`` when the network's current hold ends; False when nothing holds."""
        return self.network.defer_tick(tick)

    def peer_connected(self, node: Any) -> None:
        if node.id in self.peers:
            self._onNodeConnected(node)
            self._on_connected()

    def peer_disconnected(self, node: Any) -> None:
        if node.id in self.peers:
            self._onNodeDisconnected(node)
