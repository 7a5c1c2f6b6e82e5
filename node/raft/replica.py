"""One partition's Raft group member: a pysyncobj ``SyncObj`` around the engine.

Theory of operation: the leader's event loop hands whole batches of validated
commands to :meth:`PartitionReplica.propose`; pysyncobj replicates one log
entry per batch (group commit) and, once committed, every replica applies the
batch to its :class:`~shoal.node.state.PartitionEngine`.

pysyncobj runs *inside the node's event loop*, not in a tick thread of its
own. Its messages travel over the node's shared Raft links
(:class:`~.transport.PartitionTransport`); a received message is handled at
once and schedules one ``_onTick`` of that replica, except a follower's
AppendEntries (answered inside the call and applied a few entries at a time, see
:data:`FOLLOWER_APPLY_BATCH`) and a leader's ack of entries already committed; a
leader's proposal is appended and sent at once, without a tick. Timed work
(heartbeats, election deadlines, a busy partition's lazy sends) is booked on the
node's one :class:`~.scheduler.TickScheduler`: an idle group ticks only when its
next heartbeat or election deadline comes. A command therefore crosses no
thread boundary between the client socket, Raft and the reply, and a read never
sees a half-applied batch because an apply runs to its end without yielding.

Snapshots are written by a forked child (:mod:`.snapshots`): the file is the
engine's own compact snapshot (job data stays raw bytes) plus the two log
entries it ends with, and the loop only forks and polls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from shoal.cluster.errors import CommandError, ErrorCode

from ..state import EVENTS_MAX, Command, Event, PartitionEngine, command_name, command_queue
from ._io import NoSpace, RealIO
from ._pysyncobj import (CANDIDATE, FAIL_REASON, FOLLOWER, LEADER, HookedSyncObj, RaftInternals, SyncObjConf,
                         install_module_patches, monotonic_time, replicated)
from .journal import SyncFailed
from .log_matching import Accept, match_append_entries
from .scheduler import TickScheduler
from .snapshots import ForkSnapshotter, SnapshotSettings, align_journal
from .storage import NodeStorage
from .transport import PartitionTransport, RaftNetwork
from .view import PartitionView

__all__ = ["PartitionReplica", "BatchResult", "raft_conf", "fail_reason_error", "timing_scale",
           "HEARTBEAT_S", "ELECTION_TIMEOUT_MIN_S", "ELECTION_TIMEOUT_MAX_S"]

log = logging.getLogger(__name__)

install_module_patches()

#: A batch's outcome: one reply dict (ok) or CommandError per command, in order.
BatchResult = list[Any]
#: A follower applies committed entries on the periodic tick, or at once when this many wait.
#: Applying only on the 20 ms tick costs the least CPU but makes its ticks long enough to delay
#: its next answer (lone-PUSH p99 2.2-2.4 ms, against 1.4-1.8 ms with a batch of 8).
FOLLOWER_APPLY_BATCH = 8
#: A proposal refused because the journal had no room (our own reason, beside pysyncobj's FAIL_REASON).
FAIL_NO_SPACE = -507
#: Commands that bring new data into a partition: refused with NO_SPACE while free space is low.
#: Pulls, acks, fails and removals still pass (their entries are small and let consumers drain it).
SPACE_TAKING_COMMANDS = frozenset({"PUSH", "PUSHB", "PushRun", "CreateQueue", "AddLog", "Progress", "Cron",
                                   "RegisterWorker"})
#: A partition short of space logs why at most this often.
NO_SPACE_LOG_S = 10.0
#: Bytes a follower accepts for one entry sent in pieces (pysyncobj's "transmission").
TRANSMISSION_BYTES_MAX = 512 * 1024 * 1024
#: The leader remembers its disk-class entries (_lazy_indexes) up to this many before pruning.
LAZY_INDEXES_MAX = 4096
#: A busy group (a leader that proposed lately, a follower with entries to apply) ticks this often.
ACTIVE_TICK_S = 0.02
#: How long after its last proposal a leader counts as busy.
ACTIVE_WINDOW_S = 0.5
#: A leader's heartbeat period when it has nothing to send: many groups on few cores make
#: idle heartbeats the bulk of a node's idle CPU, so they are a fraction of the election timeout.
HEARTBEAT_S = 0.2
#: Heartbeats are booked on this grid so that many groups' heartbeats leave in one write per peer.
HEARTBEAT_GRID_S = 0.05
#: A follower that missed heartbeats for a random time in this range campaigns. Four to eight
#: heartbeats fit in it (no election because one was late under load), and a killed leader is
#: replaced within about 1-2 s.
ELECTION_TIMEOUT_MIN_S = 0.8
ELECTION_TIMEOUT_MAX_S = 1.6
#: A node hosting more groups than this stretches its heartbeat and election timeouts in
#: proportion (1,024 groups: heartbeat 0.8 s, elections after 3.2-6.4 s): its loop has more to
#: do per round, and slower failover beats heartbeats late enough to set off elections.
TIMING_GROUPS_BASE = 256


def timing_scale(groups: int) -> float:
    """How much a node hosting ``groups`` Raft groups stretches its Raft timers (at least 1)."""
    return max(1.0, groups / TIMING_GROUPS_BASE)

#: At start, the preferred replica (first in placement) campaigns after this, the others only
#: after a full election timeout more: leaders start where the balancer wants them.
PREFERRED_FIRST_ELECTION_S = 0.2
#: A campaign the node's budget (scheduler.CampaignBudget) deferred is retried after a random
#: delay in this range.
CAMPAIGN_RETRY_MIN_S = 0.1
CAMPAIGN_RETRY_MAX_S = 0.6
#: After a peer link comes up, a follower waits at least this long (over two heartbeats) before
#: campaigning, so a leader it had not heard of yet can reach it first.
LINK_UP_GRACE_S = 0.5
#: A follower whose election deadline passed while it reaches no peer looks again this often
#: (a peer link coming up ticks it at once anyway).
UNCONNECTED_RECHECK_S = 0.5
#: A follower that answered within this long gets a new entry at once (_fast_follower).
FAST_FOLLOWER_STALL_S = 0.01
#: The other followers get what they lack at most this often while entries keep coming.
LAZY_SEND_PERIOD_S = 0.005
#: How long a leader waits for its next entry to carry a new commit index before sending it alone.
COMMIT_ANNOUNCE_DELAY_S = 0.002
_LEADER = LEADER
_FOLLOWER = FOLLOWER
_STATE_NAMES = {FOLLOWER: "follower", CANDIDATE: "candidate", LEADER: "leader"}


class _NullPoller:
    """pysyncobj polls its own poller at the end of every tick; the node's loop does the polling."""

    def subscribe(self, *_args: Any) -> None:
        pass

    def unsubscribe(self, *_args: Any) -> None:
        pass

    def poll(self, _timeout: float) -> None:
        pass


