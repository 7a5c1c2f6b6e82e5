"""Moving replicas: every partition this node leads walks, one membership change at a time, to its target.

Theory of operation. The target of a partition is its placement over the registry's active
nodes (:meth:`shoal.cluster.registry.Registry.placement`): when a node joins, leaves, or is
replaced, the targets change, and each partition's *leader* moves its own group toward its
target — there is no central controller, and every leader computes the same targets from
the same registry. One change at a time (Raft's single-server changes, :mod:`.raft.membership`),
the next one chosen by :func:`~.raft.planning.plan_change`:

1. a learner the target does not name is removed;
2. a target member the group lacks joins as a learner (it catches up by snapshot and log, at
   the node's share of the cluster's move rate);
3. a voter the target does not name and the leader has not heard from lately (a dead node)
   is removed, once a majority of the voters left is caught up;
4. a learner the target names that is caught up (replicating, within
   :data:`~.raft.planning.PROMOTE_LAG_MAX` entries of the commit index) is promoted to voter;
5. a voter the target does not name is removed once every target member votes (a new replica
   counts only once caught up) and a majority of the voters left is caught up; the leader
   itself first hands leadership to a caught-up voter of the target.

A change is proposed only when the previous one is applied and the leader has committed an
entry of its term (the core refuses otherwise), so a membership is never changed by a
leader that may not know the latest one. Moves run by themselves after the registry changes
(``rebalance_auto``, default on); with it off they run when the operator asks (the
registry's ``rebalance_epoch`` rises) until every partition of the cluster is on its target
(as the node's topology shows it: a partition's leadership may pass to another node
mid-move, which must finish it), and always for nodes leaving, removed or replaced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from shoal.cluster.registry import ACTIVE, MOVE_RATE_BYTES_PER_S, node_of_member

from .raft.core import ProposalRefused
from .raft.install import RATE_BYTES_PER_S, ByteRate
from .raft.membership import ConfigChange
from .raft.planning import HAND_OVER

if TYPE_CHECKING:
    from .raft import PartitionReplica

__all__ = ["MoveService", "RECONCILE_INTERVAL_S"]

log = logging.getLogger(__name__)

#: How often every led partition is compared with its target.
RECONCILE_INTERVAL_S = 0.5


class MoveService:
    """Reconciles the partitions this node leads with their targets; counts moves and bytes."""

    def __init__(self, node: Any) -> None:
        self.node = node
        #: The node's outgoing catch-up traffic (snapshot streams): its share of the cluster's move rate.
        self.rate = ByteRate(self._share())
        #: Replicas this node, as a partition's leader, added as learners / promoted to voters.
        self.started = 0
        self.finished = 0
        #: Snapshot bytes streamed by replicas this node no longer hosts (see :meth:`snapshot_bytes_sent`).
        self.retired_snapshot_bytes = 0
        #: The last ``rebalance_epoch`` (operator's rebalance) carried out; None until the first look,
        #: which takes the registry's as done (a restarted node does not redo an old request).
        self._done_epoch: int | None = None
        #: partition -> (change kind, member, when proposed) of the last change this leader made.
        self.last_change: dict[int, tuple[str, str, float]] = {}

    def _share(self) -> float:
        reg = self.node.cluster_map.registry if self.node.cluster_map is not None else None
        if reg is None:
            return float(MOVE_RATE_BYTES_PER_S)
        return reg.settings.move_rate_bytes_per_s / max(1, len(reg.active()))

    def registry_changed(self) -> None:
        """The move rate may have changed: every stream picks the new share up at once."""
        self.rate.rate = self._share()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_INTERVAL_S)
            try:
                self.reconcile()
            except Exception:  # a bug here must not stop the node's other loops
                log.exception("reconciling partitions with their targets failed")

    def reconcile(self) -> None:
        node = self.node
        reg = node.cluster_map.registry
        epoch = reg.settings.rebalance_epoch
        auto = self._auto()
        busy = False
        for p, part in sorted(node.partitions.items()):
            if part.replica.is_leader():
                busy |= self.step(p, part.replica, node.target(p), auto)
        # An operator's rebalance is done once every partition of the cluster is on its target, not
        # once this node's are: leadership of a partition still moving may come here later.
        if epoch != self._done_epoch and not busy and self._cluster_on_target():
            self._done_epoch = epoch

    def _auto(self) -> bool:
        """True when moves run: automatic rebalancing on, or an operator's rebalance not yet done."""
        settings = self.node.cluster_map.registry.settings
        if self._done_epoch is None:
            self._done_epoch = settings.rebalance_epoch
        return settings.rebalance_auto or settings.rebalance_epoch != self._done_epoch

    def _cluster_on_target(self) -> bool:
        """Every partition, as this node's topology knows it, has a leader and its target's nodes as voters."""
        node = self.node
        for info in node.topology.partition_map:
            target = sorted(node_of_member(m) for m in node.target(info.id))
            if info.leader is None or sorted(info.replicas) != target:
                return False
        return True

    def step(self, p: int, replica: "PartitionReplica", target: list[str], auto: bool) -> bool:
        """One change toward ``target`` for partition ``p``; True while the group differs from it."""
        if not target or not replica.is_leader():
            return False
        members = replica.membership
        voters, learners = set(members.voters), set(members.learners)
        wanted = set(target)
        if voters == wanted and not learners:
            return False
        if not auto and not self._must_move(voters | learners, wanted):
            return False
        now = time.monotonic()
        change = replica.plan_change(target, now)
        if change is None:
            return True  # a change pending, or waiting for a learner to catch up
        if change == HAND_OVER:
            # Any live, caught-up voter of the target will do: the first one may be down.
            replica.transfer_leadership(among=[m for m in target if m in voters])
            return True
        assert isinstance(change, ConfigChange)
        try:
            replica.propose_change(change)
        except ProposalRefused as exc:
            log.debug("partition %d: %s %s refused for now: %s", p, change.kind, change.node, exc)
            return True
        if change.kind == "add_learner":
            self.started += 1
        elif change.kind == "promote":
            self.finished += 1
        self.last_change[p] = (change.kind, change.node, now)
        log.info("partition %d: membership change %s %s (voters %s, learners %s, target %s)", p, change.kind,
                 change.node, sorted(voters), sorted(learners), target)
        return True

    def _must_move(self, members: set[str], wanted: set[str]) -> bool:
        """Moves that run even with automatic rebalancing off: members of nodes no longer active."""
        reg = self.node.cluster_map.registry
        for m in members - wanted:
            entry = reg.entry_of_member(m)
            if entry is None or entry.state != ACTIVE:
                return True
        return False

    def snapshot_bytes_sent(self) -> int:
        """Snapshot bytes this node streamed to learners and lagging followers, node-wide (replicas
        since retired included)."""
        return self.retired_snapshot_bytes + sum(int(part.replica.status()["snapshotBytesSent"])
                                                 for part in self.node.partitions.values())

    def counters(self) -> dict[str, Any]:
        """Moves this node started and finished as a leader, snapshot bytes it sent, its share of the move rate."""
        return {"started": self.started, "finished": self.finished, "snapshotBytesSent": self.snapshot_bytes_sent(),
                "rateBytesPerS": round(self.rate.rate)}

    def moves(self) -> list[dict[str, Any]]:
        """Every move this node runs as a leader: partition, from → to (node and member ids), state,
        bytes sent, rate, time left. A move that waits for an operator's ``rebalance`` (automatic
        rebalancing off) is in state ``pending rebalance``."""
        out: list[dict[str, Any]] = []
        node = self.node
        auto = self._auto()
        led = {p: part.replica for p, part in sorted(node.partitions.items()) if part.replica.is_leader()}
        streams_by_p = {p: r.stream_progress() for p, r in led.items()}
        # What one stream may send from now on: the node's share of the move rate, split over its
        # streams, at most a stream's own limit. A stream's average since it began overstates it
        # (the first window leaves at once, the token bucket's burst).
        cap = min(float(RATE_BYTES_PER_S), self.rate.rate / max(1, sum(map(len, streams_by_p.values()))))
        for p, replica in led.items():
            target = node.target(p)
            wanted = set(target)
            members = replica.membership
            joining = [m for m in members.learners if m in wanted] + [m for m in target if m not in members.members]
            leaving = [m for m in members.members if m not in wanted]
            if not joining and not leaving:
                continue
            held = not auto and not self._must_move(set(members.members), wanted)
            streams = {s["peer"]: s for s in streams_by_p[p]}
            for k in range(max(len(joining), len(leaving))):
                to = joining[k] if k < len(joining) else None
                src = leaving[k] if k < len(leaving) else None
                entry: dict[str, Any] = {"partition": p, "from": node_of_member(src) if src else None,
                                         "to": node_of_member(to) if to else None, "fromMember": src,
                                         "toMember": to, "state": "waiting"}
                if held:
                    entry["state"] = "pending rebalance"
                elif to is not None and to in members.learners:
                    match = replica.match_index(to)
                    stream = streams.get(to)
                    entry["state"] = "catching up"
                    if stream is not None:
                        entry.update(bytesSent=stream["acked"], bytesTotal=stream["total"])
                        elapsed = max(1e-3, time.monotonic() - stream.get("started", time.monotonic()))
                        rate = min(stream["acked"] / elapsed, cap)
                        entry["rateBytesPerS"] = round(rate)
                        entry["etaS"] = round((stream["total"] - stream["acked"]) / rate, 1) if rate > 0 else None
                    elif match is not None:
                        entry.update(matchIndex=match, commitIndex=replica.commit_index())
                elif to is None:
                    entry["state"] = "removing"
                out.append(entry)
        return out
