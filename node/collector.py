"""The node's Prometheus collector: its counters and every hosted engine's figures, read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shoal.cluster.registry import node_of_member

if TYPE_CHECKING:
    from .view import NodeView

__all__ = ["NodeCollector", "MoveWatch"]


#: Per partition, from its payload files' ``stats()``: (family, name, help, stats key).
_PAYLOAD_METRICS: tuple[tuple[Any, str, str, str], ...] = (
    (GaugeMetricFamily, "shoal_payload_bytes", "Bytes of job data this node's replica of the partition holds "
     "in its payload files (not yet released)", "liveBytes"),
    (GaugeMetricFamily, "shoal_payload_files", "Payload files of the partition's replica holding unreleased "
     "job data", "files"),
    (GaugeMetricFamily, "shoal_payload_disk_bytes", "Bytes the partition replica's payload files take on disk "
     "(released bytes until their file is deleted or compacted)", "diskBytes"),
    (CounterMetricFamily, "shoal_payload_copied_bytes", "Bytes compactions of the partition replica's payload "
     "files copied", "copiedBytes"),
    (CounterMetricFamily, "shoal_payload_read_errors", "Reads of the partition replica's payload files that "
     "failed (a damaged file: the replica is rebuilt from its snapshot and journal)", "readErrors"),
)


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
        self.move_watch = MoveWatch()

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
        lag = GaugeMetricFamily("shoal_raft_follower_lag_entries", "Entries a voter of the partition lacks "
                                 "(this node's last index minus the follower's match index), on the partition's "
                                 "leader", labels=["partition", "follower"])
        silence = GaugeMetricFamily("shoal_raft_follower_silence_seconds", "Seconds since the partition's leader "
                                    "last heard from a voter (or became leader)", labels=["partition", "follower"])
        now = time.monotonic()  # the replicas' clock (as in moves.py)
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
            # a learner catching up is a move (shoal_move_idle_seconds), not lag
            for member, behind, silent_s in replica.follower_lags(now):
                follower = [str(p), node_of_member(member)]
                lag.add_metric(follower, behind)
                silence.add_metric(follower, silent_s)
        yield from (lag, silence)
        payloads = [(kind(name, text, labels=["partition"]), key) for kind, name, text, key in _PAYLOAD_METRICS]
        for p, part in sorted(node.partitions.items()):
            stats = part.replica.application.payloads.stats()
            for family, key in payloads:
                family.add_metric([str(p)], stats[key])
        yield from (family for family, _ in payloads)
        yield CounterMetricFamily("shoal_payload_rebuilds", "Replicas this node rebuilt from their snapshot and "
                                  "journal after a read of their payload files failed",
                                  value=node.payload_repair.rebuilds)
        storage = node.storage
        if storage is not None:
            yield GaugeMetricFamily("shoal_disk_space_low", "1 while free space on the data directory is below "
                                    "disk_free_min_bytes (partitions refuse new data with NO_SPACE)",
                                    value=1 if storage.space_low() else 0)
            yield GaugeMetricFamily("shoal_disk_free_min_bytes", "disk_free_min_bytes: free space below which "
                                    "new data is refused with NO_SPACE", value=storage.io.disk_free_min_bytes)
            try:
                free = storage.io.free_bytes(storage.data_dir)  # one statvfs per scrape
            except OSError:
                pass
            else:
                yield GaugeMetricFamily("shoal_disk_free_bytes", "Bytes free for the node on its data "
                                        "directory's filesystem", value=free)
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
        yield from _peer_metrics(node)
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
        yield from _moves(node, self.move_watch)


def _peer_metrics(node: "NodeView") -> Iterator[Any]:
    """The node-to-node links' traffic and the relay's forwarding (``node/relay.py``)."""
    network = node.raft_network
    if network is not None:
        yield CounterMetricFamily("shoal_peer_frames_sent", "Frames written to the other nodes on the "
                                  "node-to-node links (Raft messages and the relay, registry and topology "
                                  "channels)", value=network.frames_sent)
        yield CounterMetricFamily("shoal_peer_bytes_sent", "Message bytes written to the other nodes on the "
                                  "node-to-node links", value=network.bytes_sent)
    relay = node.relay
    if relay is None:
        return
    yield CounterMetricFamily("shoal_relay_forwarded", "Client commands this node sent to the leader of their "
                              "partition on another node (each push of a block counted)", value=relay.forwarded)
    yield CounterMetricFamily("shoal_relay_retried", "Forwarded commands sent again: their leader moved, "
                              "its link was lost or it did not answer in time", value=relay.retried + relay.followed)
    yield CounterMetricFamily("shoal_relay_served", "Commands other nodes forwarded to this node as their "
                              "partition's leader (each push of a block counted)", value=relay.served)
    waiting = GaugeMetricFamily("shoal_relay_in_flight", "Forwarded commands not yet answered: sent by this "
                                "node (forwarding) or served here for other nodes (serving)", labels=["side"])
    stats = relay.stats()
    waiting.add_metric(["forwarding"], stats["forwarding"])
    waiting.add_metric(["serving"], stats["serving"])
    yield waiting


class MoveWatch:
    """How long each partition's move has gone without progress, as seen from one scrape to the next.

    A move progresses when its group's membership changes or its new replica gets further (snapshot
    bytes acknowledged, match index): :meth:`idle_seconds` is given, per partition with a move
    running, a value that changes exactly then, and answers the seconds since it last changed.
    Partitions no longer given are forgotten.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Hashable, float]] = {}

    def idle_seconds(self, progress: Mapping[int, Hashable], now: float) -> dict[int, float]:
        """Per partition of ``progress`` (partition -> its move's progress mark at ``now``), the
        seconds since its mark last changed."""
        seen: dict[int, tuple[Hashable, float]] = {}
        for p, mark in progress.items():
            before = self._seen.get(p)
            seen[p] = before if before is not None and before[0] == mark else (mark, now)
        self._seen = seen
        return {p: max(0.0, now - since) for p, (_mark, since) in seen.items()}


