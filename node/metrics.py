"""Prometheus metrics of one node (prometheus-client), served on ``/prometheus``
and by the ``Prometheus`` command.

Counters that the hot path touches are plain ints on the node; a custom
collector turns them and the engines' counts into samples at scrape time, so
serving a command costs no metrics lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .server import Node

__all__ = ["NodeMetrics"]


class _NodeCollector(Collector):
    def __init__(self, node: "Node") -> None:
        self.node = node

    def collect(self) -> Iterator[Any]:
        node = self.node
        d = node.dispatcher
        yield CounterMetricFamily("shoal_commands", "Commands received by this node", value=d.commands_total)
        yield GaugeMetricFamily("shoal_connections", "Open client connections", value=len(d.connections))
        yield GaugeMetricFamily("shoal_sessions", "Sessions with an open connection", value=d.sessions.active)
        term = GaugeMetricFamily("shoal_raft_term", "Raft term per hosted partition", labels=["partition"])
        commit = GaugeMetricFamily("shoal_raft_commit_index", "Raft commit index", labels=["partition"])
        leader = GaugeMetricFamily("shoal_partition_is_leader", "1 when this node leads the partition",
                                   labels=["partition"])
        pending = GaugeMetricFamily("shoal_pending_commands", "Commands waiting for group commit",
                                    labels=["partition"])
        batches = CounterMetricFamily("shoal_raft_batches", "Raft entries proposed by group commit",
                                      labels=["partition"])
        for p, replica in sorted(node.replicas.items()):
            label = [str(p)]
            term.add_metric(label, replica.term())
            commit.add_metric(label, replica.raftCommitIndex)
            leader.add_metric(label, 1 if replica.is_leader() else 0)
            gc = node.group_commits[p]
            pending.add_metric(label, gc.pending)
            batches.add_metric(label, gc.proposed_batches)
        yield from (term, commit, leader, pending, batches)


class NodeMetrics:
    """The node's registry."""

    def __init__(self, node: "Node") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(node))

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()
