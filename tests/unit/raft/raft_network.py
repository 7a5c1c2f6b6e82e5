"""An in-memory network of Raft cores for the golden scripts and table tests.

Each node is a :class:`~shoal.node.raft.core.RaftCore` over a
:class:`~shoal.node.raft.raft_log.MemoryStorage`; the network handles every Ready
as a replica would (hard state and entries "durable" at once, a snapshot request
turned into an :class:`~shoal.node.raft.messages.InstallSnapshot` of the leader's
applied state) and keeps the messages in flight until a script delivers them.
Time is a number the script moves; nothing here reads a clock or draws a
random number the seed did not decide.

The network checks what a replica must guarantee: a message leaves only once the
hard state it depends on is durable (a vote is stored before it is granted, a
candidate's own vote before it asks), and two snapshots of the same ``(index,
term)`` hold the same state.

A snapshot stream travels as one :class:`~shoal.node.raft.messages.InstallSnapshot`
(the whole verified file). The follower's side does what the replica does once a
file is complete: a snapshot its core does not want (an older term, or one it
already holds, :meth:`~shoal.node.raft.core.RaftCore.wants_snapshot`) is answered
with a ``SnapshotChunkAck`` "not wanted" and never installed; otherwise the ack
says "complete" and the core steps the InstallSnapshot. The ack reaching the
leader ends its stream (:meth:`~shoal.node.raft.core.RaftCore.snapshot_done`); a
stream that breaks (the InstallSnapshot or its ack lost, a crash) is reported to
the leader's core as failed, as the replica's stream timeout does. A crash and a
restart take the node's links down and up: the others' cores hear of it
(``peer_unreachable`` / ``peer_reachable``), as from the replica's transport.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shoal.node.raft.core import RaftCore, RaftParams, Ready
from shoal.node.raft.install import COMPLETE, NOT_WANTED
from shoal.node.raft.membership import ConfigChange, Membership, decode_change
from shoal.node.raft.messages import (ENTRY_CONFIG, ENTRY_NOOP, AppendEntries, AppendResponse, Heartbeat,
                                      HeartbeatResponse, InstallSnapshot, Message, RequestVote, SnapshotChunkAck,
                                      TimeoutNow, VoteResponse)
from shoal.node.raft.raft_log import MemoryStorage

__all__ = ["Cluster", "SimNode", "describe", "PARAMS"]

#: Fixed timing for scripts: elections after 1.0-2.0 s, heartbeats every 0.2 s.
PARAMS = RaftParams(heartbeat_s=0.2, election_min_s=1.0, election_max_s=2.0, inflight_max=4,
                    message_bytes_max=64, check_quorum_s=2.0, commit_announce_s=0.002, transfer_timeout_s=2.0)


@dataclass
class SimNode:
    """One member: its core, what is on its "disk", and what it applied."""

    id: str
    core: RaftCore
    storage: MemoryStorage
    #: The membership it started with (a snapshot's replaces it).
    bootstrap: Membership
    hard_state: tuple[int, str | None] = (0, None)
    applied: list[tuple[int, bytes]] = field(default_factory=list)
    #: The applied state a snapshot carries: (index, term, applied payloads, membership).
    snapshot: tuple[int, int, list[tuple[int, bytes]], Membership] | None = None
    up: bool = True
    #: Starts of this node (0 for the first): a restart is a new core with what was stored.
    incarnation: int = 0
    #: The last index of its storage that a power cut keeps (disk-class entries wait for a sync).
    synced: int = 0


def _payload_text(payload: bytes) -> str:
    if payload[:1] == bytes([ENTRY_NOOP]):
        return "noop"
    if payload[:1] == bytes([ENTRY_CONFIG]):
        change = decode_change(payload)
        return f"{change.kind}:{change.node}"
    return payload[1:].decode(errors="replace")


def describe(msg: Message) -> str:
    """One message as a script line shows it."""
    name = type(msg).__name__
    if isinstance(msg, AppendEntries):
        ents = " ".join(f"{i}/{t}:{_payload_text(p)}" for p, i, t in msg.entries)
        lazy = " lazy" if msg.lazy else ""
        return f"{name} term={msg.term} prev={msg.prev_index}/{msg.prev_term} commit={msg.commit} [{ents}]{lazy}"
    if isinstance(msg, AppendResponse):
        if msg.reject:
            return f"{name} term={msg.term} reject index={msg.index} hint={msg.hint_index}/{msg.hint_term}"
        return f"{name} term={msg.term} index={msg.index}"
    if isinstance(msg, RequestVote):
        flags = "".join((" pre" if msg.pre else "", " transfer" if msg.transfer else ""))
        return f"{name} term={msg.term} last={msg.last_index}/{msg.last_term}{flags}"
    if isinstance(msg, VoteResponse):
        return f"{name} term={msg.term} {'granted' if msg.granted else 'refused'}{' pre' if msg.pre else ''}"
    if isinstance(msg, Heartbeat):
        return f"{name} term={msg.term} commit={msg.commit}"
    if isinstance(msg, (HeartbeatResponse, TimeoutNow)):
        return f"{name} term={msg.term}"
    if isinstance(msg, InstallSnapshot):
        return f"{name} term={msg.term} index={msg.index}/{msg.snap_term} voters={msg.config[0]} learners={msg.config[1]}"
    if isinstance(msg, SnapshotChunkAck):
        status = {COMPLETE: "complete", NOT_WANTED: "not wanted"}.get(msg.status, str(msg.status))
        return f"{name} term={msg.term} index={msg.index} {status}"
    return repr(msg)


class Cluster:
    """Cores on an in-memory network with a script-controlled clock."""

    def __init__(self, ids: Iterable[str], *, voters: Iterable[str] | None = None, learners: Iterable[str] = (),
                 seed: int = 0, params: RaftParams = PARAMS) -> None:
        self.now = 0.0
        self.params = params
        self.seed = seed
        ids = list(ids)
        self.membership = Membership.of(list(voters) if voters is not None else ids, list(learners))
        self.nodes: dict[str, SimNode] = {}
        for i in ids:
            self.nodes[i] = self._new_node(i, self.membership)
        #: Messages sent and not yet delivered, in order.
        self.in_flight: list[tuple[str, str, Message]] = []
        #: (from, to) pairs whose messages are dropped.
        self.cut: set[tuple[str, str]] = set()
        #: Messages taken out of flight by a script (``hold``), delivered only once released.
        self.held: list[tuple[str, str, Message]] = []
        #: Messages sent that match one of these are held rather than put in flight.
        self.hold_filters: list[Callable[[tuple[str, str, Message]], bool]] = []
        #: Every snapshot taken, by (index, term): applied payloads and membership.
        self.snapshots: dict[tuple[int, int], tuple[list[tuple[int, bytes]], Membership]] = {}
        self.log: list[str] = []
        self.on_output: Callable[[str], None] = self.log.append
        self._processing: set[str] = set()

    def _new_node(self, node_id: str, membership: Membership, storage: MemoryStorage | None = None,
                  hard_state: tuple[int, str | None] = (0, None), snapshot: Any = None,
                  log_configs: list[tuple[int, ConfigChange]] | None = None,
                  recovering: bool = False) -> SimNode:
        storage = storage or MemoryStorage()
        rng = random.Random(f"{self.seed}/{node_id}")
        snap = (0, 0)
        applied: list[tuple[int, bytes]] = []
        bootstrap = membership
        if snapshot is not None:
            snap = (snapshot[0], snapshot[1])
            applied = list(snapshot[2])
            membership = snapshot[3]
        core = RaftCore(node_id, membership, storage, params=self.params, rng=rng, term=hard_state[0],
                        vote=hard_state[1], snapshot=snap, log_configs=log_configs, recovering=recovering,
                        now=self.now)
        return SimNode(node_id, core, storage, bootstrap, hard_state, applied, snapshot)

    def add_node(self, node_id: str) -> SimNode:
        """A new server with an empty log, to be added as a learner. It starts, as every member
        does, from the group's initial membership: the config entries of the log it receives
        (or the snapshot's membership) bring it up to date. (Replayed onto any other starting
        membership they give a wrong one: onto an empty one, a promoted learner believes it is
        the only voter and elects itself.)"""
        node = self.nodes[node_id] = self._new_node(node_id, self.membership)
        return node

    # --- driving --------------------------------------------------------------------------------

    def process(self, node: SimNode) -> None:
        """Handle every Ready of ``node`` as a replica would (a nested call folds into the running one)."""
        if node.id in self._processing:
            return
        self._processing.add(node.id)
        core = node.core
        try:
            while core.has_ready():
                rd = core.ready()
                self._handle(node, rd)
                core.advance(rd)
        finally:
            self._processing.discard(node.id)

    def _handle(self, node: SimNode, rd: Ready) -> None:
        core = node.core
        if rd.hard_state is not None:
            node.hard_state = (rd.hard_state.term, rd.hard_state.vote)
            self.on_output(f"{node.id} stores term={rd.hard_state.term} vote={rd.hard_state.vote}")
        if rd.snapshot is not None:
            index, term = rd.snapshot
            if (index, term) not in self.snapshots:
                raise AssertionError(f"{node.id} installs snapshot {index}/{term}, which nobody took")
            applied, membership = self.snapshots[(index, term)]
            node.storage.clear(index + 1)
            node.applied = list(applied)
            node.snapshot = (index, term, list(applied), membership)
            self.on_output(f"{node.id} installed snapshot {index}/{term}")
        elif rd.truncate_from is not None:
            node.storage.delete_from(rd.truncate_from)
            node.synced = min(node.synced, rd.truncate_from - 1)
        if rd.snapshot is not None:
            node.synced = rd.snapshot[0]
        if rd.rollback:
            node.applied = list(node.snapshot[2]) if node.snapshot else []
            self.on_output(f"{node.id} takes its state machine back to its snapshot "
                           f"({node.snapshot[0] if node.snapshot else 0})")
        if rd.entries:
            node.storage.append(rd.entries)
            last = rd.entries[-1][1]
            if not rd.lazy:
                node.synced = last  # synced before anything of this Ready leaves
            if core.is_leader:
                core.persisted(last, synced=not rd.lazy)
        for to, msg in rd.messages:
            self._check_durable(node, to, msg)
            self._send(node, to, msg)
        for payload, index, _ in rd.committed:
            if payload[:1] not in (bytes([ENTRY_NOOP]), bytes([ENTRY_CONFIG])):
                node.applied.append((index, payload))
        for peer, index, term in rd.snapshot_requests:
            self.on_output(f"{node.id} sends snapshot {index}/{term} to {peer}")
            snap = node.snapshot
            assert snap is not None and snap[0] == index, (node.id, index, snap)
            self._send(node, peer, InstallSnapshot(core.term, node.id, index, term, snap[3].to_wire()))

    def _check_durable(self, node: SimNode, to: str, msg: Message) -> None:
        """A message leaves only once the term and vote it speaks for are durable (Raft §5.1)."""
        term, vote = node.hard_state
        pre = isinstance(msg, (RequestVote, VoteResponse)) and msg.pre
        if not pre and msg.term > term:
            raise AssertionError(f"{node.id} sends {describe(msg)} with term {term} stored")
        if isinstance(msg, RequestVote) and not msg.pre and (term, vote) != (msg.term, node.id):
            raise AssertionError(f"{node.id} asks for votes with term={term} vote={vote} stored")
        if isinstance(msg, VoteResponse) and msg.granted and not msg.pre and (term, vote) != (msg.term, to):
            raise AssertionError(f"{node.id} grants its vote to {to} with term={term} vote={vote} stored")

    def _stream_failed(self, leader_id: str, peer: str) -> None:
        """A snapshot stream from ``leader_id`` to ``peer`` broke: the leader's core is told."""
        leader = self.nodes[leader_id]
        if not leader.up:
            return
        self.on_output(f"{leader_id} snapshot stream to {peer} failed")
        leader.core.snapshot_done(peer, False, self.now)
        self.process(leader)

    def _lost(self, sender: str, to: str, msg: Message) -> None:
        """A message in flight is lost (dropped, or its receiver is down or cut off)."""
        self.on_output(f"{sender}->{to} {describe(msg)} (dropped)")
        if isinstance(msg, InstallSnapshot):
            self._stream_failed(sender, to)
        elif isinstance(msg, SnapshotChunkAck):
            self._stream_failed(to, sender)

    def _step(self, node: SimNode, sender: str, msg: Message) -> None:
        """Hand ``msg`` to ``node`` as its replica would."""
        core = node.core
        if isinstance(msg, SnapshotChunkAck):
            core.snapshot_done(sender, msg.status == COMPLETE, self.now)
        elif isinstance(msg, InstallSnapshot):
            if msg.term < core.term or not core.wants_snapshot(msg.index, msg.snap_term):
                self._send(node, sender, SnapshotChunkAck(core.term, msg.index, 0, NOT_WANTED))
            else:
                self._send(node, sender, SnapshotChunkAck(core.term, msg.index, 0, COMPLETE))
                core.step(sender, msg, self.now)
        else:
            core.step(sender, msg, self.now)

    def _send(self, node: SimNode, to: str, msg: Message) -> None:
        item = (node.id, to, msg)
        if (node.id, to) in self.cut or not self.nodes.get(to, node).up:
            self._lost(node.id, to, msg)
        elif any(f(item) for f in self.hold_filters):
            self.held.append(item)
            self.on_output(f"{node.id}->{to} {describe(msg)} (held)")
        else:
            self.in_flight.append(item)

    def hold(self, match: Callable[[tuple[str, str, Message]], bool]) -> None:
        """Hold the messages in flight that ``match``, and those sent from now on, until :meth:`release`."""
        for item in [m for m in self.in_flight if match(m)]:
            self.in_flight.remove(item)
            self.held.append(item)
            self.on_output(f"{item[0]}->{item[1]} {describe(item[2])} (held)")
        self.hold_filters.append(match)

    def release(self, lose: bool = False) -> None:
        """Stop holding: the held messages go back in flight after the others (or are lost)."""
        held, self.held, self.hold_filters = self.held, [], []
        for sender, to, msg in held:
            if lose:
                self._lost(sender, to, msg)
            else:
                self.in_flight.append((sender, to, msg))
                self.on_output(f"{sender}->{to} {describe(msg)} (released)")

    def deliver(self, only_to: str | None = None, count: int | None = None) -> int:
        """Deliver messages in flight (to ``only_to`` if given), ``count`` at most; return how many."""
        done = 0
        while count is None or done < count:
            k = next((k for k, (_, to, _) in enumerate(self.in_flight) if only_to is None or to == only_to), None)
            if k is None:
                break
            self.deliver_at(k)
            done += 1
        return done

    def deliver_at(self, k: int) -> None:
        """Deliver the ``k``-th message in flight (lost if its receiver is down or cut off)."""
        sender, to, msg = self.in_flight.pop(k)
        node = self.nodes[to]
        if not node.up or (sender, to) in self.cut:
            self._lost(sender, to, msg)
            return
        self.on_output(f"{sender}->{to} {describe(msg)}")
        before = (node.core.state, node.core.term)
        self._step(node, sender, msg)
        self._note_state(node, before)
        self.process(node)

    def stabilize(self, rounds_max: int = 1000) -> None:
        """Deliver until nothing is in flight (bounded)."""
        for _ in range(rounds_max):
            for node in self.nodes.values():
                if node.up:
                    self.process(node)
            if not self.in_flight:
                return
            self.deliver(count=len(self.in_flight))
        raise AssertionError("the network did not settle")

    def tick(self, seconds: float) -> None:
        """Move the clock and tick every node that is up."""
        self.now = round(self.now + seconds, 6)
        for node in self.nodes.values():
            if node.up:
                before = (node.core.state, node.core.term)
                node.core.tick(self.now)
                self._note_state(node, before)
                self.process(node)

    def _note_state(self, node: SimNode, before: tuple[str, int]) -> None:
        after = (node.core.state, node.core.term)
        if after != before:
            self.on_output(f"{node.id} became {after[0]} at term {after[1]}")

    def campaign(self, node_id: str) -> None:
        """Make ``node_id``'s election deadline pass now."""
        node = self.nodes[node_id]
        node.core._election_deadline = self.now  # noqa: SLF001 (scripts force an election)
        before = (node.core.state, node.core.term)
        node.core.tick(self.now)
        self._note_state(node, before)
        self.process(node)

    def propose(self, node_id: str, text: str, lazy: bool = False) -> int:
        node = self.nodes[node_id]
        index = node.core.propose(b"\0" + text.encode(), self.now, lazy=lazy)
        self.process(node)
        return index

    def take_snapshot(self, node_id: str) -> tuple[int, int]:
        """Snapshot ``node_id``'s applied state and compact its log to it."""
        node = self.nodes[node_id]
        core = node.core
        index = core.applied
        term = core.log.term(index) or 0
        membership = core.membership_at(index)
        node.snapshot = (index, term, list(node.applied), membership)
        state = (list(node.applied), membership)
        known = self.snapshots.setdefault((index, term), state)
        if known != state:
            raise AssertionError(f"{node_id}'s snapshot at {index}/{term} differs from another node's: "
                                 f"{state} != {known}")
        core.compacted(index, term)
        node.storage.delete_to(index + 1)
        return index, term

    def sync(self, node_id: str) -> None:
        """``node_id``'s periodic sync: its disk-class entries are on stable storage now."""
        node = self.nodes[node_id]
        node.synced = node.storage.last_index
        node.core.synced_to(node.synced)
        self.process(node)

    def crash(self, node_id: str, power_cut: bool = False) -> None:
        """Stop ``node_id``: its in-memory state is gone, its storage stays (with ``power_cut``,
        without the entries no sync made durable)."""
        node = self.nodes[node_id]
        node.up = False
        if power_cut and node.storage.last_index > node.synced:
            node.storage.delete_from(node.synced + 1)
        # Messages to it are lost (a stream to it breaks); so are its own snapshot streams.
        lost = [m for m in self.in_flight if m[1] == node_id]
        self.in_flight = [m for m in self.in_flight
                          if m[1] != node_id and not (m[0] == node_id and isinstance(m[2], InstallSnapshot))]
        for sender, to, msg in lost:
            self._lost(sender, to, msg)
        self._links(node_id, up=False)

    def _links(self, node_id: str, up: bool) -> None:
        """The others' links to ``node_id`` went down or came up (a process stopped or started):
        their cores are told, as the replica's transport tells them."""
        for other in self.nodes.values():
            if other.id != node_id and other.up:
                if up:
                    other.core.peer_reachable(node_id)
                else:
                    other.core.peer_unreachable(node_id)
                self.process(other)

    def drop(self, to: str | None = None) -> None:
        """Lose the messages in flight (to ``to`` only, if given)."""
        lost = [m for m in self.in_flight if to is None or m[1] == to]
        self.in_flight = [m for m in self.in_flight if to is not None and m[1] != to]
        for sender, dest, msg in lost:
            self._lost(sender, dest, msg)

    def drop_at(self, k: int) -> None:
        """Lose the ``k``-th message in flight."""
        sender, dest, msg = self.in_flight.pop(k)
        self._lost(sender, dest, msg)

    def restart(self, node_id: str, lose_log: bool = False) -> None:
        """Start ``node_id`` again from what it stored (hard state, log, snapshot), as the replica does.

        ``lose_log``: its log and snapshot were damaged and discarded, as the replica's repair does
        (term and vote are kept); the core starts *recovering*.
        """
        old = self.nodes[node_id]
        if lose_log:
            node = self._new_node(node_id, old.bootstrap, MemoryStorage(), old.hard_state, recovering=True)
            node.incarnation = old.incarnation + 1
            self.nodes[node_id] = node
            self.on_output(f"{node_id} restarted at term {node.core.term} vote={node.core.vote} with its log lost")
            self._links(node_id, up=True)
            return
        # Config entries of the log after the snapshot take effect again when applied.
        first = (old.snapshot[0] if old.snapshot else 0) + 1
        st = old.storage
        changes = [(index, decode_change(payload))
                   for payload, index, _ in st.entries(max(first, st.first_index), st.last_index + 1)
                   if payload[:1] == bytes([ENTRY_CONFIG])]
        node = self._new_node(node_id, old.bootstrap, st, old.hard_state, old.snapshot, changes)
        node.incarnation = old.incarnation + 1
        self.nodes[node_id] = node
        self.on_output(f"{node_id} restarted at term {node.core.term} vote={node.core.vote} "
                       f"(log {storage_span(st)})")
        self._links(node_id, up=True)


def storage_span(storage: MemoryStorage) -> str:
    return f"{storage.first_index}..{storage.last_index}"
