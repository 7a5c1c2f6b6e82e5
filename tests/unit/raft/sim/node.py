"""One simulated node: a real :class:`~shoal.node.raft.replica.PartitionReplica` on simulated parts.

The node keeps its disk (a :class:`~shoal.node.raft._io.SimIO`) across runs of its
process; everything else — the replica, its journal, its
:class:`~shoal.node.raft.storage.NodeStorage`, :class:`~shoal.node.raft.scheduler.TickScheduler`,
network and executor — belongs to one :class:`~.loop.Process` and is built again
at each start, from what the disk holds, as a restarted node builds it. A crash kills
the process (none of its callbacks runs again) and may cut the power (unsynced writes
are lost, appended tails torn). A pause stops the process (its links stay up) and
resumes it later; its clock may drift (:class:`~.loop.Process`).

A node is an original member of its group (the bootstrap membership) or a *joiner*,
which starts with no membership and learns it from the leader that adds it, as a node
the cluster's moves add does. A node removed from the group has its files deleted, and
joins later, if ever, as a new member (member id ``node/incarnation``), as a wiped node
rejoins a real cluster: a member never votes twice in one term under one id.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

from shoal.node.partition import PartitionMachine
from shoal.node.raft._io import SimIO
from shoal.node.raft.install import ByteRate
from shoal.node.raft.journal import Journal, quarantine_journal
from shoal.node.raft.membership import Membership
from shoal.node.raft.replica import PartitionReplica, ReplicaDamaged
from shoal.node.raft.scheduler import TickScheduler
from shoal.node.raft.snapshots import SnapshotSettings
from shoal.node.raft.storage import NodeStorage

from .disk import SimSnapshotter
from .loop import Process, ProcessExit, SimExecutor, SimLoop
from .network import Fabric, NodeNetwork

__all__ = ["SimNode", "SimReplica", "SimStorage", "PARTITION"]

#: The one partition every simulated node hosts.
PARTITION = 0
#: Disk-class journal writes are synced this often (the node's lazy sync loop).
LAZY_SYNC_S = 1.0
#: Journal sizes for the simulation's small logs: many segments (sealing, whole-segment
#: drops), a short unsynced tail, and a cache small enough that old entries are read back.
SEGMENT_BYTES = 8 * 1024
UNSYNCED_BYTES_MAX = 4 * 1024
CACHE_ENTRIES_MAX = 8


class SimStorage(NodeStorage):
    """The node's storage with journals sized for the simulation (see the constants above)."""

    def open_journal(self, partition: int) -> Journal:
        return Journal(self.io, os.path.join(self.data_dir, f"p{partition}.raft"), batcher=self.batcher,
                       segment_bytes=SEGMENT_BYTES, unsynced_bytes_max=UNSYNCED_BYTES_MAX,
                       cache_entries_max=CACHE_ENTRIES_MAX, zeros_ahead=True)

    def quarantine_journal(self, partition: int) -> str:
        # The aside directory is named by a wall clock: a fixed one keeps a seed's run (and its
        # log) the same from one replay to the next, however long the replays take.
        return quarantine_journal(self.io, self.journal_dir(partition), clock=lambda: 0.0)


class SimReplica(PartitionReplica):
    """The real replica, with observation points for the checkers: the entries it applies (and
    the durable index then: a leader applies committed disk-class entries before they are
    durable), and the state machine taken back to its snapshot or replaced by one."""

    on_entries: Callable[[str, list[Any], int], None] | None = None
    on_rollback: Callable[[str, int], None] | None = None

    def _apply(self, entries: list[Any], ahead: bool = False) -> None:
        hook = self.on_entries
        if hook is not None:
            hook(self.node_id, entries, self.core.durable)
        super()._apply(entries, ahead)

    def _roll_back(self) -> None:
        hook = self.on_rollback
        if hook is not None:
            hook(self.node_id, self.core.log.snap_index)
        super()._roll_back()

    def _start_load(self, path: str) -> None:
        # A snapshot replaces the state machine as a rollback does: what this replica applied
        # ahead of its durable index (a deposed leader's disk-class entries) is gone with it.
        hook = self.on_rollback
        if hook is not None:
            hook(self.node_id, self.core.log.snap_index)
        super()._start_load(path)


