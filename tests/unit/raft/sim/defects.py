"""Defects the simulation must catch, re-created on the real code: issue 29's findings 1-3 and
issue 41's findings 1-7.

Each is a context manager that patches the real code with the old behaviour for the
duration of a run (and restores it), so a test can show that the simulation's checkers
fail on that defect, by seed:

1. :func:`spinning_snapshot_sender` — pysyncobj's ``__sendAppendEntries`` looped for
   ``appendEntriesPeriod`` while its snapshot transmission had nothing to hand out (a
   child still writing, or the burst used up), sending a message with nothing in it each
   time round: 117,860 of them in one 200 ms call. Here each pump of a snapshot stream
   sends :data:`SPIN_MESSAGES` empty chunks besides what it should.
2. :func:`commit_on_snapshot_chunk` — a snapshot piece went to pysyncobj, which set the
   follower's commit index to ``min(leaderCommit, lastLogIndex)``: a deposed leader
   holding uncommitted entries of its own term committed and applied them on the first
   piece. Here the first chunk of a stream moves the commit index to
   ``min(snapshot index, last log index)`` (the leader's commit index is at least the
   snapshot's), and the entries are applied.
3. :func:`swallowed_snapshot_damage` — start-up checked a snapshot's header and trailer
   only, and a content checksum failure at load was swallowed by a bare ``except``: the
   replica ran on an empty engine, and as a leader sent its damaged file on. Here the
   start-up check leaves out the content checksum (the whole-file checksum the leader
   streams is computed over the damaged bytes, so followers accept them) and a failed
   load leaves the empty engine in place.

Issue 41's, each the behaviour before its fix:

- :func:`configs_of_the_commit_hint` (finding 1): a restarted replica's configuration is the
  one its commit hint (stored every few seconds) covers, not the newest of its log;
- :func:`extended_transfers` (finding 2): asking again for a transfer under way moves its
  deadline, any voter is a target (a paused one too), and a failed one is retried at once;
- :func:`reads_without_lease` (finding 3): a leader answers reads from its applied state
  whenever it has applied an entry of its term, with no lease and no ReadIndex round;
- :func:`disk_class_as_durable` (finding 4): a committed disk-class entry counts as durable
  at once (followers apply it and never cut it, snapshots and hints cover it);
- :func:`repeated_tokens` (finding 5): lease tokens restart from the same numbers after a
  restart that lost a take;
- :func:`unprotected_last_batch` (finding 6): a sync writes no copy of its batch and the
  synced mark without a flush, so damage to the newest synced batch passes for a torn tail;
- :func:`loading_replicas_lead` (finding 7): a replica loading its snapshot campaigns and
  obeys TimeoutNow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import google_crc32c

from shoal.node.raft import replica as replica_module
from shoal.node.raft.core import LEADER, ProposalRefused, RaftCore
from shoal.node.state._pull import PullOps
from shoal.node.raft.install import SnapshotSender
from shoal.node.raft.journal import Journal
from shoal.node.raft.messages import SnapshotChunk
from shoal.node.raft.replica import PartitionReplica
from shoal.node.raft.snapshot_file import SnapshotCorrupt
from shoal.node.raft.snapshots import SnapshotFile, read_snapshot_meta
from shoal.node.state import PartitionEngine

__all__ = ["spinning_snapshot_sender", "commit_on_snapshot_chunk", "swallowed_snapshot_damage", "SPIN_MESSAGES",
           "configs_of_the_commit_hint", "extended_transfers", "reads_without_lease", "disk_class_as_durable",
           "repeated_tokens", "unprotected_last_batch", "loading_replicas_lead", "ISSUE_41"]

#: Empty messages one pump of the spinning sender adds (far fewer than pysyncobj's ~100,000).
SPIN_MESSAGES = 1000


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def spinning_snapshot_sender() -> contextlib.AbstractContextManager[None]:
    """Finding 1: a snapshot stream that spins, sending empty messages while it waits."""
    real = SnapshotSender.pump

    def pump(self: SnapshotSender, now: float) -> float | None:
        wait = real(self, now)
        if not self.done:
            for _ in range(SPIN_MESSAGES):
                self._send(self.peer, self._chunk(self.sent, b""))
        return wait

    return _patched(SnapshotSender, "pump", pump)


def commit_on_snapshot_chunk() -> contextlib.AbstractContextManager[None]:
    """Finding 2: the first chunk of a snapshot moves the commit index over unchecked entries."""
    real = PartitionReplica._on_chunk

    def on_chunk(self: PartitionReplica, peer: str, chunk: SnapshotChunk) -> None:
        core = self.core
        if chunk.term >= core.term and not chunk.data:
            core.commit = max(core.commit, min(chunk.index, core.log.last_index))
            core.durable = max(core.durable, core.commit)  # pysyncobj knew no other bound
        real(self, peer, chunk)
        self._process()

    return _patched(PartitionReplica, "_on_chunk", on_chunk)


@contextlib.contextmanager
def swallowed_snapshot_damage() -> Iterator[None]:
    """Finding 3: a snapshot damaged in its body passes the start-up check and loads as empty."""

    def verify_envelope(io: Any, path: str) -> SnapshotFile:
        index, term, membership = read_snapshot_meta(io, path)  # header, trailer and metadata only
        data = io.read_all(path)
        return SnapshotFile(path, index, term, membership, len(data), google_crc32c.value(data))

    def load_or_empty(io: Any, path: str, restore: Any) -> tuple[PartitionEngine, int, int, Any]:
        try:
            return real_load(io, path, restore)
        except SnapshotCorrupt:
            index, term, membership = read_snapshot_meta(io, path)
            return PartitionEngine(0), index, term, membership

    real_load = replica_module.load_snapshot
    with _patched(replica_module, "verify_snapshot", verify_envelope), \
            _patched(replica_module, "load_snapshot", load_or_empty):
        yield


def configs_of_the_commit_hint() -> contextlib.AbstractContextManager[None]:
    """Issue 41, finding 1: a restarted replica takes only the config entries its (stale)
    commit hint covers; those after it took effect only when applied, as before the fix."""
    real = RaftCore.__init__

    def init(self: RaftCore, *args: Any, **kwargs: Any) -> None:
        commit = kwargs.get("commit", 0)
        kwargs["log_configs"] = [(i, c) for i, c in kwargs.get("log_configs") or [] if i <= commit]
        real(self, *args, **kwargs)

    return _patched(RaftCore, "__init__", init)


def extended_transfers() -> contextlib.AbstractContextManager[None]:
    """Issue 41, finding 2: every request moves a transfer's deadline, to any voter, at once."""

    def transfer(self: RaftCore, target: str, now: float) -> None:
        if self.state != LEADER or target == self.id:
            return
        if not self.membership.is_voter(target) or target not in self.progress:
            raise ProposalRefused(f"{target} is not a voter of this group")
        self.lead_transferee = target
        self._transfer_deadline = now + self.params.transfer_timeout_s
        pr = self.progress[target]
        if pr.match == self.log.last_index:
            self._send_timeout_now(target)
        else:
            self._send_append(target, pr)

    def failed(self: RaftCore, now: float) -> None:
        self.lead_transferee = None

    def replica_transfer(self: PartitionReplica, node_id: str | None = None, *,
                         among: list[str] | None = None) -> bool:
        core = self.core
        if not core.is_leader:
            return False
        caught_up = [(pr.match, p) for p, pr in core.progress.items()
                     if core.membership.is_voter(p) and self.peer_connected(p) and pr.match >= core.commit]
        if node_id is None and among:
            node_id = among[0]  # the move step's first target voter, live or not
        if node_id is None:
            if not caught_up:
                return False
            node_id = max(caught_up)[1]
        elif node_id not in {p for _, p in caught_up}:
            return False
        try:
            core.transfer_leadership(node_id, self._clock())
        except ProposalRefused:
            return False
        self._process()
        return True

    @contextlib.contextmanager
    def all_three() -> Iterator[None]:
        with _patched(RaftCore, "transfer_leadership", transfer), _patched(RaftCore, "_transfer_failed", failed), \
                _patched(PartitionReplica, "transfer_leadership", replica_transfer):
            yield

    return all_three()


