"""One partition's replica: drives its Raft core and does the I/O around it.

Theory of operation: the leader's event loop hands whole batches of validated
commands to :meth:`PartitionReplica.propose`; the core (:mod:`.core`) appends one
log entry per batch (group commit) and, once a majority holds it, hands it back as
committed; every replica then applies the batch through its application
(:class:`~.application.Application`), the only part that knows what a command does.

Everything runs on the node's event loop. Three inputs reach the core: a message
from a peer (over the node's shared Raft links, :mod:`.transport`), a tick (booked on
the node's one :class:`~.scheduler.TickScheduler` for the core's next deadline), and
a proposal. After each, the replica collects the core's :class:`~.core.Ready` and does,
in order: store term and vote durably (:mod:`.meta`), cut and append journal entries
(:mod:`.journal`; the node's storage syncs fsync-class entries before any frame
leaves, and a leader's own right after its frame is written, :mod:`.storage`),
replace the log by an installed snapshot, queue the messages (written when the
current frame or proposal ends), apply committed entries, and start snapshot streams
to followers the core found behind the journal (:mod:`.install`).

Snapshots (:mod:`.snapshots`) are written by a forked child; loading one (at start,
or after installing the leader's) runs in a worker thread while the core keeps
taking part in Raft; committed entries wait until the state is loaded, and the
replica neither campaigns nor serves reads meanwhile.

Damage found at start (a journal record or a snapshot that fails its checks) is
named in the log with its file and offset; with ``repair`` on the damaged files are
moved aside and the replica starts empty in the core's *recovering* mode: it neither
votes nor campaigns until a leader has brought it back in line, by log or snapshot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.registry import node_of_member

from ._io import NoSpace
from .application import Application
from .core import LEADER, NotLeader, ProposalRefused, RaftCore, RaftParams, Ready
from .install import (COMPLETE, NO_FILES, NOT_WANTED, START_OVER, ByteRate, Received, SnapshotReceiver,
                      SnapshotSender, RATE_BYTES_PER_S)
from .journal import QUARANTINE_INFIX, Journal, JournalCorrupt, SyncFailed
from .membership import ConfigChange, Membership, decode_change
from .messages import (ENTRY_CONFIG, ENTRY_DATA, AppendEntries, AppendResponse, InstallSnapshot, Message, MessageError, SnapshotChunk,
                       SnapshotChunkAck)
from .meta import MetaCorrupt
from .planning import plan_change
from .scheduler import TickScheduler
from .snapshot_file import SnapshotCorrupt
from .snapshots import (ForkSnapshotter, SnapshotFile, SnapshotSettings, files_path, load_snapshot,
                        read_snapshot_head, verify_snapshot)
from .storage import NodeStorage
from .transport import ENTRY_BYTES_MAX, PartitionTransport, RaftNetwork
from ._io import RealIO

__all__ = ["PartitionReplica", "BatchResult", "fail_reason_error", "timing_scale", "ReplicaDamaged", "ApplyFailed",
           "HEARTBEAT_S", "ELECTION_TIMEOUT_MIN_S", "ELECTION_TIMEOUT_MAX_S", "FOLLOWER_APPLY_BATCH",
           "FAIL_NO_LEADER", "FAIL_LOST", "FAIL_NO_SPACE", "FAIL_REFUSED", "refuse_some"]

log = logging.getLogger(__name__)

#: A batch's outcome: one reply dict (ok) or CommandError per command, in order.
BatchResult = list[Any]
#: Why a proposal got no results: never appended (no leader, refused) or leadership lost after.
FAIL_NO_LEADER = 1
FAIL_LOST = 2
FAIL_REFUSED = 3
FAIL_NO_SPACE = -507
NO_SPACE_LOG_S = 10.0
#: A follower normally applies every committed entry it is handed at once; readiness tolerates
#: a commit-to-applied lag of this many entries before calling a replica behind.
FOLLOWER_APPLY_BATCH = 8
#: Heartbeat period and election timeouts (stretched on nodes hosting many groups, timing_scale).
HEARTBEAT_S = 0.2
ELECTION_TIMEOUT_MIN_S = 0.8
ELECTION_TIMEOUT_MAX_S = 1.6
#: While entries are pipelined, a new one goes at once only to the followers the commit needs
#: (those that answered within FAST_FOLLOWER_S, in placement order); the others get what they
#: lack at most every LAZY_SEND_S: on two cores, a second follower woken per entry competes with
#: the leader for a core. A lone write goes to every follower (it commits on the faster answer).
LAZY_SEND_S = 0.005
FAST_FOLLOWER_S = 0.01
#: A leader that has not heard from a majority for this long steps down.
CHECK_QUORUM_S = 2.0
#: A leadership transfer goes only to a voter that answered within this long (a paused node
#: keeps its links up and answers nothing).
TRANSFER_HEARD_S = 0.5
TIMING_GROUPS_BASE = 256
#: At start the preferred replica (first in placement) campaigns after this; the others only
#: after a full election timeout more, so leaders start where the balancer wants them.
PREFERRED_FIRST_ELECTION_S = 0.2
#: A campaign the node's budget (scheduler.CampaignBudget) deferred is retried after a random
#: delay in this range.
CAMPAIGN_RETRY_MIN_S = 0.1
CAMPAIGN_RETRY_MAX_S = 0.6
#: Entries a replica keeps in its journal below its newest snapshot, so a follower slightly
#: behind catches up by log rather than by a whole snapshot; and the most bytes of journal
#: segments they may take (entries of bulk adds are large: 5,000 of them can be gigabytes).
SNAPSHOT_RETAIN_ENTRIES_MAX = 5_000
SNAPSHOT_RETAIN_BYTES_MAX = 256 << 20
#: The most entries the journal keeps past a snapshot for a follower still receiving an older one.
STREAM_HOLD_ENTRIES_MAX = 1_000_000
#: How long the journal keeps, for a follower that was just sent a snapshot, the entries it needs
#: next (a newer snapshot taken meanwhile would otherwise cut them, and the follower is sent
#: that one, and so on while the writes go on).
CATCH_UP_HOLD_S = 60.0
#: Reads that may wait for a ReadIndex round at once (OVERLOADED beyond), and how long one waits
#: before it is answered NO_LEADER (a leader that hears no majority steps down sooner).
READ_WAITERS_MAX = 10_000
READ_CONFIRM_TIMEOUT_S = 3.0
#: A written snapshot waits under the snapshot's name plus this until it may replace it.
NEXT_SUFFIX = ".next"
#: The directory of files a snapshot refers to is named the snapshot's name, this, and its index.
FILES_INFIX = ".files."
#: How often the commit-index hint is stored (when it changed).
COMMIT_HINT_PERIOD_S = 10.0
#: How often a running snapshot child, streams and their rates are looked at.
BACKGROUND_POLL_S = 0.05
#: Snapshot loads and fsyncs of received snapshot files run here, one at a time per node (a load
#: holds a whole state while it builds).
_BACKGROUND = ThreadPoolExecutor(1, thread_name_prefix="shoal-snapshot")
#: Builds a replica's snapshot writer: (path, partition, io, settings).
SnapshotterFactory = Callable[[str, int, Any, SnapshotSettings], Any]
#: The application a replica drives.
A = TypeVar("A", bound=Application)


def timing_scale(groups: int) -> float:
    """How much a node hosting ``groups`` Raft groups stretches its Raft timers (at least 1)."""
    return max(1.0, groups / TIMING_GROUPS_BASE)


def raft_params(scale: float = 1.0) -> RaftParams:
    """The core's settings for a node hosting groups at timing ``scale``."""
    return RaftParams(heartbeat_s=HEARTBEAT_S * scale, election_min_s=ELECTION_TIMEOUT_MIN_S * scale,
                      election_max_s=ELECTION_TIMEOUT_MAX_S * scale, check_quorum_s=CHECK_QUORUM_S * scale,
                      transfer_timeout_s=ELECTION_TIMEOUT_MAX_S * scale,
                      transfer_heard_s=TRANSFER_HEARD_S * scale, lazy_send_s=LAZY_SEND_S,
                      fast_follower_s=FAST_FOLLOWER_S)


class ReplicaDamaged(Exception):
    """A replica's files are damaged and repair is off (or impossible): the node refuses to start."""


class ApplyFailed(Exception):
    """A committed entry could not be applied: the replica stops rather than skip it."""


_DATA_BYTE = bytes([ENTRY_DATA])


