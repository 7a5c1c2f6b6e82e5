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
from dataclasses import replace
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.cluster.config import ClusterConfig
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.registry import Registry, node_of_member
from shoal.cluster.topology import NodeAddress, PartitionInfo, Topology

from .clock import WallClock
from .collector import NodeCollector
from .connection import ClientConnection
from .digests import ReplicaDigests
from .dispatch import Dispatcher
from .flows import FlowService
from .guard import NodeGuard
from .identity import load_identity
from .http import start_http
from .metrics import NodeMetrics
from .moves import MoveService
from .cluster_map import ClusterMap
from .partition import Partition, PartitionMachine
from .partition.payload_files import PAYLOADS_DIR, PayloadFiles, file_bytes_from_env
from .payload_repair import PayloadRepair
from .raft import PartitionReplica, RaftNetwork, ReplicaDamaged, TickScheduler, timing_scale
from .raft.membership import Membership
from .raft.storage import NodeStorage, make_io
from .relay import CHANNEL as RELAY_CHANNEL
from .relay import Relay

__all__ = ["Node", "run_node"]

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.02
#: How often released payload files are looked for (one is deleted a collection after it was
#: found released, so a reply naming its bytes has long been written).
PAYLOAD_COLLECT_INTERVAL_MS = 1000
#: How often one partition's payload compaction copies its next step (``COMPACT_STEP_BYTES``,
#: a few ms): at most a few percent of the loop, whatever the number of partitions.
PAYLOAD_COMPACT_INTERVAL_MS = 100
TICK_IDLE_MS = 1_000
TOPOLOGY_INTERVAL_S = 0.1
PEER_POLL_INTERVAL_S = 1.0
BALANCE_INTERVAL_S = 1.0
BALANCE_START_DELAY_S = 1.0
STOP_HANDOVER_S = 3.0
#: Written in the data directory once this node created its bootstrap replicas.
BOOTSTRAP_MARK = "bootstrapped"
#: The Raft link side channel on which nodes tell each other which partitions they lead.
TOPOLOGY_CHANNEL = "topology"
#: Exit status of a node that refuses to start on damaged data (EX_DATAERR).
EXIT_DAMAGED = 65