def reads_without_lease() -> contextlib.AbstractContextManager[None]:
    """Issue 41, finding 3: reads served from the applied state of any leader that applied its term's first entry."""
    return _patched(PartitionReplica, "lease_held", lambda self: self.read_ready())


def disk_class_as_durable() -> contextlib.AbstractContextManager[None]:
    """Issue 41, finding 4: the commit index is taken for the durable index, disk class or not."""
    real_step, real_persisted, real_tick = RaftCore.step, RaftCore.persisted, RaftCore.tick

    def durable_is_commit(self: RaftCore) -> None:
        if self.durable < self.commit:
            self.durable = self.commit

    def step(self: RaftCore, *args: Any, **kwargs: Any) -> None:
        real_step(self, *args, **kwargs)
        durable_is_commit(self)

    def persisted(self: RaftCore, *args: Any, **kwargs: Any) -> None:
        real_persisted(self, *args, **kwargs)
        durable_is_commit(self)

    def tick(self: RaftCore, *args: Any, **kwargs: Any) -> None:
        real_tick(self, *args, **kwargs)
        durable_is_commit(self)

    @contextlib.contextmanager
    def all_three() -> Iterator[None]:
        with _patched(RaftCore, "step", step), _patched(RaftCore, "persisted", persisted), \
                _patched(RaftCore, "tick", tick):
            yield

    return all_three()


def repeated_tokens() -> contextlib.AbstractContextManager[None]:
    """Issue 41, finding 5: lease numbers ignore the term of the entry that takes the job."""
    return _patched(PullOps, "enter_term", lambda self, term: None)


@contextlib.contextmanager
def unprotected_last_batch() -> Iterator[None]:
    """Issue 41, finding 6: no copy of a synced batch, and the synced mark a plain write."""
    real_write_mark = Journal._write_mark

    def plain_write(self: Journal, mark: Any, *, durable: bool = True) -> None:
        real_write_mark(self, mark, durable=False)

    with _patched(Journal, "_write_copy", lambda self, seg, active, *, zeros_ahead: False), \
            _patched(Journal, "_write_mark", plain_write):
        yield


def loading_replicas_lead() -> contextlib.AbstractContextManager[None]:
    """Issue 41, finding 7: a replica loading its snapshot campaigns and obeys TimeoutNow."""

    def can_campaign(self: RaftCore) -> bool:
        return (self.membership.is_voter(self.id) or self._removal_pending()) and not self.recovering \
            and self.state != LEADER

    return _patched(RaftCore, "_can_campaign", can_campaign)


#: Issue 41's defects by finding number.
ISSUE_41 = {1: configs_of_the_commit_hint, 2: extended_transfers, 3: reads_without_lease, 4: disk_class_as_durable,
            5: repeated_tokens, 6: unprotected_last_batch, 7: loading_replicas_lead}
