"""Where the compatibility tests connect, and the queues they use: the node that leads the
fewest partitions, and queue names whose partitions it does not lead (on a cluster of more
than one node), so that every command of bunqueue's clients goes through forwarding
(:mod:`shoal.node.relay`)."""

from __future__ import annotations

import itertools

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

__all__ = ["entry_node", "queues_away_from"]


def entry_node(cluster: LocalCluster) -> str:
    """The node to connect to: the one that leads the fewest partitions."""
    topo = cluster.topology()
    led = {n: 0 for n in cluster.node_ids}
    for p in range(cluster.config.partitions):
        leader = topo.partition_map[p].leader
        if leader in led:
            led[leader] += 1
    return min(led, key=lambda n: (led[n], n))


def queues_away_from(cluster: LocalCluster, node: str, roles: tuple[str, ...], tag: str) -> dict[str, str]:
    """A queue name per role whose partition ``node`` does not lead (any name on one node)."""
    topo = cluster.topology()
    names = {}
    for role in roles:
        for i in itertools.count():
            name = f"bq-{tag}-{role}-{i}"
            p = partition_for(name, cluster.config.partitions)
            if len(cluster.node_ids) == 1 or topo.partition_map[p].leader not in (node, None):
                names[role] = name
                break
    return names
