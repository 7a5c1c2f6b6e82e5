"""What a node holds for one partition it hosts, in one place: :class:`Partition`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio

    from ..group_commit import GroupCommit
    from ..raft import PartitionReplica

__all__ = ["Partition", "Parked", "PARKED_PER_QUEUE_MAX", "WAKE_PER_ROUND_MAX"]

#: Pulls one queue may have parked at once; one more is refused (``OVERLOADED``).
PARKED_PER_QUEUE_MAX = 10_000
#: Pulls of one queue woken per applied batch; the others wait for a later one.
WAKE_PER_ROUND_MAX = 256


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


class Partition:
    """One hosted partition: its replica, its group commit, the commands parked on it, its flags.

    A PUSH's steps on this partition, in order:

    1. admit: the dispatcher takes it while :attr:`replica` leads;
    2. group commit: it waits in :attr:`group_commit` with the others for the next entry;
    3. propose: :attr:`replica` replicates that entry;
    4. applied: the replica applies it and sets :attr:`applied_pending`: the entry owes others
       wake-ups (job events, :meth:`wake_pulls`, :meth:`wake_pushes`), run right after step 5;
    5. answer: the entry's result, or, for a full queue and a PUSH that may wait,
       :meth:`park_push` until a later entry frees room.

    A parked command is claimed (:meth:`Parked.claim`) as it leaves: a wake or a drain hands
    out only those nobody answered yet, each at most once. One that expired stays in its
    line, answered, until a wake or a drain passes it.
    """

    __slots__ = ("id", "replica", "group_commit", "_pulls", "_pushes", "applied_pending", "last_tick_ms",
                 "tick_inflight")

    def __init__(self, p: int, replica: PartitionReplica, group_commit: GroupCommit) -> None:
        self.id = p
        self.replica = replica
        self.group_commit = group_commit
        #: queue -> its parked pulls, oldest first
        self._pulls: dict[str, deque[Parked[Any]]] = {}
        #: pushes parked because their queue was full, oldest first
        self._pushes: deque[Parked[Any]] = deque()
        #: Applied entries whose wake-ups (events, parked commands) have not run yet.
        self.applied_pending = False
        #: When the leader tick last proposed ``_Tick`` here (node clock, ms).
        self.last_tick_ms = 0
        #: A ``_Tick`` of this partition is in group commit: the leader tick proposes no other.
        self.tick_inflight = False

    # --- parking ---------------------------------------------------------------------------------

    def park_pull(self, parked: Parked[Any]) -> bool:
        """Park a long-poll pull on its queue's line; False (and nothing parked) when that line is full."""
        assert parked.partition == self.id, f"a pull of partition {parked.partition} parked on {self.id}"
        assert not parked.done, "an answered pull parked"
        line = self._pulls.setdefault(parked.queue, deque())
        if len(line) >= PARKED_PER_QUEUE_MAX:
            return False
        line.append(parked)
        return True

    def park_push(self, parked: Parked[Any]) -> None:
        """Park a push refused because its queue was full, until something is applied here."""
        assert parked.partition == self.id, f"a push of partition {parked.partition} parked on {self.id}"
        assert not parked.done, "an answered push parked"
        self._pushes.append(parked)

    # --- waking ----------------------------------------------------------------------------------

    def wake_pulls(self, ready: Callable[[str], bool]) -> Iterator[Parked[Any]]:
        """The parked pulls to submit again: of each queue ``ready`` says has jobs, up to
        :data:`WAKE_PER_ROUND_MAX`, oldest first, claimed. Lines left with only answered pulls go.

        Lazy, to be taken to the end: each pull is claimed as the caller takes it, so the
        caller's submits and the claims interleave in the order they would in one loop.
        """
        for queue in list(self._pulls):
            line = self._pulls[queue]
            while line and line[0].done:
                line.popleft()
            if not line:
                del self._pulls[queue]
                continue
            if not ready(queue):
                continue
            for _ in range(min(len(line), WAKE_PER_ROUND_MAX)):
                parked = line.popleft()
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
        return [parked for parked in waiting if parked.claim()]
