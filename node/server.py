"""A Shoal node: the partitions it hosts, its client server and its background duties.

Everything runs on one event loop (uvloop): client sockets, group commit,
long polls, sessions, HTTP, and every hosted partition's Raft group (all over
the node's one Raft port and ticked by one timer, see ``raft``). Background tasks:

- the *leader tick* proposes ``_Tick`` on every partition this node leads when
  something is due (delays, leases, TTL, cron) and at least once a second;
- the *topology watch* notices leader changes of hosted partitions, pushes a
  topology event to v2 connections and learns the other partitions' leaders
  from peers;
- the *balancer* hands leadership back to a partition's preferred replica
  (first in placement) once that replica is connected and caught up.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.config import ClusterConfig
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.topology import Topology

from .clock import WallClock
from .collector import NodeCollector
from .connection import ClientConnection
from .digests import ReplicaDigests
from .dispatch import Dispatcher
from .flows import FlowService
from .group_commit import GroupCommit
from .guard import NodeGuard
from .http import start_http
from .metrics import NodeMetrics
from .raft import PartitionReplica, RaftNetwork, TickScheduler, timing_scale
from .raft.storage import NodeStorage, make_io
from .relay import CHANNEL as RELAY_CHANNEL
from .relay import Relay
from .state import event_dicts

__all__ = ["Node", "run_node"]

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.02
TICK_IDLE_MS = 1_000
TOPOLOGY_INTERVAL_S = 0.1
PEER_POLL_INTERVAL_S = 1.0
BALANCE_INTERVAL_S = 1.0
BALANCE_START_DELAY_S = 1.0
STOP_HANDOVER_S = 3.0


class Node:
    """One server process of a Shoal cluster."""

    def __init__(self, config: ClusterConfig, node_id: str | None = None) -> None:
        self.config = config
        self.node_id = node_id or config.node_id or ""
        self.spec = config.node(self.node_id)
        self.loop = asyncio.get_event_loop()
        self.placement = config.placement()
        self.data_dir = config.node_data_dir(self.node_id)
        self.replicas: dict[int, PartitionReplica] = {}
        self.digests = ReplicaDigests(self.loop)
        self.group_commits: dict[int, GroupCommit] = {}
        self.topology: Topology = config.initial_topology()
        self.event_listeners: list[Callable[[list[dict[str, Any]]], None]] = []
        self.clock = WallClock()
        #: The node's one clock (:mod:`.clock`), also what the dispatcher and group commits are given.
        self.now_ms = self.clock.now_ms
        self.metrics = NodeMetrics()
        self.metrics.registry.register(NodeCollector(self))
        self.flows = FlowService(self)
        self.dispatcher = Dispatcher(config, self.loop, clock=self.clock, directory=self, info=self,
                                     metrics=self.metrics, flows=self.flows)
        self.guard = NodeGuard(self)
        self.metrics.registry.register(self.guard)
        self.started_at = time.monotonic()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_tick_ms: dict[int, int] = {}
        self._tick_inflight: set[int] = set()
        self._led: list[int] = []
        self._tick_idle_ms = TICK_IDLE_MS
        self._applied_flags: dict[int, bool] = {}
        self.raft_network: RaftNetwork | None = None
        self.relay: Relay | None = None
        self.scheduler = TickScheduler(self.loop)
        self._stopped = asyncio.Event()
        self.http_runner: Any = None
        self.storage: NodeStorage | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open every hosted partition's Raft group, then the client and HTTP listeners."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        listen = self.config.listen
        config = self.config
        bind = config.raft_bind_host(self.node_id)
        if not config.secret:
            if config.raft_needs_secret():  # validate() refuses this too; never bind open by accident
                raise RuntimeError(f"refusing to bind Raft on {bind} without a cluster secret")
            log.warning("no cluster secret: Raft peers on loopback authenticate with an empty key")
        others = [n.id for n in config.nodes if n.id != self.node_id]
        self.raft_network = RaftNetwork(
            self.loop, self.node_id, config.cluster_id, config.secret.encode(), (bind, self.spec.raft_port),
            {peer: config.peer_raft_address(self.node_id, peer) for peer in others},
            set(config.raft_dials(self.node_id)),
            tls=(config.tls.peer_server_context(), config.tls.peer_client_context()) if config.tls else None)
        self.storage = NodeStorage(make_io(config.disk_free_min_bytes), str(self.data_dir),
                                   sync_interval_ms=config.sync_interval_ms)
        self.raft_network.before_flush = self.storage.barrier
        self.raft_network.after_flush = self.storage.after_send
        if others:  # clients that do not route for themselves have their commands forwarded (relay.py)
            network = self.raft_network
            self.relay = Relay(self.dispatcher, self, self.loop,
                               lambda peer, message: network.send_channel(peer, RELAY_CHANNEL, message))
            network.register_channel(RELAY_CHANNEL, self.relay.on_message, self.relay.peer_lost)
            self.dispatcher.relay = self.relay
            self.relay.start()
        hosted = sum(self.node_id in replicas for replicas in self.placement.values())
        # Like the Raft timers (raft.replica.timing_scale), the idle tick stretches with the groups hosted.
        self._tick_idle_ms = int(TICK_IDLE_MS * timing_scale(hosted))
        for p, replicas in sorted(self.placement.items()):
            if self.node_id not in replicas:
                continue
            peers = [r for r in replicas if r != self.node_id]
            replica = PartitionReplica(p, self.raft_network, peers, data_dir=str(self.data_dir), loop=self.loop,
                                       scheduler=self.scheduler, preferred=replicas[0] == self.node_id,
                                       groups=hosted, storage=self.storage)
            replica.on_applied = self._applied
            replica.on_leadership_lost = self._leadership_lost
            self.replicas[p] = replica
            self.group_commits[p] = GroupCommit(replica, self.loop, self.clock)
        # Links come up once every group is registered, so no peer's first votes are lost.
        await self.raft_network.start()
        for replica in self.replicas.values():
            replica.start()
        host = listen or self.spec.host
        self._server = await self.loop.create_server(
            lambda: ClientConnection(self.dispatcher, self.config.frame_bytes_max,
                                     self.config.inflight_per_connection),
            host, self.spec.client_listen_port, reuse_address=True, backlog=1024,
            ssl=self.config.tls.server_context() if self.config.tls else None)
        self.http_runner = await start_http(self, host, self.spec.http_port)
        for coro in (self._tick_loop(), self._topology_loop(), self._balance_loop(), self._peer_loop(),
                     self.guard.run(), self._lazy_sync_loop(), self.flows.run()):
            self._tasks.append(self.loop.create_task(coro))
        log.info("node %s serving clients on %s:%d (partitions %s)", self.node_id, host, self.spec.client_listen_port,
                 sorted(self.replicas))

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Graceful stop: refuse new work, hand leadership over, flush and close."""
        if self.stopping:
            return
        self.stopping = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + STOP_HANDOVER_S
        for p, replica in self.replicas.items():
            if replica.is_leader() and len(self.placement[p]) > 1:
                try:
                    replica.transfer_leadership()
                except Exception:  # best effort: a follower will time out and take over anyway
                    log.debug("partition %d: transferLeadership failed", p, exc_info=True)
        while time.monotonic() < deadline and any(
                r.is_leader() and len(self.placement[p]) > 1 for p, r in self.replicas.items()):
            await asyncio.sleep(0.05)
        err = CommandError(ErrorCode.SHUTTING_DOWN, "the node is shutting down; retry on another node")
        for p, commits in self.group_commits.items():
            commits.fail_all(err)
            self.dispatcher.fail_parked(p, err)
        for task in self._tasks:
            task.cancel()
        for conn in list(self.dispatcher.connections):
            conn.close()
        await self.flows.close()
        if self.relay is not None:
            self.relay.close()
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        for replica in self.replicas.values():
            replica.close()
        self.digests.close()
        if self.raft_network is not None:
            self.raft_network.close()
        if self.storage is not None:
            self.storage.close()
        self.scheduler.close()
        self._stopped.set()

    # --- helpers used by the dispatcher ------------------------------------------------------------

    def not_leader_error(self, p: int) -> CommandError:
        info = self.topology.partition_map[p]
        leader = self.topology.nodes.get(info.leader) if info.leader else None
        if leader is None or leader.id == self.node_id:
            return CommandError(ErrorCode.NO_LEADER, f"partition {p} has no leader yet; retry")
        return CommandError(ErrorCode.NOT_LEADER, f"node {self.node_id} does not lead partition {p}",
                            leader={"nodeId": leader.id, "host": leader.host, "port": leader.port})

    def local_stats(self, partition: Any = None) -> dict[str, Any]:
        """Diagnostics of every hosted replica, leader or not (``digest`` as of ``digestIndex``)."""
        out: dict[str, Any] = {}
        for p, replica in sorted(self.replicas.items()):
            if partition is not None and p != partition:
                continue
            digest, digest_index = self.digests.get(p, replica, self.replicas)
            out[str(p)] = {"leader": replica.leader_id(), "isLeader": replica.is_leader(),
                           "term": replica.term(), "commitIndex": replica.commit_index(),
                           "appliedIndex": replica.applied_index(), "digest": digest,
                           "digestIndex": digest_index, "snapshots": replica.snapshots.stats(),
                           "pendingCommands": self.group_commits[p].pending, "elections": replica.elections}
        net = self.raft_network
        raft = {"elections": sum(r.elections for r in self.replicas.values()),
                "peersConnected": net.connected_peers() if net else [],
                "handshakesRefused": net.refused_count if net else 0}
        return {"nodeId": self.node_id, "replicas": out, "raft": raft}

    def snapshot_now(self) -> None:
        """Start a snapshot of every hosted partition that applied entries since its last one (SIGUSR1)."""
        log.info("node %s: snapshot of every partition requested", self.node_id)
        for replica in self.replicas.values():
            replica.snapshot_now()

    # --- applied-batch notifications -----------------------------------------------------------

    def _applied(self, p: int) -> None:
        # Called inside pysyncobj's apply loop; wake waiters once, after this tick.
        if not self._applied_flags.get(p):
            self._applied_flags[p] = True
            self.loop.call_soon(self._on_applied, p)

    def _on_applied(self, p: int) -> None:
        self._applied_flags[p] = False
        replica = self.replicas[p]
        wanted = replica.is_leader() and bool(self.event_listeners or self.dispatcher.wants_events())
        replica.record_events = wanted  # nobody listens: the engine's hot paths skip their event tuples
        events = replica.take_events()
        if events and wanted:
            self.dispatcher.publish(event_dicts(p, events, replica.engine))
        self.dispatcher.on_applied(p)

    def events_wanted(self) -> None:
        """A listener or subscriber came: engines this node leads record job events from now on."""
        for replica in self.replicas.values():
            if replica.is_leader():
                replica.record_events = True

    # --- background loops ----------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            now = self.now_ms()
            for p in self._led:  # the partitions this node led at the last topology refresh
                replica = self.replicas[p]
                if p in self._tick_inflight or not replica.is_leader():
                    continue
                engine = replica.engine
                due = engine.next_due_ms()
                # The idle tick trims histories by age; a partition without queues has nothing to
                # trim, and with hundreds of partitions its Raft entry per second is most of a
                # node's idle CPU.
                if (due is not None and due <= now) or (
                        engine.queues and now - self._last_tick_ms.get(p, 0) >= self._tick_idle_ms):
                    self._last_tick_ms[p] = now
                    self._tick_inflight.add(p)
                    self.group_commits[p].submit({"cmd": "_Tick"},
                                                 lambda _r, p=p: self._tick_inflight.discard(p))

    async def _lazy_sync_loop(self) -> None:
        """Disk-class journal writes reach the disk within ``sync_interval_ms``."""
        assert self.storage is not None
        while True:
            await asyncio.sleep(self.storage.sync_interval_ms / 1000)
            self.storage.sync_lazy()

    async def _topology_loop(self) -> None:
        while True:
            await asyncio.sleep(TOPOLOGY_INTERVAL_S)
            self.refresh_topology()

    def refresh_topology(self) -> None:
        """Fold the hosted partitions' Raft view into the topology; announce changes."""
        topo = self.topology
        lost: list[int] = []
        led: list[int] = []
        for p, replica in self.replicas.items():
            leader = replica.leader_id()
            term = replica.term()
            if leader == self.node_id:
                led.append(p)
            info = topo.partition_map[p]
            if info.leader == self.node_id and leader != self.node_id:
                lost.append(p)
            if (leader, term) != (info.leader, info.term):
                topo = topo.with_leader(p, leader, term)
        self._led = led
        if topo is not self.topology:
            self.topology = topo
            self._announce_topology()
        for p in lost:
            self._release_partition(p)

    def _leadership_lost(self, p: int) -> None:
        """A hosted replica stopped leading (pysyncobj's state callback, on the loop)."""
        self.refresh_topology()
        self._release_partition(p)  # also when the topology poll had already seen the change

    def _release_partition(self, p: int) -> None:
        """Answer everything this node holds for partition ``p``, which it no longer leads."""
        err = self.not_leader_error(p)
        self.group_commits[p].fail_all(err)
        self.group_commits[p].abandon_inflight()
        self.dispatcher.fail_parked(p, err)

    def _announce_topology(self) -> None:
        event = {"event": "topology", "topology": self.topology.to_wire()}
        for conn in list(self.dispatcher.connections):
            if conn.protocol_version >= 2:
                conn.send_frame(event)

    async def _balance_loop(self) -> None:
        await asyncio.sleep(BALANCE_START_DELAY_S)
        while True:
            await asyncio.sleep(BALANCE_INTERVAL_S)
            for p, replica in self.replicas.items():
                preferred = self.placement[p][0]
                if preferred == self.node_id or not replica.is_leader():
                    continue
                if replica.peer_connected(preferred):
                    try:
                        replica.transfer_leadership(preferred)
                    except Exception:
                        log.debug("partition %d: transfer to %s refused", p, preferred, exc_info=True)

    async def _peer_loop(self) -> None:
        """Learn leaders of partitions this node does not host (only when nodes > RF)."""
        foreign = [p for p in range(self.config.partitions) if p not in self.replicas]
        if not foreign:
            return
        peers = [n for n in self.config.nodes if n.id != self.node_id]
        while True:
            await asyncio.sleep(PEER_POLL_INTERVAL_S)
            for peer in peers:
                try:
                    topo = await asyncio.wait_for(_fetch_topology(peer.host, peer.port, self.config.tokens,
                                                                  self.config.tls), 1.0)
                except (OSError, asyncio.TimeoutError, CommandError, ValueError):
                    continue
                merged = self.topology.merge(topo)
                if merged is not self.topology:
                    self.topology = merged
                    self._announce_topology()