class Node:
    """One server process of a Shoal cluster."""

    def __init__(self, config: ClusterConfig, node_id: str | None = None) -> None:
        self.config = config
        self.node_id = node_id or config.node_id or ""
        self.spec = config.node(self.node_id)
        self.loop = asyncio.get_event_loop()
        self.cluster_map: ClusterMap | None = None
        self._hosted_hint = 1
        self.data_dir = config.node_data_dir(self.node_id)
        # Before anything else touches the data directory: refuse another cluster's or node's data.
        self.identity = load_identity(str(self.data_dir), config.cluster_id, self.node_id)
        #: This node's incarnation: new whenever it starts on a data directory without an identity.
        self.incarnation = self.identity.incarnation
        #: The partitions this node hosts a replica of.
        self.partitions: dict[int, Partition] = {}
        self.digests = ReplicaDigests(self.loop)
        self.topology: Topology = config.initial_topology()
        self.event_listeners: list[Callable[[list[dict[str, Any]]], None]] = []
        self.clock = WallClock()
        #: The node's one clock (:mod:`.clock`), also what the dispatcher and group commits are given.
        self.now_ms = self.clock.now_ms
        self.metrics = NodeMetrics()
        self.metrics.registry.register(NodeCollector(self))
        self.flows = FlowService(self)
        self.moves = MoveService(self)
        self.dispatcher = Dispatcher(config, self.loop, clock=self.clock, directory=self, info=self,
                                     metrics=self.metrics, flows=self.flows)
        self.guard = NodeGuard(self)
        self.metrics.registry.register(self.guard)
        self.started_at = time.monotonic()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._led: list[int] = []
        self._tick_idle_ms = TICK_IDLE_MS
        self._payloads_collected_ms = 0
        self._payloads_compacted_ms = 0
        self._compact_turn = 0
        self._payload_file_bytes = file_bytes_from_env()
        self.payload_repair = PayloadRepair(self.loop, self._hosted_replica, self._rebuild)
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
        self.storage = NodeStorage(make_io(config.disk_free_min_bytes), str(self.data_dir),
                                   sync_interval_ms=config.sync_interval_ms)
        self.cluster_map = ClusterMap(self.storage.io, str(self.data_dir), config, self.node_id, self.incarnation)
        self.raft_network = RaftNetwork(
            self.loop, self.node_id, config.cluster_id, config.secret.encode(), (bind, self.spec.raft_port),
            self._peer_addresses(), self.cluster_map.dials(),
            tls=(config.tls.peer_server_context(), config.tls.peer_client_context()) if config.tls else None,
            incarnation=self.incarnation)
        self.raft_network.before_flush = self.storage.barrier
        # answers already owed to clients (a forwarded command's, handed over by the leader in
        # the frame that also brought entries to sync) do not wait for this node's fdatasync
        self.storage.before_sync = self.dispatcher.writes.write_now
        self.raft_network.before_deferred = self.dispatcher.writes.write_now  # nor for its applies
        self.raft_network.after_flush = self.storage.after_send
        self.raft_network.on_unknown_partition = self._unknown_partition
        self.cluster_map.attach(self.raft_network)
        self.raft_network.register_channel(TOPOLOGY_CHANNEL, self._on_topology)
        self.cluster_map.listeners.append(self._registry_changed)
        network = self.raft_network
        # Clients that do not route for themselves have their commands forwarded (relay.py).
        self.relay = Relay(self.dispatcher, self, self.loop,
                           lambda peer, message: network.send_channel(peer, RELAY_CHANNEL, message))
        network.register_channel(RELAY_CHANNEL, self.relay.on_message, self.relay.peer_lost)
        self.dispatcher.relay = self.relay
        self.flows.serve_peers()
        self.relay.start()
        self.moves.registry_changed()  # the move rate's share from the registry as stored, not the default
        self.topology = Topology(config.cluster_id, config.partitions, self._topology_nodes(), tuple(
            PartitionInfo(p, tuple(node_of_member(m) for m in self.target(p))) for p in range(config.partitions)), 0)
        boot = self.cluster_map.registry.bootstrap_placement()
        hosted = sum(self.node_id in replicas for replicas in boot.values())
        # Like the Raft timers (raft.replica.timing_scale), the idle tick stretches with the groups hosted.
        self._hosted_hint = max(1, hosted)
        self._tick_idle_ms = int(TICK_IDLE_MS * timing_scale(hosted))
        for p in range(config.partitions):
            if (self.data_dir / f"p{p}.raft").exists():
                self._open_replica(p, start=False)
        self._bootstrap_replicas(start=False)
        # Links come up once every group is registered, so no peer's first votes are lost.
        await self.raft_network.start()
        for part in self.partitions.values():
            part.replica.start()
        host = listen or self.spec.host
        self._server = await self.loop.create_server(
            lambda: ClientConnection(self.dispatcher, self.config.frame_bytes_max,
                                     self.config.inflight_per_connection),
            host, self.spec.client_listen_port, reuse_address=True, backlog=1024,
            ssl=self.config.tls.server_context() if self.config.tls else None)
        self.http_runner = await start_http(self, host, self.spec.http_port)
        for coro in (self._tick_loop(), self._topology_loop(), self._balance_loop(), self._peer_loop(),
                     self.guard.run(), self._lazy_sync_loop(), self.flows.run(), self.moves.run()):
            self._tasks.append(self.loop.create_task(coro))
        log.info("node %s serving clients on %s:%d (partitions %s)", self.node_id, host, self.spec.client_listen_port,
                 sorted(self.partitions))

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
        for p, part in self.partitions.items():
            replica = part.replica
            if replica.is_leader() and len(replica.membership.voters) > 1:
                try:
                    replica.transfer_leadership()
                except Exception:  # best effort: a follower will time out and take over anyway
                    log.debug("partition %d: transferLeadership failed", p, exc_info=True)
        while time.monotonic() < deadline and any(
                part.replica.is_leader() and len(part.replica.membership.voters) > 1
                for part in self.partitions.values()):
            await asyncio.sleep(0.05)
        err = CommandError(ErrorCode.SHUTTING_DOWN, "the node is shutting down; retry on another node")
        for part in self.partitions.values():
            part.group_commit.fail_all(err)
            self.dispatcher.fail_parked(part, err)
        for task in self._tasks:
            task.cancel()
        self.payload_repair.close()
        for conn in list(self.dispatcher.connections):
            conn.close()
        if self.relay is not None:
            self.relay.close()
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        for part in self.partitions.values():
            part.replica.close()
        self.digests.close()
        if self.raft_network is not None:
            self.raft_network.close()
        if self.storage is not None:
            self.storage.close()
        self.scheduler.close()
        self._stopped.set()

    # --- hosting replicas ---------------------------------------------------------------------------

    def target(self, p: int) -> list[str]:
        """Partition ``p``'s target replicas (member ids, preferred leader first), from the registry."""
        return self.cluster_map.placement().get(p, []) if self.cluster_map else []

    def _peer_addresses(self) -> dict[str, tuple[str, int]]:
        """Raft addresses of every live node but this one; the cluster file's routes win (chaos proxies)."""
        listed = {n.id for n in self.config.nodes}
        out = {}
        for peer, address in self.cluster_map.peer_addresses().items():
            out[peer] = self.config.peer_raft_address(self.node_id, peer) if peer in listed else address
        return out

    def _member_of(self, node: str) -> str | None:
        net = self.raft_network
        return self.cluster_map.member_of(node, net.peer_incarnation(node) if net else None)

    def _open_replica(self, p: int, *, start: bool, membership: Membership | None = None) -> PartitionReplica | None:
        """Host partition ``p`` (its files exist, or ``membership`` is its first one)."""
        me = self.cluster_map.self_member()
        if me is None or p in self.partitions:
            hosted = self.partitions.get(p)
            return hosted.replica if hosted is not None else None
        target = self.target(p)
        if membership is None:
            boot = self.cluster_map.registry.bootstrap_placement().get(p, [])
            membership = Membership.of(boot) if me in boot else Membership.of([])
        peers = [m for m in target if m != me]
        payloads = PayloadFiles(self.data_dir / PAYLOADS_DIR / f"p{p}", self._payload_file_bytes,
                                on_damage=lambda exc: self.payload_repair.damaged(p, exc))
        replica = PartitionReplica(p, self.raft_network, peers, application=PartitionMachine(p, payloads),
                                   data_dir=str(self.data_dir), loop=self.loop,
                                   scheduler=self.scheduler, preferred=bool(target) and target[0] == me,
                                   groups=self._hosted_hint, storage=self.storage, repair=self.config.repair_damaged,
                                   member=me, membership=membership, member_of=self._member_of,
                                   snapshot_rates=[self.moves.rate])
        replica.on_leadership_lost = self._leadership_lost
        self.partitions[p] = Partition.hosted(p, replica, self.loop, self.clock, serving=self.dispatcher)
        if start:
            replica.start()
        return replica

    def _bootstrap_replicas(self, *, start: bool) -> None:
        """On the cluster's first start, host the partitions the bootstrap placement gives this node.

        Only an original member does (a wiped node's new incarnation joins as a new member), and
        only once: the ``bootstrapped`` mark makes a replica created later a joiner, which never
        takes the bootstrap membership (it could not have acknowledged anything under it).
        """
        mark = self.data_dir / BOOTSTRAP_MARK
        reg = self.cluster_map.registry
        entry = reg.nodes.get(self.node_id)
        if mark.exists() or entry is None or entry.original != self.incarnation or \
                self.cluster_map.self_member() != self.node_id:
            return
        for p, replicas in sorted(reg.bootstrap_placement().items()):
            if self.node_id in replicas and p not in self.partitions:
                self._open_replica(p, start=start, membership=Membership.of(replicas))
        self.storage.io.write_atomic(str(mark), [b"1\n"])

    def _unknown_partition(self, peer: str, p: int, message: Any) -> None:
        """A peer sent a message for a partition this node hosts no replica of: a leader adding this
        node to the group. Host it (as a joiner that learns its membership from the leader)."""
        if self.stopping or not 0 <= p < self.config.partitions or self.cluster_map.self_member() is None:
            return
        if self._member_of(peer) is None or self.cluster_map.registry.nodes.get(peer) is None:
            return
        replica = self._open_replica(p, start=True)
        if replica is not None:
            log.info("partition %d: hosting a new replica, first contacted by %s", p, peer)
            replica._deliver(peer, message)  # noqa: SLF001 (the message that announced the group)

    def _registry_changed(self, old: Registry, new: Registry) -> None:
        """Links, member routes, hosting and the topology follow the registry."""
        net = self.raft_network
        if net is not None:
            net.set_peers(self._peer_addresses(), self.cluster_map.dials())
        for part in self.partitions.values():
            replica = part.replica
            replica.refresh_routes()
            replica.set_peer_order([m for m in self.target(replica.partition) if m != replica.member])
        if self.cluster_map.self_member() is not None and net is not None:
            self._bootstrap_replicas(start=True)
        self.moves.registry_changed()
        self.topology = replace(self.topology, nodes=self._topology_nodes(), epoch=self.topology.epoch + 1)
        self._announce_topology()

    def _topology_nodes(self) -> dict[str, NodeAddress]:
        return {n.id: NodeAddress(n.id, n.host, n.port, n.http_port) for n in self.cluster_map.registry.live()}

    # --- helpers used by the dispatcher ------------------------------------------------------------

    def leads(self, p: int) -> bool:
        """This node's replica of partition ``p`` leads its group now."""
        part = self.partitions.get(p)
        return part is not None and part.replica.is_leader()

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
        replicas = {p: part.replica for p, part in self.partitions.items()}
        for p, part in sorted(self.partitions.items()):
            if partition is not None and p != partition:
                continue
            replica = part.replica
            digest, digest_index = self.digests.get(p, replica, replicas)
            out[str(p)] = {"leader": replica.leader_id(), "isLeader": replica.is_leader(),
                           "term": replica.term(), "commitIndex": replica.commit_index(),
                           "appliedIndex": replica.applied_index(), "digest": digest,
                           "digestIndex": digest_index, "snapshots": replica.snapshots.stats(),
                           "pendingCommands": part.group_commit.pending, "elections": replica.elections,
                           "transferElections": replica.transfer_elections, "raft": replica.status(),
                           "payloads": replica.application.payloads.stats()}
        net = self.raft_network
        raft = {"elections": sum(r.elections for r in replicas.values()),
                "transferElections": sum(r.transfer_elections for r in replicas.values()),
                "peersConnected": net.connected_peers() if net else [],
                "peerIncarnations": {p: net.peer_incarnation(p) for p in net.connected_peers()} if net else {},
                "handshakesRefused": net.refused_count if net else 0,
                "bytesSent": net.bytes_sent if net else 0}
        return {"nodeId": self.node_id, "replicas": out, "raft": raft}

    def snapshot_now(self) -> None:
        """Start a snapshot of every hosted partition that applied entries since its last one (SIGUSR1)."""
        log.info("node %s: snapshot of every partition requested", self.node_id)
        for part in self.partitions.values():
            part.replica.snapshot_now()

    # --- job events ------------------------------------------------------------------------------

    def events_wanted(self) -> None:
        """A listener or subscriber came: engines this node leads record job events from now on."""
        for part in self.partitions.values():
            if part.replica.is_leader():
                part.replica.application.record_events = True

    # --- background loops ----------------------------------------------------------------------

    def _compact_payloads(self) -> None:
        """One step of one partition's payload compaction, the partitions taking turns."""
        compacting = [part for part in self.partitions.values() if part.replica.application.payloads.compacting]
        if compacting:
            self._compact_turn += 1
            compacting[self._compact_turn % len(compacting)].replica.application.payloads.compact()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            now = self.now_ms()
            if now - self._payloads_collected_ms >= PAYLOAD_COLLECT_INTERVAL_MS:
                self._payloads_collected_ms = now
                for part in self.partitions.values():
                    part.replica.application.payloads.collect()
            if now - self._payloads_compacted_ms >= PAYLOAD_COMPACT_INTERVAL_MS:
                self._payloads_compacted_ms = now
                self._compact_payloads()
            for p in self._led:  # the partitions this node led at the last topology refresh
                part = self.partitions[p]
                replica = part.replica
                if part.tick_inflight or not replica.is_leader():
                    continue
                view = replica.application.view
                due = view.next_due_ms()
                # The idle tick trims histories by age; a partition without queues has nothing to
                # trim, and with hundreds of partitions its Raft entry per second is most of a
                # node's idle CPU.
                if (due is not None and due <= now) or (
                        view.has_queues() and now - part.last_tick_ms >= self._tick_idle_ms):
                    part.last_tick_ms = now
                    part.tick_inflight = True
                    part.group_commit.submit({"cmd": "_Tick"}, lambda _r, part=part: _tick_done(part))

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
        for p, part in self.partitions.items():
            replica = part.replica
            leader = replica.leader_id()
            term = replica.term()
            if leader == self.node_id:
                led.append(p)
            info = topo.partition_map[p]
            if info.leader == self.node_id and leader != self.node_id:
                lost.append(p)
            target = [node_of_member(m) for m in self.target(p)]
            replicas = tuple(sorted(replica.replica_nodes(),
                                    key=lambda n: (target.index(n) if n in target else len(target), n)))
            if (leader, term, replicas) != (info.leader, info.term, info.replicas):
                topo = topo.with_leader(p, leader, term, replicas if replicas else None, replica.config_index)
        self._led = led
        if topo is not self.topology:
            self.topology = topo
            self._announce_topology()
        for p in lost:
            self._release_partition(p)

    def _leadership_lost(self, p: int) -> None:
        """A hosted replica stopped leading (the replica's callback, on the loop)."""
        self.refresh_topology()
        self._release_partition(p)  # also when the topology poll had already seen the change

    def _release_partition(self, p: int) -> None:
        """Answer everything this node holds for partition ``p``, which it no longer leads."""
        err = self.not_leader_error(p)
        part = self.partitions[p]
        part.group_commit.fail_all(err)
        part.group_commit.abandon_inflight()
        self.dispatcher.fail_parked(part, err)

    def _announce_topology(self) -> None:
        event = {"event": "topology", "topology": self.topology.to_wire()}
        for conn in list(self.dispatcher.connections):
            if conn.protocol_version >= 2:
                conn.send_frame(event)

    async def _balance_loop(self) -> None:
        await asyncio.sleep(BALANCE_START_DELAY_S)
        while True:
            await asyncio.sleep(BALANCE_INTERVAL_S)
            for p, part in self.partitions.items():
                replica = part.replica
                target = self.target(p)
                if not target or target[0] == replica.member or not replica.is_leader():
                    continue
                preferred = target[0]
                if replica.peer_connected(preferred):
                    try:
                        replica.transfer_leadership(preferred)
                    except Exception:
                        log.debug("partition %d: transfer to %s refused", p, preferred, exc_info=True)

    async def _peer_loop(self) -> None:
        """Tell every linked peer, once a second, which partitions this node leads (over the Raft
        link's ``topology`` side channel): nodes learn leaders and memberships of the partitions
        they do not host, and a replica learns it was removed from its group."""
        while True:
            await asyncio.sleep(PEER_POLL_INTERVAL_S)
            self._gossip_led()

    def _gossip_led(self) -> None:
        net = self.raft_network
        if net is None:
            return
        led = [p.to_wire() for p in self.topology.partition_map if p.leader == self.node_id]
        if not led:
            return
        for peer in net.connected_peers():
            net.send_channel(peer, TOPOLOGY_CHANNEL, led)

    def _on_topology(self, peer: str, message: Any) -> None:
        """A peer's led partitions: merged by term and membership index."""
        if type(message) is not list or len(message) > self.config.partitions:
            return
        topo = self.topology
        for item in message:
            try:
                info = PartitionInfo.from_wire(item)
            except (KeyError, TypeError, ValueError):
                return
            if not 0 <= info.id < self.config.partitions or info.leader != peer:
                continue
            topo = topo.with_leader(info.id, info.leader, info.term, info.replicas, info.conf)
        if topo is not self.topology:
            self.topology = topo
            self._announce_topology()
        self._retire_removed()

    def _retire_removed(self) -> None:
        """Close (and delete the files of) replicas whose group no longer lists this node: its
        leader's membership (or the replica's own applied one) leaves it out, and so does the target."""
        me = self.cluster_map.self_member() if self.cluster_map else None
        for p, part in list(self.partitions.items()):
            replica = part.replica
            if replica.is_leader() or me in self.target(p):
                continue
            info = self.topology.partition_map[p]
            removed_by_leader = (info.leader is not None and info.leader != self.node_id and info.conf > 0
                                 and self.node_id not in info.replicas and info.conf >= replica.config_index)
            removed_here = replica.config_index > 0 and replica.member not in replica.membership.members
            if removed_by_leader or removed_here:
                self._retire(p)

    def _retire(self, p: int) -> None:
        replica = self._close_replica(p)
        replica.delete_files()
        log.info("partition %d: this node was removed from the group; replica closed and its files deleted", p)

    def _hosted_replica(self, p: int) -> PartitionReplica | None:
        part = self.partitions.get(p)
        return part.replica if part is not None else None

    def _rebuild(self, p: int) -> None:
        """Close partition ``p``'s replica and open it again from its snapshot and journal (its
        payload files are written afresh): :class:`.payload_repair.PayloadRepair`'s repair. A
        snapshot that refers to the payload files shares their damage: it is moved aside and the
        replica repaired from a peer (:meth:`~.raft.PartitionReplica.distrust_snapshot_files`)."""
        self._close_replica(p).distrust_snapshot_files()
        try:
            self._open_replica(p, start=True)
        except ReplicaDamaged as exc:  # repair is off: as at a start, the node refuses to run on it
            log.critical("node %s stops: %s", self.node_id, exc)
            logging.shutdown()
            os._exit(EXIT_DAMAGED)
        self.refresh_topology()

    def _close_replica(self, p: int) -> PartitionReplica:
        """Stop hosting partition ``p``: what waits on it is answered, its replica closed, its
        payload files deleted; returns the closed replica."""
        part = self.partitions.pop(p)
        part.retired = True
        replica = part.replica
        part.group_commit.fail_all(self.not_leader_error(p))
        part.group_commit.abandon_inflight()  # a lone leader's proposals: outcome unknown (TIMEOUT)
        self.dispatcher.fail_parked(part, self.not_leader_error(p))
        self.moves.retired_snapshot_bytes += int(replica.status()["snapshotBytesSent"])
        replica.close()
        replica.application.payloads.close()
        return replica