_NULL_POLLER = _NullPoller()


def raft_conf(data_dir: str, partition: int, scale: float = 1.0,
              on_state_changed: Callable[[int, int], None] | None = None,
              serializer: Callable[..., Any] | None = None,
              deserializer: Callable[..., Any] | None = None,
              snapshots: SnapshotSettings | None = None) -> SyncObjConf:
    """pysyncobj settings tuned for many small groups on few cores.

    ``appendEntriesUseBatch=False`` sends each entry at once (our own group
    commit does the batching), which takes a lone command from ~100 ms to
    sub-millisecond. The transport is Shoal's (authenticated, shared per node
    pair), so pysyncobj's connection, bind and password settings do not apply.
    """
    return SyncObjConf(
        appendEntriesUseBatch=False,
        appendEntriesPeriod=HEARTBEAT_S * scale,
        raftMinTimeout=ELECTION_TIMEOUT_MIN_S * scale,
        raftMaxTimeout=ELECTION_TIMEOUT_MAX_S * scale,
        # A leader that has not heard from a majority for this long steps down (default 30 s), so
        # an isolated node stops serving reads and reports no leader instead of a stale one.
        leaderFallbackTimeout=2.0 * scale,
        # Unused by Shoal's transport, but pysyncobj insists it be at least the election timeout.
        connectionTimeout=max(3.5, ELECTION_TIMEOUT_MAX_S * scale),
        autoTick=False,  # ticked by the node's event loop (see TickScheduler)
        commandsQueueSize=200_000,
        appendEntriesBatchSizeBytes=8 * 1024 * 1024,  # a group-committed batch travels as one message
        logCompactionMinEntries=(snapshots or SnapshotSettings()).entries_min,
        logCompactionMinTime=(snapshots or SnapshotSettings()).interval_s,
        dynamicMembershipChange=False,
        onStateChanged=on_state_changed,
        # Unused: the replica hands pysyncobj Shoal's journal (storage.NodeStorage.open_journal).
        journalFile=os.path.join(data_dir, f"p{partition}.raft"),
        fullDumpFile=os.path.join(data_dir, f"p{partition}.dump"),
        serializer=serializer,
        deserializer=deserializer,
    )