class _Proposal:
    __slots__ = ("term", "callback", "early")

    def __init__(self, term: int, callback: Callable[[BatchResult | None, int], None],
                 early: Callable[[BatchResult], None] | None = None) -> None:
        self.term = term
        self.callback = callback
        self.early = early


class PartitionReplica(Generic[A]):
    """A partition's application replicated by Shoal's Raft core; the node's view of one Raft group.

    The replica orders opaque batches of commands and hands committed ones to its
    :attr:`application` (:class:`~.application.Application`); it never reads a command or
    the state. What the rest of the node uses: :meth:`propose`, :attr:`application`,
    :meth:`is_leader`, :meth:`leader_id`, :meth:`term`, :meth:`commit_index`,
    :meth:`applied_index`, :meth:`has_quorum`, :meth:`read_ready`, :meth:`transfer_leadership`,
    :meth:`peer_connected`, :attr:`elections`, :meth:`snapshot_now` and :meth:`close`.
    """

    def __init__(self, partition: int, network: RaftNetwork, peers: list[str], *, application: A, data_dir: str,
                 loop: asyncio.AbstractEventLoop, scheduler: TickScheduler, preferred: bool = False,
                 groups: int = 1, storage: NodeStorage | None = None, repair: bool = True,
                 snapshot_settings: SnapshotSettings | None = None,
                 snapshot_rates: list[ByteRate] | None = None, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, executor: Executor | None = None,
                 snapshotter: SnapshotterFactory = ForkSnapshotter, member: str | None = None,
                 membership: Membership | None = None,
                 member_of: Callable[[str], str | None] | None = None) -> None:
        """``peers`` are the other members in placement order (the fast path's preference);
        ``application`` is the partition's state machine, empty (a snapshot and the log fill it).

        ``member`` is this replica's Raft member id (default: the node id) and ``membership``
        the group's first membership, used when the partition's files are new (default: this
        member and ``peers``; empty for a replica that joins an existing group and learns the
        membership from its leader); it is recorded with the files and read back at every
        start. ``member_of(node id)`` names the member the node's current link speaks for (None:
        none of this group's); by default member ids are node ids.

        ``clock``, ``rng``, ``executor`` (where snapshot loads and fsyncs of received files run)
        and ``snapshotter`` are the node's own unless a simulation replaces them."""
        self.partition = partition
        self._clock = clock
        self._rng = rng or random.Random()
        self._executor = executor or _BACKGROUND
        self.node_id = network.node_id
        self.loop = loop
        self.scheduler = scheduler
        self.network = network
        #: The state machine this replica applies committed entries to.
        self.application: A = application
        #: Set by what hosts the replica (the node's partition): called on the loop after every
        #: applied batch.
        self.on_applied: Callable[[], None] | None = None
        #: Set by the node: called on the loop when this replica stops leading its partition.
        self.on_leadership_lost: Callable[[int], None] | None = None
        self.applied_batches = 0
        self.timer_slot: int | None = None
        self._closed = False
        self._scale = timing_scale(groups)
        self._preferred = preferred
        self.storage = storage if storage is not None else NodeStorage(RealIO(disk_free_min_bytes=0), data_dir)
        self._io = self.storage.io
        self.settings = snapshot_settings or SnapshotSettings.from_env()
        self.snapshot_path = os.path.join(data_dir, f"p{partition}.snap")
        # Snapshots are written beside the current one and replace it once the durable index
        # reaches them (_snapshot_written).
        self.snapshots = snapshotter(self.snapshot_path + NEXT_SUFFIX, partition, self._io, self.settings)
        self.snapshots.on_slot = self.snapshot_now
        self.snapshots.on_failed = self.application.snapshot_failed
        self._receiver = SnapshotReceiver(self.snapshot_path, self._io, partition)
        self._senders: dict[str, SnapshotSender] = {}
        #: Peers a stream delivered a snapshot to: (its index, until when the journal waits for them).
        self._delivered: dict[str, tuple[int, float]] = {}
        #: Peers due a snapshot whose stream found the file replaced by a newer one not yet reaped,
        #: or that take no files beside a snapshot that refers to some (they wait for one that
        #: carries them).
        self._awaiting_next: set[str] = set()
        #: The next snapshot must carry everything (a peer that takes no files waits to be sent it).
        self._portable_wanted = False
        #: Byte rates every snapshot stream of this replica obeys (per stream, plus any shared ones).
        self._shared_rates = snapshot_rates or []
        self._pending: dict[int, _Proposal] = {}
        #: The journal's synced index when _count_synced last looked.
        self._synced_seen = -1
        #: Reads waiting for a ReadIndex round: not yet in one, and (round, started at, callbacks).
        self._read_waiters: list[Callable[[bool], None]] = []
        self._read_rounds: deque[tuple[int, float, list[Callable[[bool], None]]]] = deque()
        self._read_round_booked = False
        self._tick_tail: list[tuple[Callable[..., None], tuple[Any, ...]]] | None = None
        self._processing = False
        self._again = False
        self._no_space_logged = float("-inf")
        self._leader_unsynced = False
        self._loading = False
        self._backlog: list[Any] = []
        #: A follower's committed entries, applied once the frame that committed them is answered.
        self._deferred: list[Any] = []
        #: The index of the last entry the application applied (the core hands entries out before).
        self._state_index = 0
        self._snapshot_due = self._clock() + self.settings.interval_s
        self._hint_due = self._clock() + COMMIT_HINT_PERIOD_S
        self._last_snapshot_index = 0
        self._snapshot_file: SnapshotFile | None = None
        self._was_leader = False
        self._elections_logged = 0
        self.damage: str | None = None
        self.installs = 0
        #: Times the state machine was taken back to its snapshot (see _roll_back).
        self.rollbacks = 0
        #: A snapshot written, waiting for the durable index to reach it before it replaces the
        #: current one (see _snapshot_written).
        self._next_snapshot: SnapshotFile | None = None
        self._snapshot_bytes_sent = 0
        self.member = member or self.node_id
        self._member_of = member_of or _same_id
        #: member id -> node id of the members whose node's link currently speaks for them.
        self._routes: dict[str, str] = {}
        #: node id -> member id its link speaks for (cleared when links or the registry change).
        self._senders_by_node: dict[str, str | None] = {}
        if membership is None:
            membership = Membership.of([self.member, *peers])
        # Damage can be repaired from another replica unless this one was its group's only member
        # from the start (a joiner, which starts knowing no membership, was added by a leader).
        alone = not peers and tuple(membership.members) == (self.member,)
        self._repair = repair and not alone
        self.core, self.journal = self._recover(data_dir, membership, self._repair)
        self.core.loading = self._loading
        self._transport = PartitionTransport(network, partition, [node_of_member(m) for m in peers], self._deliver,
                                             self._peer_up, self._peer_down)
        self.storage.on_leader_synced(self.journal, self._leader_synced)
        #: Followers in placement order: the fast path's choice (a preferred leader that follows
        #: stays caught up for the balancer's hand-back).
        self.core.peer_order = list(peers)

    # --- start-up and recovery ---------------------------------------------------------------------

    def _recover(self, data_dir: str, given: Membership, repair: bool) -> tuple[RaftCore, Journal]:
        """Open journal, term/vote and snapshot; on damage, refuse or (``repair``) start empty and recovering."""
        snap: SnapshotFile | None = None
        journal: Journal | None = None
        if self._io.exists(self.snapshot_path + NEXT_SUFFIX):
            self._io.unlink(self.snapshot_path + NEXT_SUFFIX)  # written, never installed: not needed
        try:
            journal = self.storage.open_journal(self.partition)
            if self._io.exists(self.snapshot_path):
                snap = verify_snapshot(self._io, self.snapshot_path)
                self._check_files(snap)
            self._check_consistent(journal, snap)
        except (JournalCorrupt, SnapshotCorrupt) as exc:
            if not repair:
                raise ReplicaDamaged(f"partition {self.partition}: {exc}; refusing to start (repair is off "
                                     "or the partition has no other replica)") from exc
            self.damage = str(exc)
            log.error("partition %d: %s; moving the damaged files aside and fetching a fresh copy from the "
                      "leader (this replica neither votes nor campaigns until it has it)", self.partition, exc)
            if journal is not None:
                journal.close()
            self.storage.quarantine_journal(self.partition)
            self._quarantine_snapshot()
            journal = self.storage.open_journal(self.partition)
            journal.meta.store(journal.meta.state.term, journal.meta.state.voted_for, 0, recovering=True)
            snap = None
        except MetaCorrupt as exc:
            raise ReplicaDamaged(f"partition {self.partition}: {exc}; the vote it held is unknown, so this "
                                 "replica cannot rejoin safely (restore the file or replace the node)") from exc
        meta = journal.meta.state
        if meta.initial is None:
            # New files: record the group's first membership with them (a replica that joins later
            # keeps knowing it started with none, whatever the node passes at a restart).
            journal.meta.store(meta.term, meta.voted_for, initial=(given.voters, given.learners))
            meta = journal.meta.state
        assert meta.initial is not None
        first = Membership.of(meta.initial[0], meta.initial[1])
        snap_point = (snap.index, snap.term) if snap is not None else (0, 0)
        membership = snap.membership if snap is not None else first
        if journal.last_index < snap_point[0] or (
                journal.last_index >= snap_point[0] >= journal.first_index
                and journal.term_at(snap_point[0]) != snap_point[1] and snap_point[0] > 0):
            journal.clear()  # the snapshot was installed from the leader; the old log is not its history
        changes = []
        for payload, index, _ in journal.entries(max(journal.first_index, snap_point[0] + 1), journal.last_index + 1):
            if payload[:1] == bytes([ENTRY_CONFIG]):
                changes.append((index, decode_change(payload)))
        params = raft_params(self._scale)
        core = RaftCore(self.member, membership, journal, params=params, rng=self._rng,
                        term=meta.term, vote=meta.voted_for, commit=journal.commit_hint,
                        snapshot=snap_point, log_configs=changes, recovering=meta.recovering,
                        now=self._clock())
        if meta.recovering and self.damage is None:
            self.damage = "an earlier start discarded damaged files; catching up from the leader"
        self._snapshot_file = snap
        self._last_snapshot_index = snap_point[0]
        self._remove_stale_files()
        if snap is not None:
            self._start_load(snap.path)
        return core, journal

    def _quarantine_snapshot(self) -> None:
        """Move the snapshot file aside (its files' directory goes with the next clean-up): the
        journal no longer continues a snapshot, so the next start repairs the replica."""
        if self._io.exists(self.snapshot_path):
            self._io.rename(self.snapshot_path, f"{self.snapshot_path}{QUARANTINE_INFIX}"
                            f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            self._io.fsync_dir(os.path.dirname(self.snapshot_path) or ".")

    def _check_files(self, snap: SnapshotFile) -> None:
        """The directory of files ``snap`` refers to must be there (its files are checked as the
        snapshot loads)."""
        path = files_path(snap.path, snap.files)
        if path is not None and not os.path.isdir(path):
            raise SnapshotCorrupt(f"{snap.path}: the directory of files it refers to, {snap.files}, is missing",
                                  path=snap.path, offset=0)

    def _files_dir(self, index: int) -> str:
        return f"{self.snapshot_path}{FILES_INFIX}{index}"

    def _remove_stale_files(self) -> None:
        """Delete the files' directories of snapshots other than the current one (written and
        overtaken, replaced, or left by a crash)."""
        directory = os.path.dirname(self.snapshot_path) or "."
        prefix = os.path.basename(self.snapshot_path) + FILES_INFIX
        keep = {snap.files for snap in (self._snapshot_file, self._next_snapshot) if snap is not None}
        try:
            names = self._io.listdir(directory)
        except OSError:
            return
        for name in names:
            if name.startswith(prefix) and name not in keep:
                self._io.remove_tree(os.path.join(directory, name))

    def _link_files(self, index: int) -> str | None:
        """(Right before a snapshot's fork.) The directory the application filled with the files
        the snapshot at ``index`` refers to, or None: the snapshot carries everything."""
        if self._portable_wanted:
            return None
        path = self._files_dir(index)
        current = self._snapshot_file
        if current is not None and current.files == os.path.basename(path):
            return None  # the current snapshot's own (same index): never relinked under it
        return path if self.application.link_snapshot_files(path) else None

    def _check_consistent(self, journal: Journal, snap: SnapshotFile | None) -> None:
        """The journal must continue the snapshot (or start at the first entry without one)."""
        base = snap.index if snap is not None else 0
        if journal.last_index >= journal.first_index and journal.first_index > base + 1:
            raise JournalCorrupt(journal.directory, 0, f"starts at entry {journal.first_index}, but the snapshot "
                                 f"ends at {base}: entries {base + 1}..{journal.first_index - 1} are missing")

    def _recovered(self) -> None:
        """The core left its recovering mode (a leader caught it up): the flag on disk goes too."""
        meta = self.journal.meta
        if meta.state.recovering:
            meta.store(meta.state.term, meta.state.voted_for, recovering=False)
            self.damage = None
            log.info("partition %d: caught up from the leader after the repair; votes and campaigns again",
                     self.partition)

    def start(self) -> None:
        """Start the election clock and receiving: the preferred replica campaigns first.

        Called once every group of the node is built, so building a thousand groups does not
        eat into the first election timeouts.
        """
        now = self._clock()
        first = PREFERRED_FIRST_ELECTION_S
        if not self._preferred:
            first += ELECTION_TIMEOUT_MAX_S * self._scale
        self.core.schedule_election(now + first)
        self._transport.attach()
        self._book_next_tick()

    # --- driving the core ----------------------------------------------------------------------

    def _deliver(self, node: str, msg: Message | MessageError) -> None:
        """A message for this partition from ``node`` (authenticated and decoded by the link:
        :func:`~.transport.decode_frame`, which gives the error for one that is not a message)."""
        if self._closed:
            return
        peer = self._senders_by_node.get(node, _UNKNOWN)
        if peer is _UNKNOWN:
            peer = self._senders_by_node[node] = self._member_of(node)
        if peer is None:
            return  # an incarnation of the node that is no member id of this cluster
        if isinstance(msg, MessageError):
            log.warning("partition %d: unreadable message from %s: %s", self.partition, peer, msg)
            return
        if isinstance(msg, SnapshotChunk):
            self._on_chunk(peer, msg)
            return
        if isinstance(msg, SnapshotChunkAck):
            self._on_chunk_ack(peer, msg)
            return
        self._count_synced()
        self.core.step(peer, msg, self._clock())
        self._process()

    def _peer_up(self, node: str) -> None:
        """A link to a peer came up: a leader sends it what it lacks at once."""
        self.refresh_routes()
        member = self._member_of(node)
        if member is not None and self.core.is_leader and not self._closed:
            self.core.peer_reachable(member)
            self._process()

    def _peer_down(self, node: str) -> None:
        self.refresh_routes()
        if not self._closed:
            for member in self.core.membership.members:
                if node_of_member(member) == node:
                    self.core.peer_unreachable(member)

    def set_peer_order(self, peers: list[str]) -> None:
        """The other members in placement order (the leader's fast path prefers them in this order)."""
        self.core.peer_order = list(peers)

    def refresh_routes(self) -> None:
        """Links or the registry changed: which member each node speaks for is looked up again."""
        self._routes.clear()
        self._senders_by_node.clear()

    def _route(self, member: str) -> str | None:
        """The node to send ``member``'s messages to: only while that node's link speaks for it."""
        node = self._routes.get(member)
        if node is None:
            node = node_of_member(member)
            if self._member_of(node) != member:
                return None
            self._routes[member] = node
        return node

    def _send_to(self, member: str, msg: Any) -> bool:
        node = self._route(member)
        return node is not None and self._transport.send(node, msg)

    def on_timer(self) -> None:
        """The scheduler's tick: the core's timers, snapshots and streams."""
        if self._closed:
            return
        now = self._clock()
        core = self.core
        if core.election_due(now) and not self.scheduler.campaigns.admit(now):
            core.schedule_election(now + self._rng.uniform(CAMPAIGN_RETRY_MIN_S, CAMPAIGN_RETRY_MAX_S))
        if self._leader_unsynced:
            # A leader's entry is synced right after the frame carrying it is written; when no
            # frame could be written (no link), the tick syncs it, or the leader never counts it.
            self.storage.after_send()
        self._count_synced()
        core.tick(now)
        self._background(now)
        self._process()
        if self._read_rounds:
            self._check_reads()

    def _process(self) -> None:
        """Handle every Ready the core has (re-entrant calls fold into the running one)."""
        if self._processing:
            self._again = True
            return
        self._processing = True
        self._tick_tail = tail = []
        core = self.core
        self._transport.hold()
        try:
            while True:
                self._again = False
                while core.has_ready():
                    rd = core.ready()
                    self._handle(rd)
                    core.advance(rd)
                if not self._again:
                    break
        except SyncFailed as exc:
            self.storage.sync_failed(exc)
        finally:
            self._processing = False
            self._tick_tail = None
            self._transport.release()
        self._run_tail(tail)
        self._after_process()

    def _handle(self, rd: Ready) -> None:
        core = self.core
        journal = self.journal
        # The stored hint never passes the durable index: a restarted replica trusts it as
        # committed, and committed disk-class entries past it may be lost to a power cut.
        journal.set_commit_hint(min(rd.commit, rd.durable))
        if rd.rollback:
            self._roll_back()
        if rd.hard_state is not None:
            journal.store_term_vote(rd.hard_state.term, rd.hard_state.vote)
        if rd.snapshot is not None:
            self._deferred = []  # all below the snapshot: the state comes from it
            self._drop_next_snapshot()
            journal.clear()
            self._start_load(self.snapshot_path)
        elif rd.truncate_from is not None:
            log.warning("partition %d: log conflicts with the leader's from index %d (log ends at %d); "
                        "deleting from there", self.partition, rd.truncate_from, journal.last_index)
            journal.delete_from(rd.truncate_from)
        messages = rd.messages
        if rd.entries:
            leader = core.is_leader
            journal.lazy_appends = rd.lazy
            journal.leader_appends = leader
            appended = False
            try:
                for payload, index, term in rd.entries:
                    journal.append(index, term, payload, check_space=False)
            except NoSpace as exc:
                self._note_no_space(f"cannot append entries: {exc}")
                core.storage_failed(journal.last_index, self._clock())
                messages = [(p, m) for p, m in messages if not isinstance(m, AppendResponse)]
            else:
                appended = True
                self.storage.no_space.pop(self.partition, None)
            finally:
                journal.lazy_appends = False
                journal.leader_appends = False
            if leader:
                if not core.progress:  # a lone replica counts only itself: sync now
                    self._sync_lone(rd, appended)
                elif rd.lazy and not self._leader_unsynced:
                    core.persisted(journal.last_index, synced=False)
                else:
                    self._leader_unsynced = True
        send = self._send_to
        for peer, msg in messages:
            if not send(peer, msg) and isinstance(msg, AppendEntries):
                core.peer_unreachable(peer)
        if rd.committed:
            if self._loading:
                self._backlog.extend(rd.committed)
            elif core.is_leader:
                if self._deferred:
                    self._apply_deferred()  # entries it committed as a follower come first
                self._apply(rd.committed)
            else:
                # A follower's answer leaves at the end of this frame, before its applies: nothing
                # waits for a follower's apply (replies and reads come from the leader), while the
                # leader waits for its answer. The applies run once the outermost hold (the
                # received frame's, or _process's own) has written, in the same callback; the
                # call_soon only guards a caller outside any hold, which _process never is.
                if not self._deferred and not self._transport.after_write(self._apply_deferred):
                    self.loop.call_soon(self._apply_deferred)
                self._deferred.extend(rd.committed)
        for peer, index, term in rd.snapshot_requests:
            self._start_sender(peer, index, term)

    def _roll_back(self) -> None:
        """Entries this replica applied ahead of the durable index (committed disk-class entries,
        as a leader) were cut by its new leader: the state machine goes back to the snapshot, the only
        state it held that no cut can reach (snapshots never pass the durable index), and the
        core hands out the entries after it again."""
        log.warning("partition %d: entries applied ahead of the durable index %d were cut by the leader; "
                    "reloading the state machine from snapshot %d", self.partition, self.core.durable,
                    self._last_snapshot_index)
        self._deferred = []
        self._backlog = []
        self._drop_next_snapshot()
        self.rollbacks += 1
        if self._loading:
            return  # the load under way is of the snapshot file: the entries handed out follow it
        if self._snapshot_file is not None:
            self._start_load(self.snapshot_path)
        else:
            self.application.reset()
            self._state_index = 0

    def _sync_lone(self, rd: Ready, appended: bool) -> None:
        """A lone leader syncs what it appended, which commits it: its entries are applied in
        this pass rather than the next Ready's. Entries whose proposers take jobs are applied
        just before the sync instead (:meth:`_apply_ahead`)."""
        core = self.core
        ahead = self._apply_ahead(rd) if appended and not rd.lazy else 0
        self.storage.sync_all_now()
        journal = self.journal
        core.persisted(journal.last_index, synced=False)  # disk-class entries count once appended
        core.synced_to(journal.synced_index)
        more = core.take_committed(1024 + ahead)
        if ahead:
            first, last = rd.entries[0][1], rd.entries[-1][1]
            if len(more) < ahead or more[0][1] != first or more[ahead - 1][1] != last:
                # a majority of one: the sync commits what was appended, or the node stopped
                raise SyncFailed(f"partition {self.partition}: entries {first}..{last} were applied "
                                 f"ahead of a sync that did not commit them")
            more = more[ahead:]
        if more:
            rd.committed = rd.committed + more if rd.committed else more

    def _apply_ahead(self, rd: Ready) -> int:
        """Apply a lone voter's appended entries before its sync when a proposer of one of them
        answers early (a take's jobs, for Shoal's queues); how many were applied (0: none, applied
        once committed).

        The sync that follows commits exactly these entries, and only the proposers' ``early``
        callbacks run before it: every other answer and event of the entries waits in the tail
        of this Ready's handling, and a failed sync stops the node first. What an early answer
        shows is written to the journal (a process kill keeps it); only a power cut can undo
        it, and the application's early answers must tolerate that (a take's session ends with
        the power cut, and its jobs go back to their queues). Only data entries following
        everything applied qualify.
        """
        core = self.core
        entries = rd.entries
        if (rd.committed or self._loading or self._deferred or core.commit != core.applied
                or core.applied != entries[0][1] - 1 or core.membership.voters != (self.member,)):
            return 0
        pending = self._pending
        early = False
        for payload, index, _ in entries:
            if payload[:1] != _DATA_BYTE:
                return 0
            proposal = pending.get(index)
            early = early or (proposal is not None and proposal.early is not None)
        if not early:
            return 0
        self._apply(entries, ahead=True)
        return len(entries)

    def _count_synced(self) -> None:
        """What the journal's syncs made durable counts, whichever sync it was: a follower's next
        answer says how far, and a leader counts it toward the commit (the node's periodic sync
        of disk-class entries may also sync a leader's fsync-class ones before its own)."""
        journal = self.journal
        core = self.core
        index = journal.synced_index
        if index == self._synced_seen and not self._leader_unsynced:
            return  # nothing synced since the last look (the common case: once per message)
        self._synced_seen = index
        core.synced_to(index)
        if core.is_leader and not self._closed:
            core.persisted(index)
            if index >= journal.last_index:
                self._leader_unsynced = False

    def _leader_synced(self, index: int) -> None:
        """The node's storage synced this (leader's) journal after sending: the core counts it."""
        self._leader_unsynced = False
        if self.core.is_leader and not self._closed:
            self.core.persisted(index)
            if self.core.has_ready():
                self._process()

    def _after_process(self) -> None:
        """Leadership changes, confirmed reads, streams to members no longer in the group, and the
        next timer booking."""
        core = self.core
        if self._read_rounds:
            self._check_reads()
        if self._senders and core.is_leader:
            for peer in [p for p in self._senders if p not in core.progress]:
                self._retire_sender(self._senders.pop(peer))  # removed from the group: its stream ends
                self._delivered.pop(peer, None)
        if not core.recovering and self.journal.meta.state.recovering:
            self._recovered()
        if core.elections != self._elections_logged:
            self._elections_logged = core.elections
            log.info("partition %d: follower -> candidate (term %d)", self.partition, core.term)
        leader = core.is_leader
        if leader != self._was_leader:
            self._was_leader = leader
            log.info("partition %d: %s (term %d)", self.partition, "leader" if leader else "no longer leader",
                     self.core.term)
            if not leader:
                self._leadership_lost()
        self._book_next_tick()

    def _leadership_lost(self) -> None:
        self._fail_reads()
        pending, self._pending = self._pending, {}
        for proposal in pending.values():
            self.after_tick(proposal.callback, None, FAIL_LOST)
        for sender in self._senders.values():
            self._retire_sender(sender)
        self._senders.clear()
        self._leader_unsynced = False
        if self.on_leadership_lost is not None and not self._closed:
            self.loop.call_soon(self.on_leadership_lost, self.partition)

    def after_tick(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` once the running Ready handling is over (its applies done); soon, outside one."""
        tail = self._tick_tail
        if tail is None:
            self.loop.call_soon(fn, *args)
        else:
            tail.append((fn, args))

    def _run_tail(self, tail: list[tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
        for fn, args in tail:
            try:
                fn(*args)
            except Exception:  # one caller's bug must not cost the others their answers
                log.exception("partition %d: callback after applying failed", self.partition)

    def _book_next_tick(self) -> None:
        if self._closed:
            return
        now = self._clock()
        due = self.core.next_deadline()
        if self._senders or self.snapshots.in_progress or self._loading:
            due = min(due, now + BACKGROUND_POLL_S)
        if self.core.applied - self._last_snapshot_index >= self.settings.entries_min:
            due = min(due, now + BACKGROUND_POLL_S)
        self.scheduler.call_later(max(0.0, due - now), self)

    # --- applying --------------------------------------------------------------------------------

    def _apply_deferred(self) -> None:
        entries, self._deferred = self._deferred, []
        if entries and not self._closed:
            if self._loading:
                self._backlog.extend(entries)
            else:
                self._apply(entries)

    def _apply(self, entries: list[Any], ahead: bool = False) -> None:
        """Apply committed entries (``ahead``: appended, about to be committed by a lone
        voter's sync, see :meth:`_apply_ahead`); proposers get their results in the tail."""
        self._state_index = entries[-1][1]
        pending = self._pending
        for payload, index, term in entries:
            if payload[:1] != _DATA_BYTE:
                proposal = pending.pop(index, None)
                if proposal is not None:  # a config change or no-op took the index of a lost proposal
                    self.after_tick(proposal.callback, None, FAIL_LOST)
                continue
            proposal = pending.pop(index, None)
            # A deposed leader may apply its own entry, committed by its successor, before it
            # hears it lost: its proposer still waits for the replies.
            try:
                results = self._apply_batch(payload, proposal is not None and proposal.term == term, term)
            except Exception as exc:
                # Skipping it would leave this state apart from the group's for good.
                failed = ApplyFailed(f"partition {self.partition}: entry {index} (term {term}) could not be "
                                     f"applied: {type(exc).__name__}: {exc}")
                log.critical("%s", failed)
                self.storage.apply_failed(failed)
                raise failed from exc
            if proposal is not None:
                if proposal.term == term:
                    if ahead and proposal.early is not None:
                        try:
                            proposal.early(results)
                        except Exception:  # a caller's bug must not stop the sync that follows
                            log.exception("partition %d: early answers failed", self.partition)
                    self.after_tick(proposal.callback, results, 0)
                else:
                    self.after_tick(proposal.callback, None, FAIL_LOST)

    def _apply_batch(self, payload: bytes, answered: bool = False, term: int = 0) -> BatchResult:
        """Apply a committed data entry (of ``term``) through the application. Replies are built
        on the leader and wherever a proposer waits for them (``answered``)."""
        leader = self.core.is_leader
        results = self.application.apply(payload, term, leading=leader, replies=leader or answered)
        self.applied_batches += 1
        hook = self.on_applied
        if hook is not None:
            hook()
        return results

    # --- proposing -------------------------------------------------------------------------------

    def propose(self, now_ms: int, commands: list[Any],
                callback: Callable[[BatchResult | None, int], None],
                early: Callable[[BatchResult], None] | None = None, *, lazy: bool = False) -> None:
        """Replicate ``commands`` as one log entry (its payload written by
        :meth:`~.application.Application.encode`, stamped ``now_ms``); ``callback(results,
        fail_reason)`` runs on the loop.

        ``early(results)``: a lone voter applies the entry before its sync and calls this
        first, then the sync, then ``callback`` (for the answers that may leave before the
        entry is durable: jobs taken, see :meth:`_apply_ahead`). Otherwise it is not called.

        ``lazy``: the entry is disk class (acknowledged once a majority appended it, synced
        later); the caller decides, and may say so only while :meth:`state_current` holds (the
        replica writes the entry in the fsync class otherwise).
        """
        core = self.core
        if self._loading:
            self.loop.call_soon(callback, None, FAIL_NO_LEADER)
            return
        try:
            payload = self.application.encode(now_ms, commands)
        except Exception as exc:  # a value the log cannot hold (the command checks keep them out)
            commands, callback = self._without_unwritable(now_ms, commands, callback, exc)
            if not commands:
                return
            payload = self.application.encode(now_ms, commands)
        if len(payload) > ENTRY_BYTES_MAX:
            self._propose_split(now_ms, commands, callback, len(payload), lazy)
            return
        try:
            index = core.propose(payload, self._clock(), lazy=lazy and self.state_current())
        except NotLeader:
            self.loop.call_soon(callback, None, FAIL_NO_LEADER)
            return
        except ProposalRefused:
            self.loop.call_soon(callback, None, FAIL_REFUSED)
            return
        self._pending[index] = _Proposal(core.term, callback, early)
        self._process()

    def _without_unwritable(self, now_ms: int, commands: list[Any],
                            callback: Callable[[BatchResult | None, int], None], exc: Exception,
                            ) -> tuple[list[Any], Callable[[BatchResult | None, int], None]]:
        """The batch without the commands the application cannot encode, each answered ``INVALID``
        in its place (found one by one: rare, and the others of the batch go on)."""
        bad = set()
        for k, cmd in enumerate(commands):
            try:
                self.application.encode(now_ms, [cmd])
            except Exception:
                bad.add(k)
        if not bad:
            bad = set(range(len(commands)))
        log.warning("partition %d: %d commands could not be written to the log: %s", self.partition, len(bad), exc)
        err = CommandError(ErrorCode.INVALID, f"the command holds a value the log cannot store: {exc}")
        return refuse_some(commands, bad, callback, self.loop, err)

    def _propose_split(self, now_ms: int, commands: list[Any],
                       callback: Callable[[BatchResult | None, int], None], nbytes: int, lazy: bool) -> None:
        """A batch too large for one entry goes as two (each command stays whole and atomic)."""
        if len(commands) == 1:
            err = CommandError(ErrorCode.FRAME_TOO_LARGE, f"a command of {nbytes} bytes exceeds the largest "
                                                          f"replicated entry ({ENTRY_BYTES_MAX} bytes)")
            self.loop.call_soon(callback, [err], 0)
            return
        half = len(commands) // 2
        parts: list[tuple[BatchResult | None, int] | None] = [None, None]

        def part_done(k: int, results: BatchResult | None, reason: int) -> None:
            parts[k] = (results, reason)
            if parts[0] is not None and parts[1] is not None:
                (r0, e0), (r1, e1) = parts
                if r0 is None or r1 is None:
                    n0, n1 = half, len(commands) - half
                    r0 = r0 if r0 is not None else [fail_reason_error(e0)] * n0
                    r1 = r1 if r1 is not None else [fail_reason_error(e1)] * n1
                callback(r0 + r1, 0)

        self.propose(now_ms, commands[:half], lambda r, e: part_done(0, r, e), lazy=lazy)
        self.propose(now_ms, commands[half:], lambda r, e: part_done(1, r, e), lazy=lazy)

    def state_current(self) -> bool:
        """Does the applied state hold every committed entry (and serve reads)? Only then may
        a decision be read from it about a new entry, such as its durability class: a new
        leader before its first commit, or with committed entries not yet applied, could
        judge by a state a committed entry has changed."""
        core = self.core
        return core.read_ready and core.applied >= core.commit and not self._loading

    def propose_change(self, change: ConfigChange) -> int:
        """Propose a single-server membership change (:mod:`.membership`); its log index."""
        index = self.core.propose_change(change, self._clock())
        self._process()
        return index

    # --- snapshots -------------------------------------------------------------------------------

    def snapshot_now(self) -> None:
        """Take a snapshot on the next tick, whatever the thresholds (skipped if nothing is new)."""
        self._snapshot_due = 0.0
        self.scheduler.call_later(0.0, self)

    def _background(self, now: float) -> None:
        """Snapshot children, snapshot streams and their timeouts."""
        snap = self.snapshots.poll()
        if snap is not None:
            self._snapshot_written(snap)
        elif self._awaiting_next and not self.snapshots.in_progress:
            self._release_awaiting()  # the child that replaced the file failed: ask again
        waiting = self._next_snapshot
        if waiting is not None and waiting.index <= self.core.durable:
            self._install_snapshot(waiting)
        if now >= self._hint_due:
            # Only a hint (a restarted replica applies what it knew committed without waiting for a
            # leader): stored every few seconds, each store being two fsyncs.
            self._hint_due = now + COMMIT_HINT_PERIOD_S
            self.journal.store_commit_hint()
        core = self.core
        current = self._snapshot_file
        due = core.applied - self._last_snapshot_index >= self.settings.entries_min or (
            now >= self._snapshot_due and core.applied > self._last_snapshot_index) or (
            self._portable_wanted and current is not None and current.files is not None)
        if due and not self.snapshots.in_progress and not self._loading and not self._receiving() \
                and not self._deferred and self._next_snapshot is None:
            index = core.applied
            term = core.log.term(index)
            if term is not None and index > 0:
                if self.snapshots.start(self.application.snapshot_chunks, index, term, core.membership_at(index),
                                        prepare=lambda: self._link_files(index)):
                    self._snapshot_due = now + self.settings.interval_s
        elif now >= self._snapshot_due:
            self._snapshot_due = now + self.settings.interval_s
        for peer, sender in list(self._senders.items()):
            if sender.timed_out(now):
                log.warning("partition %d: snapshot stream to %s made no progress for a while; retrying",
                            self.partition, peer)
                self._end_sender(peer, ok=False)
            else:
                self._pump(sender, now)

    def _release_awaiting(self) -> None:
        """Peers that waited for a newer snapshot are probed again: their next answer asks for it."""
        if self._awaiting_next:
            waiting, self._awaiting_next = self._awaiting_next, set()
            for peer in waiting:
                self.core.snapshot_done(peer, False, self._clock())

    def _receiving(self) -> bool:
        return self._receiver.active

    def _snapshot_written(self, snap: SnapshotFile) -> None:
        """A child's snapshot is durable and verified beside the current one. It replaces it once
        the durable index reaches it: a leader applies committed disk-class entries before they are
        durable, and a snapshot holding one a power cut then loses could not be taken back."""
        if snap.index > self.core.durable:
            self._next_snapshot = snap
            return
        self._install_snapshot(snap)

    def _drop_next_snapshot(self) -> None:
        waiting, self._next_snapshot = self._next_snapshot, None
        if waiting is not None:
            self._io.unlink(waiting.path)

    def _install_snapshot(self, snap: SnapshotFile) -> None:
        """Make a written snapshot the replica's snapshot: the journal may drop the prefix it covers."""
        self._next_snapshot = None
        current = self._snapshot_file
        # One that carries everything may replace one of the same entry that refers to files.
        portable_again = (current is not None and current.files is not None and snap.files is None
                          and snap.index == self._last_snapshot_index)
        if (snap.index <= self._last_snapshot_index and not portable_again) or snap.index < self.core.log.snap_index:
            self._io.unlink(snap.path)  # overtaken (a newer one was installed from the leader)
            self._remove_stale_files()
            return
        self._io.rename(snap.path, self.snapshot_path)
        self._io.fsync_dir(os.path.dirname(self.snapshot_path) or ".")
        snap = dataclasses.replace(snap, path=self.snapshot_path)
        self._snapshot_file = snap
        self._last_snapshot_index = snap.index
        if snap.files is None:
            self._portable_wanted = False
        self._remove_stale_files()
        core = self.core
        core.compacted(snap.index, snap.term)
        self._release_awaiting()
        retain = min(SNAPSHOT_RETAIN_ENTRIES_MAX, self.settings.entries_min // 2)
        drop_below = max(snap.index + 1 - retain, self.journal.first_within(snap.index, SNAPSHOT_RETAIN_BYTES_MAX))
        # A follower being sent an older snapshot continues from the journal once it has it: keep
        # the entries after that snapshot, or it would be sent this one next, and so on while the
        # move rate makes a stream outlast the time between snapshots (a learner that never joins).
        for sender in self._senders.values():
            if snap.index - sender.index <= STREAM_HOLD_ENTRIES_MAX:
                drop_below = min(drop_below, sender.index)  # its term too: the next append's prev
        # The same for a follower that has its snapshot and now catches up by log: from where it is.
        now = self._clock()
        for peer, (index, until) in list(self._delivered.items()):
            pr = core.progress.get(peer)
            if pr is None or now > until or pr.match >= snap.index:
                del self._delivered[peer]  # no longer followed, given up on, or past this snapshot
                continue
            need = max(index, pr.match)
            if snap.index - need <= STREAM_HOLD_ENTRIES_MAX:
                drop_below = min(drop_below, need)
        if drop_below > self.journal.first_index:
            self.journal.delete_to(drop_below)

    def _start_load(self, path: str) -> None:
        """Load the application's state from ``path`` in the loader thread; committed entries wait for it."""
        self._loading = True
        if hasattr(self, "core"):
            self.core.loading = True  # neither campaigns nor obeys TimeoutNow until the load ends
        started = self._clock()
        loop = self.loop
        application = self.application

        def done(state: object, error: BaseException | None) -> None:
            self._loading = self.core.loading = False
            if self._closed:
                return
            if error is not None or state is None:
                # The file verified before it was loaded: a failure here is the machine's (memory, I/O),
                # or, for a snapshot that refers to files, those files' (checked only as they are read).
                snap = self._snapshot_file
                if snap is not None and snap.files is not None and self._repair and snap.path == path:
                    self._quarantine_snapshot()
                    log.critical("partition %d: loading snapshot %s failed: %s; it was moved aside, and the "
                                 "next start fetches a fresh copy from the leader; stopping the node",
                                 self.partition, path, error)
                else:
                    log.critical("partition %d: loading snapshot %s failed: %s; stopping the node", self.partition,
                                 path, error)
                self.storage.sync_failed(SyncFailed(f"snapshot load failed: {error}"))
                return
            application.install(state)
            log.info("partition %d: loaded snapshot at entry %d (%s) in %.2f s", self.partition,
                     self._last_snapshot_index, application.describe(), self._clock() - started)
            backlog, self._backlog = self._backlog, []
            backlog = [e for e in backlog if e[1] > self._last_snapshot_index]
            if backlog:
                self._apply(backlog)
            if self.on_applied is not None:
                self.on_applied()
            self._book_next_tick()

        def load() -> None:
            try:
                state = load_snapshot(self._io, path, application.load_snapshot)[0]
            except BaseException as exc:  # handed to the loop, which decides
                loop.call_soon_threadsafe(done, None, exc)
                return
            loop.call_soon_threadsafe(done, state, None)

        self._executor.submit(load)

    # --- streaming snapshots (leader) --------------------------------------------------------------

    def _start_sender(self, peer: str, index: int, term: int) -> None:
        snap = self._snapshot_file
        if snap is None or snap.index != index:
            log.error("partition %d: the core wants snapshot %d sent to %s, but the verified file is %s",
                      self.partition, index, peer, snap.index if snap else None)
            self.core.snapshot_done(peer, False, self._clock())
            return
        old = self._senders.pop(peer, None)
        if old is not None:
            old.close()
        now = self._clock()
        # A replica being added (a learner) is a move: it also waits on the node's share of the
        # cluster's move rate. A voter that fell behind is the group's redundancy coming back: only
        # the stream's own limit holds it, which keeps the leader's loop serving.
        rates = [ByteRate(RATE_BYTES_PER_S)]
        if peer not in self.core.membership.voters:
            rates += self._shared_rates
        try:
            files = None
            directory = files_path(snap.path, snap.files)
            if directory is not None:  # the files it refers to follow it in the stream
                files = [(name, os.path.join(directory, name)) for name in sorted(self._io.listdir(directory))]
            sender = SnapshotSender(peer, snap, self.core.term, self._io, self._send_chunk, rates, now, files)
        except OSError as exc:
            log.info("partition %d: snapshot %d cannot be opened (%s); %s is sent the next one", self.partition,
                     index, exc, peer)
            self._awaiting_next.add(peer)
            return
        if not sender.opened_whole():
            # A newer snapshot was renamed over the file before this replica heard of it (the
            # child is not reaped yet): what the path holds now is not the verified file.
            sender.close()
            # The peer waits, still marked as wanting a snapshot, until the newer one is known
            # (``_snapshot_written``): asking again at once would find the same file, on every
            # answer the peer sends meanwhile.
            if peer not in self._awaiting_next:
                self._awaiting_next.add(peer)
                log.info("partition %d: snapshot %d was replaced on disk; %s is sent the next one",
                         self.partition, index, peer)
            return
        self._senders[peer] = sender
        log.info("partition %d: sending snapshot %d (%d bytes, %d files beside it) to %s", self.partition, index,
                 sender.total, len(sender.layout or ()), peer)
        self._pump(sender, now)

    def _send_chunk(self, peer: str, msg: Message) -> bool:
        return self._send_to(peer, msg)

    def _pump(self, sender: SnapshotSender, now: float) -> None:
        try:
            sender.pump(now)
        except (OSError, SnapshotCorrupt) as exc:
            log.error("partition %d: reading the snapshot for %s failed: %s", self.partition, sender.peer, exc)
            self._end_sender(sender.peer, ok=False)

    def _on_chunk_ack(self, peer: str, ack: SnapshotChunkAck) -> None:
        sender = self._senders.get(peer)
        if sender is None:
            return
        status = sender.on_ack(ack, self._clock())
        if status == COMPLETE:
            self._end_sender(peer, ok=True)
        elif status == NO_FILES:
            # An older release: it waits for a snapshot that carries everything, taken as soon as a
            # snapshot child may run (and sent when the core asks again, _release_awaiting).
            self._retire_sender(self._senders.pop(peer))
            if not self._portable_wanted:
                log.info("partition %d: %s takes no snapshot files; it is sent a snapshot that carries them, "
                         "taken now", self.partition, peer)
            self._portable_wanted = True
            self._awaiting_next.add(peer)
            self.snapshot_now()
        elif status in (NOT_WANTED, START_OVER):
            # START_OVER: what arrived failed its checksum (or the follower lost its copy). Sending
            # the same open file again could fail the same way: the core asks anew, the file is
            # opened anew.
            self._end_sender(peer, ok=False)
        else:
            self._transport.hold()
            try:
                self._pump(sender, self._clock())
            finally:
                self._transport.release()

    def _end_sender(self, peer: str, ok: bool) -> None:
        sender = self._senders.pop(peer, None)
        if sender is not None:
            self._retire_sender(sender)
            if ok:
                log.info("partition %d: snapshot %d delivered to %s (%d bytes sent)", self.partition,
                         sender.index, peer, sender.bytes_sent)
                self._delivered[peer] = (sender.index, self._clock() + CATCH_UP_HOLD_S)
        self.core.snapshot_done(peer, ok, self._clock())  # on success too: the follower's answer may be lost
        self._process()

    def _retire_sender(self, sender: SnapshotSender) -> None:
        """A stream that ended: its file closed, its bytes counted."""
        sender.close()
        self._snapshot_bytes_sent += sender.bytes_sent

    def stream_progress(self) -> list[dict[str, Any]]:
        """The snapshot streams this leader runs: peer, index, bytes acknowledged and total."""
        return [{"peer": peer, **sender.progress()} for peer, sender in sorted(self._senders.items())]

    # --- receiving snapshots (follower) ------------------------------------------------------------

    def _on_chunk(self, peer: str, chunk: SnapshotChunk) -> None:
        core = self.core
        if chunk.term > core.term or (chunk.term == core.term and core.leader != peer):
            # A newer leader: the core learns of it from its next AppendEntries or heartbeat; the
            # chunk is taken now (the term check below keeps older leaders out).
            pass
        try:
            ack, received = self._receiver.on_chunk(chunk, core.term)
        except OSError as exc:
            log.error("partition %d: storing a snapshot chunk failed: %s", self.partition, exc)
            self._receiver.abort()
            ack, received = SnapshotChunkAck(core.term, chunk.index, 0, START_OVER), None
        if received is None:
            self._send_to(peer, ack)
            return
        self.snapshots.cancel()  # a local snapshot must not be renamed over the one arriving
        self._drop_next_snapshot()
        loop = self.loop

        def finish() -> None:
            try:
                self._receiver.finish(received)
            except BaseException as exc:  # handed to the loop, which asks the leader again
                loop.call_soon_threadsafe(self._received, peer, chunk.term, received, exc)
                return
            loop.call_soon_threadsafe(self._received, peer, chunk.term, received, None)

        self._executor.submit(finish)

    def _received(self, peer: str, term: int, received: Received, error: BaseException | None) -> None:
        core = self.core
        if self._closed:
            return
        try:
            if error is not None:
                raise error
            if term < core.term or not core.wants_snapshot(received.index, received.term):
                self._receiver.abort()
                self._send_to(peer, SnapshotChunkAck(core.term, received.index, 0, NOT_WANTED))
                if term == core.term:
                    # The log holds the snapshot already (an install whose answer was lost): the
                    # core tells the leader how far it matches, or the leader sends it again.
                    core.step(peer, InstallSnapshot(term, peer, received.index, received.term, [[], []]),
                              self._clock())
                self._process()
                return
            index, snap_term, membership, files = read_snapshot_head(self._io, received.tmp_path)
            if (files is None) != (received.files_dir is None) or (
                    files is not None and files != os.path.basename(self._files_dir(index))):
                raise SnapshotCorrupt(f"{received.tmp_path}: refers to files {files!r}, "
                                      f"{'none' if received.files_dir is None else 'others'} came with it")
            # A local snapshot may have started while the file was being synced: it must not be
            # renamed over the one installed now (nor loaded in its place), nor one written meanwhile.
            self.snapshots.cancel()
            self._drop_next_snapshot()
            self._receiver.install(received, files)
        except (OSError, SnapshotCorrupt) as exc:
            log.error("partition %d: the received snapshot %d does not check out: %s; asking again",
                      self.partition, received.index, exc)
            self._receiver.abort()
            self._send_to(peer, SnapshotChunkAck(core.term, received.index, 0, START_OVER))
            return
        self.installs += 1
        # Its bytes are the leader's verified file (the whole-file CRC matched): it may be sent on.
        self._snapshot_file = SnapshotFile(self.snapshot_path, index, snap_term, membership, received.size,
                                           received.file_crc, files)
        self._last_snapshot_index = index
        self._portable_wanted = False
        self._remove_stale_files()
        self._send_to(peer, SnapshotChunkAck(core.term, received.index, received.size, COMPLETE))
        core.step(peer, InstallSnapshot(term, peer, index, snap_term, membership.to_wire()), self._clock())
        self._process()

    # --- reads and state ---------------------------------------------------------------------------

    def lease_held(self) -> bool:
        """This leader may answer a read from its applied state right now (its read lease holds,
        :meth:`~.core.RaftCore.lease_valid`, and the state holds every commit)."""
        return self.core.lease_valid(self._clock()) and self.read_ready()

    def confirm_reads(self, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once a majority has answered a heartbeat round this leader sent after
        this call (ReadIndex: a read that arrived before it may then be answered from the applied
        state), ``callback(False)`` if that cannot be (leadership lost, no majority in time).

        Reads that arrive in one loop iteration share one round. Raises ``CommandError``
        ``OVERLOADED`` when :data:`READ_WAITERS_MAX` reads wait already."""
        if self._closed or not self.core.is_leader:
            self.loop.call_soon(callback, False)
            return
        if len(self._read_waiters) + sum(len(w) for _, _, w in self._read_rounds) >= READ_WAITERS_MAX:
            raise CommandError(ErrorCode.OVERLOADED, f"{READ_WAITERS_MAX} reads of partition {self.partition} wait "
                                                     "for the leader to confirm its leadership; retry")
        self._read_waiters.append(callback)
        if not self._read_round_booked:
            self._read_round_booked = True
            self.loop.call_soon(self._start_read_round)

    def _start_read_round(self) -> None:
        self._read_round_booked = False
        waiters, self._read_waiters = self._read_waiters, []
        if not waiters:
            return
        core = self.core
        if self._closed or not core.is_leader:
            _call_reads(waiters, False)
            return
        self._read_rounds.append((core.read_index(self._clock()), self._clock(), waiters))
        self._process()

    def _check_reads(self) -> None:
        """Answer the reads whose round a majority confirmed; give up those waiting too long."""
        core = self.core
        rounds = self._read_rounds
        while rounds and core.confirmed(rounds[0][0]):
            _call_reads(rounds.popleft()[2], True)
        now = self._clock()
        while rounds and now - rounds[0][1] > READ_CONFIRM_TIMEOUT_S:
            _call_reads(rounds.popleft()[2], False)

    def _fail_reads(self) -> None:
        waiters, self._read_waiters = self._read_waiters, []
        rounds, self._read_rounds = self._read_rounds, deque()
        for _, _, callbacks in rounds:
            waiters.extend(callbacks)
        _call_reads(waiters, False)

    def read_ready(self) -> bool:
        """True once this leader has applied an entry of its own term (Raft §8) and its state is loaded."""
        core = self.core
        return core.read_ready and core.applied >= core.commit and not self._loading

    def is_leader(self) -> bool:
        return self.core.state == LEADER

    def commits_alone(self) -> bool:
        """True while this replica leads with no peer: its own sync commits what it proposes,
        within the proposal's call."""
        return self.core.state == LEADER and not self.core.progress

    def leader_id(self) -> str | None:
        """The node id of the last known leader (this node's own id when it leads), or None."""
        leader = self.core.leader
        return node_of_member(leader) if leader is not None else None

    def replica_nodes(self) -> tuple[str, ...]:
        """The node ids of the group's voters, as this replica last applied its membership."""
        return tuple(node_of_member(m) for m in self.core.membership.voters)

    def term(self) -> int:
        return self.core.term

    def commit_index(self) -> int:
        return self.core.commit

    @property
    def membership(self) -> Membership:
        """The group's configuration in effect: the newest one in this replica's log."""
        return self.core.membership

    @property
    def config_index(self) -> int:
        """The log index of the entry :attr:`membership` comes from (the snapshot's, or 0)."""
        return self.core.config_index

    def match_index(self, member: str) -> int | None:
        """How far ``member``'s log is known to match this leader's; None if it is not a peer of
        this leader (or this replica does not lead)."""
        pr = self.core.progress.get(member) if self.core.is_leader else None
        return pr.match if pr is not None else None

    def follower_lags(self, now: float) -> list[tuple[str, int, float]]:
        """``(member, entries behind, seconds since heard)`` of each voter this leader replicates
        to, by member id; empty unless this replica leads. Learners are moves, not lag."""
        core = self.core
        if not core.is_leader:
            return []
        last = core.log.last_index
        return [(member, max(0, last - pr.match), max(0.0, now - pr.last_heard))
                for member, pr in sorted(core.progress.items()) if not pr.learner]

    def plan_change(self, target: list[str], now: float) -> ConfigChange | str | None:
        """The next membership change this leader makes toward ``target`` (member ids, preferred
        leader first): see :func:`~.planning.plan_change`; ``now`` on the core's clock."""
        return plan_change(self.core, self.member, target, now)

    def applied_index(self) -> int:
        """The index of the last entry the application's state holds."""
        if self._loading:
            return self._last_snapshot_index
        return max(self._state_index, self._last_snapshot_index) if self._deferred else self.core.applied

    @property
    def elections(self) -> int:
        """Campaigns this replica started, for metrics and /stats."""
        return self.core.elections

    @property
    def transfer_elections(self) -> int:
        """Of :attr:`elections`, the campaigns a leader asked for (leadership transfers)."""
        return self.core.transfer_elections

    def has_quorum(self) -> bool:
        """True when this replica reaches a majority of its group over the links (itself included)."""
        voters = self.membership.voters
        reached = sum(1 for v in voters if v == self.member or self.peer_connected(v))
        return reached >= len(voters) // 2 + 1

    def peer_connected(self, member: str) -> bool:
        """True while a link speaks for ``member`` (a member id; a node id for original members)."""
        node = self._route(member)
        return node is not None and node in self._transport.connected

    def transfer_leadership(self, node_id: str | None = None, *, among: list[str] | None = None) -> bool:
        """Ask ``node_id`` (None: the most caught-up eligible follower, of ``among`` if given) to
        take over; best effort. True when a transfer to it is under way.

        Only a connected voter that holds every committed entry is eligible (proposals pause
        while a transfer runs, so it must be quick); the core also wants it heard from lately
        and not refused by a recent failed transfer, and never extends a transfer under way.
        """
        core = self.core
        if not core.is_leader:
            return False
        now = self._clock()
        heard_s = core.params.transfer_heard_s
        eligible = [(pr.match, p) for p, pr in core.progress.items()
                    if core.membership.is_voter(p) and self.peer_connected(p) and pr.match >= core.commit
                    and now - pr.answered_at <= heard_s and (among is None or p in among)]
        if node_id is None:
            if not eligible:
                return False
            node_id = max(eligible)[1]
        elif node_id not in {p for _, p in eligible}:
            return False
        try:
            core.transfer_leadership(node_id, now)
        except ProposalRefused:
            return False
        self._process()
        return core.lead_transferee == node_id

    def status(self) -> dict[str, Any]:
        """The core's summary plus what the replica adds (loading, damage, snapshot streams)."""
        out = self.core.status()
        out.update(loading=self._loading, damage=self.damage, installs=self.installs,
                   streams=self.stream_progress(),
                   snapshotBytesSent=self._snapshot_bytes_sent + sum(s.bytes_sent for s in self._senders.values()))
        return out

    def close(self) -> None:
        """Stop ticking and detach from the node's Raft links."""
        if self._closed:
            return
        self._closed = True
        self._fail_reads()
        self.scheduler.cancel(self)
        self.snapshots.cancel()
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
        self._receiver.abort()
        self._transport.close()
        self.storage.on_leader_synced(self.journal, None)
        self.journal.close()

    def distrust_snapshot_files(self) -> bool:
        """(A closed replica whose application found its files damaged.) A snapshot that refers
        to files shares them with the state: it is moved aside, so the replica opened next is
        repaired from a peer, as when a snapshot file is damaged. False (nothing done) when the
        snapshot carries everything, or no peer can repair it (then the files are all there is)."""
        assert self._closed, "close the replica first"
        snap = self._snapshot_file
        if snap is None or snap.files is None or not self._repair:
            return False
        log.error("partition %d: snapshot %d shares the damaged files; moved aside, the replica is repaired "
                  "from a peer", self.partition, snap.index)
        self._quarantine_snapshot()
        return True

    def delete_files(self) -> None:
        """Remove this (closed) replica's journal and snapshot: the group no longer lists this node."""
        assert self._closed, "close the replica first"
        journal_dir = self.journal.directory
        for name in sorted(self._io.listdir(journal_dir)) if os.path.isdir(journal_dir) else []:
            self._io.unlink(os.path.join(journal_dir, name))
        if os.path.isdir(journal_dir):
            os.rmdir(journal_dir)
        self._io.unlink(self.snapshot_path)
        self._snapshot_file = None
        self._remove_stale_files()
        self._io.fsync_dir(os.path.dirname(journal_dir) or ".")

    def _note_no_space(self, why: str) -> None:
        """Record (for /ready and the metrics) and log, at most every NO_SPACE_LOG_S, a refusal for lack of space."""
        self.storage.no_space[self.partition] = why
        now = self._clock()
        if now - self._no_space_logged >= NO_SPACE_LOG_S:
            self._no_space_logged = now
            log.warning("partition %d: %s", self.partition, why)


def refuse_some(commands: list[Any], refused: set[int], callback: Callable[[BatchResult | None, int], None],
                loop: asyncio.AbstractEventLoop, err: CommandError,
                ) -> tuple[list[Any], Callable[[BatchResult | None, int], None]]:
    """Drop the ``refused`` commands from a batch about to be proposed; the returned callback
    answers them with ``err`` in their places and passes the others' results through."""
    kept = [cmd for k, cmd in enumerate(commands) if k not in refused]
    n = len(commands)
    if not kept:
        loop.call_soon(callback, [err] * n, 0)
        return kept, callback

    def merged(results: BatchResult | None, reason: int) -> None:
        others = iter(results if results is not None and reason == 0 else [fail_reason_error(reason)] * len(kept))
        callback([err if k in refused else next(others) for k in range(n)], 0)

    return kept, merged


_UNKNOWN: Any = object()


def _call_reads(callbacks: list[Callable[[bool], None]], ok: bool) -> None:
    for callback in callbacks:
        try:
            callback(ok)
        except Exception:  # one read's bug must not cost the others their answers
            log.exception("answering a confirmed read failed")


def _same_id(node: str) -> str:
    return node


def fail_reason_error(reason: int) -> CommandError:
    """Translate a proposal's failure into a wire error.

    ``NO_LEADER`` means the entry was never appended, so any command may be sent again. When
    leadership changed after the entry was appended, the entry may still be committed by the
    next leader: that is ``TIMEOUT`` (outcome unknown), which a client only retries for commands
    that are safe to repeat (pushes carry idempotency keys).
    """
    if reason == FAIL_NO_SPACE:
        return CommandError(ErrorCode.NO_SPACE, "the partition's disk is full: the write was not taken; "
                                                "retry once space is freed")
    if reason == FAIL_NO_LEADER:
        return CommandError(ErrorCode.NO_LEADER, "no leader for the partition; retry")
    if reason == FAIL_REFUSED:
        return CommandError(ErrorCode.NO_LEADER, "the partition's leadership is moving; retry")
    return CommandError(ErrorCode.TIMEOUT, "leadership changed while the command was being replicated; "
                        "its outcome is unknown")
