"""The node's Raft port: one authenticated connection per node pair, every partition over it.

:class:`RaftNetwork` listens on the node's one ``raft_port`` and keeps one link
to every peer. Of each pair, the node listed later in the cluster's node list
dials, the other accepts, so a pair never holds two links. A link first runs
the :mod:`.handshake` (nothing else is read before it succeeds, and its frames
are tiny): the peer proves the cluster secret and names its incarnation, which
the network's peer policy (:attr:`RaftNetwork.peer_policy`, set by the node;
default: any) accepts or refuses. After it, frames are authenticated
(:mod:`._frames`) and carry MessagePack arrays of ``(partition, message)`` pairs. With TLS configured the
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

:class:`PartitionTransport` is one partition's view of the network: it sends the
partition's messages and receives them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Union

import msgspec

from ._frames import FrameError, FrameOpener, FrameSealer, array_header
from .handshake import (Established, Handshake, HandshakeFailed, PeerPolicy, RejectReason, Role, SendBytes,
                        accept_any_incarnation)
from .messages import MessageError, decode_message

__all__ = ["RaftNetwork", "PartitionTransport", "PeerAddress", "FRAME_BYTES_MAX", "ENTRY_BYTES_MAX",
           "SEND_BUFFER_BYTES_MAX", "decode_frame"]

log = logging.getLogger(__name__)

#: The largest log entry a replica proposes (a larger batch is split into several entries; a
#: single larger command is refused).
ENTRY_BYTES_MAX = 96 * 1024 * 1024
#: The largest authenticated frame a link accepts: one entry and its message's envelope.
FRAME_BYTES_MAX = ENTRY_BYTES_MAX + 4 * 1024 * 1024
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
_decode_items = msgspec.msgpack.Decoder(list[tuple[Union[int, str], msgspec.Raw]]).decode


def decode_frame(payload: bytes | memoryview) -> list[tuple[int | str, Any]]:
    """A frame's ``(partition, message)`` and ``(channel, value)`` pairs, decoded.

    A partition's message is decoded straight into its :class:`~.messages.Message` struct (or
    is the :class:`~.messages.MessageError` saying why it is none, so one bad message costs
    only itself); a channel's value is plain MessagePack. Every item is decoded before this
    returns, so nothing keeps a view of ``payload``. A payload that is no list of such pairs
    raises (the link is then closed).
    """
    out: list[tuple[int | str, Any]] = []
    for key, raw in _decode_items(payload):
        if type(key) is int:
            try:
                out.append((key, decode_message(raw)))
            except MessageError as exc:
                out.append((key, exc))
        else:
            out.append((key, _decode(raw)))
    return out


class _Link(asyncio.Protocol):
    """One TCP connection to a peer: handshake first, then authenticated frames."""

    def __init__(self, network: "RaftNetwork", role: Role, peer_id: str | None) -> None:
        self.network = network
        self.role = role
        self.peer_id = peer_id
        #: The peer's incarnation, proved by the handshake (None before it).
        self.peer_incarnation: str | None = None
        self.transport: asyncio.Transport | None = None
        self.address = "?"
        self.established = False
        self.closed: asyncio.Future[None] = network.loop.create_future()
        self._handshake: Handshake | None = None
        self._opener: FrameOpener | None = None
        self._sealer: FrameSealer | None = None
        self._timeout: asyncio.TimerHandle | None = None
        #: Queued Raft messages (they wait for the barrier) and side-channel ones (they never do).
        self._out: list[bytes] = []
        self._out_side: list[bytes] = []
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
        self._handshake = Handshake(self.role, net.node_id, net.secret, net.cluster_id, incarnation=net.incarnation,
                                    peer_id=self.peer_id, known_peers=net.peer_ids, check_peer=net.check_peer)
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
                    net.deliver(self.peer_id, items)
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
        self.peer_incarnation = event.peer_incarnation
        self._sealer = FrameSealer(event.send_key)
        self._opener = FrameOpener(event.recv_key, FRAME_BYTES_MAX, decode_frame)
        self.established = True
        self.network.link_established(self)
        if event.rest:
            self.data_received(event.rest)

    def _refuse(self, exc: HandshakeFailed) -> None:
        claimed = self.peer_id or (self._handshake.peer_id if self._handshake is not None else None)
        self.network.refused(self.address, claimed, exc)
        if self.transport is not None and not exc.remote and self._handshake is not None:
            self.transport.write(self._handshake.reject_frame(exc.reason, exc.note))
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
        if not self._out and not self._out_side:
            self.network.queued(self)
        (self._out if type(partition) is int else self._out_side).append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FRAME_SPLIT_BYTES:
            self.flush()
        return True

    def flush(self, after: bool = True) -> bool:
        """Seal and write everything queued; True when something was written.

        Raft answers and entries leave only once the journals they vouch for are synced (the
        network's barrier). Side-channel messages (forwarded commands, their replies) vouch for
        nothing on disk here and never wait for this node's syncs: when the barrier is due they
        leave first, in a frame of their own; otherwise one frame carries everything.

        ``after=False`` leaves the network's ``after_flush`` to the caller, which writes
        to the other peers first (:meth:`RaftNetwork.flush_queued`).
        """
        raft, side = self._out, self._out_side
        if (not raft and not side) or self._sealer is None or self.transport is None \
                or self.transport.is_closing():
            return False
        self.network.bytes_sent += self._out_bytes
        self._out = []
        self._out_side = []
        self._out_bytes = 0
        barrier = self.network.before_flush
        if raft and barrier is not None:
            if side:
                self._write_frame(side)
                side = []
            barrier()
        self._write_frame(raft + side if side else raft)
        hook = self.network.after_flush
        if after and hook is not None:
            hook()  # a leader's own copy of what it just sent becomes durable before anything else runs
        return True

    def _write_frame(self, items: list[bytes]) -> None:
        assert self._sealer is not None and self.transport is not None
        self.transport.writelines(self._sealer.seal([array_header(len(items)), *items]))
        self.network.frames_sent += 1

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class RaftNetwork:
    """One node's Raft port and its links to every peer (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str, cluster_id: str, secret: bytes,
                 bind: PeerAddress, peers: dict[str, PeerAddress], dial: set[str],
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None, incarnation: str = "") -> None:
        self.loop = loop
        self.node_id = node_id
        self.cluster_id = cluster_id
        #: This node's incarnation, named in every handshake (empty for a tool or test without one).
        self.incarnation = incarnation
        #: Which peer incarnations may link (:data:`.handshake.PeerPolicy`); asked at every handshake.
        #: Replace it with :meth:`set_peer_policy` to also drop the links it now refuses.
        self.peer_policy: PeerPolicy = accept_any_incarnation
        self.secret = secret
        self.bind = bind
        self.peers = dict(peers)
        self.peer_ids = frozenset(peers)
        self._dial = set(dial)
        self.links: dict[str, _Link] = {}
        self._partitions: dict[int, PartitionTransport] = {}
        self._pending: list[_Link] = []
        self._flush_scheduled = False
        #: Above 0 while a caller that flushes when done is running (a received frame, a
        #: proposal): what it queues needs no flush callback of its own.
        self.holding = 0
        self._deferred_ticks: list[Callable[[], None]] = []
        self._after_write: list[Callable[[], None]] = []
        self._server: asyncio.AbstractServer | None = None
        self._dialers: dict[str, asyncio.Task[None]] = {}
        self._refusals: dict[str, float] = {}
        self._closed = False
        #: Mutual TLS for the links when set, as (listening side, dialling side) contexts; the
        #: secret's handshake runs inside it either way.
        self.tls = tls
        self.handshakes_pending = 0
        self.frames_sent = 0
        #: Message bytes written to peers (before framing and MACs).
        self.bytes_sent = 0
        self.dropped = 0
        self.refused_count = 0
        #: Called before any frame is written (the node's journal sync barrier, storage.py).
        self.before_flush: Callable[[], None] | None = None
        #: Called right after a frame is written (the leaders' journal syncs, storage.py).
        self.after_flush: Callable[[], None] | None = None
        #: Called once a peer's frame has been handled and answered, before the work it left for
        #: later (a follower's applies): the node writes what it owes its clients (a forwarded
        #: command's answer the frame brought).
        self.before_deferred: Callable[[], None] | None = None
        #: Called with the peer's id whenever a link to it is established (after the partitions heard).
        self.on_peer_up: list[Callable[[str], None]] = []
        #: Called with (peer, partition, message) for a partition this node hosts no replica of.
        self.on_unknown_partition: Callable[[str, int, Any], None] | None = None
        #: Side channels (:meth:`register_channel`): name -> (handler, on peer lost).
        self._channels: dict[str, tuple[Callable[[str, Any], None], Callable[[str], None] | None]] = {}

    def check_peer(self, peer_id: str, incarnation: str) -> str | None:
        """The current peer policy's answer for ``peer_id`` offering ``incarnation`` (None: accepted)."""
        return self.peer_policy(peer_id, incarnation)

    def set_peer_policy(self, policy: PeerPolicy) -> list[str]:
        """Use ``policy`` from now on and drop every link it refuses; returns those peers.

        A dropped peer's link comes back through a new handshake (the dialling side retries),
        which the new policy decides.
        """
        self.peer_policy = policy
        dropped = []
        for peer, link in sorted(self.links.items()):
            why = self.check_peer(peer, link.peer_incarnation or "")
            if why is not None:
                log.warning("raft link to %s (%s) dropped: incarnation %r is refused: %s", peer, link.address,
                            link.peer_incarnation, why)
                self.drop_peer(peer)
                dropped.append(peer)
        return dropped

    def drop_peer(self, peer_id: str) -> bool:
        """Close the link to ``peer_id`` (it comes back through a new handshake); False if none is up."""
        link = self.links.get(peer_id)
        if link is None:
            return False
        link.close()
        return True

    def peer_incarnation(self, peer_id: str) -> str | None:
        """The incarnation ``peer_id`` proved on its current link; None while it has none."""
        link = self.links.get(peer_id)
        return link.peer_incarnation if link is not None else None

    async def start(self) -> None:
        """Bind the listener and start dialling the peers this node dials."""
        host, port = self.bind
        tls = {"ssl": self.tls[0], "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S} if self.tls else {}
        self._server = await self.loop.create_server(lambda: _Link(self, Role.LISTENER, None), host, port,
                                                     reuse_address=True, backlog=128, **tls)
        for peer in sorted(self._dial):
            self._dialers[peer] = self.loop.create_task(self._dial_forever(peer))
        log.info("raft port listening on %s:%d (peers %s; dialling %s)", host, port, sorted(self.peers),
                 sorted(self._dial))

    def close(self) -> None:
        self._closed = True
        for task in self._dialers.values():
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.flush()
            link.close()

    def set_peers(self, peers: dict[str, PeerAddress], dial: set[str]) -> None:
        """The cluster's nodes changed: dial new peers this node dials, forget the ones gone.

        A node added later has the higher ordinal, so it dials every older node; the older
        ones only listen for it (see :class:`~shoal.cluster.registry.Registry.dials`).
        """
        gone = set(self.peers) - set(peers)
        self.peers = dict(peers)
        self.peer_ids = frozenset(peers)
        for peer in gone:
            task = self._dialers.pop(peer, None)
            if task is not None:
                task.cancel()
            self.drop_peer(peer)
        self._dial = set(dial) & set(peers)
        if self._server is not None and not self._closed:
            for peer in sorted(self._dial - set(self._dialers)):
                self._dialers[peer] = self.loop.create_task(self._dial_forever(peer))

    async def _dial_forever(self, peer: str) -> None:
        delay = RETRY_MIN_S
        while not self._closed and peer in self.peers:
            host, port = self.peers[peer]  # read each time: an address may change
            tls: dict[str, Any] = {}
            if self.tls:
                tls = {"ssl": self.tls[1], "server_hostname": host, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}
            link = _Link(self, Role.DIALER, peer)
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can lose a cancellation (a stop)
                async with asyncio.timeout(CONNECT_TIMEOUT_S + (HANDSHAKE_TIMEOUT_S if tls else 0.0)):
                    await self.loop.create_connection(lambda: link, host, port, **tls)
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
                transport.peer_connected(peer)
        log.info("raft link to %s (%s) authenticated, incarnation %s", peer, link.address, link.peer_incarnation)
        for hook in list(self.on_peer_up):
            try:
                hook(peer)
            except Exception:  # one listener's fault must not cost the link
                log.exception("raft link to %s: a link-up listener failed", peer)

    def link_lost(self, link: _Link) -> None:
        if self.links.get(link.peer_id or "") is not link:
            return
        del self.links[link.peer_id or ""]
        log.info("raft link to %s (%s) lost", link.peer_id, link.address)
        for transport in list(self._partitions.values()):
            transport.peer_disconnected(link.peer_id or "")
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
        for peer in self.links:
            transport.peer_connected(peer)

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
            if self._after_write:
                if self.before_deferred is not None:
                    self.before_deferred()
                done, self._after_write = self._after_write, []
                for work in done:
                    work()

    def defer_tick(self, tick: Callable[[], None]) -> bool:
        """Run ``tick`` at the end of the current :meth:`hold`; False when nothing holds."""
        if not self.holding:
            return False
        self._deferred_ticks.append(tick)
        return True

    def after_write(self, work: Callable[[], None]) -> bool:
        """Run ``work`` once the current :meth:`hold` has written what it queued (a follower's
        applies, after its answers have left); False when nothing holds."""
        if not self.holding:
            return False
        self._after_write.append(work)
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

    def deliver(self, peer: str, items: list[tuple[int | str, Any]]) -> None:
        """Hand one frame's pairs (:func:`decode_frame`) to the partitions and channels."""
        partitions = self._partitions
        for key, value in items:
            if type(key) is int:
                transport = partitions.get(key)
                if transport is not None:
                    transport.on_message(peer, value)
                elif self.on_unknown_partition is not None:
                    self.on_unknown_partition(peer, key, value)
            else:
                channel = self._channels.get(key)
                if channel is not None:
                    try:
                        channel[0](peer, value)
                    except Exception:  # a channel's fault must not cost the frame's Raft messages
                        log.exception("raft link %s: channel %r failed on a message", peer, key)

    def connected_peers(self) -> list[str]:
        return sorted(self.links)


class PartitionTransport:
    """One partition's messages on the node's shared links."""

    def __init__(self, network: RaftNetwork, partition: int, peers: list[str],
                 on_message: Callable[[str, Any], None], on_connected: Callable[[str], None],
                 on_disconnected: Callable[[str], None] | None = None) -> None:
        """``peers`` are the node ids the partition expects to hear from first; any linked node is
        heard (a group's members change), the replica decides what a message from it means."""
        self.network = network
        self.partition = partition
        self.peers = frozenset(peers)
        #: Called with each message from a peer for this partition.
        self.on_message = on_message
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._attached = False

    @property
    def connected(self) -> dict[str, Any]:
        """The nodes a link is up to (every partition shares them)."""
        return self.network.links

    def attach(self) -> None:
        """Start receiving this partition's messages."""
        if not self._attached:
            self._attached = True
            self.network.attach(self)

    def send(self, peer: str, message: Any) -> bool:
        return self.network.send(peer, self.partition, message)

    def close(self) -> None:
        self.network.detach(self)
        self._attached = False

    def hold(self) -> None:
        """Messages sent until :meth:`release` wait for it (one write per peer, no callback)."""
        self.network.hold()

    def release(self) -> None:
        """End a :meth:`hold`: deferred ticks run and what was queued is written."""
        self.network.release()

    def defer_tick(self, tick: Callable[[], None]) -> bool:
        """Run ``tick`` when the network's current hold ends; False when nothing holds."""
        return self.network.defer_tick(tick)

    def after_write(self, work: Callable[[], None]) -> bool:
        """Run ``work`` once the network's current hold has written its frames; False when
        nothing holds."""
        return self.network.after_write(work)

    def peer_connected(self, peer: str) -> None:
        self._on_connected(peer)

    def peer_disconnected(self, peer: str) -> None:
        if self._on_disconnected is not None:
            self._on_disconnected(peer)
