"""A simulated Raft network: what :class:`~shoal.node.raft.transport.PartitionTransport` needs
of :class:`~shoal.node.raft.transport.RaftNetwork`, over a faulty fabric.

Each node's :class:`NodeNetwork` behaves as the node's real network does for its
partitions: ``attach``/``detach``, ``send`` (False when there is no link to the peer or
its send buffer is full), ``hold``/``release``/``defer_tick`` (messages queued inside a
hold leave when the outermost hold ends, deferred ticks run first), ``links``, and the
node storage's barrier hooks around every write (``before_flush`` before any frame
leaves, ``after_flush`` once every peer has its frame), so a follower's answer leaves
only after its journal sync and a leader syncs its own copy right after sending. A
received frame is delivered inside a hold, as the real link delivers one.

Frames are the real link's MessagePack arrays of ``(partition, message)`` pairs,
encoded and decoded with msgspec as the link does (without the MAC, which the
handshake tests cover). The :class:`Fabric` between the nodes decides each frame's
fate from the simulation's one random generator: lost, duplicated, delayed (so
reordered), or dropped because the link broke (a partition, a crash); a link that
comes back is a new connection, so frames of the old one are gone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from shoal.node.raft._frames import array_header
from shoal.node.raft.transport import FRAME_SPLIT_BYTES, PartitionTransport, decode_frame

from .loop import Process, SimLoop

__all__ = ["Fabric", "NodeNetwork", "NetFaults", "LINK_BUFFER_BYTES_MAX"]

#: Bytes one link may hold in flight; beyond, ``send`` refuses (the real link's full buffer;
#: a message is taken whatever its size while the buffer is below this).
LINK_BUFFER_BYTES_MAX = 512 * 1024
#: A link that can come back does so after a reconnect delay in this range (seconds).
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 1.0

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


@dataclass
class NetFaults:
    """How hostile the fabric is now (probabilities per frame; delays in seconds)."""

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay_min_s: float = 0.0005
    delay_max_s: float = 0.005
    #: A frame is late by up to ``spike_max_s`` with this probability.
    spike: float = 0.0
    spike_max_s: float = 0.3

    @classmethod
    def calm(cls) -> "NetFaults":
        return cls()


class NodeNetwork:
    """One node's Raft network as its partitions see it (see the module docstring)."""

    def __init__(self, fabric: "Fabric", process: Process, node_id: str) -> None:
        self.fabric = fabric
        self.loop = process
        self.process = process
        self.node_id = node_id
        #: Peers with a working link (the real network's ``links``: only keys are read).
        self.links: dict[str, bool] = {}
        self._partitions: dict[int, PartitionTransport] = {}
        self._out: dict[str, list[bytes]] = {}
        self._out_bytes: dict[str, int] = {}
        self._pending: list[str] = []
        self._flush_scheduled = False
        self.holding = 0
        self._deferred_ticks: list[Callable[[], None]] = []
        self._after_write: list[Callable[[], None]] = []
        self.before_flush: Callable[[], None] | None = None
        self.after_flush: Callable[[], None] | None = None
        self.frames_sent = 0
        self.dropped = 0

    # --- partitions -------------------------------------------------------------------------------

    def attach(self, transport: PartitionTransport) -> None:
        self._partitions[transport.partition] = transport
        for peer in self.links:
            transport.peer_connected(peer)

    def detach(self, transport: PartitionTransport) -> None:
        if self._partitions.get(transport.partition) is transport:
            del self._partitions[transport.partition]

    # --- links --------------------------------------------------------------------------------------

    def link_up(self, peer: str) -> None:
        if peer in self.links:
            return
        self.links[peer] = True
        for transport in list(self._partitions.values()):
            transport.peer_connected(peer)

    def link_down(self, peer: str) -> None:
        if self.links.pop(peer, None) is None:
            return
        self._out.pop(peer, None)  # queued on the lost connection: gone with it
        self._out_bytes.pop(peer, None)
        for transport in list(self._partitions.values()):
            transport.peer_disconnected(peer)

    # --- sending ------------------------------------------------------------------------------------

    def send(self, peer_id: str, partition: int, message: Any) -> bool:
        if peer_id not in self.links or not self.process.alive:
            return False
        queued = self._out_bytes.get(peer_id, 0)
        if self.fabric.in_flight_bytes(self.node_id, peer_id) + queued > LINK_BUFFER_BYTES_MAX:
            self.dropped += 1  # as the real link: refused once its buffer is over the limit
            return False
        data = _encode((partition, message))
        self.fabric.note_send(self.node_id, len(data))
        out = self._out.get(peer_id)
        if out is None:
            out = self._out[peer_id] = []
            self._out_bytes[peer_id] = 0
            self._pending.append(peer_id)
            if not self._flush_scheduled and not self.holding:
                self._flush_scheduled = True
                self.process.call_soon(self._flush_scheduled_links)
        out.append(data)
        self._out_bytes[peer_id] += len(data)
        if self._out_bytes[peer_id] >= FRAME_SPLIT_BYTES:
            self._flush_link(peer_id)
        return True

    def _flush_link(self, peer: str) -> bool:
        out = self._out.pop(peer, None)
        self._out_bytes.pop(peer, None)
        if not out or peer not in self.links or not self.process.alive:
            return False
        barrier = self.before_flush
        if barrier is not None:
            barrier()  # answers and entries leave only once the journals they vouch for are synced
        self.frames_sent += 1
        self.fabric.transmit(self.node_id, peer, array_header(len(out)) + b"".join(out))
        return True

    def flush_queued(self) -> None:
        pending, self._pending = self._pending, []
        written = False
        for peer in pending:
            written = self._flush_link(peer) or written
        if written and self.after_flush is not None:
            self.after_flush()

    def _flush_scheduled_links(self) -> None:
        self._flush_scheduled = False
        self.flush_queued()

    def hold(self) -> None:
        self.holding += 1

    def release(self) -> None:
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
                for tick in late:
                    self.process.call_soon(tick)
        if not self.holding:
            self.flush_queued()
            if self._after_write:
                done, self._after_write = self._after_write, []
                for work in done:
                    work()

    def defer_tick(self, tick: Callable[[], None]) -> bool:
        if not self.holding:
            return False
        self._deferred_ticks.append(tick)
        return True

    def after_write(self, work: Callable[[], None]) -> bool:
        if not self.holding:
            return False
        self._after_write.append(work)
        return True

    # --- receiving ----------------------------------------------------------------------------------

    def receive(self, peer: str, frame: bytes) -> None:
        """One frame from ``peer``: its messages to the partitions, inside one hold."""
        items = decode_frame(frame)
        self.hold()
        try:
            for key, message in items:
                transport = self._partitions.get(key)
                if transport is not None:  # any linked node is heard, as on the real network
                    transport.on_message(peer, message)
        finally:
            self.release()


