"""Prometheus metrics of one node (prometheus-client), served on ``/prometheus``
and by the ``Prometheus`` command.

Counters that the hot path touches are plain ints on the node; a custom
collector turns them and the engines' counts into samples at scrape time, so
serving a command costs no metrics lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
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
        leaders = GaugeMetricFamily("shoal_partition_leader", "1 for the node this node believes leads the partition",
                                    labels=["partition", "leader"])
        for info in node.topology.partition_map:
            if info.leader:
                leaders.add_metric([str(info.id), info.leader], 1)
        inflight = GaugeMetricFamily("shoal_inflight_commands", "Commands received and not yet answered",
                                     value=sum(getattr(c, "_inflight", 0) for c in d.connections))
        yield from (term, commit, leader, pending, batches, leaders, inflight)
        jobs = GaugeMetricFamily("shoal_queue_jobs", "Jobs by state, per queue (partitions this node leads)",
                                 labels=["queue", "state"])
        totals = CounterMetricFamily("shoal_queue_events", "Per-queue totals: enqueued, completed, failed, "
                                     "reclaimed, expired, retried", labels=["queue", "kind"])
        for p, replica in sorted(node.replicas.items()):
            if not replica.is_leader():
                continue
            for name, q in replica.engine.queues.items():
                for state, n in q.counts.items():
                    jobs.add_metric([name, state], n)
                for kind, n in q.totals.items():
                    totals.add_metric([name, kind], n)
        yield from (jobs, totals)


class NodeMetrics:
    """The node's registry."""

    def __init__(self, node: "Node") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(node))
        self.latency = Histogram("shoal_command_latency_seconds", "Time from receiving a command to answering it",
                                 ["cmd"], registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30))
        self._children: dict[str, Any] = {}

    def observe(self, cmd: str, seconds: float) -> None:
        """Record one command's latency (children cached: a labels() lookup per command is slow)."""
        child = self._children.get(cmd)
        if child is None:
            child = self._children[cmd] = self.latency.labels(cmd)
        child.observe(seconds)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()
