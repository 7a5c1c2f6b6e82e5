"""The cluster topology model shared by nodes and clients.

On the wire (``Hello`` reply and ``{event: "topology"}`` pushes)::

    {"clusterId": str, "epoch": int, "partitions": int,
     "nodes": [{"id": str, "host": str, "port": int, "httpPort": int}],
     "partitionMap": [{"id": int, "replicas": [node id...], "leader": node id | None, "term": int}]}

Nodes learn leaders from their own Raft groups and from peers; merging keeps,
per partition, the view with the highest Raft term.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .errors import ProtocolError
from .jobid import partition_of_job
from .partitioning import partition_for

__all__ = ["NodeAddress", "PartitionInfo", "Topology"]


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where a node listens for clients."""

    id: str
    host: str
    port: int
    http_port: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "port": self.port, "httpPort": self.http_port}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "NodeAddress":
        return cls(str(d["id"]), str(d["host"]), int(d["port"]), int(d.get("httpPort") or 0))


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition's replicas, its leader (if known) and that leader's Raft term."""

    id: int
    replicas: tuple[str, ...]
    leader: str | None = None
    term: int = 0
    #: The log index of the membership ``replicas`` comes from (orders views of one term).
    conf: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "replicas": list(self.replicas), "leader": self.leader, "term": self.term,
                "conf": self.conf}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "PartitionInfo":
        leader = d.get("leader")
        return cls(int(d["id"]), tuple(str(r) for r in d.get("replicas") or ()),
                   str(leader) if leader is not None else None, int(d.get("term") or 0), int(d.get("conf") or 0))


@dataclass(frozen=True, slots=True)
class Topology:
    """Nodes, partitions with leaders, and an epoch that grows with every change."""

    cluster_id: str
    partitions: int
    nodes: dict[str, NodeAddress]
    partition_map: tuple[PartitionInfo, ...]
    epoch: int = 0

    def leader_of(self, partition: int) -> NodeAddress | None:
        """The leader's address of ``partition``, if one is known."""
        info = self.partition_map[partition]
        return self.nodes.get(info.leader) if info.leader else None

    def partition_of_queue(self, queue: str) -> int:
        return partition_for(queue, self.partitions)

    def partition_of_job(self, job_id: str) -> int:
        return partition_of_job(job_id)

    def with_leader(self, partition: int, leader: str | None, term: int,
                    replicas: tuple[str, ...] | None = None, conf: int = 0) -> "Topology":
        """A copy where ``partition`` has ``leader`` at ``term`` (if not older than what is known),
        and ``replicas`` as of membership index ``conf`` when given and newer."""
        info = self.partition_map[partition]
        new_replicas = replicas is not None and replicas != info.replicas and (term, conf) >= (info.term, info.conf)
        if term < info.term or (term == info.term and info.leader == leader and not new_replicas):
            return self
        parts = list(self.partition_map)
        parts[partition] = replace(info, leader=leader, term=term)
        if new_replicas:
            parts[partition] = replace(parts[partition], replicas=tuple(replicas or ()), conf=conf)
        return replace(self, partition_map=tuple(parts), epoch=self.epoch + 1)

    def merge(self, other: "Topology") -> "Topology":
        """Per partition, keep the view that names a leader, then the one with the highest term.

        A node that names no leader is campaigning or cut off; its leaderless view (maybe
        at a higher term it voted in) must not hide the leader the majority elected.
        """
        if other.partitions != self.partitions:
            return other if other.epoch > self.epoch else self
        parts = []
        changed = False
        for mine, theirs in zip(self.partition_map, other.partition_map):
            newer = (theirs.leader is not None, theirs.term, theirs.conf) > (mine.leader is not None, mine.term, mine.conf)
            parts.append(theirs if newer else mine)
            changed |= newer
        nodes = {**self.nodes, **other.nodes}
        if not changed and nodes == self.nodes:
            return self
        return replace(self, nodes=nodes, partition_map=tuple(parts),
                       epoch=max(self.epoch, other.epoch) + 1)

    def to_wire(self) -> dict[str, Any]:
        return {
            "clusterId": self.cluster_id,
            "epoch": self.epoch,
            "partitions": self.partitions,
            "nodes": [n.to_wire() for n in self.nodes.values()],
            "partitionMap": [p.to_wire() for p in self.partition_map],
        }

    @classmethod
    def from_wire(cls, d: Any) -> "Topology":
        try:
            nodes = {n.id: n for n in (NodeAddress.from_wire(x) for x in d["nodes"])}
            parts = tuple(sorted((PartitionInfo.from_wire(p) for p in d["partitionMap"]), key=lambda p: p.id))
            count = int(d["partitions"])
            if len(parts) != count or any(p.id != i for i, p in enumerate(parts)):
                raise ValueError("partitionMap does not cover every partition")
            return cls(str(d.get("clusterId") or ""), count, nodes, parts, int(d.get("epoch") or 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed topology: {exc}") from exc