class Fabric:
    """The wires between the nodes: links, partitions and each frame's fate (module docstring)."""

    def __init__(self, loop: SimLoop, rng: random.Random, node_ids: list[str]) -> None:
        self.loop = loop
        self.rng = rng
        self.node_ids = list(node_ids)
        self.faults = NetFaults.calm()
        self._nets: dict[str, NodeNetwork] = {}
        #: Unordered pairs whose link is cut.
        self.cut: set[frozenset[str]] = set()
        self._epoch: dict[frozenset[str], int] = {}
        self._in_flight: dict[tuple[str, str], int] = {}
        self._fifo_at: dict[tuple[str, str], float] = {}
        self._reconnect: dict[frozenset[str], Any] = {}
        #: A test's own fault: called with (source, destination, decoded frame); True drops it.
        self.drop_if: Callable[[str, str, list[Any]], bool] | None = None
        #: Messages and bytes sent since the checkers last looked (one loop callback's worth).
        self.callback_msgs = 0
        self.callback_bytes = 0
        self.frames = 0
        self.frames_lost = 0

    # --- nodes and partitions -----------------------------------------------------------------

    def node_up(self, net: NodeNetwork) -> None:
        self._nets[net.node_id] = net
        for other in self._nets:
            if other != net.node_id:
                self._maybe_connect(net.node_id, other)

    def node_down(self, node_id: str) -> None:
        self._nets.pop(node_id, None)
        for other in list(self._nets):
            self._break(node_id, other)

    def set_cut(self, pairs: set[frozenset[str]]) -> None:
        """Cut exactly ``pairs``: links of newly cut pairs break, healed pairs reconnect."""
        old, self.cut = self.cut, set(pairs)
        for a, b in sorted(tuple(sorted(pair)) for pair in old | self.cut):  # sorted: sets' order is per process
            pair = frozenset((a, b))
            if pair in self.cut:
                self._break(a, b)
            else:
                self._maybe_connect(a, b)

    def _break(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        self._epoch[pair] = self._epoch.get(pair, 0) + 1
        handle = self._reconnect.pop(pair, None)
        if handle is not None:
            handle.cancel()
        for x, y in ((a, b), (b, a)):
            net = self._nets.get(x)
            if net is not None:
                net.link_down(y)

    def _maybe_connect(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        if pair in self.cut or pair in self._reconnect or a not in self._nets or b not in self._nets:
            return
        if b in self._nets[a].links and a in self._nets[b].links:
            return
        delay = self.rng.uniform(RECONNECT_MIN_S, RECONNECT_MAX_S)
        self._reconnect[pair] = self.loop.call_later(delay, self._connect, a, b)

    def _connect(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        self._reconnect.pop(pair, None)
        na, nb = self._nets.get(a), self._nets.get(b)
        if pair in self.cut or na is None or nb is None:
            return
        self._epoch[pair] = self._epoch.get(pair, 0) + 1
        na.link_up(b)
        nb.link_up(a)

    def connected(self, a: str, b: str) -> bool:
        net = self._nets.get(a)
        return net is not None and b in net.links

    # --- frames -------------------------------------------------------------------------------------

    def note_send(self, node_id: str, nbytes: int) -> None:
        self.callback_msgs += 1
        self.callback_bytes += nbytes

    def in_flight_bytes(self, src: str, dst: str) -> int:
        return self._in_flight.get((src, dst), 0)

    def transmit(self, src: str, dst: str, frame: bytes) -> None:
        """``src`` wrote ``frame`` to its link to ``dst``: lose, delay or duplicate it."""
        self.frames += 1
        faults = self.faults
        rng = self.rng
        if self.drop_if is not None and self.drop_if(src, dst, _decode(frame)):
            self.frames_lost += 1
            return
        if rng.random() < faults.loss:
            self.frames_lost += 1
            return
        copies = 2 if rng.random() < faults.duplicate else 1
        key = (src, dst)
        epoch = self._epoch.get(frozenset(key), 0)
        for _ in range(copies):
            now = self.loop.time()
            delay = rng.uniform(faults.delay_min_s, faults.delay_max_s)
            if rng.random() < faults.spike:
                delay += rng.uniform(0.0, faults.spike_max_s)
            at = now + delay
            if rng.random() >= faults.reorder:
                at = max(at, self._fifo_at.get(key, 0.0))  # a stream: after the frames before it
                self._fifo_at[key] = at
            self._in_flight[key] = self._in_flight.get(key, 0) + len(frame)
            self.loop.call_at(at, self._arrive, src, dst, frame, epoch)

    def _arrive(self, src: str, dst: str, frame: bytes, epoch: int) -> None:
        key = (src, dst)
        net = self._nets.get(dst)
        if net is None or self._epoch.get(frozenset(key), 0) != epoch or src not in net.links:
            self._in_flight[key] -= len(frame)
            return  # the connection it travelled on broke
        if net.process.paused_until > self.loop.time():
            # A stopped process reads nothing; its socket keeps the frame (in order) for later.
            self.loop.call_at(net.process.paused_until, self._arrive, src, dst, frame, epoch)
            return
        self._in_flight[key] -= len(frame)
        loop = self.loop
        loop.current = net.process  # the receiving node's callback from here on
        net.receive(src, frame)
