"""One seeded run: a partition's replica group, its clients and a nemesis, on one random generator.

A run draws its shape from the seed (3 or 5 nodes, how hostile the network is, how
often nodes crash or lose data, the snapshot threshold), then:

1. starts every node of the group and the clients;
2. lets the nemesis loose for the chaos period: partitions (short ones, and long ones
   that leave a follower behind the leader's compaction point so it must be caught up
   by snapshot), crashes with and without a power cut, and damaged journal or snapshot
   files on a stopped node (a minority at a time; restarted with repair off first now
   and then, when it must refuse by name);
3. heals everything: network calm, links back, pauses over, every node of the group
   restarted with repair on, no new client operations;
4. runs until the group has settled, within :data:`SETTLE_S` of virtual time, and
   checks it (:mod:`.checkers`).

Besides, a run draws *features* of the cluster from its seed (:class:`Features`), each on
in some runs: an operator that changes the group's target replication (1, 3 or 5 voters
out of a pool of nodes) while a mover walks the group there one change at a time, with
the node's own planner (:func:`shoal.node.raft.planning.plan_change`), and removed nodes' files
deleted; the balancer handing leadership back to the preferred replica; paused nodes
(stopped with their links up, then resumed); clocks that drift; a disk-class queue; and
clients that read. They come from a generator of their own, so a seed's classic draws
stay what they were.

Every random choice comes from ``random.Random(seed)``, so a seed replays exactly.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shoal.node.moves import RECONCILE_INTERVAL_S
from shoal.node.raft.planning import HAND_OVER, plan_change
from shoal.node.partition import Partition
from shoal.node.raft import install
from shoal.node.raft.membership import ConfigChange
from shoal.node.raft.replica import PartitionReplica, ReplicaDamaged
from shoal.node.raft.snapshots import SnapshotSettings

from .checkers import Checkers, Violation
from .disk import Damage, damage
from .loop import SimLoop
from .network import Fabric, NetFaults
from .node import SimNode, SimReplica
from .workload import Workload

__all__ = ["SimConfig", "SimRun", "run_seed", "sim_scale", "SETTLE_S"]

log = logging.getLogger(__name__)

#: After the faults stop, the group must settle within this much virtual time.
SETTLE_S = 60.0
#: Snapshot chunks and the stream window in the simulation (small states, many chunks).
SIM_CHUNK_BYTES = 2048
SIM_WINDOW_BYTES = 4 * SIM_CHUNK_BYTES
#: Lines of the run's trace kept for a failure's report.
TRACE_LINES = 120
#: How often digests are compared and the leader ticks its engine (virtual seconds).
DIGEST_PERIOD_S = 0.5
ENGINE_TICK_S = 0.5
#: How often the balancer looks at the leader (the node's BALANCE_INTERVAL_S).
BALANCE_S = 1.0
#: How often removed members' nodes are looked for (their files are deleted).
RETIRE_S = 0.5


@dataclass
class SimConfig:
    """The shape of one run, drawn from its seed (see :meth:`draw`)."""

    nodes: int = 3
    chaos_s: float = 20.0
    entries_min: int = 20
    clients: int = 3
    faults: NetFaults = field(default_factory=NetFaults)
    #: Mean seconds between two nemesis actions.
    nemesis_period_s: float = 2.0
    crash_weight: float = 1.0
    partition_weight: float = 1.0
    damage_weight: float = 0.5
    rate_bytes_per_s: float = 128 * 1024
    #: Damage may hit the last journal segment too, in every byte the journal reported synced
    #: before the crash (its synced mark as it ran, ``sim.disk._reported``): the journal must
    #: refuse it. Were its mark to lag behind that report after a power cut, a flip in the last
    #: synced batch would pass for a torn tail (soak seed 1761 then loses a committed entry).
    damage_last_segment: bool = True

    @classmethod
    def draw(cls, rng: random.Random, chaos_s: float) -> "SimConfig":
        faults = NetFaults(loss=rng.choice((0.0, 0.01, 0.05, 0.15)), duplicate=rng.choice((0.0, 0.01, 0.05)),
                           reorder=rng.choice((0.0, 0.02, 0.1)), delay_max_s=rng.choice((0.002, 0.01, 0.05)),
                           spike=rng.choice((0.0, 0.01, 0.05)))
        return cls(nodes=5 if rng.random() < 0.15 else 3, chaos_s=chaos_s, entries_min=rng.choice((8, 16, 40)),
                   clients=rng.randint(1, 4), faults=faults, nemesis_period_s=rng.choice((0.7, 1.5, 3.0)),
                   crash_weight=rng.choice((0.0, 1.0, 2.0)), partition_weight=rng.choice((0.5, 1.0, 2.0)),
                   damage_weight=rng.choice((0.0, 0.5, 1.0)),
                   rate_bytes_per_s=rng.choice((32 * 1024, 128 * 1024, 1024 * 1024)))


@dataclass
class Features:
    """What a run adds to the classic faults (see the module docstring), drawn by :meth:`draw`."""

    #: An operator changes the target replication (1, 3 or 5 voters) during the chaos period.
    membership: bool = False
    #: The group starts as a single voter (a 1-node cluster that grows).
    start_alone: bool = False
    #: Nodes beyond the first group that may join it.
    spare_nodes: int = 0
    #: Mean seconds between two of the operator's actions (membership changes, pauses).
    operator_period_s: float = 2.0
    #: The balancer hands leadership to the target's first member.
    balancer: bool = False
    #: Weight of pausing a node among the operator's actions (0: none).
    pause_weight: float = 0.0
    #: Each node's clock runs at a rate within 1 ± this.
    clock_drift: float = 0.0
    #: Queue q2 is of the disk class.
    disk_class: bool = False
    #: Share of the clients' operations that are reads.
    reads: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> "Features":
        membership = rng.random() < 0.4
        return cls(membership=membership, start_alone=membership and rng.random() < 0.35,
                   spare_nodes=rng.choice((0, 1, 2)) if membership else 0,
                   operator_period_s=rng.choice((1.0, 2.0, 4.0)), balancer=rng.random() < 0.5,
                   pause_weight=rng.choice((0.0, 0.0, 1.0, 2.0)), clock_drift=rng.choice((0.0, 0.05, 0.1)),
                   disk_class=rng.random() < 0.5, reads=rng.choice((0.0, 0.1, 0.25)))

    @classmethod
    def none(cls) -> "Features":
        return cls()


@contextlib.contextmanager
def sim_scale() -> Iterator[None]:
    """Snapshot chunks and windows sized for the simulation's small states (restored after)."""
    saved = install.CHUNK_BYTES, install.WINDOW_BYTES
    install.CHUNK_BYTES, install.WINDOW_BYTES = SIM_CHUNK_BYTES, SIM_WINDOW_BYTES
    try:
        yield
    finally:
        install.CHUNK_BYTES, install.WINDOW_BYTES = saved


