"""The node's Prometheus collector: its counters and every hosted engine's figures, read at scrape time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .view import NodeView

__all__ = ["NodeCollector"]


def _syncs(storage: Any) -> CounterMetricFamily:
    family = CounterMetricFamily("shoal_journal_syncs", "Journal fdatasyncs by the sync barrier (fsync class) "
                                 "and by the sync_interval_ms timer (disk class)", labels=["kind"])
    family.add_metric(["barrier"], storage.barrier_syncs)
    family.add_metric(["interval"], storage.lazy_syncs)
    return family


class NodeCollector(Collector):
    """Samples of the node's dispatcher, replicas, group commits and HTTP counters."""

    def __init__(self, node: "NodeView") -> None:
        self.node = node

    def collect(self) -> Iterator[Any]:
        node = self.node
        d = node.dispatcher
        yield CounterMetricFamily("shoal_commands", "Commands received by this node", value=d.commands_total)
        yield GaugeMetricFamily("shoal_connections", "Open client connections", value=len(d.connections))
        yield GaugeMetricFamily("shoal_sessions", "Sessions with an open connection", value=d.sessions.active)
        term = GaugeMetricFamily("shoal_raft_term", "Raft term per hosted partition", labels=["partition"])
        commit = GaugeMetricFamily("shoal_raft_commit_index", "Raft commit index", labels=["partition"])
        elections = CounterMetricFamily("shoal_raft_elections", "Elections this node's replica of the partition "
                                        "started (campaigns, including requested leadership transfers)",
                                        labels=["partition"])
        leader = GaugeMetricFamily("shoal_partition_is_leader", "1 when this node leads the partition",
                                   labels=["partition"])
        pending = GaugeMetricFamily("shoal_pending_commands", "Commands waiting for group commit",
                                    labels=["partition"])
        batches = CounterMetricFamily("shoal_raft_batches", "Raft entries proposed by group commit",
                                      labels=["partition"])
        batched = CounterMetricFamily("shoal_raft_batched_commands", "Commands carried by those entries "
                                      "(divided by shoal_raft_batches: the group-commit batch size)",
                                      labels=["partition"])
        for p, part in sorted(node.partitions.items()):
            replica = part.replica
            label = [str(p)]
            term.add_metric(label, replica.term())
            commit.add_metric(label, replica.commit_index())
            elections.add_metric(label, replica.elections)
            leader.add_metric(label, 1 if replica.is_leader() else 0)
            gc = part.group_commit
            pending.add_metric(label, gc.pending)
            batches.add_metric(label, gc.proposed_batches)
            batched.add_metric(label, gc.proposed_commands)
        storage = node.storage
        if storage is not None:
            yield GaugeMetricFamily("shoal_disk_space_low", "1 while free space on the data directory is below "
                                    "disk_free_min_bytes (partitions refuse new data with NO_SPACE)",
                                    value=1 if storage.space_low() else 0)
            no_space = GaugeMetricFamily("shoal_partition_no_space", "1 when the partition's last write was "
                                         "refused for lack of space", labels=["partition"])
            for p in sorted(node.partitions):
                no_space.add_metric([str(p)], 1 if p in storage.no_space else 0)
            yield no_space
            yield _syncs(storage)
        leaders = GaugeMetricFamily("shoal_partition_leader", "1 for the node this node believes leads the partition",
                                    labels=["partition", "leader"])
        for info in node.topology.partition_map:
            if info.leader:
                leaders.add_metric([str(info.id), info.leader], 1)
        inflight = GaugeMetricFamily("shoal_inflight_commands", "Commands received and not yet answered "
                                     "(binary connections and HTTP)",
                                     value=sum(getattr(c, "_inflight", 0) for c in d.connections)
                                     + node.metrics.http_inflight)
        streams = GaugeMetricFamily("shoal_http_streams", "Open HTTP streams: SSE events, /work push "
                                    "streams, WebSockets", labels=["kind"])
        for kind, n in sorted(node.metrics.http_streams.items()):
            streams.add_metric([kind], n)
        forwarded = CounterMetricFamily("shoal_http_forwarded", "HTTP requests forwarded to a partition's leader",
                                        value=node.metrics.http_forwarded)
        http_open = GaugeMetricFamily("shoal_http_connections", "Open HTTP connections (limits.http_connections_max)",
                                      value=node.metrics.http_connections)
        refusals = CounterMetricFamily("shoal_http_refusals", "HTTP connections refused or cut off: connections_max "
                                       "(503), header_timeout and body_timeout (408)", labels=["reason"])
        for reason, n in sorted(node.metrics.http_refusals.items()):
            refusals.add_metric([reason], n)
        yield from (term, commit, elections, leader, pending, batches, batched, leaders, inflight, streams, forwarded,
                    http_open, refusals)
        jobs = GaugeMetricFamily("shoal_queue_jobs", "Jobs by state, per queue (partitions this node leads)",
                                 labels=["queue", "state"])
        totals = CounterMetricFamily("shoal_queue_events", "Per-queue totals: enqueued, completed, failed, "
                                     "reclaimed, expired, retried", labels=["queue", "kind"])
        for _p, part in sorted(node.partitions.items()):
            replica = part.replica
            if not replica.is_leader():
                continue
            for q in replica.application.view.queue_figures():
                for state, n in q.counts.items():
                    jobs.add_metric([q.name, state], n)
                for kind, n in q.totals.items():
                    totals.add_metric([q.name, kind], n)
        yield from (jobs, totals)
        yield from _moves(node)


def _moves(node: "NodeView") -> Iterator[Any]:
    """Moves of replicas (membership changes this node makes as a leader) and their traffic."""
    moves = node.moves
    yield CounterMetricFamily("shoal_moves_started", "Replicas this node, as a partition's leader, added as "
                              "learners (a move begins)", value=moves.started)
    yield CounterMetricFamily("shoal_moves_finished", "Learners this node, as a partition's leader, promoted to "
                              "voters (a move's new replica votes)", value=moves.finished)
    running = GaugeMetricFamily("shoal_moves_in_progress", "Moves of the partitions this node leads, by state "
                                "(waiting, catching up, removing, pending rebalance)", labels=["state"])
    by_state: dict[str, int] = {}
    for move in moves.moves():
        by_state[move["state"]] = by_state.get(move["state"], 0) + 1
    for state, n in sorted(by_state.items()):
        running.add_metric([state], n)
    yield running
    yield CounterMetricFamily("shoal_snapshot_bytes_sent", "Snapshot bytes this node streamed to new replicas and "
                              "lagging followers", value=moves.snapshot_bytes_sent())
    yield GaugeMetricFamily("shoal_move_rate_bytes_per_second", "This node's share of the cluster's move rate "
                            "(move_rate_bytes_per_s over the active nodes)", value=moves.rate.rate)
    voters = GaugeMetricFamily("shoal_partition_voters", "Voting members of the partition's group, as this "
                               "node's replica last applied its membership", labels=["partition"])
    learners = GaugeMetricFamily("shoal_partition_learners", "Learners (new replicas catching up) of the "
                                 "partition's group, as this node's replica last applied its membership",
                                 labels=["partition"])
    for p, part in sorted(node.partitions.items()):
        membership = part.replica.core.membership
        voters.add_metric([str(p)], len(membership.voters))
        learners.add_metric([str(p)], len(membership.learners))
    yield from (voters, learners)
