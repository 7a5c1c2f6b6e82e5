"""Prometheus metrics of one node (prometheus-client), served on ``/prometheus``
and by the ``Prometheus`` command.

Counters that the hot path touches are plain ints on the node; a custom
collector turns them and the engines' counts into samples at scrape time, so
serving a command costs no metrics lock.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .server import Node

__all__ = ["NodeMetrics"]


def _syncs(storage: Any) -> CounterMetricFamily:
    family = CounterMetricFamily("shoal_journal_syncs", "Journal fdatasyncs by the sync barrier (fsync class) "
                                 "and by the sync_interval_ms timer (disk class)", labels=["kind"])
    family.add_metric(["barrier"], storage.barrier_syncs)
    family.add_metric(["interval"], storage.lazy_syncs)
    return family


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
        for p, replica in sorted(node.replicas.items()):
            label = [str(p)]
            term.add_metric(label, replica.term())
            commit.add_metric(label, replica.commit_index())
            elections.add_metric(label, replica.elections)
            leader.add_metric(label, 1 if replica.is_leader() else 0)
            gc = node.group_commits[p]
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
            for p in sorted(node.replicas):
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
        for p, replica in sorted(node.replicas.items()):
            if not replica.is_leader():
                continue
            for name, q in replica.engine.queues.items():
                for state, n in q.counts.items():
                    jobs.add_metric([name, state], n)
                for kind, n in q.totals.items():
                    totals.add_metric([name, kind], n)
        yield from (jobs, totals)


_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30)


class _LatencyHistograms(Collector):
    """Per-command latency histograms kept as plain lists, exposed at scrape time.

    Every command of the binary protocol records one sample; prometheus-client's
    ``Histogram.observe`` takes a lock and walks the buckets (~1.5 µs, 5% of a leader's
    time under pipelined PUSH). Here a sample is one bisect and two additions, done on
    the event loop thread only, so no lock is needed.
    """

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self._counts: dict[str, list[int]] = {}   # cmd -> per-bucket counts (last: +Inf)
        self._sums: dict[str, float] = {}

    def observe(self, cmd: str, seconds: float, n: int = 1) -> None:
        """``n`` samples of ``seconds`` each (commands answered together took the same time)."""
        counts = self._counts.get(cmd)
        if counts is None:
            counts = self._counts[cmd] = [0] * (len(_BUCKETS) + 1)
            self._sums[cmd] = 0.0
        counts[bisect_left(_BUCKETS, seconds)] += n
        self._sums[cmd] += seconds * n

    def collect(self) -> Iterator[Any]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["cmd"])
        bounds = [str(float(b)) for b in _BUCKETS] + ["+Inf"]
        for cmd, counts in sorted(self._counts.items()):
            cumulative, total = [], 0
            for bound, n in zip(bounds, counts):
                total += n
                cumulative.append((bound, total))
            family.add_metric([cmd], cumulative, self._sums[cmd])
        yield family
#: Bound on distinct ``cmd`` labels of HTTP commands (a client choosing ``cmd`` over /ws must not
#: grow the registry without limit); the rest are counted as "other".
_LABELS_MAX = 200


class NodeMetrics:
    """The node's registry, plus the plain counters the HTTP layer keeps for it."""

    def __init__(self, node: "Node") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(node))
        self.latency = _LatencyHistograms("shoal_command_latency_seconds",
                                          "Time from receiving a command to answering it")
        self.registry.register(self.latency)
        self.http_command_latency = Histogram(
            "shoal_http_command_latency_seconds",
            "Commands run for HTTP, /ws and /work: time until the reply (long-poll waits included)",
            ["cmd"], registry=self.registry, buckets=_BUCKETS)
        self.http_latency = Histogram("shoal_http_request_latency_seconds",
                                      "HTTP requests (streams excluded): time until the response",
                                      ["method", "route"], registry=self.registry, buckets=_BUCKETS)
        self.http_requests = Counter("shoal_http_requests", "HTTP requests answered, by route and status",
                                     ["method", "route", "status"], registry=self.registry)
        self.http_inflight = 0
        self.http_forwarded = 0
        self.http_streams: dict[str, int] = {"events": 0, "work": 0, "ws": 0}
        self.http_connections = 0
        self.http_refusals: dict[str, int] = {"connections_max": 0, "header_timeout": 0, "body_timeout": 0}
        self._http_children: dict[tuple[str, str, int], Any] = {}
        self._http_cmd_children: dict[str, Any] = {}

    def observe(self, cmd: str, seconds: float, n: int = 1) -> None:
        """Record the latency of ``n`` commands answered together (``cmd`` is a validated
        command name: a bounded set)."""
        self.latency.observe(cmd, seconds, n)

    def observe_http_command(self, cmd: str, seconds: float) -> None:
        """Record one command run for HTTP (cmd names come from clients, hence the bound)."""
        child = self._http_cmd_children.get(cmd)
        if child is None:
            if len(self._http_cmd_children) >= _LABELS_MAX:
                cmd = "other"
                child = self._http_cmd_children.get(cmd)
            if child is None:
                child = self._http_cmd_children[cmd] = self.http_command_latency.labels(cmd)
        child.observe(seconds)

    def observe_http(self, method: str, route: str, status: int, seconds: float | None) -> None:
        """Count one HTTP request; ``seconds`` is None for streams (their length means nothing).

        ``method`` and ``route`` come from a fixed set (the caller maps the rest to "other" and
        "unmatched"); ``status`` is bounded by HTTP itself.
        """
        key = (method, route, status)
        child = self._http_children.get(key)
        if child is None:
            child = self._http_children[key] = self.http_requests.labels(method, route, str(status))
        child.inc()
        if seconds is not None:
            self.http_latency.labels(method, route).observe(seconds)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()