def _tick_done(part: Partition) -> None:
    part.tick_inflight = False


GC_THRESHOLDS = (50_000, 20, 100)
#: Open files a node asks for at start (see raise_open_files_limit), and below which it warns.
OPEN_FILES_WANTED = 65_536
OPEN_FILES_LOW = 4_096


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


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise the soft limit of open files towards ``wanted`` (never past the hard limit, never
    lower it); returns the limit now. A node holds a descriptor per payload file (64 MiB of job
    data), per journal segment and per connection, and a snapshot stream one per file it sends:
    a backlog of a hundred gigabytes passes the common default of 1,024."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (ImportError, OSError, ValueError) as exc:  # not POSIX, or not allowed: keep what there is
        log.warning("cannot raise the limit of open files: %s", exc)
        return -1
    if soft != resource.RLIM_INFINITY and soft < min(wanted, OPEN_FILES_LOW):
        log.warning("the limit of open files is %d (the hard limit); a large backlog's payload files may need "
                    "more (ulimit -n)", soft)
    return soft


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
    raise_open_files_limit()
    try:
        loop.run_until_complete(node.start())
        loop.run_until_complete(node.serve_forever())
    except ReplicaDamaged as exc:
        log.critical("node %s refuses to start: %s", node_id, exc)
        return EXIT_DAMAGED
    finally:
        loop.close()
    return 0
