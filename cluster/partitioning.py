"""Stable queue→partition hashing and replica placement.

The hash must be identical in every process and Python version, so it is
BLAKE2b (never Python's salted ``hash``). Placement walks a ketama ring of node
ids (``uhashring``) and takes the first ``rf`` distinct nodes: every node that
knows the same node set computes the same replicas, and a joining node takes
over only the partitions whose ring position it lands next to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from uhashring import HashRing

__all__ = ["stable_hash", "partition_for", "shard_queue_name", "place_replicas", "default_rf"]


def stable_hash(key: str) -> int:
    """A 64-bit hash of ``key`` that never changes across processes or versions."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def partition_for(queue: str, partitions: int) -> int:
    """The partition that holds ``queue``."""
    return stable_hash(queue) % partitions


def shard_queue_name(queue: str, shard: int) -> str:
    """The internal name of a sharded queue's ``shard``-th sub-queue.

    ``#`` is not allowed in user queue names, so sub-queues never collide with them.
    """
    return f"{queue}#{shard}"


def default_rf(node_count: int) -> int:
    """Default replication factor: ``min(3, nodes)``."""
    return max(1, min(3, node_count))


def place_replicas(node_ids: Iterable[str], partitions: int, rf: int) -> dict[int, list[str]]:
    """Replicas of every partition, preferred leader first.

    Deterministic in the *set* of node ids (their order does not matter).
    """
    nodes = sorted(set(node_ids))
    if not nodes:
        raise ValueError("placement needs at least one node")
    rf = max(1, min(rf, len(nodes)))
    ring = HashRing(nodes=nodes, hash_fn="ketama")
    placement: dict[int, list[str]] = {}
    for p in range(partitions):
        replicas: list[str] = []
        for node in ring.range(f"partition-{p}", size=None, unique=True):
            name = node if isinstance(node, str) else node["nodename"]
            if name not in replicas:
                replicas.append(name)
            if len(replicas) == rf:
                break
        placement[p] = replicas
    return placement


def leaders_per_node(placement: dict[int, Sequence[str]]) -> dict[str, int]:
    """How many partitions prefer each node as leader (for spread checks)."""
    counts: dict[str, int] = {}
    for replicas in placement.values():
        counts[replicas[0]] = counts.get(replicas[0], 0) + 1
    return counts
