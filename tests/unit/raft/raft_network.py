"""An in-memory network of Raft cores for the golden scripts and table tests.

Each node is a :class:`~shoal.node.raft.core.RaftCore` over a
:class:`~shoal.node.raft.raft_log.MemoryStorage`; the network handles every Ready
as a replica would (hard state and entries "durable" at once, a snapshot request
turned into an :class:`~shoal.node.raft.messages.InstallSnapshot` of the leader's
applied state) and keeps the messages in flight until a script delivers them.
Time is a number the script moves; nothing here reads a clock or draws a
random number the seed did not decide.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shoal.node.raft.core import RaftCore, RaftParams, Ready
from shoal.node.raft.membership import Membership, decode_change
from shoal.node.raft.messages import (ENTRY_CONFIG, ENTRY_NOOP, AppendEntries, AppendResponse, Heartbeat,
                                      HeartbeatResponse, InstallSnapshot, Message, RequestVote, TimeoutNow,
                                      VoteResponse)
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
    hard_state: tuple[int, str | None] = (0, None)
    applied: list[tuple[int, bytes]] = field(default_factory=list)
    #: The applied state a snapshot carries: (index, term, applied payloads, membership).
    snapshot: tuple[int, int, list[tuple[int, bytes]], Membership] | None = None
    up: bool = True


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
        self.log: list[str] = []
        self.on_output: Callable[[str], None] = self.log.append

    def _new_node(self, node_id: str, membership: Membership, storage: MemoryStorage | None = None,
                  hard_state: tuple[int, str | None] = (0, None), commit: int = 0,
                  snapshot: Any = None) -> SimNode:
        storage = storage or MemoryStorage()
        rng = random.Random(f"{self.seed}/{node_id}")
        snap = (0, 0)
        applied: list[tuple[int, bytes]] = []
        if snapshot is not None:
            snap = (snapshot[0], snapshot[1])
            applied = list(snapshot[2])
            membership = snapshot[3]
        core = RaftCore(node_id, membership, storage, params=self.params, rng=rng, term=hard_state[0],
                        vote=hard_state[1], commit=commit, snapshot=snap, now=self.now)
        return SimNode(node_id, core, storage, hard_state, applied, snapshot)

    def add_node(self, node_id: str) -> SimNode:
        """A new, empty member that knows no membership yet (it learns it from the leader)."""
        node = self.nodes[node_id] = self._new_node(node_id, Membership.of([]))
        return node

    # --- driving --------------------------------------------------------------------------------

    def process(self, node: SimNode) -> None:
        """Handle every Ready of ``node`` as a replica would."""
        core = node.core
        while core.has_ready():
            rd = core.ready()
            self._handle(node, rd)
            core.advance(rd)

    def _handle(self, node: SimNode, rd: Ready) -> None:
        core = node.core
        if rd.hard_state is not None:
            node.hard_state = (rd.hard_state.term, rd.hard_state.vote)
        if rd.snapshot is not None:
            index, term = rd.snapshot
            leader = self.nodes.get(core.leader or "")
            snap = leader.snapshot if leader is not None else None
            if snap is None or snap[0] != index:
                raise AssertionError(f"{node.id} installs snapshot {index} its leader does not have")
            node.storage.clear(index + 1)
            node.applied = list(snap[2])
            node.snapshot = snap
            self.on_output(f"{node.id} installed snapshot {index}/{term}")
        elif rd.truncate_from is not None:
            node.storage.delete_from(rd.truncate_from)
        if rd.entries:
            node.storage.append(rd.entries)
            if core.is_leader:
                core.persisted(rd.entries[-1][1])
        for to, msg in rd.messages:
            if (node.id, to) in self.cut or not self.nodes.get(to, node).up:
                self.on_output(f"{node.id}->{to} {describe(msg)} (dropped)")
                continue
            self.in_flight.append((node.id, to, msg))
        for payload, index, _ in rd.committed:
            if payload[:1] not in (bytes([ENTRY_NOOP]), bytes([ENTRY_CONFIG])):
                node.applied.append((index, payload))
        for peer, index, term in rd.snapshot_requests:
            self.on_output(f"{node.id} sends snapshot {index}/{term} to {peer}")
            snap = node.snapshot
            assert snap is not None and snap[0] == index, (node.id, index, snap)
            if (node.id, peer) in self.cut or not self.nodes[peer].up:
                core.snapshot_done(peer, False, self.now)
                continue
            self.in_flight.append((node.id, peer, InstallSnapshot(core.term, node.id, index, term,
                                                                   snap[3].to_wire())))

    def deliver(self, only_to: str | None = None, count: int | None = None) -> int:
        """Deliver messages in flight (to ``only_to`` if given), ``count`` at most; return how many."""
        done = 0
        while count is None or done < count:
            k = next((k for k, (_, to, _) in enumerate(self.in_flight) if only_to is None or to == only_to), None)
            if k is None:
                break
            sender, to, msg = self.in_flight.pop(k)
            node = self.nodes[to]
            done += 1
            if not node.up or (sender, to) in self.cut:
                self.on_output(f"{sender}->{to} {describe(msg)} (dropped)")
                continue
            self.on_output(f"{sender}->{to} {describe(msg)}")
            before = (node.core.state, node.core.term)
            node.core.step(sender, msg, self.now)
            self._note_state(node, before)
            self.process(node)
        return done

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

    def propose(self, node_id: str, text: str) -> int:
        node = self.nodes[node_id]
        index = node.core.propose(b"\0" + text.encode(), self.now)
        self.process(node)
        return index

    def take_snapshot(self, node_id: str) -> tuple[int, int]:
        """Snapshot ``node_id``'s applied state and compact its log to it."""
        node = self.nodes[node_id]
        core = node.core
        index = core.applied
        term = core.log.term(index) or 0
        node.snapshot = (index, term, list(node.applied), core.membership)
        core.compacted(index, term)
        node.storage.delete_to(index + 1)
        return index, term

    def crash(self, node_id: str) -> None:
        """Stop ``node_id``: its in-memory state is gone, its storage stays."""
        node = self.nodes[node_id]
        node.up = False
        self.in_flight = [m for m in self.in_flight if m[1] != node_id]

    def restart(self, node_id: str) -> None:
        """Start ``node_id`` again from what it stored (hard state, log, snapshot)."""
        old = self.nodes[node_id]
        membership = old.snapshot[3] if old.snapshot else self.membership
        node = self._new_node(node_id, membership, old.storage, old.hard_state, 0, old.snapshot)
        # Config entries of the log after the snapshot take effect again when applied.
        first = (old.snapshot[0] if old.snapshot else 0) + 1
        changes = []
        for payload, index, _ in old.storage.entries(max(first, old.storage.first_index), old.storage.last_index + 1):
            if payload[:1] == bytes([ENTRY_CONFIG]):
                changes.append((index, decode_change(payload)))
        node.core._pending_changes = changes  # noqa: SLF001 (the replica passes them to the constructor)
        self.nodes[node_id] = node
        self.on_output(f"{node_id} restarted at term {node.core.term} (log {storage_span(old.storage)})")


def storage_span(storage: MemoryStorage) -> str:
    return f"{storage.first_index}..{storage.last_index}"