class SimRun:
    """One run of the simulation (see the module docstring)."""

    def __init__(self, seed: int, *, chaos_s: float = 20.0, config: SimConfig | None = None,
                 replica_class: type[PartitionReplica] = SimReplica, quiet_after_heal: bool = False,
                 features: Features | None = None) -> None:
        """``quiet_after_heal``: the leader stops proposing engine ticks once the faults stop;
        ``features``: what the run adds to the classic faults (drawn from the seed if None)."""
        self.seed = seed
        self.quiet_after_heal = quiet_after_heal
        self.rng = rng = random.Random(seed)
        self.config = cfg = config or SimConfig.draw(rng, chaos_s)
        feature_rng = random.Random(f"{seed}:features")
        self.features = feat = features if features is not None else Features.draw(feature_rng)
        self.loop = SimLoop()
        self.checkers = Checkers()
        self.trace: deque[str] = deque(maxlen=TRACE_LINES)
        ids = [f"n{k}" for k in range(cfg.nodes + feat.spare_nodes)]
        first_group = ids[:1] if feat.start_alone else ids[:cfg.nodes]
        #: The group's target: node ids, preferred leader first (what the registry's placement says).
        self.target = list(first_group)
        self.fabric = Fabric(self.loop, random.Random(rng.getrandbits(64)), ids)
        settings = SnapshotSettings(entries_min=cfg.entries_min, interval_s=30.0, child_time_limit_s=60.0)
        self.nodes: dict[str, SimNode] = {}
        for k, node_id in enumerate(ids):
            node_rng = random.Random(rng.getrandbits(64) if k < cfg.nodes else feature_rng.getrandbits(64))
            drift = feature_rng.uniform(-feat.clock_drift, feat.clock_drift) if feat.clock_drift else 0.0
            node = SimNode(node_id, first_group, self.loop, self.fabric, node_rng, settings,
                           cfg.rate_bytes_per_s, SIM_WINDOW_BYTES, replica_class, bootstrap=node_id in first_group,
                           group=self._target_members, member_of=self._member_of, clock_rate=1.0 + drift)
            node.on_fail_stop = self._fail_stopped
            node.on_replica = self._new_replica
            self.nodes[node_id] = node
        #: When the last power cut of any node happened (disk-class writes acknowledged before may be gone).
        self.power_cut_at = float("-inf")
        self.workload = Workload(self.loop, random.Random(rng.getrandbits(64)), self._leaders, self.checkers.fail,
                                 clients=cfg.clients, disk_class=feat.disk_class, reads=feat.reads,
                                 power_cut_at=lambda: self.power_cut_at)
        self._nemesis_rng = random.Random(rng.getrandbits(64))
        self._ops_rng = random.Random(feature_rng.getrandbits(64))
        self.membership_changes = 0
        self.pauses = 0
        #: Nodes whose files were damaged, until they are back in line: (commit index then).
        self.damaged: dict[str, int] = {}
        self.refusals: list[str] = []
        self.stops: list[str] = []
        self.heal_at = 0.0
        self.healed_at = 0.0
        self.settled_at: float | None = None
        self.loop.after_callback = self._after_callback

    # --- the nodes' hooks -----------------------------------------------------------------------

    def _new_replica(self, node: SimNode, replica: PartitionReplica) -> None:
        self.checkers.restarted(node.id)
        if isinstance(replica, SimReplica):
            replica.on_entries = self.checkers.on_entries
            replica.on_rollback = lambda node_id, _base: self.checkers.rolled_back(node_id)

    def _target_members(self) -> list[str]:
        return [self.nodes[n].member for n in self.target]

    def _member_of(self, node_id: str) -> str | None:
        node = self.nodes.get(node_id)
        return node.member if node is not None else None

    def _replicas(self) -> list[PartitionReplica]:
        return [n.replica for n in self.nodes.values() if n.replica is not None]

    def _leaders(self) -> list[PartitionReplica]:
        return [n.replica for n in self.nodes.values() if n.replica is not None and n.replica.is_leader()
                and not n.paused]

    def _after_callback(self, process: Any) -> None:
        fabric = self.fabric
        self.checkers.now = self.loop.time()
        self.checkers.after_callback(self._replicas(), fabric.callback_msgs, fabric.callback_bytes)
        fabric.callback_msgs = fabric.callback_bytes = 0

    def _fail_stopped(self, node: SimNode, reason: str) -> None:
        """A node stopped itself (a failed sync or snapshot load): the simulation injects no
        failure that should make it, so this is a defect."""
        self.note(f"{node.id} stopped itself: {reason}")
        self.stops.append(f"{node.id}: {reason}")
        node.crash(power_cut=False)
        self.checkers.fail(f"{node.id} stopped itself: {reason}")

    def note(self, what: str) -> None:
        self.trace.append(f"{self.loop.time():9.3f} {what}")
        log.debug("sim %s: %s", self.seed, what)

    # --- running ------------------------------------------------------------------------------------

    def run(self) -> None:
        """The whole run; raises :class:`~.checkers.Violation` (with the trace's tail) on a failure."""
        handler = _TraceHandler(self)
        raft_log = logging.getLogger("shoal.node.raft")
        level = raft_log.level
        raft_log.addHandler(handler)
        raft_log.setLevel(logging.INFO)
        try:
            with sim_scale():
                self._run()
        except Violation as exc:
            tail = "\n".join(self.trace)
            raise Violation(f"{exc}\n--- last events of seed {self.seed} ---\n{tail}") from None
        finally:
            raft_log.removeHandler(handler)
            raft_log.setLevel(level)

    def _run(self) -> None:
        cfg = self.config
        feat = self.features
        loop = self.loop
        start = loop.time()
        for node_id in self.target:
            self.nodes[node_id].start()
        self.fabric.faults = cfg.faults
        self.workload.start(start + 0.5)
        self.heal_at = start + cfg.chaos_s
        self.workload.stop_at = self.heal_at
        loop.call_later(self._nemesis_rng.expovariate(1 / cfg.nemesis_period_s), self._nemesis)
        loop.call_later(DIGEST_PERIOD_S, self._sample)
        loop.call_later(ENGINE_TICK_S, self._engine_tick)
        loop.call_later(RECONCILE_INTERVAL_S, self._move)
        loop.call_later(RETIRE_S, self._retire)
        if feat.balancer:
            loop.call_later(BALANCE_S, self._balance)
        if feat.membership or feat.pause_weight:
            loop.call_later(self._ops_rng.expovariate(1 / feat.operator_period_s), self._operate)
        loop.run_until(self.heal_at)
        self._heal()
        settled = loop.run_until(self.heal_at + SETTLE_S, stop=self._settled)
        if not settled:
            reason = self._not_settled()
            self.checkers.fail(f"the group did not settle within {SETTLE_S:.0f} s after healing: {reason}")
        self.settled_at = loop.time()
        self.checkers.sample_digests(self._replicas())
        replicas = {n.id: n.replica for n in self.nodes.values() if n.replica is not None}
        self.checkers.settled(replicas, self.workload.records, int(loop.time() * 1000), self.workload.maybe_lost)

    def _not_settled(self) -> str:
        return self._converged() or "?"

    def _settled(self) -> bool:
        if self.loop.time() < self.healed_at:
            return False
        return self._converged() is None

    def _converged(self) -> str | None:
        replicas = {n: self.nodes[n].replica for n in self.target}
        why = self.checkers.converged(replicas, len(self.workload.pending), self.workload.inflight)
        if why is not None:
            return why
        leader = next(r for r in replicas.values() if r is not None and r.is_leader())
        members = leader.core.membership
        if sorted(members.voters) != sorted(self._target_members()) or members.learners:
            return f"the group {members} is not on its target {self._target_members()} yet"
        strays = [n.id for n in self.nodes.values() if n.up and n.id not in self.target]
        if strays:
            return f"removed nodes still run: {strays}"
        return None

    def _sample(self) -> None:
        self.checkers.sample_digests(self._replicas())
        self.loop.call_later(DIGEST_PERIOD_S, self._sample)

    def _engine_tick(self) -> None:
        """The leader's periodic ``_Tick`` (leases expire, delayed jobs come due), as the node proposes it."""
        if self.quiet_after_heal and self.healed_at:
            return  # an idle partition: nothing new in the log once the faults stop
        for replica in self._leaders():
            if replica.read_ready():
                Partition(replica.partition, replica).propose(int(self.loop.time() * 1000), [{"cmd": "_Tick"}],
                                                              lambda _r, _reason: None)
        self.loop.call_later(ENGINE_TICK_S, self._engine_tick)

    def _heal(self) -> None:
        self.note("heal: calm network, links back, pauses over, every node of the group running with repair on")
        self.fabric.faults = NetFaults.calm()
        self.fabric.set_cut(set())
        for node in self.nodes.values():
            node.resume()
            if not node.up and self._hosts_a_member(node):
                self._restart(node.id, True)
        self.healed_at = self.loop.time()

    @staticmethod
    def _hosts_a_member(node: SimNode) -> bool:
        """``node`` holds a replica the group may count on: it ran one that was not retired (a
        node whose member the group removed deletes its files: it is started again only when the
        target names it anew)."""
        return node.runs > 0

    # --- what the cluster's own loops do ------------------------------------------------------------

    def _leading(self) -> list[tuple[SimNode, PartitionReplica]]:
        """Running, not paused nodes whose replica leads (their loops run)."""
        return [(n, n.replica) for n in self.nodes.values()
                if n.replica is not None and not n.paused and n.replica.is_leader()]

    def _move(self) -> None:
        """The leader's move step (``MoveService.step``): one change toward the target at a time."""
        self.loop.call_later(RECONCILE_INTERVAL_S, self._move)
        for node_id in self.target:  # a target node runs, as a registry's active node does
            node = self.nodes[node_id]
            if not node.up and node.runs == 0:
                self.note(f"start {node_id} (member {node.member}): the target names it")
                node.start()
        for node, replica in self._leading():
            assert node.process is not None
            change = plan_change(replica.core, replica.member, self._target_members(), node.process.time())
            if change == HAND_OVER:
                voters = replica.core.membership.voters
                replica.transfer_leadership(among=[m for m in self._target_members() if m in voters])
            elif isinstance(change, ConfigChange):
                try:
                    replica.propose_change(change)
                except Exception as exc:  # refused for now (ProposalRefused): tried again later
                    self.note(f"{node.id}: {change.kind} {change.node} refused: {exc}")
                    continue
                self.membership_changes += 1
                self.note(f"{node.id}: membership change {change.kind} {change.node}")

    def _balance(self) -> None:
        """The balancer: a leader hands leadership to the target's first member, if linked."""
        self.loop.call_later(BALANCE_S, self._balance)
        preferred = self._target_members()[0] if self.target else None
        for _node, replica in self._leading():
            if preferred is not None and preferred != replica.member and replica.peer_connected(preferred):
                replica.transfer_leadership(preferred)

    def _retire(self) -> None:
        """A node whose member the group removed closes its replica and deletes its files (it
        learns of its removal from the leader's topology, as a real node does)."""
        self.loop.call_later(RETIRE_S, self._retire)
        leaders = [r for _, r in self._leading() if r.read_ready() and not r.core.change_pending]
        if len(leaders) != 1:
            return
        members = leaders[0].core.membership.members
        for node in self.nodes.values():
            if node.id not in self.target and node.member not in members and (node.up or node.runs):
                self.note(f"{node.id} (member {node.member}) left the group: stopped, files deleted")
                node.crash(power_cut=False)
                node.wipe()
                node.runs = 0
                self.damaged.pop(node.id, None)

    def _operate(self) -> None:
        """The operator's actions: a new target replication, or a node paused for a while."""
        loop = self.loop
        if loop.time() >= self.heal_at:
            return
        rng = self._ops_rng
        feat = self.features
        _pick(rng, [(1.0 if feat.membership else 0.0, self._retarget), (feat.pause_weight, self._pause)])
        loop.call_later(rng.expovariate(1 / feat.operator_period_s), self._operate)

    def _retarget(self) -> None:
        rng = self._ops_rng
        pool = list(self.nodes)
        size = rng.choice([r for r in (1, 3, 5) if r <= len(pool)])
        keep = [n for n in self.target if rng.random() < 0.8][:size]
        rest = [n for n in pool if n not in keep]
        rng.shuffle(rest)
        target = keep + rest[:size - len(keep)]
        rng.shuffle(target)
        self.note(f"operator: target {self.target} -> {target}")
        self.target = target

    def _pause(self) -> None:
        rng = self._ops_rng
        up = [n for n in self.nodes.values() if n.up and not n.paused]
        if not up:
            return
        leaders = [n for n in up if n.replica is not None and n.replica.is_leader()]
        preferred = [n for n in up if self.target and n.id == self.target[0]]
        kind = rng.random()
        node = rng.choice(leaders if kind < 0.4 and leaders else preferred if kind < 0.7 and preferred else up)
        seconds = rng.uniform(0.3, 6.0)
        self.note(f"pause {node.id} for {seconds:.1f} s")
        self.pauses += 1
        node.pause(seconds)

    # --- the nemesis --------------------------------------------------------------------------------

    def _nemesis(self) -> None:
        loop = self.loop
        if loop.time() >= self.heal_at:
            return
        rng = self._nemesis_rng
        cfg = self.config
        _pick(rng, [(cfg.partition_weight, self._partition), (cfg.crash_weight, self._crash),
                    (cfg.damage_weight, self._damage)])
        loop.call_later(rng.expovariate(1 / cfg.nemesis_period_s), self._nemesis)

    def _faulty(self) -> set[str]:
        """Nodes of the group down or damaged and not yet back in line."""
        self._forget_repaired()
        return {n.id for n in self.nodes.values() if not n.up and self._hosts_a_member(n)} | set(self.damaged)

    def _forget_repaired(self) -> None:
        for node_id, commit in list(self.damaged.items()):
            replica = self.nodes[node_id].replica
            if replica is not None and not replica.core.recovering and not replica.status()["loading"] \
                    and replica.core.log.last_index >= commit and replica.commit_index() >= commit:
                del self.damaged[node_id]
                self.note(f"{node_id} is back in line after its damage")

    def _minority(self) -> int:
        """How many voters may be faulty at once: a minority of the group (the smallest of its
        target and what any replica counts, while a change runs)."""
        voters = len(self.target)
        for replica in self._replicas():
            if replica.core.membership.voters:
                voters = min(voters, len(replica.core.membership.voters))
        return (voters - 1) // 2

    def _partition(self) -> None:
        rng = self._nemesis_rng
        ids = list(self.nodes)
        leaders = [r.node_id for r in self._leaders()]
        kind = rng.random()
        if kind < 0.4 and leaders:
            side = {rng.choice(leaders)}
        elif kind < 0.8 or len(ids) < 5:
            side = {rng.choice(ids)}
        else:
            side = set(rng.sample(ids, 2))
        cut = {frozenset((a, b)) for a in side for b in ids if b not in side}
        long = rng.random() < 0.35
        duration = rng.uniform(4.0, 12.0) if long else rng.uniform(0.2, 3.0)
        self.note(f"partition {sorted(side)} from the rest for {duration:.1f} s")
        self.fabric.set_cut(cut)
        self.loop.call_later(duration, self._unpartition, cut)

    def _unpartition(self, cut: set[frozenset[str]]) -> None:
        if self.fabric.cut == cut:
            self.note("partition healed")
            self.fabric.set_cut(set())

    def _crash(self) -> None:
        rng = self._nemesis_rng
        up = [n for n in self.nodes.values() if n.up]
        if not up or len(self._faulty()) >= max(1, self._minority()):
            return
        node = rng.choice(up)
        power_cut = rng.random() < 0.7
        self.note(f"crash {node.id}{' with a power cut' if power_cut else ''}")
        node.crash(power_cut=power_cut)
        if power_cut:
            self.power_cut_at = self.loop.time()
        down_s = rng.uniform(3.0, 10.0) if rng.random() < 0.3 else rng.uniform(0.1, 2.0)
        self.loop.call_later(down_s, self._restart, node.id, True)

    def _damage(self) -> None:
        rng = self._nemesis_rng
        up = [n for n in self.nodes.values() if n.up]
        if not up or len(self._faulty()) >= self._minority():
            return
        node = rng.choice(up)
        commit = max((r.commit_index() for r in self._replicas()), default=0)
        synced = node.replica.journal.synced_mark if self.config.damage_last_segment and node.replica else None
        power_cut = rng.random() < 0.5
        node.crash(power_cut=power_cut)
        if power_cut:
            self.power_cut_at = self.loop.time()
        done = [d for d in (damage(node.io, node.data_dir, 0, rng, synced=synced)
                            for _ in range(rng.randint(1, 2))) if d]
        self.note(f"crash {node.id} and damage its files: {done}")
        if done:
            self.damaged[node.id] = commit
        repair = rng.random() < 0.7
        self.loop.call_later(rng.uniform(0.1, 3.0), self._restart, node.id, repair, done)

    def _restart(self, node_id: str, repair: bool, damaged: list[Damage] | None = None) -> None:
        node = self.nodes[node_id]
        if node.up or not self._hosts_a_member(node):
            return  # running, or its member left the group meanwhile (files deleted)
        refused = node.start(repair=repair)
        if refused is None:
            self.note(f"restart {node_id}{'' if repair else ' with repair off'}")
            return
        self._refused(node, refused, repair, damaged or [])
        # The operator turns repair on and starts it again.
        self.loop.call_later(self._nemesis_rng.uniform(0.1, 2.0), self._restart, node_id, True)

    def _refused(self, node: SimNode, exc: ReplicaDamaged, repair: bool, damaged: list[Damage]) -> None:
        message = str(exc)
        self.note(f"{node.id} refuses to start: {message}")
        self.refusals.append(message)
        if repair:
            self.checkers.fail(f"{node.id} refused to start with repair on: {message}")
        if not damaged:
            self.checkers.fail(f"{node.id} refused to start without damage: {message}")
        if not any(d.path in message or _journal_dir(d.path) in message for d in damaged):
            self.checkers.fail(f"{node.id} refused to start but names none of the damaged files {damaged}: {message}")

    def summary(self) -> dict[str, Any]:
        """Counters of the run, for the test's report and for sizing."""
        records = self.workload.records
        replicas = self._replicas()
        return {"seed": self.seed, "nodes": self.config.nodes, "callbacks": self.loop.callbacks,
                "pushes": len(records.pushes), "deliveries": records.deliveries, "acks": records.acks_ok,
                "commit": max((r.commit_index() for r in replicas), default=0),
                "installs": sum(r.installs for r in replicas), "refusals": len(self.refusals),
                "stops": len(self.stops), "frames": self.fabric.frames, "reads": records.reads_ok,
                "membership_changes": self.membership_changes, "pauses": self.pauses,
                "rollbacks": sum(getattr(r, "rollbacks", 0) for r in replicas),
                "elections": sum(r.elections for r in replicas),
                "callback_msgs_max": self.checkers.callback_msgs_max,
                "callback_bytes_max": self.checkers.callback_bytes_max,
                "virtual_s": round(self.loop.time() - 1000.0, 1)}


class _TraceHandler(logging.Handler):
    """The replicas' log lines in the run's trace, with virtual time and the node that logged."""

    def __init__(self, run: SimRun) -> None:
        super().__init__(logging.INFO)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        process = self.run.loop.current
        who = process.name if process is not None else "-"
        self.run.trace.append(f"{self.run.loop.time():9.3f} {who} {record.getMessage()}")


def _pick(rng: random.Random, actions: list[tuple[float, Any]]) -> None:
    """Run one of ``actions`` ((weight, action) pairs), drawn by weight (none if all weigh 0)."""
    total = sum(w for w, _ in actions)
    if total <= 0:
        return
    pick = rng.uniform(0, total)
    for weight, action in actions:
        if pick < weight:
            action()
            return
        pick -= weight


def _journal_dir(path: str) -> str:
    head, _, _ = path.rpartition("/")
    return head if head.endswith(".raft") else path


def run_seed(seed: int, **kwargs: Any) -> SimRun:
    """Run seed ``seed`` to the end; raises :class:`~.checkers.Violation` on a failure."""
    run = SimRun(seed, **kwargs)
    run.run()
    return run