def _move_progress(node: "NodeView", moves: list[dict[str, Any]]) -> dict[int, Hashable]:
    """Per partition with a move that runs (one held for an operator's rebalance does not), what
    changes when the move progresses: the group's membership and each new replica's progress."""
    marks: dict[int, list[Any]] = {}
    for move in moves:
        if move["state"] == "pending rebalance":
            continue
        p = move["partition"]
        if p not in marks:
            membership = node.partitions[p].replica.membership
            marks[p] = [tuple(membership.voters), tuple(membership.learners)]
        marks[p].append((move["toMember"], move["fromMember"], move["state"], move.get("bytesSent"),
                         move.get("matchIndex")))
    return {p: tuple(mark) for p, mark in marks.items()}


def _moves(node: "NodeView", watch: MoveWatch) -> Iterator[Any]:
    """Moves of replicas (membership changes this node makes as a leader) and their traffic."""
    moves = node.moves
    yield CounterMetricFamily("shoal_moves_started", "Replicas this node, as a partition's leader, added as "
                              "learners (a move begins)", value=moves.started)
    yield CounterMetricFamily("shoal_moves_finished", "Learners this node, as a partition's leader, promoted to "
                              "voters (a move's new replica votes)", value=moves.finished)
    running = GaugeMetricFamily("shoal_moves_in_progress", "Moves of the partitions this node leads, by state "
                                "(waiting, catching up, removing, pending rebalance)", labels=["state"])
    by_state: dict[str, int] = {}
    running_moves = moves.moves()
    for move in running_moves:
        by_state[move["state"]] = by_state.get(move["state"], 0) + 1
    for state, n in sorted(by_state.items()):
        running.add_metric([state], n)
    yield running
    idle = GaugeMetricFamily("shoal_move_idle_seconds", "Seconds since the running move of a partition this node "
                             "leads last progressed (membership changed, new replica further along); moves held "
                             "for an operator's rebalance are left out", labels=["partition"])
    for p, seconds in sorted(watch.idle_seconds(_move_progress(node, running_moves), time.monotonic()).items()):
        idle.add_metric([str(p)], seconds)
    yield idle
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
        membership = part.replica.membership
        voters.add_metric([str(p)], len(membership.voters))
        learners.add_metric([str(p)], len(membership.learners))
    yield from (voters, learners)
