"""Shoal's Raft core: one group member as a pure state machine behind a Ready boundary.

Theory of operation
-------------------
:class:`RaftCore` does no I/O, reads no clock and draws randomness only from the
``random.Random`` it is given. It is driven by three kinds of input:

- :meth:`RaftCore.step` — a message from a peer (:mod:`.messages`);
- :meth:`RaftCore.tick` — time passing (``now``, seconds on any monotonic clock);
- :meth:`RaftCore.propose` / :meth:`RaftCore.propose_change` — a new entry on the leader.

Each may leave work in a :class:`Ready` (``ready()`` collects it, ``advance()``
acknowledges it): hard state (term and vote) and entries to make durable,
storage entries to cut, a snapshot that replaced the log, messages to send and
committed entries to apply. The replica that drives the core does, in this
order: store the hard state (durably), cut and append entries (synced, for the
fsync durability class, before any message leaves), install the snapshot, send
the messages, apply the committed entries, then ``advance()``. The leader counts
its own log toward the commit only up to what the replica reports durable
(:meth:`RaftCore.persisted`).

What it implements (section numbers of the Raft paper, or of Ongaro's thesis "§T"):
elections with randomized timeouts (§5.2) behind a pre-vote (§T9.6) and a leader
lease that makes followers deaf to candidates while a leader is heard (§T4.2.3),
so a node rejoining a settled group never deposes its leader; log replication
with the log-matching rule (§5.3) — nothing at or below the commit index is ever
cut; commitment of the current term's entries only (§5.4.2) starting with a no-op
entry of each new term; the leader steps down when it stops hearing from a
majority (check quorum); leadership transfer (§T3.10); single-server membership
changes with learners (§T4.1, :mod:`.membership`); and catch-up by snapshot (§7):
a follower whose next entry the leader no longer holds gets the leader's
snapshot, streamed by the replicas (:mod:`.install`) and stepped here as one
:class:`~.messages.InstallSnapshot`, which moves the follower's commit index to
the snapshot's last index and never further.

Acknowledgements carry the term they answer in: an answer from an earlier term
never moves a leader's match index. A heartbeat carries a commit index no larger
than what the follower is known to match, so a follower never commits an entry
it has not checked against the leader's log.

Replication is pipelined: a follower known to match (``replicate`` state) gets
new entries at once, up to :attr:`RaftParams.inflight_max` messages of at most
:attr:`RaftParams.message_bytes_max` bytes in flight; a follower whose log is
not known to match is probed one message at a time.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .membership import ConfigChange, ConfigError, Membership, decode_change, encode_change
from .messages import (ENTRY_CONFIG, NOOP_PAYLOAD, AppendEntries, AppendResponse, Entry, Heartbeat,
                       HeartbeatResponse, InstallSnapshot, Message, RequestVote, TimeoutNow, VoteResponse)
from .raft_log import LogStorage, RaftLog

__all__ = ["RaftCore", "RaftParams", "Ready", "HardState", "Progress", "NotLeader", "ProposalRefused",
           "FOLLOWER", "CANDIDATE", "PRE_CANDIDATE", "LEADER", "PROBE", "REPLICATE", "SNAPSHOT"]

_CONFIG_BYTE = bytes([ENTRY_CONFIG])
FOLLOWER, PRE_CANDIDATE, CANDIDATE, LEADER = "follower", "pre-candidate", "candidate", "leader"
#: A follower's replication state on the leader.
PROBE, REPLICATE, SNAPSHOT = "probe", "replicate", "snapshot"
#: The leader's record of disk-class entry indexes is first trimmed past this size.
LAZY_TRIM_MIN = 4096
#: Heartbeat rounds whose send time a leader remembers (for its read lease).
ROUNDS_KEPT = 64


class NotLeader(Exception):
    """A proposal reached a core that does not lead (``leader`` names the one it knows, if any)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader})")
        self.leader = leader


class ProposalRefused(Exception):
    """A proposal the leader will not take now (a transfer under way, a change pending, …)."""


@dataclass(frozen=True, slots=True)
class RaftParams:
    """Timing and flow-control settings of one core (seconds, bytes)."""

    heartbeat_s: float = 0.2
    election_min_s: float = 0.8
    election_max_s: float = 1.6
    #: Messages in flight to one follower in the replicate state.
    inflight_max: int = 64
    #: Payload bytes of one AppendEntries (an entry larger than this travels alone).
    message_bytes_max: int = 1024 * 1024
    #: A leader that has not heard from a majority for this long steps down.
    check_quorum_s: float = 2.0
    #: After a commit the leader waits this long for a new entry to carry the commit index
    #: before it announces it on its own.
    commit_announce_s: float = 0.002
    #: How much two replicas' clocks may disagree on the length of an interval (a rate, 0.2: 20 %).
    #: A leader's read lease lasts the minimum election timeout less this share.
    clock_drift_max: float = 0.2
    #: A transfer that has not happened after this long is given up.
    transfer_timeout_s: float = 1.6
    #: Only a voter that answered within this long is a transfer's target.
    transfer_heard_s: float = 0.5
    #: After a failed transfer its target is refused for this long, doubling per failure up to the max.
    transfer_backoff_min_s: float = 2.0
    transfer_backoff_max_s: float = 30.0
    #: 0: every new entry goes to every follower at once. Above 0: while other entries are in
    #: flight, a new entry goes at once only to as many followers as the commit needs (those that
    #: answered within ``fast_follower_s``, in :attr:`RaftCore.peer_order`); the others get what
    #: they lack at most this often, several entries per message.
    lazy_send_s: float = 0.0
    fast_follower_s: float = 0.01


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before the messages of the same :class:`Ready` leave (§5.1)."""

    term: int
    vote: str | None


@dataclass(slots=True)
class Ready:
    """What the replica must do, in this order (see the module docstring)."""

    hard_state: HardState | None = None
    #: Storage entries from this index on are cut, durably, before appending.
    truncate_from: int | None = None
    #: A snapshot at ``(index, term)`` replaced the log: storage restarts after ``index`` and the
    #: state machine is loaded from the snapshot file before anything later is applied.
    snapshot: tuple[int, int] | None = None
    #: Entries to append to storage (the durability class decides when they are synced).
    entries: list[Entry] = field(default_factory=list)
    #: True when every entry of ``entries`` is of the disk class (a follower need not sync first).
    lazy: bool = False
    #: (peer, message) pairs to send once the above is durable.
    messages: list[tuple[str, Message]] = field(default_factory=list)
    #: Committed entries to apply, in order.
    committed: list[Entry] = field(default_factory=list)
    #: (peer, snapshot index, snapshot term): the leader wants this snapshot streamed to the peer.
    snapshot_requests: list[tuple[str, int, int]] = field(default_factory=list)
    #: The commit index as of this Ready.
    commit: int = 0
    #: The durable index as of this Ready: committed entries on stable storage on a majority.
    #: A follower applies only up to it, and it bounds what a snapshot or the stored commit hint
    #: may cover (committed disk-class entries beyond it may still be lost to power cuts).
    durable: int = 0
    #: The state machine must go back to the snapshot (the log's base): entries it applied ahead
    #: of the durable index were cut. The committed entries of this and later Readys follow it.
    rollback: bool = False


class Progress:
    """The leader's view of one follower (match/next index, replication state, activity)."""

    __slots__ = ("match", "next", "state", "inflight", "paused", "pending_snapshot", "recent_active",
                 "last_heard", "answered_at", "learner", "lazy", "acked_round", "synced")

    def __init__(self, next_index: int, learner: bool) -> None:
        self.match = 0
        self.next = next_index
        self.state = PROBE
        #: Last index of each AppendEntries in flight (replicate state).
        self.inflight: deque[int] = deque()
        self.paused = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.last_heard = float("-inf")
        #: When the follower last answered this leader (last_heard also counts a new leader's start).
        self.answered_at = float("-inf")
        self.learner = learner
        #: New entries wait for the next lazy send (see RaftParams.lazy_send_s).
        self.lazy = False
        #: The newest heartbeat round of this leader's term the follower answered.
        self.acked_round = 0
        #: How far the follower's log is on stable storage, as it last said.
        self.synced = 0

    def to_probe(self) -> None:
        self.state = PROBE
        self.next = self.match + 1 if self.state != SNAPSHOT else max(self.match + 1, self.pending_snapshot + 1)
        self.inflight.clear()
        self.paused = False
        self.pending_snapshot = 0

    def __repr__(self) -> str:
        return f"Progress(match={self.match} next={self.next} {self.state})"