async def _fetch_topology(host: str, port: int, tokens: tuple[str, ...], tls: Any = None) -> Topology:
    reader, writer = await asyncio.open_connection(host, port, ssl=tls.client_context() if tls else None)
    try:
        frames = [{"cmd": "Hello", "protocolVersion": 2, "reqId": 1}]
        if tokens:
            frames.insert(0, {"cmd": "Auth", "token": tokens[0], "reqId": 0})
        writer.write(b"".join(encode(f) for f in frames))
        decoder = FrameDecoder(requests=False)
        while True:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("peer closed")
            decoder.feed(data)
            for frame in decoder:
                if frame.get("reqId") == 1:
                    if not frame.get("ok"):
                        raise CommandError(ErrorCode.INTERNAL, str(frame.get("error")))
                    return Topology.from_wire(frame["topology"])
    finally:
        writer.close()


GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Make the cyclic GC rare: a node holds millions of long-lived, acyclic job objects.

    With the default thresholds (700, 10, 10) the collector runs so often that it
    takes about a third of the time of applying pushes (a bench/bench_engine.py
    style loop shows it). Objects made during start-up (modules, config) are
    frozen out of every later collection.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_node(config: ClusterConfig, node_id: str) -> int:
    """Run a node until SIGTERM/SIGINT; returns the exit code."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # uvloop is a hard dependency; fall back only on exotic platforms
        log.warning("uvloop unavailable; using the default asyncio loop")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    node = Node(config, node_id)
    Path(node.data_dir).mkdir(parents=True, exist_ok=True)

    def on_signal() -> None:
        log.info("node %s: stopping on signal", node_id)
        loop.create_task(node.stop())

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGUSR1, node.snapshot_now)
    tune_gc()
    try:
        loop.run_until_complete(node.start())
        loop.run_until_complete(node.serve_forever())
    finally:
        loop.close()
    return 0
