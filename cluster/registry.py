"""The cluster's node registry: which nodes exist, where they listen, and which incarnation is each.

Theory of operation. Every node keeps a :class:`Registry` and exchanges it with its peers
(gossip over the Raft link); :meth:`Registry.merge` keeps, per node, the entry with the
higher version (ties broken by a total order on the entry, so every node picks the same),
and the cluster settings with the higher version, so every node converges to the same
registry whatever order the updates reach it in. Nothing here does I/O.

A node's *incarnation* is the random id written with its data on its first start: a node
whose data was wiped comes back with a new one. Raft configurations name members by
:func:`member_id`: the plain node id stands for the node's ``original`` incarnation (the one
the cluster was created with), ``"<id>/<incarnation>"`` for any later one. So a wiped node is
never mistaken for the member its old self was: it is a new member, added as a learner.

The target placement of every partition (:meth:`Registry.placement`) is computed from the
*active* nodes alone, as :func:`~.partitioning.place_replicas` does: adding a node moves only
the partitions whose ring position it lands next to.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .partitioning import default_rf, place_replicas

__all__ = ["NodeEntry", "Registry", "Settings", "RegistryError", "member_id", "node_of_member",
           "ACTIVE", "LEAVING", "REMOVED", "STATES", "MOVE_RATE_BYTES_PER_S"]

ACTIVE, LEAVING, REMOVED = "active", "leaving", "removed"
STATES = (ACTIVE, LEAVING, REMOVED)
#: Default cluster-wide byte rate of snapshot streams to new replicas (learners), split evenly
#: over the active nodes (``PUT /admin/settings moveRateBytesPerS`` changes it while moves run).
#: Chosen from ``bench/bench_elastic.py`` (docs/benchmarks.md, "Adding and removing a node under
#: load"): adding a fourth node to a loaded 3-node cluster at this rate keeps about 85 % of the
#: write rate it had (32 MiB/s about 81 %, unthrottled 78 %), and the node joins in about 12 s.
#: Log entries a new replica catches up on after its snapshot are not counted.
MOVE_RATE_BYTES_PER_S = 8 * 1024 * 1024
_NODES_MAX = 1000
_ID_CHARS_MAX = 64


class RegistryError(ValueError):
    """A registry document or update that cannot be accepted; the message says why."""


def member_id(node: str, incarnation: str | None, original: str | None) -> str:
    """The Raft member id of ``node`` running ``incarnation`` (see the module docstring)."""
    if not incarnation or incarnation == original or original is None:
        return node
    return f"{node}/{incarnation}"


def node_of_member(member: str) -> str:
    """The node id a Raft member id names."""
    return member.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """One node: addresses, incarnations, state, and the version that orders updates."""

    id: str
    host: str
    port: int
    http_port: int
    raft_port: int
    incarnation: str = ""
    original: str = ""
    state: str = ACTIVE
    version: int = 1
    #: Position in the cluster's node list (bootstrap nodes first, then nodes in the order added):
    #: of two nodes, the one with the higher ordinal dials the other's Raft port.
    ordinal: int = 0

    def member(self) -> str:
        """This node's Raft member id as its current incarnation runs it."""
        return member_id(self.id, self.incarnation, self.original or None)

    def _order(self) -> tuple[Any, ...]:
        return (self.version, STATES.index(self.state), self.incarnation, self.original, self.host, self.port,
                self.http_port, self.raft_port, self.ordinal)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, doc: Any) -> "NodeEntry":
        if not isinstance(doc, dict):
            raise RegistryError(f"node entry must be a map, not {type(doc).__name__}")
        try:
            entry = cls(id=str(doc["id"]), host=str(doc["host"]), port=int(doc["port"]),
                        http_port=int(doc["http_port"]), raft_port=int(doc["raft_port"]),
                        incarnation=str(doc.get("incarnation", "")), original=str(doc.get("original", "")),
                        state=str(doc.get("state", ACTIVE)), version=int(doc.get("version", 1)),
                        ordinal=int(doc.get("ordinal", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"malformed node entry: {exc}") from exc
        entry.check()
        return entry

    def check(self) -> None:
        if not self.id or len(self.id) > _ID_CHARS_MAX or "/" in self.id:
            raise RegistryError(f"bad node id {self.id!r}")
        if self.state not in STATES:
            raise RegistryError(f"node {self.id}: state must be one of {', '.join(STATES)}")
        for port in (self.port, self.http_port, self.raft_port):
            if not 0 < port < 65536:
                raise RegistryError(f"node {self.id}: port {port} out of range")
        if self.version < 1:
            raise RegistryError(f"node {self.id}: version must be at least 1")


@dataclass(frozen=True, slots=True)
class Settings:
    """Cluster-wide settings that may change while the cluster runs."""

    replication: int = 3
    rebalance_auto: bool = True
    move_rate_bytes_per_s: int = MOVE_RATE_BYTES_PER_S
    #: Raised by an operator's ``rebalance``: leaders move toward their targets even with
    #: ``rebalance_auto`` off.
    rebalance_epoch: int = 0
    version: int = 1

    def check(self) -> None:
        if not 1 <= self.replication <= 7:
            raise RegistryError("replication must be 1 .. 7")
        if not 1024 <= self.move_rate_bytes_per_s <= 10 * 1024**3:
            raise RegistryError("move_rate_bytes_per_s must be 1024 .. 10 GiB")


def _settings_order(settings: Settings) -> tuple[int, str]:
    return settings.version, json.dumps(asdict(settings), sort_keys=True)


@dataclass(frozen=True, slots=True)
class Registry:
    """Every node of the cluster and its settings (see the module docstring)."""

    cluster_id: str
    partitions: int
    nodes: dict[str, NodeEntry] = field(default_factory=dict)
    settings: Settings = Settings()
    #: The nodes the cluster was created with and its replication then: every partition's
    #: first membership (:meth:`bootstrap_placement`). Never changes.
    bootstrap: tuple[str, ...] = ()
    bootstrap_rf: int = 3

    # --- queries -------------------------------------------------------------------------------

    def active(self) -> list[NodeEntry]:
        return [n for _, n in sorted(self.nodes.items()) if n.state == ACTIVE]

    def live(self) -> list[NodeEntry]:
        """Nodes not removed (active or leaving): the ones that may still hold replicas."""
        return [n for _, n in sorted(self.nodes.items()) if n.state != REMOVED]

    def rf(self) -> int:
        active = len(self.active())
        return max(1, min(self.settings.replication, active)) if active else default_rf(0)

    def placement(self) -> dict[int, list[str]]:
        """Target replicas of every partition as Raft member ids, preferred leader first."""
        active = self.active()
        if not active:
            return {p: [] for p in range(self.partitions)}
        by_id = {n.id: n for n in active}
        nodes = place_replicas(list(by_id), self.partitions, self.rf())
        return {p: [by_id[n].member() for n in replicas] for p, replicas in nodes.items()}

    def dials(self, node: str) -> list[str]:
        """The live peers ``node`` dials: those with a lower ordinal (ties: the lower id)."""
        me = self.nodes[node]
        return [n.id for n in self.live() if (n.ordinal, n.id) < (me.ordinal, me.id)]

    def next_ordinal(self) -> int:
        return max((n.ordinal for n in self.nodes.values()), default=-1) + 1

    def bootstrap_placement(self) -> dict[int, list[str]]:
        """Every partition's first membership: the placement over the nodes the cluster was created with."""
        if not self.bootstrap:
            return {p: [] for p in range(self.partitions)}
        return place_replicas(self.bootstrap, self.partitions, self.bootstrap_rf)

    def entry_of_member(self, member: str) -> NodeEntry | None:
        """The node entry a member id denotes *now* (None when it names a past incarnation)."""
        entry = self.nodes.get(node_of_member(member))
        if entry is None or entry.member() != member:
            return None
        return entry

    def accepts(self, node: str, incarnation: str) -> str | None:
        """None when ``node`` running ``incarnation`` may use the Raft link, else why not."""
        entry = self.nodes.get(node)
        if entry is None:
            return f"{node} is not a node of cluster {self.cluster_id}"
        if entry.state == REMOVED:
            return f"{node} was removed from cluster {self.cluster_id}"
        if entry.incarnation and incarnation != entry.incarnation:
            return (f"{node} runs incarnation {incarnation}, the cluster knows it as incarnation "
                    f"{entry.incarnation} (a wiped or restored data directory: replace the node)")
        return None

    # --- updates (each returns a new registry) --------------------------------------------------

    def with_entry(self, entry: NodeEntry) -> "Registry":
        entry.check()
        if len(self.nodes) >= _NODES_MAX and entry.id not in self.nodes:
            raise RegistryError(f"a cluster has at most {_NODES_MAX} nodes")
        return replace(self, nodes={**self.nodes, entry.id: entry})

    def bumped(self, node: str, **changes: Any) -> "Registry":
        """The registry with ``node``'s entry changed and its version raised."""
        entry = self.nodes.get(node)
        if entry is None:
            raise RegistryError(f"no node {node!r}")
        return self.with_entry(replace(entry, version=entry.version + 1, **changes))

    def with_settings(self, **changes: Any) -> "Registry":
        settings = replace(self.settings, version=self.settings.version + 1, **changes)
        settings.check()
        return replace(self, settings=settings)

    def merge(self, other: "Registry") -> "Registry":
        """Per node the newer entry, and the newer settings (see the module docstring)."""
        if other.cluster_id != self.cluster_id:
            raise RegistryError(f"registry of cluster {other.cluster_id} cannot merge into {self.cluster_id}")
        nodes = dict(self.nodes)
        for node, theirs in other.nodes.items():
            mine = nodes.get(node)
            if mine is None or theirs._order() > mine._order():
                nodes[node] = theirs
        settings = max(self.settings, other.settings, key=_settings_order)
        if self.bootstrap and other.bootstrap and (self.bootstrap, self.bootstrap_rf) != (other.bootstrap, other.bootstrap_rf):
            raise RegistryError(f"registries of cluster {self.cluster_id} disagree on the nodes it was created "
                                f"with ({', '.join(self.bootstrap)} / {', '.join(other.bootstrap)})")
        bootstrap, rf = (self.bootstrap, self.bootstrap_rf) if self.bootstrap else (other.bootstrap, other.bootstrap_rf)
        if nodes == self.nodes and settings == self.settings and bootstrap == self.bootstrap:
            return self
        return replace(self, nodes=nodes, settings=settings, bootstrap=bootstrap, bootstrap_rf=rf)

    # --- wire form -----------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        return {"clusterId": self.cluster_id, "partitions": self.partitions,
                "nodes": [n.to_wire() for _, n in sorted(self.nodes.items())],
                "settings": asdict(self.settings), "bootstrap": list(self.bootstrap),
                "bootstrapRf": self.bootstrap_rf}

    @classmethod
    def from_wire(cls, doc: Any) -> "Registry":
        if not isinstance(doc, dict):
            raise RegistryError("registry must be a map")
        try:
            nodes_doc = doc["nodes"]
            if not isinstance(nodes_doc, list) or len(nodes_doc) > _NODES_MAX:
                raise RegistryError(f"nodes must be a list of at most {_NODES_MAX}")
            nodes = {e.id: e for e in (NodeEntry.from_wire(n) for n in nodes_doc)}
            s = doc.get("settings", {})
            settings = Settings(replication=int(s.get("replication", 3)),
                                rebalance_auto=bool(s.get("rebalance_auto", True)),
                                move_rate_bytes_per_s=int(s.get("move_rate_bytes_per_s", MOVE_RATE_BYTES_PER_S)),
                                rebalance_epoch=int(s.get("rebalance_epoch", 0)), version=int(s.get("version", 1)))
            settings.check()
            bootstrap = tuple(str(n) for n in doc.get("bootstrap", ()))
            if len(bootstrap) > _NODES_MAX:
                raise RegistryError("bootstrap lists too many nodes")
            return cls(str(doc["clusterId"]), int(doc["partitions"]), nodes, settings, bootstrap,
                       int(doc.get("bootstrapRf", 3)))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, RegistryError):
                raise
            raise RegistryError(f"malformed registry: {exc}") from exc