class RaftCore:
    """One member of one Raft group (see the module docstring)."""

    def __init__(self, node_id: str, membership: Membership, storage: LogStorage, *,
                 params: RaftParams | None = None, rng: random.Random | None = None,
                 term: int = 0, vote: str | None = None, commit: int = 0,
                 snapshot: tuple[int, int] = (0, 0), applied: int | None = None,
                 log_configs: list[tuple[int, ConfigChange]] | None = None,
                 recovering: bool = False, now: float = 0.0) -> None:
        """``membership`` is the snapshot's (or the group's initial one, at index 0);
        ``log_configs`` are the config entries of the log after the snapshot (index, change): the
        newest of them is in effect at once (thesis §4.1), whatever the commit index.
        ``recovering``: this replica lost its log (damage repaired by discarding it) and neither
        votes nor campaigns until it holds every committed entry again: until its log matches a
        leader's through that leader's commit index, at an entry of the leader's own term (only
        then does the leader's commit index cover every entry committed in earlier terms).
        """
        self.id = node_id
        self.params = params or RaftParams()
        self.rng = rng or random.Random()
        self.log = RaftLog(storage, snapshot[0], snapshot[1])
        #: The configurations the log holds, oldest first: (index, membership). The first is the
        #: snapshot's (or the group's first, at index 0), the others come from config entries. The
        #: newest is in effect as soon as it is in the log, committed or not, and a cut of the log
        #: takes it back with the entry (thesis §4.1): a restarted replica thus uses the newest
        #: configuration it holds, not the one of a stale commit index.
        self._configs: list[tuple[int, Membership]] = [(snapshot[0], membership)]
        self.term = term
        self.vote = vote
        self.state = FOLLOWER
        self.leader: str | None = None
        self.commit = max(commit, snapshot[0])
        self.commit = min(self.commit, max(self.log.last_index, snapshot[0]))
        self.applied = snapshot[0] if applied is None else applied
        #: The highest index on stable storage on a majority, of which this member knows (never
        #: above the commit index; equal to it for the fsync class). Nothing at or below it is
        #: ever cut. A restart begins from the stored commit hint, which never exceeds it.
        self.durable = self.commit
        #: How far this member's own log is on stable storage (recovery synced what it found).
        self._synced = self.log.last_index
        #: Entries applied ahead of the durable index were cut (see Ready.rollback).
        self._rollback = False
        self.recovering = recovering
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.lead_transferee: str | None = None
        self._transfer_deadline = 0.0
        # A restarted member acts as if it had just heard a leader: a leader may hold a read lease
        # on the strength of its answers from before the restart (see _in_lease).
        self._heard_leader_at = now if term > 0 else float("-inf")
        #: The leader's heartbeat rounds in its term: the newest, (round, sent at) of recent ones,
        #: the newest a majority answered, and until when that round's lease lasts.
        self._round = 0
        self._rounds_sent: deque[tuple[int, float]] = deque(maxlen=ROUNDS_KEPT)
        self._confirmed_round = 0
        self._lease_until = float("-inf")
        #: This leader sent a TimeoutNow in its term: a transfer vote overrides the followers'
        #: leases, so its own read lease no longer holds (reads go through ReadIndex).
        self._lease_void = False
        self._election_deadline = 0.0
        self._heartbeat_due = 0.0
        self._quorum_check_due = 0.0
        self._announce_due: float | None = None
        self._lazy_due: float | None = None
        #: Followers in the order the replica prefers them for the fast path (placement order).
        self.peer_order: list[str] = []
        self._sent_since_commit = False
        self._persisted = self.log.last_index
        self._term_start_index = 0
        #: Index of the newest config entry not yet applied (0: none), on the leader.
        self._lazy_indexes: set[int] = set()
        #: Size of ``_lazy_indexes`` past which :meth:`advance` trims it.
        self._lazy_trim_at = LAZY_TRIM_MIN
        self._msgs: list[tuple[str, Message]] = []
        self._snap_requests: list[tuple[str, int, int]] = []
        self._hard_state = (term, vote)
        self._pending_snapshot: tuple[int, int] | None = None
        #: Whether every unstable entry a follower holds is of the disk class (None: none held).
        self._unstable_lazy: bool | None = None
        #: Counters for metrics: campaigns started (real ones, not pre-votes), and those of them a
        #: leader asked for (leadership transfers).
        self.elections = 0
        self.transfer_elections = 0
        #: Messages from another leader of this core's own term while it led (never, if safe).
        self.foreign_leader_messages = 0
        #: Leadership transfers given up (their target did not take over in time).
        self.transfers_failed = 0
        #: Set by the replica while its state machine loads a snapshot: it neither campaigns nor
        #: obeys TimeoutNow, since as leader it could serve nothing until the load ends.
        self.loading = False
        #: target -> (no transfer to it before this time, the backoff that set it): transfers that failed.
        self._transfer_backoff: dict[str, tuple[float, float]] = {}
        for index, change in log_configs or []:
            if index > snapshot[0]:
                self._add_config(index, change)
        self._reset_election_deadline(now)

    # --- queries -----------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.state == LEADER

    @property
    def last_index(self) -> int:
        return self.log.last_index

    @property
    def read_ready(self) -> bool:
        """The leader has committed an entry of its term: its applied state holds every
        earlier commit once applied (§8)."""
        return self.state == LEADER and self.commit >= self._term_start_index > 0

    @property
    def membership(self) -> Membership:
        """The configuration in effect: the newest one in the log (thesis §4.1)."""
        return self._configs[-1][1]

    @property
    def config_index(self) -> int:
        """The log index of the entry :attr:`membership` comes from (the snapshot's, or 0)."""
        return self._configs[-1][0]

    def membership_at(self, index: int) -> Membership:
        """The configuration as of log index ``index`` (what a snapshot ending there records)."""
        for at, membership in reversed(self._configs):
            if at <= index:
                return membership
        raise ValueError(f"no configuration known at index {index} (the oldest is at {self._configs[0][0]})")

    @property
    def change_pending(self) -> bool:
        """A membership change is in the log and not yet committed (the next one must wait)."""
        return self._configs[-1][0] > self.commit

    def next_deadline(self) -> float:
        """When :meth:`tick` has work next (the replica books its timer for it)."""
        if self.state == LEADER:
            due = min(self._heartbeat_due, self._quorum_check_due)
            if self._announce_due is not None:
                due = min(due, self._announce_due)
            if self._lazy_due is not None:
                due = min(due, self._lazy_due)
            if self.lead_transferee is not None:
                due = min(due, self._transfer_deadline)
            return due
        return self._election_deadline

    def election_due(self, now: float) -> bool:
        """A tick at ``now`` would start a (pre-)campaign."""
        return self.state != LEADER and now >= self._election_deadline and self._can_campaign()

    def schedule_election(self, at: float) -> None:
        """Move the election deadline to ``at`` (start-up order, a deferred campaign)."""
        if self.state != LEADER:
            self._election_deadline = at

    def wants_snapshot(self, index: int, term: int) -> bool:
        """Would an :class:`~.messages.InstallSnapshot` at ``(index, term)`` replace this log?
        (Asked before a received file replaces the local snapshot.)"""
        return index > self.durable and not self.log.match_term(index, term)

    def peer_unreachable(self, peer: str) -> None:
        """A message to ``peer`` could not be sent (no link, or its buffer is full): the leader
        stops assuming its pipelined entries arrive and probes it again."""
        pr = self.progress.get(peer)
        if self.state == LEADER and pr is not None and pr.state == REPLICATE:
            pr.state = PROBE
            pr.next = pr.match + 1
            pr.inflight.clear()
            pr.paused = True  # the next heartbeat answer (or the link coming back) probes it

    def peer_reachable(self, peer: str) -> None:
        """A link to ``peer`` came up: a leader probes it at once rather than at the next heartbeat."""
        pr = self.progress.get(peer)
        if self.state == LEADER and pr is not None and pr.state == PROBE:
            pr.paused = False
            self._send_append(peer, pr, force=True)

    def status(self) -> dict[str, Any]:
        """A plain summary (for /stats, scripts and tests)."""
        out: dict[str, Any] = {"id": self.id, "state": self.state, "term": self.term, "leader": self.leader,
                               "commit": self.commit, "applied": self.applied, "last": self.log.last_index,
                               "snapshot": self.log.snap_index, "voters": list(self.membership.voters),
                               "learners": list(self.membership.learners)}
        if self.state == LEADER:
            out["progress"] = {p: {"match": pr.match, "next": pr.next, "state": pr.state}
                               for p, pr in sorted(self.progress.items())}
        return out

    # --- inputs ------------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Time passed: elections, heartbeats, quorum checks, transfers, commit announcements."""
        if self.state == LEADER:
            if now >= self._quorum_check_due:
                self._quorum_check_due = now + self.params.check_quorum_s
                if not self._quorum_active(now):
                    self._become_follower(self.term, None, now)
                    return
            if self.lead_transferee is not None and now >= self._transfer_deadline:
                if not self.membership.is_voter(self.id):
                    self._become_follower(self.term, None, now)  # its hand-over failed: the voters elect
                    return
                self._transfer_failed(now)
            if self.lead_transferee is None and not self.membership.is_voter(self.id) \
                    and self.commit >= self.config_index:
                self._hand_over(now)
            if now >= self._heartbeat_due:
                self._heartbeat_due = now + self.params.heartbeat_s
                self._broadcast_heartbeat(now)
            if self._lazy_due is not None and now >= self._lazy_due:
                self._lazy_due = None
                for peer, pr in self.progress.items():
                    if pr.lazy:
                        pr.lazy = False
                        self._send_append(peer, pr)
            if self._announce_due is not None and now >= self._announce_due:
                self._announce_due = None
                if not self._sent_since_commit:
                    self._broadcast_append(force=True)
            return
        if now >= self._election_deadline:
            self._reset_election_deadline(now)
            if self._can_campaign():
                self._campaign(now, pre=True)

    def step(self, sender: str, msg: Message, now: float) -> None:
        """Handle one message from ``sender``."""
        term = msg.term
        if term > self.term:
            if isinstance(msg, RequestVote):
                if not msg.transfer and self._in_lease(now):
                    return  # a leader is heard from: ignore a disruptive candidate (§T4.2.3)
                if not msg.pre:
                    self._become_follower(term, None, now)
            elif isinstance(msg, VoteResponse) and msg.pre and msg.granted:
                pass  # granted in the term the pre-candidate would campaign in
            elif isinstance(msg, (AppendEntries, Heartbeat, InstallSnapshot, TimeoutNow)):
                self._become_follower(term, sender, now)
            else:
                self._become_follower(term, None, now)  # an answer from a newer term
        elif term == self.term and self.state == LEADER and isinstance(msg, (AppendEntries, Heartbeat,
                                                                            InstallSnapshot)):
            # Another leader of this very term: impossible while elections are safe (one vote per
            # term). Obeying it would let two logs claim one term; the message is refused, and
            # counted so a simulation or an operator sees it.
            self.foreign_leader_messages += 1
            return
        elif term < self.term:
            if isinstance(msg, (AppendEntries, Heartbeat)):
                # A deposed leader: the answer carries the term that makes it step down (§5.1).
                self._send(sender, HeartbeatResponse(self.term))
            elif isinstance(msg, RequestVote) and msg.pre:
                self._send(sender, VoteResponse(self.term, False, pre=True))
            return

        if isinstance(msg, AppendEntries):
            self._handle_append(sender, msg, now)
        elif isinstance(msg, AppendResponse):
            self._handle_append_response(sender, msg, now)
        elif isinstance(msg, Heartbeat):
            self._handle_heartbeat(sender, msg, now)
        elif isinstance(msg, HeartbeatResponse):
            self._handle_heartbeat_response(sender, msg, now)
        elif isinstance(msg, RequestVote):
            self._handle_vote(sender, msg, now)
        elif isinstance(msg, VoteResponse):
            self._handle_vote_response(sender, msg, now)
        elif isinstance(msg, TimeoutNow):
            if self._can_campaign():
                self._campaign(now, pre=False, transfer=True)
        elif isinstance(msg, InstallSnapshot):
            self._handle_snapshot(sender, msg, now)

    def _in_lease(self, now: float) -> bool:
        """A leader was heard from within the minimum election timeout (or this member restarted
        that recently): candidates other than a transfer's are ignored (§T4.2.3).

        This is what a leader's read lease rests on: a member that answered its heartbeat round
        sent at ``t`` votes for nobody else before ``t`` plus the minimum election timeout on its
        own clock, restarted or not.
        """
        if self.state == LEADER:
            return True
        return now - self._heard_leader_at < self.params.election_min_s

    # --- reads (§T6.4) ---------------------------------------------------------------------------

    @property
    def lease_s(self) -> float:
        """How long after sending a heartbeat round a majority answered the leader may serve reads
        on that round alone: the minimum election timeout less the clock drift bound."""
        p = self.params
        return p.election_min_s * (1.0 - p.clock_drift_max)

    def lease_valid(self, now: float) -> bool:
        """This leader may answer a read from its state now, without a round of messages: a
        majority answered a heartbeat round sent less than :attr:`lease_s` ago, so no other leader
        can have been elected since (none of them votes for another before its lease ends), and
        it has committed an entry of its term (its state holds every earlier commit once applied).
        """
        return (self.state == LEADER and not self._lease_void and now < self._lease_until
                and self.read_ready and self.membership.is_voter(self.id))

    def read_index(self, now: float) -> int:
        """Start a heartbeat round now and return its number: once :meth:`confirmed` says a
        majority answered it, this core still led when the round left, so a read that arrived
        before this call may be answered from the state applied up to the commit index of then
        (ReadIndex, §T6.4). Raises :class:`NotLeader`."""
        if self.state != LEADER:
            raise NotLeader(self.leader)
        self._heartbeat_due = now + self.params.heartbeat_s
        self._broadcast_heartbeat(now)
        return self._round

    def confirmed(self, round_: int) -> bool:
        """A majority of voters answered heartbeat round ``round_`` (or a later one) of this term."""
        return self.state == LEADER and self._confirmed_round >= round_ and self.read_ready

    def _update_lease(self) -> None:
        voters = self.membership.voters
        progress = self.progress
        rounds = sorted((self._round if v == self.id else (progress[v].acked_round if v in progress else 0)
                         for v in voters), reverse=True)
        if not rounds:
            return
        q = rounds[self.membership.quorum() - 1]
        if q > self._confirmed_round:
            self._confirmed_round = q
            for r, sent in self._rounds_sent:
                if r == q:
                    self._lease_until = max(self._lease_until, sent + self.lease_s)
                    break

    def propose(self, payload: bytes, now: float, *, lazy: bool = False) -> int:
        """Append ``payload`` as a new entry on the leader; return its index.

        ``lazy``: the entry holds only disk-class commands (followers need not sync it before
        answering). Raises :class:`NotLeader` or :class:`ProposalRefused`.
        """
        if self.state != LEADER:
            raise NotLeader(self.leader)
        if self.lead_transferee is not None:
            raise ProposalRefused(f"leadership is being transferred to {self.lead_transferee}")
        if not self.membership.is_voter(self.id):
            raise ProposalRefused("this leader is leaving its group")
        index = self.log.last_index + 1
        self.log.unstable.append((payload, index, self.term))
        if lazy:
            self._lazy_indexes.add(index)
        lazy_s = self.params.lazy_send_s
        if lazy_s <= 0 or self.commit >= index - 1:
            # A lone write (nothing else in flight) goes to everyone: it commits on the faster answer.
            for peer, pr in self.progress.items():
                self._send_append(peer, pr)
            return index
        needed = self.membership.quorum() - (1 if self.membership.is_voter(self.id) else 0)
        recent = now - self.params.fast_follower_s
        progress = self.progress
        for peer in self.peer_order or list(progress):
            pr = progress.get(peer)
            if pr is None:
                continue
            if needed > 0 and not pr.learner and pr.state == REPLICATE and pr.last_heard >= recent:
                needed -= 1
                self._send_append(peer, pr)
            elif not pr.lazy:
                pr.lazy = True
                if self._lazy_due is None:
                    self._lazy_due = now + lazy_s
        if needed > 0:  # no follower answered lately: everyone gets it now
            for peer, pr in progress.items():
                if pr.lazy:
                    pr.lazy = False
                    self._send_append(peer, pr)
        return index

    def propose_change(self, change: ConfigChange, now: float) -> int:
        """Propose a single-server membership change; return its index.

        Refused unless this core leads, has committed an entry of its term, no other change is
        pending, and the change applies to the current membership.
        """
        if self.state != LEADER:
            raise NotLeader(self.leader)
        if not self.read_ready:
            raise ProposalRefused("the leader has not committed an entry of its term yet")
        if self.change_pending:
            raise ProposalRefused(f"a membership change is pending at index {self.config_index}")
        if self.lead_transferee is not None:
            raise ProposalRefused(f"leadership is being transferred to {self.lead_transferee}")
        try:
            change = ConfigChange(change.kind, change.node, self.membership.apply(change))
        except ConfigError as exc:
            raise ProposalRefused(str(exc)) from exc
        if change.kind in ("remove", "demote") and change.node == self.id:
            raise ProposalRefused("the leader cannot remove or demote itself; transfer leadership first")
        index = self.log.last_index + 1
        self.log.append([(encode_change(change), index, self.term)])
        self._add_config(index, change)
        self._membership_changed()
        self._broadcast_append()
        return index

    def transfer_leadership(self, target: str, now: float) -> None:
        """Hand leadership to voter ``target`` once it has the whole log (§T3.10).

        Bounded: proposals wait while a transfer runs, so it is given up after
        :attr:`RaftParams.transfer_timeout_s` and never extended (asking again for the same
        target changes nothing; another target is refused meanwhile). Only a voter that
        answered within :attr:`RaftParams.transfer_heard_s` is a target (a paused or cut-off
        node keeps its TCP link up but answers nothing), and a target whose transfer failed is
        refused for a backoff that doubles with each failure. Raises :class:`ProposalRefused`.
        """
        if self.state != LEADER or target == self.id:
            return
        if self.lead_transferee is not None:
            if self.lead_transferee == target:
                return
            raise ProposalRefused(f"a transfer to {self.lead_transferee} is under way")
        if not self.membership.is_voter(target) or target not in self.progress:
            raise ProposalRefused(f"{target} is not a voter of this group")
        pr = self.progress[target]
        if now - pr.answered_at > self.params.transfer_heard_s:
            raise ProposalRefused(f"{target} has not answered for {now - pr.answered_at:.1f} s")
        backoff = self._transfer_backoff.get(target)
        if backoff is not None and now < backoff[0]:
            raise ProposalRefused(f"a transfer to {target} failed lately; not before {backoff[0] - now:.1f} s")
        self.lead_transferee = target
        self._transfer_deadline = now + self.params.transfer_timeout_s
        if pr.match == self.log.last_index:
            self._send_timeout_now(target)
        else:
            self._send_append(target, pr)

    def persisted(self, index: int, synced: bool = True) -> None:
        """The replica's own log counts toward the commit up to ``index``: synced there, or (not
        ``synced``) appended there with nothing after the durable index but disk-class entries."""
        if index > self._persisted:
            self._persisted = index
            if self.state == LEADER:
                self._maybe_commit()
        if synced:
            self.synced_to(index)

    def synced_to(self, index: int) -> None:
        """The replica's own log is on stable storage up to ``index`` (its syncs say so)."""
        index = min(index, self.log.last_index)
        if index > self._synced:
            self._synced = index
            if self.state == LEADER:
                self._maybe_durable()

    def snapshot_done(self, peer: str, ok: bool, now: float) -> None:
        """The leader's snapshot stream to ``peer`` ended: the peer is probed again.

        On success it is probed right after the snapshot. On failure nothing is known of its
        log (it may even hold the snapshot and have refused it as not wanted): it is probed
        from the log's end, as a new leader does, and its rejections' hints lead back to where
        it is; probing below the compaction point would only ask for the snapshot again. Either
        way the probe waits for the follower's answer or the next heartbeat's (the follower's
        answer to an installed snapshot may be lost).
        """
        pr = self.progress.get(peer)
        if pr is None or pr.state != SNAPSHOT:
            return
        pr.state = PROBE
        pr.inflight.clear()
        pr.next = max(pr.match, pr.pending_snapshot if ok else self.log.last_index) + 1
        pr.paused = True
        pr.pending_snapshot = 0

    def compacted(self, index: int, term: int) -> None:
        """A durable snapshot covers the log up to ``index`` (the replica may drop that prefix)."""
        if index > self.applied:
            raise ValueError(f"snapshot at {index} beyond the applied index {self.applied}")
        self.log.compacted(index, term)
        configs = self._configs
        keep = max(k for k, (at, _) in enumerate(configs) if at <= index)
        del configs[:keep]

    def _transfer_failed(self, now: float) -> None:
        """The transfer under way timed out: proposals resume, and its target waits a backoff."""
        target = self.lead_transferee
        self.lead_transferee = None
        if target is None:
            return
        last = self._transfer_backoff.get(target)
        p = self.params
        backoff = min(p.transfer_backoff_max_s, 2 * last[1]) if last is not None else p.transfer_backoff_min_s
        self._transfer_backoff[target] = (now + backoff, backoff)
        self.transfers_failed += 1

    # --- Ready -----------------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        log = self.log
        return bool(self._msgs or log.unstable or log.truncate_from is not None or log.reset_to is not None
                    or self._apply_limit() > self.applied or self._snap_requests or self._rollback
                    or self._hard_state[0] != self.term or self._hard_state[1] != self.vote)

    def ready(self, committed_max: int = 1024) -> Ready:
        """Collect the work left by the last inputs (see :class:`Ready`); the core counts it done."""
        log = self.log
        # Before the entries handed out below leave the unstable tail (storage holds them only
        # once the replica appended them).
        assert self.applied <= self.commit <= max(log.last_index, log.snap_index), \
            f"applied {self.applied}, commit {self.commit}, log ends at {log.last_index}"
        assert self.durable <= self.commit, f"durable {self.durable} beyond the commit index {self.commit}"
        rd = Ready(commit=self.commit, durable=self.durable, rollback=self._rollback)
        self._rollback = False
        if self._hard_state[0] != self.term or self._hard_state[1] != self.vote:
            rd.hard_state = HardState(self.term, self.vote)
            self._hard_state = (self.term, self.vote)
        if log.reset_to is not None:
            rd.snapshot = (log.snap_index, log.snap_term)
        else:
            rd.truncate_from = log.truncate_from
        rd.committed = self.take_committed(committed_max)
        unstable = log.unstable
        if unstable:
            rd.entries = list(unstable)
            if self.state == LEADER:
                lazy = self._lazy_indexes
                rd.lazy = bool(lazy) and all(e[1] in lazy for e in unstable)
            else:
                rd.lazy = bool(self._unstable_lazy)
            log.stable_to(unstable[-1][1])
        elif log.truncate_from is not None or log.reset_to is not None:
            log.stable_to(log.last_index)
        self._unstable_lazy = None
        if self.state != LEADER:
            self._persisted = log.last_index  # a follower's appends are durable before its answers leave
            if rd.entries and not rd.lazy:
                self._synced = max(self._synced, log.last_index)
        rd.messages, self._msgs = self._msgs, []
        if self._snap_requests:
            rd.snapshot_requests, self._snap_requests = self._snap_requests, []
        return rd

    def take_committed(self, committed_max: int = 1024) -> list[Entry]:
        """The committed entries not yet handed out (at most ``committed_max``), counted applied:
        :meth:`ready`'s, or a lone leader's right after its own sync committed them."""
        limit = self._apply_limit()
        if limit <= self.applied:
            return []
        entries = self.log.entries(self.applied + 1, min(limit, self.applied + committed_max) + 1)
        if entries:
            self._applied_to(entries[-1][1])
        return entries

    def _apply_limit(self) -> int:
        """How far entries are handed out to be applied: the leader's commit index (a disk-class
        entry answers its client once a majority appended it), a follower's durable index."""
        return self.commit if self.state == LEADER else min(self.commit, self.durable)

    def advance(self, rd: Ready) -> None:
        """The replica has done what ``rd`` asked (the core counted it done in :meth:`ready`;
        this only trims the leader's record of disk-class entries).

        The record keeps what some follower may still be sent as entries: above the lowest
        match, and in the log (below its first index a follower gets the snapshot). It is
        trimmed once it has doubled since the last trim, so a follower whose match stays put
        (stopped, cut off) costs amortized constant work per entry, not a pass over the
        record on every entry."""
        lazy = self._lazy_indexes
        if len(lazy) > self._lazy_trim_at and self.state == LEADER:
            low = min((pr.match for pr in self.progress.values()), default=self.commit)
            low = max(low, self.log.first_index - 1)
            self._lazy_indexes = {i for i in lazy if i > low}
            self._lazy_trim_at = max(LAZY_TRIM_MIN, 2 * len(self._lazy_indexes))

    def storage_failed(self, last_stored: int, now: float) -> None:
        """Appending failed (the disk is full): storage ends at ``last_stored``.

        The core forgets what it believed stored beyond; a leader steps down (its log no longer
        holds what it sent), a follower answers the next AppendEntries from there.
        """
        log = self.log
        if last_stored < log.last_index:
            log.truncate_from = last_stored + 1 if log.truncate_from is None else min(log.truncate_from, last_stored + 1)
            log.unstable = []
            self._persisted = min(self._persisted, last_stored)
            self._synced = min(self._synced, last_stored)
            self._changes_cut_from(last_stored + 1)
        if self.state == LEADER:
            self._become_follower(self.term, None, now)

    # --- elections ---------------------------------------------------------------------------------

    def _reset_election_deadline(self, now: float) -> None:
        p = self.params
        self._election_deadline = now + p.election_min_s + self.rng.random() * (p.election_max_s - p.election_min_s)

    def _can_campaign(self) -> bool:
        return (self.membership.is_voter(self.id) or self._removal_pending()) and not self.recovering \
            and not self.loading and self.state != LEADER

    def _removal_pending(self) -> bool:
        """The newest configuration, not yet committed, removed or demoted this voter.

        Such a node still campaigns and may lead (thesis §4.2.2: a leader manages a configuration
        it is no voter of until that commits): the others may lack the entry while its log is
        ahead of theirs, and only it can then be elected.
        """
        configs = self._configs
        return (len(configs) > 1 and configs[-1][0] > self.commit and configs[-2][1].is_voter(self.id)
                and not configs[-1][1].is_voter(self.id))

    def _campaign(self, now: float, pre: bool, transfer: bool = False) -> None:
        if pre:
            self.state = PRE_CANDIDATE
            term = self.term + 1
        else:
            self.state = CANDIDATE
            self.term += 1
            self.vote = self.id
            self.elections += 1
            self.transfer_elections += transfer
            term = self.term
        self.leader = None
        self.votes = {self.id: True}
        self._reset_election_deadline(now)
        if self._won():
            if pre:
                self._campaign(now, pre=False)
            else:
                self._become_leader(now)
            return
        msg = RequestVote(term, self.log.last_index, self.log.last_term, pre=pre, transfer=transfer)
        for peer in self.membership.voters:
            if peer != self.id:
                self._send(peer, msg)

    def _won(self) -> bool:
        granted = sum(1 for v, ok in self.votes.items() if ok and self.membership.is_voter(v))
        return granted >= self.membership.quorum()

    def _lost(self) -> bool:
        refused = sum(1 for v, ok in self.votes.items() if not ok and self.membership.is_voter(v))
        return refused > len(self.membership.voters) - self.membership.quorum()

    def _handle_vote(self, sender: str, msg: RequestVote, now: float) -> None:
        # A vote request is answered without consulting this node's configuration (thesis §4.1),
        # neither its own place in it nor the candidate's: the candidate counts the votes of its
        # own configuration, which may be one change ahead of or behind this one (a candidate
        # holding its own uncommitted removal, or this node lacking the entry that promoted the
        # candidate), and refusing it can leave the group unable to elect anyone. A removed
        # node cannot win: a majority of its configuration holds the entries it lacks, and the
        # lease keeps it from disrupting a group that hears its leader.
        if self.recovering:
            self._send(sender, VoteResponse(self.term, False, pre=msg.pre))
            return
        up_to_date = self.log.is_up_to_date(msg.last_index, msg.last_term)
        if msg.pre:
            # Granted when the candidate's next term is newer and its log up to date; no state changes.
            grant = msg.term > self.term and up_to_date
            self._send(sender, VoteResponse(msg.term if grant else self.term, grant, pre=True))
            return
        if (self.vote is None or self.vote == sender) and up_to_date and self.state != LEADER:
            self.vote = sender
            self._reset_election_deadline(now)
            self._send(sender, VoteResponse(self.term, True))
        else:
            self._send(sender, VoteResponse(self.term, False))

    def _handle_vote_response(self, sender: str, msg: VoteResponse, now: float) -> None:
        if msg.pre:
            if self.state != PRE_CANDIDATE:
                return
            if msg.granted != (msg.term == self.term + 1):
                return  # a grant is in the next term, a refusal in ours; anything else is stale
        elif self.state != CANDIDATE or msg.term != self.term:
            return
        self.votes[sender] = msg.granted
        if self._won():
            if msg.pre:
                self._campaign(now, pre=False)
            else:
                self._become_leader(now)
        elif self._lost():
            self._become_follower(self.term, None, now)

    def _become_follower(self, term: int, leader: str | None, now: float) -> None:
        assert term >= self.term, f"term {term} below the current {self.term}"
        if term > self.term:
            self.term = term
            self.vote = None
        self.state = FOLLOWER
        self.leader = leader
        self.lead_transferee = None
        self.progress = {}
        self._announce_due = None
        self._lazy_due = None
        self._reset_election_deadline(now)

    def _become_leader(self, now: float) -> None:
        self.state = LEADER
        self.leader = self.id
        self.lead_transferee = None
        self._transfer_backoff = {}
        self._round = self._confirmed_round = 0
        self._rounds_sent.clear()
        self._lease_until = float("-inf")
        self._lease_void = False
        last = self.log.last_index
        self.progress = {peer: Progress(last + 1, not self.membership.is_voter(peer))
                         for peer in self.membership.members if peer != self.id}
        for pr in self.progress.values():
            pr.last_heard = now  # a new leader gives everyone a full quorum-check period
            pr.recent_active = True
        self._heartbeat_due = now + self.params.heartbeat_s
        self._quorum_check_due = now + self.params.check_quorum_s
        self._lazy_indexes = set()
        self._lazy_trim_at = LAZY_TRIM_MIN
        # The no-op entry commits every earlier entry once it commits (§5.4.2).
        index = last + 1
        self._term_start_index = index
        self.log.append([(NOOP_PAYLOAD, index, self.term)])
        self._maybe_commit()
        self._broadcast_append()

    def _quorum_active(self, now: float) -> bool:
        window = self.params.check_quorum_s
        active = 1 if self.membership.is_voter(self.id) else 0
        for peer, pr in self.progress.items():
            if not pr.learner and now - pr.last_heard <= window:
                active += 1
        return active >= self.membership.quorum()

    # --- replication (leader) ------------------------------------------------------------------

    def _broadcast_append(self, force: bool = False) -> None:
        for peer, pr in self.progress.items():
            self._send_append(peer, pr, force)

    def _send_append(self, peer: str, pr: Progress, force: bool = False) -> None:
        """Send ``peer`` what it lacks, as far as its state allows; ``force`` sends an empty
        AppendEntries (the commit index) when there is nothing new."""
        if pr.state == SNAPSHOT:
            return
        log = self.log
        last = log.last_index
        if pr.state == PROBE:
            if pr.paused:
                return
        elif len(pr.inflight) >= self.params.inflight_max:
            return
        if pr.next > last and not force:
            return
        prev = pr.next - 1
        prev_term = log.term(prev)
        if prev_term is None or pr.next < log.first_index:
            self._need_snapshot(peer, pr)
            return
        entries = log.entries(pr.next, last + 1, self.params.message_bytes_max) if pr.next <= last else []
        if entries:
            pr.lazy = False
        lazy = bool(entries) and bool(self._lazy_indexes) and all(e[1] in self._lazy_indexes for e in entries)
        commit = self.commit
        self._send(peer, AppendEntries(self.term, prev, prev_term, commit, entries, lazy, self.durable))
        self._sent_since_commit = True
        if entries:
            sent_last = entries[-1][1]
            if pr.state == REPLICATE:
                pr.next = sent_last + 1
                pr.inflight.append(sent_last)
            else:
                pr.paused = True
        elif pr.state == PROBE:
            pr.paused = True

    def _need_snapshot(self, peer: str, pr: Progress) -> None:
        log = self.log
        pr.state = SNAPSHOT
        pr.pending_snapshot = log.snap_index
        pr.inflight.clear()
        self._snap_requests.append((peer, log.snap_index, log.snap_term))

    def _heard_from(self, sender: str, term: int, now: float) -> Progress | None:
        """A follower's answer in this leader's term: its progress, marked active; else None."""
        if self.state != LEADER or term != self.term:
            return None
        pr = self.progress.get(sender)
        if pr is not None:
            pr.recent_active = True
            pr.last_heard = pr.answered_at = now
        return pr

    def _handle_append_response(self, sender: str, msg: AppendResponse, now: float) -> None:
        pr = self._heard_from(sender, msg.term, now)
        if pr is None:
            return
        if msg.reject:
            if msg.lost and msg.hint_index < pr.match:
                # The follower lost entries it had acknowledged (a damaged log it discarded): what
                # it holds now is what it says, and it is probed from there.
                pr.match = msg.hint_index
                pr.next = msg.hint_index + 1
                pr.state = PROBE
                pr.inflight.clear()
                pr.pending_snapshot = 0
                pr.paused = False
                self._send_append(sender, pr)
                return
            if pr.state == SNAPSHOT:
                return  # the stream decides (snapshot_done)
            if pr.state == REPLICATE:
                if msg.index <= pr.match:
                    return  # stale: an answer to something sent before the follower matched
                pr.next = pr.match + 1
            elif msg.index != pr.next - 1:
                return  # an answer to an earlier probe
            else:
                if msg.hint_index < pr.match:
                    # The follower's log ends below what it acknowledged: it lost entries (a
                    # repaired replica, or unsynced disk-class entries lost in a crash). Count
                    # it for what it holds, and probe below the old match index.
                    pr.match = msg.hint_index
                probe, _ = self.log.find_conflict_by_term(min(msg.index, msg.hint_index), msg.hint_term)
                pr.next = max(min(msg.index, probe + 1), pr.match + 1)
            pr.state = PROBE
            pr.inflight.clear()
            pr.paused = False
            self._send_append(sender, pr)
            return
        index = msg.index
        assert index <= self.log.last_index, f"{sender} matches {index}, beyond this leader's log {self.log.last_index}"
        if index > pr.match:
            pr.match = index
        if index + 1 > pr.next:
            pr.next = index + 1
        if msg.synced > pr.synced:
            pr.synced = msg.synced
        if pr.state == PROBE:
            pr.state = REPLICATE
            pr.paused = False
            pr.inflight.clear()
        elif pr.state == SNAPSHOT:
            if pr.match >= pr.pending_snapshot:
                pr.state = PROBE
                pr.pending_snapshot = 0
                pr.paused = False
                pr.next = pr.match + 1
        inflight = pr.inflight
        while inflight and inflight[0] <= index:
            inflight.popleft()
        if self._maybe_commit() | (self.durable < self.commit and self._maybe_durable()):
            self._announce_commit(now)
        if self.lead_transferee == sender and pr.match == self.log.last_index:
            self._send_timeout_now(sender)
        self._send_append(sender, pr)

    def _handle_heartbeat_response(self, sender: str, msg: HeartbeatResponse, now: float) -> None:
        pr = self._heard_from(sender, msg.term, now)
        if pr is None:
            return
        if msg.round > pr.acked_round:
            pr.acked_round = msg.round
            if not pr.learner:
                self._update_lease()
        if msg.synced > pr.synced:
            pr.synced = min(msg.synced, pr.match)
            if self._maybe_durable():
                self._announce_commit(now)
        if pr.state == PROBE:
            pr.paused = False
        elif pr.state == REPLICATE and len(pr.inflight) >= self.params.inflight_max:
            pr.inflight.popleft()  # a lost message must not stall the pipeline for good
        if pr.match < self.log.last_index or pr.state == PROBE:
            # Forced: a follower that was sent everything but lacks the end gets an empty append
            # it must answer (its last message was lost, and nothing newer reveals the gap).
            self._send_append(sender, pr, force=True)

    def _broadcast_heartbeat(self, now: float) -> None:
        self._round += 1
        self._rounds_sent.append((self._round, now))
        commit = self.commit
        round_ = self._round
        durable = self.durable
        for peer, pr in self.progress.items():
            self._send(peer, Heartbeat(self.term, min(pr.match, commit), commit, round_, min(pr.match, durable)))
        self._update_lease()  # a lone voter is its own majority

    def _maybe_commit(self) -> bool:
        """Advance the commit index to what a majority of voters holds, of the current term (§5.4.2)."""
        voters = self.membership.voters
        matches = [self._persisted if v == self.id else (self.progress[v].match if v in self.progress else 0)
                   for v in voters]
        if not matches:
            return False
        matches.sort(reverse=True)
        candidate = matches[self.membership.quorum() - 1]
        if candidate > self.commit and self.log.term(candidate) == self.term:
            assert candidate <= self.log.last_index, f"commit {candidate} beyond the log's end {self.log.last_index}"
            pending = self.change_pending
            self.commit = candidate
            self._sent_since_commit = False
            if pending and not self.change_pending:
                self._membership_changed()  # the change committed: members it removed are dropped
            return True
        return False

    def _maybe_durable(self) -> bool:
        """Advance the durable index to what a majority of voters holds on stable storage, of the
        current term (§5.4.2), within the commit index."""
        voters = self.membership.voters
        progress = self.progress
        synced = sorted((self._synced if v == self.id else (min(progress[v].synced, progress[v].match)
                                                            if v in progress else 0) for v in voters), reverse=True)
        if not synced:
            return False
        candidate = min(synced[self.membership.quorum() - 1], self.commit)
        if candidate > self.durable and self.log.term(candidate) == self.term:
            self._durable_to(candidate)
            return True
        return False

    def _durable_to(self, index: int) -> None:
        if index > self.durable:
            self.durable = index
            if self.commit < index:
                self.commit = index  # durable on a majority: committed, whichever leader said it

    def _announce_commit(self, now: float) -> None:
        """Followers learn a new commit index from the next AppendEntries; if none leaves within
        ``commit_announce_s``, the next tick sends it on its own."""
        if self._announce_due is None:
            self._announce_due = now + self.params.commit_announce_s

    # --- follower side -------------------------------------------------------------------------

    def _handle_append(self, sender: str, msg: AppendEntries, now: float) -> None:
        self._heard_from_leader(sender, now)
        log = self.log
        prev = msg.prev_index
        entries = msg.entries
        for k, entry in enumerate(entries):
            if entry[1] != prev + 1 + k:
                self._send(sender, AppendResponse(self.term, prev, reject=True, hint_index=log.last_index,
                                                  hint_term=log.last_term))
                return
        durable = self.durable
        if prev < durable:
            # Entries up to the durable index are on stable storage on a majority, so they are in
            # every later leader's log (§5.4). Committed disk-class entries past it are not: a
            # power cut may lose them where they were not synced, and a new leader may hold
            # another entry at their index, so they are checked like any other.
            entries = entries[durable - prev:]
            prev = durable
        elif not log.match_term(prev, msg.prev_term):
            hint_index, hint_term = log.find_conflict_by_term(min(prev, log.last_index), msg.prev_term)
            self._send(sender, AppendResponse(self.term, prev, reject=True, hint_index=hint_index,
                                              hint_term=hint_term, lost=self.recovering))
            return
        if entries:
            conflict = self._find_conflict(entries)
            if conflict:
                new = entries[conflict - prev - 1:]
                if conflict <= log.last_index:
                    self._cut_from(conflict)
                    log.truncate_and_append(new)
                else:
                    log.unstable.extend(new)
                self._note_changes(new)
                lazy = self._unstable_lazy
                self._unstable_lazy = msg.lazy if lazy is None else (lazy and msg.lazy)
        match = prev + len(entries)
        if msg.commit > self.commit:
            new_commit = min(msg.commit, match)
            if new_commit > self.commit:
                self.commit = new_commit
        if msg.durable > self.durable:
            self._durable_to(min(msg.durable, match))
        if self.recovering and msg.commit <= match and log.term(msg.commit) == self.term:
            self.recovering = False
        if entries and not self._unstable_lazy:
            # What this message appended is fsync class (or follows such entries in this Ready):
            # the journal is synced, through its end, before this answer leaves.
            self._synced = max(self._synced, log.last_index)
        self._send(sender, AppendResponse(self.term, match, synced=min(self._synced, match)))

    def _cut_from(self, index: int) -> None:
        """Entries from ``index`` on conflict with the leader's and leave the log.

        Only entries past the durable index are cut. Those a leader applied before they were
        durable (committed disk-class entries) may be among them: the state machine is then
        taken back to the snapshot and the entries up to the durable index applied again
        (:attr:`Ready.rollback`), so no replica keeps the effect of an entry no leader holds.
        """
        assert index > self.durable, f"a cut at {index}, at or below the durable index {self.durable}"
        self._changes_cut_from(index)
        self._synced = min(self._synced, index - 1)
        self._persisted = min(self._persisted, index - 1)
        if self.commit >= index:
            self.commit = index - 1  # committed there only in the disk class, and lost since
        if self.applied >= index:
            self.applied = self.log.snap_index
            self._rollback = True

    def _find_conflict(self, entries: list[Entry]) -> int:
        """Index of the first entry that is new or conflicts (0: the log already holds them all)."""
        log = self.log
        last = log.last_index
        for entry in entries:
            index = entry[1]
            if index > last or log.term(index) != entry[2]:
                return index
        return 0

    def _handle_heartbeat(self, sender: str, msg: Heartbeat, now: float) -> None:
        self._heard_from_leader(sender, now)
        if msg.commit > self.commit:
            self.commit = min(msg.commit, self.log.last_index)
        if msg.durable > self.durable:
            self._durable_to(min(msg.durable, self.log.last_index))
        if self.recovering and msg.commit >= msg.leader_commit > 0 and self.log.term(msg.commit) == self.term:
            # The leader knows this log matches its own through its whole commit index, at an
            # entry of its own term (so it covers every earlier term's commits): all of them are here.
            self.recovering = False
        self._send(sender, HeartbeatResponse(self.term, msg.round, self._synced))

    def _heard_from_leader(self, sender: str, now: float) -> None:
        if self.state != FOLLOWER:
            self._become_follower(self.term, sender, now)
        self.leader = sender
        self._heard_leader_at = now
        self._reset_election_deadline(now)

    def _handle_snapshot(self, sender: str, msg: InstallSnapshot, now: float) -> None:
        self._heard_from_leader(sender, now)
        index, term = msg.index, msg.snap_term
        log = self.log
        if index <= self.durable:
            self._send(sender, AppendResponse(self.term, self.durable, synced=self.durable))
            return
        if log.match_term(index, term):
            # The log already holds the snapshot's last entry: only the commit and durable indexes
            # move (a leader's snapshot never covers more than its durable index).
            self.commit = max(self.commit, index)
            self._durable_to(index)
            self._send(sender, AppendResponse(self.term, index, synced=min(self._synced, index)))
            return
        try:
            membership = Membership.from_wire(msg.config)
        except ConfigError:
            self._send(sender, AppendResponse(self.term, self.durable, synced=self.durable))
            return
        log.restore(index, term)
        self.commit = self.applied = index
        self._durable_to(index)
        self._rollback = False  # the state machine is loaded from the snapshot anyway
        self._configs = [(index, membership)]
        self._persisted = self._synced = index  # recovering until an append or heartbeat proves the leader's commit
        self._send(sender, AppendResponse(self.term, index, synced=index))

    # --- membership -----------------------------------------------------------------------------

    def _add_config(self, index: int, change: ConfigChange) -> None:
        """A config entry at ``index`` is in the log: its configuration is in effect from now on.

        A configuration differs from the one before it by one member at most (single-server
        changes, thesis §4.1): that is what makes every majority of the old one meet every
        majority of the new one.
        """
        before = self._configs[-1]
        assert index > before[0], f"config entry {index} does not follow the one at {before[0]}"
        after = change.result if change.result is not None else before[1].apply(change)
        changed = set(before[1].voters) ^ set(after.voters)
        # (A joiner starts knowing no configuration: its first config entry tells it the whole one.)
        assert len(changed) <= 1 or not before[1].voters, f"config entry {index} changes voters {sorted(changed)} at once"
        self._configs.append((index, after))

    def _note_changes(self, entries: list[Entry]) -> None:
        for payload, index, _ in entries:
            if payload[:1] == _CONFIG_BYTE:
                try:
                    change = decode_change(payload)
                except ConfigError:
                    continue  # a malformed change is a no-op (the leader never writes one)
                self._add_config(index, change)

    def _changes_cut_from(self, index: int) -> None:
        """Entries from ``index`` on left the log: so do the configurations they carried."""
        configs = self._configs
        while len(configs) > 1 and configs[-1][0] >= index:
            configs.pop()
        assert configs[-1][0] < index, f"a cut at {index} reaches the snapshot's configuration"

    def _applied_to(self, index: int) -> None:
        """The entries up to ``index`` are handed out for applying."""
        assert index <= self._apply_limit(), f"applying {index} beyond {self._apply_limit()}"
        self.applied = index

    def _membership_changed(self) -> None:
        """The leader's configuration changed (its own config entry): followers and quorum follow."""
        if self.state != LEADER:
            return
        membership = self.membership
        last = self.log.last_index
        for peer in membership.members:
            if peer != self.id and peer not in self.progress:
                self.progress[peer] = Progress(last + 1, not membership.is_voter(peer))
        # A member the change removed still gets the log until the change commits, so it learns
        # of its removal (it counts for nothing meanwhile).
        kept = set(self._configs[-2][1].members) if self.change_pending and len(self._configs) > 1 else set()
        for peer in list(self.progress):
            if peer not in membership.members and peer not in kept:
                del self.progress[peer]
            else:
                self.progress[peer].learner = not membership.is_voter(peer)
        self._maybe_commit()

    def _hand_over(self, now: float) -> None:
        """This leader is no voter of its committed configuration (it was elected holding its own
        removal): it tells the voter holding the most of its log to campaign at once (§T3.10), and
        steps down if that has not happened within the transfer timeout."""
        voters = [(pr.match, peer) for peer, pr in self.progress.items() if not pr.learner]
        if not voters:
            self._become_follower(self.term, None, now)
            return
        target = max(voters)[1]
        self.lead_transferee = target
        self._transfer_deadline = now + self.params.transfer_timeout_s
        pr = self.progress[target]
        if pr.match == self.log.last_index:
            self._send_timeout_now(target)
        else:
            self._send_append(target, pr)

    # --- sending -------------------------------------------------------------------------------

    def _send(self, peer: str, msg: Message) -> None:
        self._msgs.append((peer, msg))

    def _send_timeout_now(self, target: str) -> None:
        """Tell ``target`` to campaign now. Its transfer vote is granted during the others' leases,
        so from here on this leader's read lease does not hold in this term."""
        self._lease_void = True
        self._send(target, TimeoutNow(self.term))

    def __repr__(self) -> str:
        return f"RaftCore({self.id} {self.state} term={self.term} commit={self.commit} last={self.log.last_index})"
