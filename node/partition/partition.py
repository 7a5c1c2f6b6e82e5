"""What a node holds for one partition it hosts, in one place: :class:`Partition`."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from shoal.cluster.errors import CommandError, ErrorCode

from ..clock import Clock
from ..raft import BatchResult, refuse_some
from .group_commit import GroupCommit

if TYPE_CHECKING:
    from shoal.cluster.codec import PlainBulk, PlainPush

    from ..raft import PartitionReplica
    from ..state import Event, PushBatch
    from ..writes import PendingWrites
    from .machine import PartitionMachine
    from .view import PartitionView

__all__ = ["Partition", "Parked", "Serving", "writes_lazily", "PARKED_PER_QUEUE_MAX", "WAKE_PER_ROUND_MAX", "NO_SPACE_ERROR"]

#: What a command that brings new data in meets while the disk is nearly full.
NO_SPACE_ERROR = CommandError(ErrorCode.NO_SPACE, "the partition's disk is (nearly) full: new data is refused "
                                                  "until space is freed; pulls, acks and reads still work")
#: Pulls one queue may have parked at once; one more is refused (``OVERLOADED``).
PARKED_PER_QUEUE_MAX = 10_000
#: Pulls of one line (a queue, or a queue's group) woken per applied batch; the others wait for a later one.
WAKE_PER_ROUND_MAX = 256
#: A parked pull's line: its queue, the one group it is limited to (None: any), and whether it
#: is limited to jobs without a group (``PULL``/``PULLB`` ``group`` and ``ungrouped``).
Line = tuple[str, "str | None", bool]


class _Link(Protocol):
    """The connection a parked command answers on, as far as parking needs it."""

    closed: bool


LinkT = TypeVar("LinkT", bound=_Link)


class Parked(Generic[LinkT]):
    """A command waiting on its partition: a long-poll pull or a push to a full queue."""

    __slots__ = ("conn", "frame", "partition", "queue", "deadline", "timer", "done")

    def __init__(self, conn: LinkT, frame: dict[str, Any], partition: int, queue: str, deadline: float) -> None:
        self.conn = conn
        self.frame = frame
        self.partition = partition
        self.queue = queue
        self.deadline = deadline
        self.timer: asyncio.TimerHandle | None = None
        self.done = False

    def claim(self) -> bool:
        """Take this command off its wait for good; False if it was already answered or its link closed."""
        if self.done or self.conn.closed:
            return False
        self.done = True
        if self.timer:
            self.timer.cancel()
        return True


class Serving(Protocol):
    """What answers the commands of a partition this node leads (the node's dispatcher): reads
    from the applied state, long polls, writes through group commit, each on its connection
    (a :class:`~shoal.node.ports.Replier`, which this layer only passes on).

    ``writes`` holds the connections with output to write (:class:`~shoal.node.writes.PendingWrites`)."""

    writes: PendingWrites

    def serve(self, part: Partition, conn: Any, frame: dict[str, Any]) -> None: ...

    def serve_pushes(self, part: Partition, conn: Any, frames: list[PlainPush]) -> None: ...

    def serve_bulk(self, part: Partition, conn: Any, bulk: PlainBulk, batch: PushBatch) -> None: ...

    def wants_events(self) -> bool:
        """Does anyone (a connection, a peer, a node listener) take job events now?"""

    def publish(self, partition: int, events: Sequence[Event], view: PartitionView) -> None:
        """Send one partition's job events (``view``: its applied state) to those who take them."""

    def wake(self, part: Partition) -> None:
        """Submit again the commands parked on ``part`` that may now succeed (:meth:`Partition.wake_pulls`,
        :meth:`Partition.wake_pushes`)."""


class Partition:
    """One hosted partition: its replica, its group commit, the commands parked on it, its flags.

    A PUSH's steps on this partition, in order:

    1. admit: the dispatcher hands it to :meth:`submit_pushes` (or :meth:`submit`) while
       :attr:`replica` leads (a :class:`~.remote.RemotePartition` takes the same calls while
       another node leads);
    2. group commit: it waits in :attr:`group_commit` with the others for the next entry;
    3. propose (:meth:`propose`): the partition's write policies (no new data while the disk is
       nearly full; the durability class), then :attr:`replica` replicates that entry;
    4. applied: the replica applies it and calls :meth:`applied`: the entry owes others
       wake-ups (job events, :meth:`wake_pulls`, :meth:`wake_pushes`);
    5. answer: the entry's result, or, for a full queue and a PUSH that may wait,
       :meth:`park_push` until a later entry frees room; then :meth:`answered` writes the
       answers at once and runs step 4's wake-ups (:meth:`settle`) while the clients read them.

    A parked command is claimed (:meth:`Parked.claim`) as it leaves: a wake or a drain hands
    out only those nobody answered yet, each at most once. One that expired stays in its
    line, answered, until a wake or a drain passes it.
    """

    __slots__ = ("id", "replica", "group_commit", "serving", "_pulls", "_parked_pulls", "_pushes", "applied_pending",
                 "last_tick_ms", "tick_inflight", "retired", "_loop")

    def __init__(self, p: int, replica: PartitionReplica, group_commit: GroupCommit | None = None,
                 serving: Serving | None = None) -> None:
        self.id = p
        self.replica = replica
        #: Answers the commands submitted here (see :meth:`submit`).
        self.serving = serving
        #: Batches the partition's writes into entries (see :meth:`hosted`).
        self.group_commit: GroupCommit = group_commit  # type: ignore[assignment]
        #: line (queue, and the group a pull is limited to) -> its parked pulls, oldest first
        self._pulls: dict[Line, deque[Parked[Any]]] = {}
        #: queue -> the pulls in its lines (answered ones included until a wake passes them)
        self._parked_pulls: dict[str, int] = {}
        #: pushes parked because their queue was full, oldest first
        self._pushes: deque[Parked[Any]] = deque()
        #: Applied entries whose wake-ups (events, parked commands) have not run yet.
        self.applied_pending = False
        #: When the leader tick last proposed ``_Tick`` here (node clock, ms).
        self.last_tick_ms = 0
        #: A ``_Tick`` of this partition is in group commit: the leader tick proposes no other.
        self.tick_inflight = False
        #: The node no longer hosts this partition: wake-ups still scheduled do nothing.
        self.retired = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def hosted(cls, p: int, replica: PartitionReplica, loop: asyncio.AbstractEventLoop, clock: Clock, *,
               serving: Serving) -> Partition:
        """The partition a node hosts: ``serving`` answers what is submitted to it and writes the
        answers; its group commit proposes through :meth:`propose`, and the replica tells it of
        every applied entry (:meth:`applied`)."""
        part = cls(p, replica, serving=serving)
        part._loop = loop
        writes = serving.writes
        part.group_commit = GroupCommit(replica, loop, clock, propose=part.propose, after_answers=part.answered,
                                        before_output=writes.propose_first, early_answers=writes.write_now)
        replica.on_applied = part.applied
        return part

    # --- commands --------------------------------------------------------------------------------

    def submit(self, conn: Any, frame: dict[str, Any]) -> None:
        """Answer a validated command of this partition on ``conn``; this node leads it."""
        assert self.serving is not None, f"partition {self.id} has nothing to serve its commands"
        self.serving.serve(self, conn, frame)

    def submit_pushes(self, conn: Any, frames: list[PlainPush]) -> None:
        """Answer a block of plain PUSHes to one queue of this partition, each on ``conn``."""
        assert self.serving is not None, f"partition {self.id} has nothing to serve its commands"
        self.serving.serve_pushes(self, conn, frames)

    def submit_bulk(self, conn: Any, bulk: PlainBulk, batch: PushBatch) -> None:
        """Answer a checked plain PUSHB of this partition on ``conn``: ``batch`` is its replicated form."""
        assert self.serving is not None, f"partition {self.id} has nothing to serve its commands"
        self.serving.serve_bulk(self, conn, bulk, batch)

    # --- writing ---------------------------------------------------------------------------------

    def propose(self, now_ms: int, commands: list[Any], callback: Callable[[BatchResult | None, int], None],
                early: Callable[[BatchResult], None] | None = None) -> None:
        """Step 3: replicate one entry of ``commands``, under the partition's write policies.

        - **No space**: while the data directory's free space is below its floor, a command that
          brings new data in (:data:`~.machine.SPACE_TAKING_COMMANDS`) is answered ``NO_SPACE``
          in its place and the others go on, so pulls, acks and deletes keep freeing room
          (``/ready`` and the metrics report it).
        - **Durability class** (:func:`writes_lazily`): an entry of ``durable: false`` queues
          only is acknowledged once a majority appended it and synced later.
        """
        replica = self.replica
        storage = replica.storage
        machine: PartitionMachine = replica.application  # type: ignore[assignment]
        if storage.space_low():
            refused = {k for k, cmd in enumerate(commands) if machine.takes_space(cmd)}
            if refused:
                storage.no_space[self.id] = "free space below disk_free_min_bytes"
                commands, callback = refuse_some(commands, refused, callback, replica.loop, NO_SPACE_ERROR)
                if not commands:
                    return
        else:
            storage.no_space.pop(self.id, None)
        replica.propose(now_ms, commands, callback, early, lazy=writes_lazily(replica, machine, commands))

    # --- after an entry is applied ------------------------------------------------------------------

    def applied(self) -> None:
        """Step 4: the replica applied entries (it calls this within each apply). Their wake-ups
        run once, after the answers (:meth:`answered`), or at the end of the loop iteration for
        entries nobody here waited on (a follower's, a ``_Tick``'s)."""
        if not self.applied_pending and self._loop is not None:
            self.applied_pending = True
            self._loop.call_soon(self._settle_soon)

    def answered(self) -> None:
        """Step 5: the group commit handed out an entry's answers. They are written at once, then
        what the applies owe to others (:meth:`settle`), and what that wrote, while the clients
        read their answers rather than after the loop polled and handled what came meanwhile."""
        assert self.serving is not None, f"partition {self.id} has nothing to write its answers"
        writes = self.serving.writes
        writes.write_now()
        if self.applied_pending and not self.retired:
            self.settle()
            writes.write_now()

    def _settle_soon(self) -> None:
        if self.applied_pending and not self.retired:
            self.settle()

    def settle(self) -> None:
        """Run what applied entries owe to others: their job events go out (and the engine records
        them only while someone takes them, so its hot paths skip their event tuples otherwise),
        and on a leader the parked commands that may now succeed are submitted again."""
        self.applied_pending = False
        serving = self.serving
        assert serving is not None, f"partition {self.id} has nothing to serve its commands"
        replica = self.replica
        leads = replica.is_leader()
        machine: PartitionMachine = replica.application  # type: ignore[assignment]
        wanted = leads and serving.wants_events()
        machine.record_events = wanted
        events = machine.take_events()
        if events and wanted:
            serving.publish(self.id, events, machine.view)
        if leads:
            serving.wake(self)

    # --- parking ---------------------------------------------------------------------------------

    def park_pull(self, parked: Parked[Any]) -> bool:
        """Park a long-poll pull on its line (its queue's, or for a pull limited to one group
        or to jobs without a group, that group's); False (and nothing parked) when its queue
        has :data:`PARKED_PER_QUEUE_MAX` pulls parked."""
        assert parked.partition == self.id, f"a pull of partition {parked.partition} parked on {self.id}"
        assert not parked.done, "an answered pull parked"
        queue = parked.queue
        n = self._parked_pulls.get(queue, 0)
        if n >= PARKED_PER_QUEUE_MAX:
            return False
        frame = parked.frame
        line: Line = (queue, frame.get("group"), bool(frame.get("ungrouped")))
        self._pulls.setdefault(line, deque()).append(parked)
        self._parked_pulls[queue] = n + 1
        return True

    def _unparked(self, queue: str) -> None:
        """One pull of ``queue`` left its line."""
        n = self._parked_pulls[queue] - 1
        if n:
            self._parked_pulls[queue] = n
        else:
            del self._parked_pulls[queue]

    def park_push(self, parked: Parked[Any]) -> None:
        """Park a push refused because its queue was full, until something is applied here."""
        assert parked.partition == self.id, f"a push of partition {parked.partition} parked on {self.id}"
        assert not parked.done, "an answered push parked"
        self._pushes.append(parked)

    # --- waking ----------------------------------------------------------------------------------

    def wake_pulls(self, ready: Callable[..., bool]) -> Iterator[Parked[Any]]:
        """The parked pulls to submit again: of each line whose pull would take a job now, up to
        :data:`WAKE_PER_ROUND_MAX`, oldest first, claimed. Lines left with only answered pulls go.

        ``ready(queue)`` says whether a pull of ``queue`` would; ``ready(queue, group,
        ungrouped)`` whether one limited to ``group`` (or to jobs without a group) would. A
        limited line is asked only when its queue is ready, and wakes only when its own pull
        would take a job, so a pull waiting for one group never wakes for another's jobs.

        Lazy, to be taken to the end: each pull is claimed as the caller takes it, so the
        caller's submits and the claims interleave in the order they would in one loop.
        """
        queue_ready: dict[str, bool] = {}
        for key in list(self._pulls):
            line = self._pulls[key]
            queue, group, ungrouped = key
            while line and line[0].done:
                line.popleft()
                self._unparked(queue)
            if not line:
                del self._pulls[key]
                continue
            ok = queue_ready.get(queue)
            if ok is None:
                ok = queue_ready[queue] = ready(queue)
            if not ok or ((group is not None or ungrouped) and not ready(queue, group, ungrouped)):
                continue
            for _ in range(min(len(line), WAKE_PER_ROUND_MAX)):
                parked = line.popleft()
                self._unparked(queue)
                assert parked.queue == queue, f"a pull of {parked.queue} in the line of {queue}"
                if parked.claim():
                    yield parked

    def wake_pushes(self) -> Iterator[Parked[Any]]:
        """Every parked push, to write again, claimed as taken; one parked meanwhile waits for the next wake."""
        pushes, self._pushes = self._pushes, deque()
        for parked in pushes:
            if parked.claim():
                yield parked

    def drain_parked(self) -> list[Parked[Any]]:
        """Everything parked here (pushes, then pulls queue by queue), claimed: this node no
        longer leads the partition, and the caller answers each with why."""
        waiting: list[Parked[Any]] = list(self._pushes)
        self._pushes = deque()
        for line in self._pulls.values():
            waiting.extend(line)
        self._pulls.clear()
        self._parked_pulls.clear()
        return [parked for parked in waiting if parked.claim()]


def writes_lazily(replica: PartitionReplica, machine: PartitionMachine, commands: list[Any]) -> bool:
    """The durability-class policy: True when the entry of ``commands`` may be written in the
    disk class, judged from the applied state (:meth:`PartitionMachine.disk_class`), and only
    while that state holds every committed entry
    (:meth:`~shoal.node.raft.PartitionReplica.state_current`). Whatever the machine cannot
    place counts as fsync class: an entry a majority acknowledged must survive a node's power
    cut even when nobody waits for it, or a replica that applied it can be left holding it alone
    while the others commit another entry at its index."""
    return replica.state_current() and machine.disk_class(commands)