class SimNode:
    """A node of the simulation: its disk, and the process running its replica (module docstring)."""

    def __init__(self, node_id: str, members: list[str], loop: SimLoop, fabric: Fabric, rng: random.Random,
                 settings: SnapshotSettings, rate_bytes_per_s: float, burst_bytes: int,
                 replica_class: type[PartitionReplica] = SimReplica, *, bootstrap: bool = True,
                 group: Callable[[], list[str]] | None = None, member_of: Callable[[str], str | None] | None = None,
                 clock_rate: float = 1.0) -> None:
        """``members``: the bootstrap group (node ids, preferred first); ``bootstrap``: this node is
        one of them (else a joiner). ``group()`` names the group's target members now (member ids,
        preferred first) and ``member_of(node id)`` the member a node's link speaks for."""
        self.id = node_id
        self.member = node_id
        self.bootstrap = list(members) if bootstrap else None
        self._group = group or (lambda: list(members))
        self._member_of = member_of
        self.clock_rate = clock_rate
        self.incarnation = 0
        self.loop = loop
        self.fabric = fabric
        self.rng = rng
        self.settings = settings
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes
        self.replica_class = replica_class
        self.io = SimIO()
        self.data_dir = f"/sim/{node_id}"
        self.process: Process | None = None
        self.replica: PartitionReplica | None = None
        self.storage: NodeStorage | None = None
        self.runs = 0
        #: Called with (node, reason) when the node stops itself (a failed sync or load).
        self.on_fail_stop: Callable[["SimNode", str], None] | None = None
        #: Called with each new replica right after it is built (the cluster sets its hooks).
        self.on_replica: Callable[["SimNode", PartitionReplica], None] | None = None

    @property
    def up(self) -> bool:
        return self.replica is not None

    def start(self, repair: bool = True) -> ReplicaDamaged | None:
        """Run the node's process again from its disk; the refusal if the replica will not start."""
        assert self.process is None, f"{self.id} is running"
        self.runs += 1
        process = Process(self.loop, f"{self.id}#{self.runs}", rate=self.clock_rate)
        net = NodeNetwork(self.fabric, process, self.id)
        storage = SimStorage(self.io, self.data_dir, on_sync_failed=lambda exc: self._fail_stop(process, exc))
        net.before_flush = storage.barrier
        net.after_flush = storage.after_send
        rng = random.Random(self.rng.getrandbits(64))
        clock = process.time

        def snapshotter(path: str, partition: int, io: Any, settings: SnapshotSettings) -> SimSnapshotter:
            return SimSnapshotter(path, partition, io, settings, clock, rng)

        group = self._group()
        peers = [m for m in group if m != self.member]
        membership = Membership.of(self.bootstrap) if self.bootstrap is not None else Membership.of([])
        try:
            replica = self.replica_class(
                PARTITION, net, peers,  # type: ignore[arg-type]
                application=PartitionMachine(PARTITION), data_dir=self.data_dir, loop=process,  # type: ignore[arg-type]
                scheduler=TickScheduler(process), preferred=bool(group) and group[0] == self.member,  # type: ignore[arg-type]
                storage=storage, repair=repair, snapshot_settings=self.settings,
                snapshot_rates=[ByteRate(self.rate_bytes_per_s, self.burst_bytes)], clock=clock, rng=rng,
                executor=SimExecutor(process, rng), snapshotter=snapshotter, member=self.member,
                membership=membership, member_of=self._member_of)
        except ReplicaDamaged as exc:
            process.kill()
            return exc
        self.process, self.replica, self.storage = process, replica, storage
        if self.on_replica is not None:
            self.on_replica(self, replica)
        self.fabric.node_up(net)
        replica.start()
        process.call_later(LAZY_SYNC_S, self._lazy_sync, process)
        return None

    def pause(self, seconds: float) -> None:
        """Stop the running process for ``seconds`` of the loop's time (SIGSTOP, then SIGCONT)."""
        if self.process is not None:
            self.process.pause(self.loop.time() + seconds)

    def resume(self) -> None:
        if self.process is not None:
            self.process.paused_until = float("-inf")

    @property
    def paused(self) -> bool:
        return self.process is not None and self.process.paused_until > self.loop.time()

    def wipe(self) -> None:
        """The node (stopped) was removed from the group: its files are gone, and it joins again,
        if ever, as a new member."""
        assert self.process is None, f"{self.id} is running"
        self.io = SimIO()
        self.incarnation += 1
        self.member = f"{self.id}/{self.incarnation}"
        self.bootstrap = None

    def crash(self, power_cut: bool, torn: bool = True) -> None:
        """The process dies; with ``power_cut`` everything not synced is lost (tails torn if ``torn``)."""
        if self.process is not None:
            self.process.kill()
        self.process = self.replica = self.storage = None
        self.fabric.node_down(self.id)
        if power_cut:
            self.io.power_cut(self.rng if torn else None)

    def _lazy_sync(self, process: Process) -> None:
        if process is self.process and self.storage is not None:
            self.storage.sync_lazy()
            process.call_later(LAZY_SYNC_S, self._lazy_sync, process)

    def _fail_stop(self, process: Process, exc: BaseException) -> None:
        """The node's storage gave up (the real node exits): stop this run of the process."""
        if process is not self.process:
            return
        process.kill()
        hook = self.on_fail_stop
        if hook is not None:
            self.loop.call_soon(hook, self, f"{type(exc).__name__}: {exc}")
        raise ProcessExit(str(exc))  # nothing of this run goes on, not even the rest of this callback

    def __repr__(self) -> str:
        return f"SimNode({self.id} {'up' if self.up else 'down'})"
