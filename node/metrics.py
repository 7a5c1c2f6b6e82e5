"""Prometheus metrics of one node (prometheus-client), served on ``/prometheus``
and by the ``Prometheus`` command.

Counters that the hot path touches are plain ints on the node; a custom
collector (:mod:`.collector`) turns them and the engines' counts into samples at
scrape time, so serving a command costs no metrics lock.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = ["NodeMetrics"]


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

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
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