class PartitionReplica(HookedSyncObj):
    """A partition's engine replicated by pysyncobj; the node's view of one Raft group.

    What the rest of the node uses: :meth:`propose`, :meth:`read`, :attr:`engine`,
    :meth:`is_leader`, :meth:`leader_id`, :meth:`term`, :meth:`commit_index`,
    :meth:`applied_index`, :meth:`has_quorum`, :meth:`transfer_leadership`,
    :meth:`peer_connected`, :attr:`elections` and :meth:`close`.
    """

    def __init__(self, partition: int, network: RaftNetwork, peers: list[str], *, data_dir: str,
                 loop: asyncio.AbstractEventLoop, scheduler: TickScheduler, preferred: bool = False,
                 groups: int = 1, storage: NodeStorage | None = None) -> None:
        self.partition = partition
        self.engine = PartitionEngine(partition)
        self.view = PartitionView(lambda: self.engine)  # what the edge reads; never the engine itself
        self.loop = loop
        self.scheduler = scheduler
        #: Set by the node: called on the loop after every applied batch.
        self.on_applied: Callable[[int], None] | None = None
        #: Set by the node: False while nobody listens to job events (the engine then skips them).
        self.record_events = True
        #: Job events of applied batches while leading, until the node takes them (bounded).
        self.events: deque[Event] = deque(maxlen=EVENTS_MAX)
        #: Set by the node: called on the loop when this replica stops leading its partition.
        self.on_leadership_lost: Callable[[int], None] | None = None
        self.applied_batches = 0
        #: Campaigns this replica started (transitions to candidate), for metrics and /stats.
        self.elections = 0
        self.timer_slot: int | None = None
        self._tick_scheduled = False
        #: While a tick runs: what :meth:`after_tick` defers to its end.
        self._tick_tail: list[tuple[Callable[..., None], tuple[Any, ...]]] | None = None
        self._announce_due = False
        self._closed = False
        self._event_messages = 0
        self._event_tick_free = 0
        self._direct_send = False
        self._direct_sends = 0
        self._last_sent: dict[Any, float] = {}
        self._last_proposal = 0.0
        transport = PartitionTransport(network, partition, peers, self._deliver, self._peer_link_up)
        self._transport = transport
        self._transport_send = transport.send
        transport.send = self._send  # type: ignore[method-assign]
        self._scale = timing_scale(groups)
        conf = raft_conf(data_dir, partition, self._scale, on_state_changed=self._state_changed,
                         serializer=_replaced_serializer_hook, deserializer=_replaced_serializer_hook,
                         snapshots=SnapshotSettings.from_env())
        self._raft: RaftInternals | None = None
        self.storage = storage if storage is not None else NodeStorage(RealIO(disk_free_min_bytes=0), data_dir)
        self.journal = self.storage.open_journal(partition)
        #: Indexes of this leader's entries holding only disk-class commands (see _send).
        self._lazy_indexes: set[int] = set()
        self._transmission: list[bytes] = []
        self._read_ready_term = -1
        self._no_space_logged = float("-inf")
        super().__init__(network.self_node, [network.node_of(p) for p in peers], conf=conf, transport=transport,
                         journal=self.journal)
        self._poller = _NULL_POLLER  # the node's loop polls; pysyncobj's own would add a syscall per tick
        self._raft = RaftInternals(self)
        #: Writes snapshots in a forked child and installs the leader's (see snapshots.py).
        self.snapshots = ForkSnapshotter(conf.fullDumpFile, partition, lambda: self.engine, self._adopt_engine,
                                         conf.logCompactionBatchSize, on_slot=self.snapshot_now)
        self.snapshots.check_at_start()
        self._raft.install_serializer(self.snapshots)
        #: Followers in placement order (see _fast_follower).
        self._follower_order = [network.node_of(p) for p in peers]
        self._preferred = preferred

    def start(self) -> None:
        """Start the election clock: the preferred replica campaigns first (see PREFERRED_FIRST_ELECTION_S).

        Called once every group of the node is built, so building a thousand groups does not
        eat into the first election timeouts.
        """
        assert self._raft is not None
        first = PREFERRED_FIRST_ELECTION_S
        if not self._preferred:
            first += ELECTION_TIMEOUT_MAX_S * self._scale
        self._raft.election_deadline = monotonic_time() + first
        self._book_next_tick()

    # --- driving pysyncobj from the loop ------------------------------------------------------

    def schedule_tick(self) -> None:
        """Run one pysyncobj tick soon (coalesced): after messages, proposals, new peer links."""
        if not self._tick_scheduled and not self._closed:
            self._tick_scheduled = True
            if not self._transport.defer_tick(self._tick):  # inside a received frame: at its end
                self.loop.call_soon(self._tick)

    def _peer_link_up(self) -> None:
        """A link to a peer came up: give its leader, if any, time to be heard before campaigning.

        A replica whose election deadline passed while it reached nobody would otherwise
        campaign the moment the first link comes up; pysyncobj has no pre-vote, so a node
        rejoining a settled cluster would depose healthy leaders with its higher term.
        """
        raft = self._raft
        if raft is not None and raft.state != _LEADER:
            raft.election_deadline = max(raft.election_deadline, monotonic_time() + LINK_UP_GRACE_S * self._scale)
        self.schedule_tick()

    def _deliver(self, node: Any, message: Any) -> None:
        """One Raft message from the network; tick afterwards unless it needs none."""
        if self._closed:
            return
        self._event_messages = self._event_tick_free = 0
        try:
            self.handle_message(node, message)
        except SyncFailed as exc:
            self.storage.sync_failed(exc)
        except Exception:  # a malformed message (from an authenticated peer) must not stop the link
            log.exception("partition %d: raft message %r from %s failed", self.partition,
                          message.get("type") if type(message) is dict else type(message).__name__, node)
        if self._event_messages and self._event_messages == self._event_tick_free:
            # Nothing in this message needs a tick at once; a follower's new commit index is
            # applied on the next busy tick (one timer slot per node, not one call per message).
            raft = self._raft
            if raft is not None and raft.commit_index > raft.last_applied:
                self.scheduler.call_later(ACTIVE_TICK_S, self)
            return
        self.schedule_tick()

    def _hold_campaign_unless_admitted(self) -> None:
        """Defer this tick's campaign (if it would start one) when the node's budget is spent."""
        raft = self._raft
        if raft is None or raft.state == _LEADER:
            return
        now = monotonic_time()
        if raft.election_deadline < now and raft.connected_nodes \
                and not self.scheduler.campaigns.admit(now):
            raft.election_deadline = now + random.uniform(CAMPAIGN_RETRY_MIN_S, CAMPAIGN_RETRY_MAX_S)

    def _lone_barrier(self) -> None:
        """A replica without peers counts only itself toward the commit: sync before its tick."""
        raft = self._raft
        if raft is not None and not raft.other_nodes:
            self.storage.sync_all_now()

    def _tick(self) -> None:
        self._run_tick(timed=False)

    def on_timer(self) -> None:
        """The scheduler's tick: pysyncobj's, then the lazy sends of a busy leader."""
        self._run_tick(timed=True)

    def _run_tick(self, timed: bool) -> None:
        """One pysyncobj tick, the :meth:`after_tick` callbacks it collected, the next booking."""
        self._tick_scheduled = False
        if self._closed:
            return
        self._tick_tail = tail = []
        try:
            self._hold_campaign_unless_admitted()
            self._lone_barrier()
            self.raft_tick()
            if timed and self.is_leader() and not self._closed:
                self._send_lagging(monotonic_time())  # entries proposed, then a pause
        except SyncFailed as exc:
            self.storage.sync_failed(exc)
        except Exception:
            log.exception("partition %d: raft tick failed", self.partition)
        finally:
            self._tick_tail = None
        self._run_tail(tail)
        self._book_next_tick()

    def after_tick(self, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` once the running tick is over (its applies done); soon, outside one.

        A proposal's callback runs inside pysyncobj's apply loop, where answering clients
        would interleave with applying; after the tick, rather than in a loop callback of
        its own, the answer is one loop iteration sooner.
        """
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
                log.exception("partition %d: callback after a tick failed", self.partition)

    def _book_next_tick(self) -> None:
        """Book the next timed tick: heartbeat or busy tick (leader), deadline or applies (follower)."""
        raft = self._raft
        if self._closed or raft is None:
            return
        now = monotonic_time()
        if raft.state == _LEADER:
            due = raft.next_append_entries_time
            if now - self._last_proposal < ACTIVE_WINDOW_S:
                due = min(due, now + ACTIVE_TICK_S)
            else:
                due = -(-due // HEARTBEAT_GRID_S) * HEARTBEAT_GRID_S  # round up onto the shared grid
        else:
            due = raft.election_deadline
            if due <= now:  # campaigning needs a connected peer; a new link ticks us at once
                due = now + UNCONNECTED_RECHECK_S
            if raft.commit_index > raft.last_applied:
                due = min(due, now + ACTIVE_TICK_S)
        self.scheduler.call_later(max(0.0, due - now), self)

    def close(self) -> None:
        """Stop ticking and detach from the node's Raft links."""
        if self._closed:
            return
        self._closed = True
        self.scheduler.cancel(self)
        self.snapshots.cancel()
        self.destroy()  # autoTick=False: pysyncobj tears the transport down at once

    def _state_changed(self, old: int, new: int) -> None:
        # Runs inside a tick. A deposed leader's unanswered proposals must be answered at once:
        # polling the leader (the topology loop) misses a step-down and re-election between two
        # polls, and pysyncobj itself answers them only once other entries fill their indexes.
        # A leader's entries may leave before they are synced (storage.NodeStorage.after_send).
        self.journal.leader_appends = new == _LEADER
        if old == _LEADER or new == _LEADER:
            self._lazy_indexes = set()  # indexes of an earlier term may hold other entries in the next
        if new == CANDIDATE:
            self.elections += 1
        log.info("partition %d: %s -> %s (term %d)", self.partition, _STATE_NAMES.get(old, old),
                 _STATE_NAMES.get(new, new), self.raftCurrentTerm)
        if old == _LEADER and new != _LEADER and self.on_leadership_lost is not None and not self._closed:
            self.loop.call_soon(self.on_leadership_lost, self.partition)

    # --- replicated state machine -------------------------------------------------------------

    @replicated
    def apply_batch(self, now_ms: int, commands: list[Command]) -> BatchResult:
        """Apply a committed batch; each command is atomic, errors are per command."""
        results: BatchResult = []
        apply = self.engine.apply
        leader = self.is_leader()
        record = leader and self.record_events
        events = self.events
        for cmd in commands:
            try:
                applied = apply(cmd, now_ms, replies=leader, events=record)
                results.append(applied.result)
                if applied.events:
                    events.extend(applied.events)
            except CommandError as exc:
                results.append(exc)
            except Exception as exc:  # an engine bug must not kill the replica or diverge silently
                log.exception("partition %d: engine failed on %s", self.partition, command_name(cmd))
                results.append(CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))
        self.applied_batches += 1
        hook = self.on_applied
        if hook is not None:
            hook(self.partition)
        return results

    def propose(self, now_ms: int, commands: list[Command],
                callback: Callable[[BatchResult | None, int], None]) -> None:
        """Replicate ``commands`` (in their replicated form, :mod:`shoal.node.pushes`) as one log
        entry; ``callback(results, fail_reason)`` runs on the loop."""
        if self.storage.space_low():
            refused = {k for k, cmd in enumerate(commands) if command_name(cmd) in SPACE_TAKING_COMMANDS}
            if refused:
                self.storage.no_space[self.partition] = "free space below disk_free_min_bytes"
                commands, callback = _without_refused(commands, refused, callback, self.loop)
                if not commands:
                    return
        else:
            self.storage.no_space.pop(self.partition, None)
        self.apply_batch(now_ms, commands, callback=callback)
        self._last_proposal = monotonic_time()
        raft = self._raft
        assert raft is not None
        if raft.state == _LEADER:
            # Append and send the entry now rather than in a tick a loop iteration later: the
            # rest of a tick (commit index, applies, timers) has nothing to do until a follower
            # answers, and that answer schedules one.
            journal = self.journal
            index = journal.last_index + 1
            lazy = self._disk_class(commands)
            if lazy:
                self._lazy_indexes.add(index)
            journal.lazy_appends = lazy
            self._direct_send = True
            # The entry leaves at the release, not after the other callbacks of this loop iteration:
            # a pipelined client waits for the round trip. (The link's flush runs the sync barrier.)
            self._transport.hold()
            try:
                try:
                    self.append_queued_commands()
                except NoSpace as exc:
                    self._note_no_space(f"proposal refused: {exc}")
                    self.loop.call_soon(callback, None, FAIL_NO_SPACE)
                except SyncFailed as exc:
                    self.storage.sync_failed(exc)
                finally:
                    self._direct_send = False
                    journal.lazy_appends = False
                if lazy and journal.last_index != index:
                    # Not exactly our entry was appended (an older queued proposal too, or none):
                    # treat what was written as fsync class.
                    self._lazy_indexes.discard(index)
                    if journal.dirty:
                        self.storage.batcher.mark(journal)
            finally:
                self._transport.release()
            if not raft.other_nodes:
                # A lone replica commits in the next tick. (A tick appends proposals only after
                # computing the commit index, so without this one it would wait for the periodic one.)
                self.schedule_tick()
        else:
            self.schedule_tick()

    def _disk_class(self, commands: list[Command]) -> bool:
        """True when every command of the batch writes to an existing ``durable: false`` queue.

        A command naming no queue (acks by job id) counts as fsync class. The leader's timer
        tick counts as disk class: nothing is acknowledged on its strength alone, and any later
        fsync-class entry syncs it too (a sync covers the journal's whole prefix); so an idle
        node does not fdatasync once a second per partition.
        """
        queues = self.engine.queues
        for cmd in commands:
            if type(cmd) is dict and cmd["cmd"] == "_Tick":
                continue
            q = queues.get(command_queue(cmd))  # type: ignore[arg-type]
            if q is None or q.opts.get("durable", True):
                return False
        return True

    # --- one follower at once, the others a little later --------------------------------------

    def send_append_entries(self) -> None:
        """Send a proposal's entry to one responsive follower; the others get it lazily.

        A commit needs one follower's ack out of two. Sending every entry to both costs the
        leader a send and an ack per follower per entry, and on two cores a second follower
        woken per entry competes with the leader for a core. So a new entry goes at once to
        the first follower in placement order that answered within
        :data:`FAST_FOLLOWER_STALL_S` (a preferred leader that is following stays caught up
        for the balancer's hand-back); the others receive everything pending in one message
        at most every :data:`LAZY_SEND_PERIOD_S`, on the periodic tick and on pysyncobj's
        heartbeat. If no follower answered lately, every follower gets the entry at once.
        So does an entry no other entry is in flight with (a lone write): its commit then
        waits for the faster of two acknowledgements, and with nothing else in flight there
        is no load for a woken second follower to slow down. Commit still needs a majority;
        only the order of sends changes.
        """
        raft = self._raft
        if self._direct_send and raft is not None and raft.commit_index < raft.raft_log[-1][1] - 1:
            now = monotonic_time()
            fast = self._fast_follower(now)
            if fast is not None and self._send_entries_to(fast, now):
                self._send_lagging(now, fast)
                return
        super().send_append_entries()

    def _fast_follower(self, now: float) -> Any:
        raft = self._raft
        assert raft is not None
        connected = raft.connected_nodes
        last = raft.last_response_time
        for node in self._follower_order:
            if node in connected and now - last.get(node, 0.0) < FAST_FOLLOWER_STALL_S:
                return node
        return None

    def _send_lagging(self, now: float, skip: Any = None) -> None:
        """Catch up the followers not sent to for :data:`LAZY_SEND_PERIOD_S`."""
        raft = self._raft
        assert raft is not None
        for node in self._follower_order:
            if node is not skip and now - self._last_sent.get(node, 0.0) >= LAZY_SEND_PERIOD_S \
                    and node in raft.connected_nodes:
                self._send_entries_to(node, now)

    def _send_entries_to(self, node: Any, now: float) -> bool:
        """Send ``node`` every entry it lacks in one AppendEntries; False when that takes
        pysyncobj's own path (a snapshot, an entry over the batch size) or nothing is due."""
        raft = self._raft
        assert raft is not None
        raft_log = raft.raft_log
        next_index = raft.next_index
        next_idx = next_index.get(node)
        if next_idx is None or next_idx <= raft_log[0][1] or next_idx > raft_log[-1][1]:
            return False
        prev = raft.get_entries(next_idx - 1, 1)
        limit = raft.conf.appendEntriesBatchSizeBytes
        entries = raft.get_entries(next_idx, None, limit)
        if not prev or not entries or (len(entries) == 1 and len(entries[0][0]) >= limit):
            return False
        next_index[node] = entries[-1][1] + 1
        self._last_sent[node] = now
        self._direct_sends += 1
        raft.transport.send(node, {
            "type": "append_entries", "term": self.raftCurrentTerm,
            "commit_index": raft.commit_index, "entries": entries,
            "prevLogIdx": next_idx - 1, "prevLogTerm": prev[0][2]})
        return True

    def _send(self, node: Any, message: Any) -> bool:
        """Every message this replica sends: entries of the disk class only are marked ``lazy``
        (the follower need not sync them before answering), on every path that sends entries."""
        lazy = self._lazy_indexes
        if lazy and type(message) is dict and message.get("entries"):
            if all(e[1] in lazy for e in message["entries"]):
                message["lazy"] = True
            if len(lazy) > LAZY_INDEXES_MAX and self._raft is not None:
                low = min(self._raft.next_index.values(), default=0)
                self._lazy_indexes = {i for i in lazy if i >= low}
        return self._transport_send(node, message)

    # --- pipelining fix ------------------------------------------------------------------------

    def handle_message(self, node: Any, message: Any) -> None:
        """Keep ``nextIndex`` from moving backwards on a success reply.

        With several entries in flight, the reply to an older entry carries a lower
        ``next_node_idx``; pysyncobj then rewinds ``nextIndex`` and sends the newer entries
        again, which the follower truncates and re-appends ("truncating already-applied log
        entries"). A success reply only ever confirms a prefix, so the optimistic pointer may
        stay where it was; a *reset* (rejection) still rewinds it as Raft requires.

        Also counts the messages of the current socket event that need no tick of their own.
        """
        self._event_messages += 1
        raft = self._raft
        assert raft is not None
        kind = message.get("type") if type(message) is dict else None
        if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
            next_index = raft.next_index
            before = next_index.get(node)
            super().handle_message(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before
            if raft.match_index.get(node, 0) <= raft.commit_index:
                # An ack of entries already committed (the slower follower's, usually) cannot
                # move the commit index, which is all a tick after an ack is for.
                self._event_tick_free += 1
            return
        if kind == "append_entries" and "prevLogIdx" in message and message["term"] >= self.raftCurrentTerm:
            self._append_entries(node, message)
        else:
            super().handle_message(node, message)
        if kind == "append_entries" and raft.state == _FOLLOWER \
                and "prevLogIdx" in message and "transmission" not in message \
                and raft.commit_index - raft.last_applied < FOLLOWER_APPLY_BATCH:
            # A follower has appended the entries and answered inside this call; applying them
            # is all a tick would add, and nothing waits for a follower's apply (reads and
            # replies come from the leader), so they are applied a few at a time.
            self._event_tick_free += 1

    def _append_entries(self, node: Any, message: dict[str, Any]) -> None:
        """A follower's AppendEntries, under Raft's log-matching rule (log_matching.py, paper §5.3).

        pysyncobj's own handling deletes every entry after ``prevLogIdx`` whatever their
        terms, committed ones included. Here the log changes only as
        :func:`match_append_entries` decides; pysyncobj then sees the message without its
        log part (term, leader, election deadline) and with the commit index the rule
        allows, and the answer names the last index the message proved matching.
        """
        raft = self._raft
        assert raft is not None
        journal = self.journal
        header = {"type": "append_entries", "term": message["term"], "commit_index": raft.commit_index}
        entries = message.get("entries") or []
        transmission = message.get("transmission")
        if transmission is not None:
            entries = self._reassemble(message, transmission)
            if entries is None:  # more pieces to come
                super().handle_message(node, header)
                raft.send_next_index(node, journal.last_index + 1, success=False, reset=False)
                return
        decision = match_append_entries(journal, raft.commit_index, message["prevLogIdx"], message["prevLogTerm"],
                                        entries, message["commit_index"])
        if not isinstance(decision, Accept):
            super().handle_message(node, header)
            raft.send_next_index(node, decision.next_index, success=False, reset=True)
            return
        journal.lazy_appends = bool(message.get("lazy"))
        journal.leader_appends = False  # a follower's answer must wait for the sync (a deposed leader's too)
        try:
            if decision.delete_from is not None:
                log.warning("partition %d: log conflicts with leader %s from index %d (log ends at %d, "
                            "commit index %d); deleting from there", self.partition, node.id,
                            decision.delete_from, journal.last_index, raft.commit_index)
                journal.delete_from(decision.delete_from)
            for entry in decision.append:
                journal.add(entry[0], entry[1], entry[2])
        except NoSpace as exc:
            self._note_no_space(f"cannot append entries from {node.id}: {exc}")
            super().handle_message(node, header)
            raft.send_next_index(node, journal.last_index + 1, success=False, reset=True)
            return
        finally:
            journal.lazy_appends = False
        if decision.append:
            self.storage.no_space.pop(self.partition, None)
        header["commit_index"] = decision.commit_index
        super().handle_message(node, header)
        raft.send_next_index(node, decision.match_index + 1, success=True, reset=False)

    def _note_no_space(self, why: str) -> None:
        """Record (for /ready and the metrics) and log, at most every NO_SPACE_LOG_S, a refusal
        for lack of space: the log may live on the full disk, and a leader resends often."""
        self.storage.no_space[self.partition] = why
        now = monotonic_time()
        if now - self._no_space_logged >= NO_SPACE_LOG_S:
            self._no_space_logged = now
            log.warning("partition %d: %s", self.partition, why)

    def _reassemble(self, message: dict[str, Any], transmission: str) -> list[Any] | None:
        """Collect an entry sent in pieces; the entry once its last piece came, else None."""
        parts = self._transmission
        if transmission == "start":
            parts.clear()
        elif transmission not in ("process", "finish"):
            raise ValueError(f"unknown transmission {transmission!r}")
        parts.append(message["data"])
        if sum(len(p) for p in parts) > TRANSMISSION_BYTES_MAX:
            parts.clear()
            raise ValueError(f"an entry sent in pieces exceeds {TRANSMISSION_BYTES_MAX} bytes")
        if transmission != "finish":
            return None
        data = b"".join(parts)
        parts.clear()
        # From an authenticated peer only (transport.py), as pysyncobj itself does.
        return [tuple(pickle.loads(data))]

    def apply_log_entries(self) -> bool:
        """Apply committed entries; announce the new commit index a moment later, if still needed.

        With ``appendEntriesUseBatch=False`` pysyncobj follows every apply on the leader with
        an AppendEntries round to every follower, which often carries nothing but the new commit
        index, and each follower answers it: half of a leader's Raft messages under pipelined
        load. Here that round waits :data:`COMMIT_ANNOUNCE_DELAY_S`; if any AppendEntries left
        meanwhile (the next entry, carrying the commit index), it is skipped. Followers that lag
        (after a restart) still catch up round after round at that pace.
        """
        applied = super().apply_log_entries()
        if applied and not self._announce_due and self.is_leader():
            self._announce_due = True
            assert self._raft is not None
            self.loop.call_later(COMMIT_ANNOUNCE_DELAY_S, self._announce_commit,
                                 (self._raft.next_append_entries_time, self._direct_sends))
        return False

    def _announce_commit(self, sent_mark: Any) -> None:
        self._announce_due = False
        if self._closed or not self.is_leader() or self._raft is None:
            return
        if (self._raft.next_append_entries_time, self._direct_sends) == sent_mark:  # nothing sent since
            try:
                self.send_append_entries()
            except Exception:
                log.exception("partition %d: announcing the commit index failed", self.partition)

    # --- reads --------------------------------------------------------------------------------

    def read(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """Answer a read-only command from the applied state."""
        return self.engine.apply(cmd, now_ms, events=False).result

    def take_events(self) -> list[Event]:
        """The job events applied since the last call, oldest first."""
        out = list(self.events)
        self.events.clear()
        return out

    def read_ready(self) -> bool:
        """True once this leader has applied an entry of its own term (Raft paper §8).

        A new leader's applied state may lack entries its predecessor committed (a restarted
        cluster knows only a stale commit index) until its own first entry commits; reads
        answered before would miss acknowledged writes.
        """
        term = self.raftCurrentTerm
        if self._read_ready_term == term:
            return True
        if self.journal.term_at(self.raftLastApplied) == term:
            self._read_ready_term = term
            return True
        return False

    def has_ready(self, queue: str) -> bool:
        return self.engine.has_ready(queue)

    # --- leadership ---------------------------------------------------------------------------

    def leader_id(self) -> str | None:
        """The node id of the last known leader (this node's own id when it leads), or None."""
        leader = self.leader_node()
        return leader.id if leader is not None else None

    def term(self) -> int:
        return self.raftCurrentTerm  # type: ignore[no-any-return]

    def commit_index(self) -> int:
        return self.raftCommitIndex  # type: ignore[no-any-return]

    def applied_index(self) -> int:
        return self.raftLastApplied  # type: ignore[no-any-return]

    def has_quorum(self) -> bool:
        """True when this replica reaches a majority of its group (itself included)."""
        return bool(self.hasQuorum)

    def peer_connected(self, node_id: str) -> bool:
        return any(n.id == node_id and self.isNodeConnected(n) for n in self._follower_order)

    def transfer_leadership(self, node_id: str | None = None) -> None:
        """Ask ``node_id`` (None: the most caught-up follower) to take over; best effort.

        Refused quietly unless this replica leads and the target is connected and caught up.
        """
        target = next((n for n in self._follower_order if n.id == node_id), None) if node_id else None
        if node_id and target is None:
            return
        self.transferLeadership(target)

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot_now(self) -> None:
        """Take a snapshot on the next tick, whatever the thresholds (skipped if nothing is new)."""
        self.forceLogCompaction()
        self.schedule_tick()

    def _adopt_engine(self, engine: PartitionEngine, prev_entry: Any, last_entry: Any) -> None:
        """A snapshot was loaded (at start, or installed from the leader): it is the state now."""
        self.engine = engine
        if self._raft is not None:
            dropped = align_journal(self._raft.raft_log, prev_entry, last_entry)
            if dropped:
                log.info("partition %d: dropped %d journal entries the snapshot covers", self.partition, dropped)
            # Loading a large snapshot holds the loop for a while: hear from the leader again
            # before campaigning rather than depose it for the time spent loading.
            self._raft.election_deadline = max(self._raft.election_deadline,
                                               monotonic_time() + ELECTION_TIMEOUT_MAX_S * self._scale)


def _replaced_serializer_hook(*_args: Any) -> Any:
    """pysyncobj builds no snapshot data of its own when a custom serializer is configured; the
    serializer object itself is replaced by a :class:`~.snapshots.ForkSnapshotter`, so this never runs."""
    raise AssertionError("pysyncobj's Serializer was replaced; this hook is unused")


def _without_refused(commands: list[Command], refused: set[int],
                     callback: Callable[[BatchResult | None, int], None],
                     loop: asyncio.AbstractEventLoop) -> tuple[list[Command], Callable[[BatchResult | None, int], None]]:
    """Drop the ``refused`` commands (no room for new data) from a batch; the callback answers
    them with ``NO_SPACE`` in their places and passes the others' results through."""
    err = CommandError(ErrorCode.NO_SPACE, "the partition's disk is (nearly) full: new data is refused until "
                                           "space is freed; pulls, acks and reads still work")
    kept = [cmd for k, cmd in enumerate(commands) if k not in refused]
    n = len(commands)
    if not kept:
        loop.call_soon(callback, [err] * n, 0)
        return kept, callback

    def merged(results: BatchResult | None, reason: int) -> None:
        others = iter(results if results is not None and reason == 0 else [fail_reason_error(reason)] * len(kept))
        callback([err if k in refused else next(others) for k in range(n)], 0)

    return kept, merged


def fail_reason_error(reason: int) -> CommandError:
    """Translate a pysyncobj failure into a wire error.

    ``NO_LEADER``/``OVERLOADED`` mean the entry was never appended, so any command may be
    sent again. When leadership changed after the entry was appended, the entry may still be
    committed by the next leader: that is ``TIMEOUT`` (outcome unknown), which a client only
    retries for commands that are safe to repeat (pushes carry idempotency keys).
    """
    if reason == FAIL_NO_SPACE:
        return CommandError(ErrorCode.NO_SPACE, "the partition's disk is full: the write was not taken; "
                                                "retry once space is freed")
    if reason == FAIL_REASON.MISSING_LEADER:
        return CommandError(ErrorCode.NO_LEADER, "no leader for the partition; retry")
    if reason == FAIL_REASON.QUEUE_FULL:
        return CommandError(ErrorCode.OVERLOADED, "the partition's proposal queue is full; back off")
    return CommandError(ErrorCode.TIMEOUT, "leadership changed while the command was being replicated; "
                        "its outcome is unknown")
