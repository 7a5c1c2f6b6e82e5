"""One seeded run: a partition's replica group, its clients and a nemesis, on one random generator.

A run draws its shape from the seed (3 or 5 nodes, how hostile the network is, how
often nodes crash or lose data, the snapshot threshold), then:

1. starts every node and the clients;
2. lets the nemesis loose for the chaos period: partitions (short ones, and long ones
   that leave a follower behind the leader's compaction point so it must be caught up
   by snapshot), crashes with and without a power cut, and damaged journal or snapshot
   files on a stopped node (a minority at a time; restarted with repair off first now
   and then, when it must refuse by name);
3. heals everything: network calm, links back, every node restarted with repair on,
   no new client operations;
4. runs until the group has settled, within :data:`SETTLE_S` of virtual time, and
   checks it (:mod:`.checkers`).

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

from shoal.node.raft import install
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
    #: Damage may hit the last journal segment too, in the bytes a durable synced mark vouches
    #: for (``sim.disk._vouched``): the journal must refuse it. Past them lies the window the
    #: journal documents (its module docstring, *The synced mark*), where damage passes for a
    #: torn tail by design: let in there, a flip in a segment's one synced batch after a power
    #: cut loses a committed entry (soak seed 1761).
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
                 replica_class: type[PartitionReplica] = SimReplica, quiet_after_heal: bool = False) -> None:
        """``quiet_after_heal``: the leader stops proposing engine ticks once the faults stop."""
        self.seed = seed
        self.quiet_after_heal = quiet_after_heal
        self.rng = rng = random.Random(seed)
        self.config = cfg = config or SimConfig.draw(rng, chaos_s)
        self.loop = SimLoop()
        self.checkers = Checkers()
        self.trace: deque[str] = deque(maxlen=TRACE_LINES)
        ids = [f"n{k}" for k in range(cfg.nodes)]
        self.fabric = Fabric(self.loop, random.Random(rng.getrandbits(64)), ids)
        settings = SnapshotSettings(entries_min=cfg.entries_min, interval_s=30.0, child_time_limit_s=60.0)
        self.nodes: dict[str, SimNode] = {}
        for node_id in ids:
            node = SimNode(node_id, ids, self.loop, self.fabric, random.Random(rng.getrandbits(64)), settings,
                           cfg.rate_bytes_per_s, SIM_WINDOW_BYTES, replica_class)
            node.on_fail_stop = self._fail_stopped
            node.on_replica = self._new_replica
            self.nodes[node_id] = node
        self.workload = Workload(self.loop, random.Random(rng.getrandbits(64)), self._leaders, self.checkers.fail,
                                 clients=cfg.clients)
        self._nemesis_rng = random.Random(rng.getrandbits(64))
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
        if isinstance(replica, SimReplica):
            replica.on_entries = self.checkers.on_entries

    def _replicas(self) -> list[PartitionReplica]:
        return [n.replica for n in self.nodes.values() if n.replica is not None]

    def _leaders(self) -> list[PartitionReplica]:
        return [r for r in self._replicas() if r.is_leader()]

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
        loop = self.loop
        start = loop.time()
        for node in self.nodes.values():
            node.start()
        self.fabric.faults = cfg.faults
        self.workload.start(start + 0.5)
        self.heal_at = start + cfg.chaos_s
        self.workload.stop_at = self.heal_at
        loop.call_later(self._nemesis_rng.expovariate(1 / cfg.nemesis_period_s), self._nemesis)
        loop.call_later(DIGEST_PERIOD_S, self._sample)
        loop.call_later(ENGINE_TICK_S, self._engine_tick)
        loop.run_until(self.heal_at)
        self._heal()
        settled = loop.run_until(self.heal_at + SETTLE_S, stop=self._settled)
        if not settled:
            reason = self._not_settled()
            self.checkers.fail(f"the group did not settle within {SETTLE_S:.0f} s after healing: {reason}")
        self.settled_at = loop.time()
        self.checkers.sample_digests(self._replicas())
        replicas = {n.id: n.replica for n in self.nodes.values() if n.replica is not None}
        self.checkers.settled(replicas, self.workload.records, int(loop.time() * 1000))

    def _not_settled(self) -> str:
        replicas = {n.id: n.replica for n in self.nodes.values()}
        return self.checkers.converged(replicas, len(self.workload.pending), self.workload.inflight) or "?"

    def _settled(self) -> bool:
        if self.loop.time() < self.healed_at:
            return False
        replicas = {n.id: n.replica for n in self.nodes.values()}
        return self.checkers.converged(replicas, len(self.workload.pending), self.workload.inflight) is None

    def _sample(self) -> None:
        self.checkers.sample_digests(self._replicas())
        self.loop.call_later(DIGEST_PERIOD_S, self._sample)

    def _engine_tick(self) -> None:
        """The leader's periodic ``_Tick`` (leases expire, delayed jobs come due), as the node proposes it."""
        if self.quiet_after_heal and self.healed_at:
            return  # an idle partition: nothing new in the log once the faults stop
        for replica in self._leaders():
            if replica.read_ready():
                replica.propose(int(self.loop.time() * 1000), [{"cmd": "_Tick"}], lambda _r, _reason: None)
        self.loop.call_later(ENGINE_TICK_S, self._engine_tick)

    def _heal(self) -> None:
        self.note("heal: calm network, links back, every node running with repair on")
        self.fabric.faults = NetFaults.calm()
        self.fabric.set_cut(set())
        for node in self.nodes.values():
            if not node.up:
                self._restart(node.id, True)
        self.healed_at = self.loop.time()

    # --- the nemesis --------------------------------------------------------------------------------

    def _nemesis(self) -> None:
        loop = self.loop
        if loop.time() >= self.heal_at:
            return
        rng = self._nemesis_rng
        cfg = self.config
        actions = [(cfg.partition_weight, self._partition), (cfg.crash_weight, self._crash),
                   (cfg.damage_weight, self._damage)]
        total = sum(w for w, _ in actions)
        if total > 0:
            pick = rng.uniform(0, total)
            for weight, action in actions:
                if pick < weight:
                    action()
                    break
                pick -= weight
        loop.call_later(rng.expovariate(1 / cfg.nemesis_period_s), self._nemesis)

    def _faulty(self) -> set[str]:
        """Nodes down or damaged and not yet back in line."""
        self._forget_repaired()
        return {n.id for n in self.nodes.values() if not n.up} | set(self.damaged)

    def _forget_repaired(self) -> None:
        for node_id, commit in list(self.damaged.items()):
            replica = self.nodes[node_id].replica
            if replica is not None and not replica.core.recovering and not replica.status()["loading"] \
                    and replica.core.log.last_index >= commit and replica.commit_index() >= commit:
                del self.damaged[node_id]
                self.note(f"{node_id} is back in line after its damage")

    def _minority(self) -> int:
        return (self.config.nodes - 1) // 2

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
        if not up or len(self._faulty()) >= self._minority():
            return
        node = rng.choice(up)
        power_cut = rng.random() < 0.7
        self.note(f"crash {node.id}{' with a power cut' if power_cut else ''}")
        node.crash(power_cut=power_cut)
        down_s = rng.uniform(3.0, 10.0) if rng.random() < 0.3 else rng.uniform(0.1, 2.0)
        self.loop.call_later(down_s, self._restart, node.id, True)

    def _damage(self) -> None:
        rng = self._nemesis_rng
        up = [n for n in self.nodes.values() if n.up]
        if not up or len(self._faulty()) >= self._minority():
            return
        node = rng.choice(up)
        commit = max((r.commit_index() for r in self._replicas()), default=0)
        node.crash(power_cut=rng.random() < 0.5)
        last_segment = self.config.damage_last_segment
        done = [d for d in (damage(node.io, node.data_dir, 0, rng, last_segment=last_segment)
                            for _ in range(rng.randint(1, 2))) if d]
        self.note(f"crash {node.id} and damage its files: {done}")
        if done:
            self.damaged[node.id] = commit
        repair = rng.random() < 0.7
        self.loop.call_later(rng.uniform(0.1, 3.0), self._restart, node.id, repair, done)

    def _restart(self, node_id: str, repair: bool, damaged: list[Damage] | None = None) -> None:
        node = self.nodes[node_id]
        if node.up:
            return
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
                "stops": len(self.stops), "frames": self.fabric.frames,
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


def _journal_dir(path: str) -> str:
    head, _, _ = path.rpartition("/")
    return head if head.endswith(".raft") else path


def run_seed(seed: int, **kwargs: Any) -> SimRun:
    """Run seed ``seed`` to the end; raises :class:`~.checkers.Violation` on a failure."""
    run = SimRun(seed, **kwargs)
    run.run()
    return run
