"""The node's copy of the cluster registry: persisted, gossiped over the Raft link, deciding who may link.

Theory of operation. The registry (:mod:`shoal.cluster.registry`) lives in
``<data dir>/registry.json``, written atomically on every change. On a node's first start
it is built from the cluster file: every listed node active, none of their incarnations
known yet, and the list itself recorded as the nodes the cluster was created with.

Gossip: whenever a Raft link comes up the two nodes send each other their registries on
the link's ``registry`` side channel; a node that learns something merges it, persists
it, tells its listeners, and sends the result back when it differs from what came in,
so both ends converge. A local change (an operator command) goes to every linked peer.

Incarnations (:mod:`.identity`): the first time any node links with a node whose entry
names no incarnation, it records the one the handshake proved as that node's current and
*original* incarnation (the one the plain node id denotes in Raft configurations). From
then on the link policy (:meth:`ClusterMap.check_peer`) refuses that node running any
other incarnation — a wiped or restored data directory — until an operator replaces it
(:meth:`ClusterMap.replace_incarnation`), which makes the new one current while the plain
id keeps naming the old one: the new incarnation joins as a new member (``<id>/<inc>``).

A node knows its own member id only once the registry names its incarnation
(:meth:`ClusterMap.self_member`): a fresh node learns that from its first link, and until
then hosts no replica. A single-node cluster records its own incarnation.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from shoal.cluster.config import ClusterConfig
from shoal.cluster.partitioning import default_rf
from shoal.cluster.registry import ACTIVE, REMOVED, NodeEntry, Registry, RegistryError, member_id

from .raft._io import FileIO
from .raft.transport import RaftNetwork

__all__ = ["ClusterMap", "REGISTRY_FILE", "CHANNEL"]

log = logging.getLogger(__name__)

REGISTRY_FILE = "registry.json"
#: The Raft link side channel the registry travels on.
CHANNEL = "registry"
_REGISTRY_BYTES_MAX = 4 * 1024 * 1024


def bootstrap_registry(config: ClusterConfig) -> Registry:
    """The registry a cluster file describes, before any node was seen on a link."""
    boot = config.bootstrap_ids()
    rf = max(1, min(config.replication, len(boot))) if config.replication > 0 else default_rf(len(boot))
    reg = Registry(config.cluster_id, config.partitions, {}, bootstrap=boot, bootstrap_rf=rf)
    wanted = max(1, min(7, config.replication)) if config.replication > 0 else 3
    reg = reg.with_settings(replication=wanted) if wanted != reg.settings.replication else reg
    for k, n in enumerate(config.nodes):
        reg = reg.with_entry(NodeEntry(n.id, n.host, n.port, n.http_port, n.raft_port, ordinal=k))
    return reg


class ClusterMap:
    """The registry as one node holds it (see the module docstring)."""

    def __init__(self, io: FileIO, data_dir: str, config: ClusterConfig, node_id: str, incarnation: str) -> None:
        self._io = io
        self.path = os.path.join(data_dir, REGISTRY_FILE)
        self.node_id = node_id
        self.incarnation = incarnation
        self.network: RaftNetwork | None = None
        self._placement: tuple[Registry, dict[int, list[str]]] | None = None
        #: Called with (old, new) after every change of the registry.
        self.listeners: list[Callable[[Registry, Registry], None]] = []
        boot = bootstrap_registry(config)
        stored = self._load()
        self.registry = stored.merge(_config_additions(boot, stored)) if stored is not None else boot
        self.fresh = stored is None
        self._self_tofu()
        self._persist()

    # --- persistence -----------------------------------------------------------------------------

    def _load(self) -> Registry | None:
        if not self._io.exists(self.path):
            return None
        raw = self._io.read_all(self.path)
        if len(raw) > _REGISTRY_BYTES_MAX:
            raise RegistryError(f"{self.path}: {len(raw)} bytes, more than {_REGISTRY_BYTES_MAX}")
        try:
            return Registry.from_wire(json.loads(raw))
        except (ValueError, RegistryError) as exc:
            raise RegistryError(f"{self.path}: {exc}") from exc

    def _persist(self) -> None:
        body = json.dumps(self.registry.to_wire(), sort_keys=True, separators=(",", ":")).encode()
        self._io.write_atomic(self.path, [body])

    # --- queries ----------------------------------------------------------------------------------

    def placement(self) -> dict[int, list[str]]:
        """Every partition's target replicas (member ids), computed once per registry: building the
        hash ring costs about half a millisecond, and the node asks many times a second."""
        cached = self._placement
        if cached is None or cached[0] is not self.registry:
            cached = self._placement = (self.registry, self.registry.placement())
        return cached[1]

    def self_member(self) -> str | None:
        """This node's Raft member id, once the registry names this incarnation as its current one."""
        entry = self.registry.nodes.get(self.node_id)
        if entry is None or entry.incarnation != self.incarnation:
            return None
        return entry.member()

    def member_of(self, node: str, incarnation: str | None) -> str | None:
        """The member id of ``node`` running ``incarnation`` (None when the registry does not know it)."""
        entry = self.registry.nodes.get(node)
        if entry is None or not incarnation:
            return None
        return member_id(node, incarnation, entry.original or None)

    def check_peer(self, peer: str, incarnation: str) -> str | None:
        """The Raft link's policy: None when ``peer`` running ``incarnation`` may link, else why not."""
        return self.registry.accepts(peer, incarnation)

    def peer_addresses(self) -> dict[str, tuple[str, int]]:
        """Raft addresses of every live node but this one."""
        return {n.id: (n.host, n.raft_port) for n in self.registry.live() if n.id != self.node_id}

    def dials(self) -> set[str]:
        return set(self.registry.dials(self.node_id)) if self.node_id in self.registry.nodes else set()

    # --- changes ----------------------------------------------------------------------------------

    def update(self, registry: Registry) -> bool:
        """Adopt ``registry`` (a local change): persist, notify, send to every linked peer."""
        return self._set(registry, gossip=True)

    def _set(self, registry: Registry, gossip: bool) -> bool:
        if registry == self.registry:
            return False
        old, self.registry = self.registry, registry
        self._self_tofu()
        self._persist()
        for listener in list(self.listeners):
            try:
                listener(old, self.registry)
            except Exception:  # one listener's fault must not stop the others
                log.exception("registry listener failed")
        if gossip:
            self.broadcast()
        return True

    def _self_tofu(self) -> None:
        """A cluster of one records its own incarnation (no peer will)."""
        reg = self.registry
        entry = reg.nodes.get(self.node_id)
        if entry is not None and not entry.incarnation and [n.id for n in reg.live()] == [self.node_id]:
            self.registry = reg.bumped(self.node_id, incarnation=self.incarnation, original=self.incarnation)

    def add_node(self, entry: NodeEntry) -> Registry:
        """Register a new node (active, next ordinal); a known live id is refused."""
        reg = self.registry
        old = reg.nodes.get(entry.id)
        if old is not None and old.state != REMOVED:
            raise RegistryError(f"node {entry.id} is already a {old.state} node of the cluster")
        version = old.version + 1 if old is not None else 1
        new = NodeEntry(entry.id, entry.host, entry.port, entry.http_port, entry.raft_port,
                        incarnation=entry.incarnation, original=entry.incarnation, state=ACTIVE, version=version,
                        ordinal=reg.next_ordinal())
        self.update(reg.with_entry(new))
        return self.registry

    def set_state(self, node: str, state: str) -> Registry:
        reg = self.registry
        if node not in reg.nodes:
            raise RegistryError(f"no node {node!r}")
        if reg.nodes[node].state != state:
            self.update(reg.bumped(node, state=state))
        return self.registry

    def replace_incarnation(self, node: str, incarnation: str) -> Registry:
        """``node`` now runs ``incarnation`` (a replaced disk): it joins as a new member."""
        reg = self.registry
        entry = reg.nodes.get(node)
        if entry is None or entry.state == REMOVED:
            raise RegistryError(f"no live node {node!r}")
        if not incarnation or len(incarnation) > 64:
            raise RegistryError("incarnation must be 1 to 64 characters")
        if entry.incarnation != incarnation:
            self.update(reg.bumped(node, incarnation=incarnation, state=ACTIVE))
        return self.registry

    # --- gossip -----------------------------------------------------------------------------------

    def attach(self, network: RaftNetwork) -> None:
        """Gossip over ``network`` and decide who may link to it."""
        self.network = network
        network.register_channel(CHANNEL, self._on_message)
        network.on_peer_up.append(self._peer_up)
        network.set_peer_policy(self.check_peer)

    def broadcast(self) -> None:
        net = self.network
        if net is None:
            return
        wire = self.registry.to_wire()
        for peer in net.connected_peers():
            net.send_channel(peer, CHANNEL, wire)

    def _peer_up(self, peer: str) -> None:
        net = self.network
        assert net is not None
        incarnation = net.peer_incarnation(peer) or ""
        entry = self.registry.nodes.get(peer)
        if entry is not None and not entry.incarnation and incarnation:
            log.info("node %s: first seen running incarnation %s; recorded as its original", peer, incarnation)
            self._set(self.registry.bumped(peer, incarnation=incarnation, original=incarnation), gossip=True)
        net.send_channel(peer, CHANNEL, self.registry.to_wire())

    def _on_message(self, peer: str, message: Any) -> None:
        try:
            theirs = Registry.from_wire(message)
            merged = self.registry.merge(theirs)
        except RegistryError as exc:
            log.warning("registry from %s refused: %s", peer, exc)
            return
        self._set(merged, gossip=False)
        if merged != theirs and self.network is not None:
            self.network.send_channel(peer, CHANNEL, merged.to_wire())


def _config_additions(boot: Registry, stored: Registry) -> Registry:
    """Nodes the cluster file lists that the stored registry lacks (a local ``add-node`` writes
    the file before the node starts), as a registry to merge; nothing else of the file overrides."""
    extra = {k: v for k, v in boot.nodes.items() if k not in stored.nodes}
    if not extra:
        return stored
    ordinal = stored.next_ordinal()
    nodes = dict(stored.nodes)
    for k, (node, entry) in enumerate(sorted(extra.items(), key=lambda kv: kv[1].ordinal)):
        nodes[node] = NodeEntry(entry.id, entry.host, entry.port, entry.http_port, entry.raft_port,
                                ordinal=ordinal + k)
    return Registry(stored.cluster_id, stored.partitions, nodes, stored.settings, stored.bootstrap,
                    stored.bootstrap_rf)
