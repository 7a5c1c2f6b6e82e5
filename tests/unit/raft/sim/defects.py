"""The defects of issue 29's findings 1-3, re-created on the real replica for the simulation to catch.

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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import google_crc32c

from shoal.node.raft import replica as replica_module
from shoal.node.raft.install import SnapshotSender
from shoal.node.raft.messages import SnapshotChunk
from shoal.node.raft.replica import PartitionReplica
from shoal.node.raft.snapshot_file import SnapshotCorrupt
from shoal.node.raft.snapshots import SnapshotFile, read_snapshot_meta
from shoal.node.state import PartitionEngine

__all__ = ["spinning_snapshot_sender", "commit_on_snapshot_chunk", "swallowed_snapshot_damage", "SPIN_MESSAGES"]

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

    def load_or_empty(io: Any, path: str) -> tuple[PartitionEngine, int, int, Any]:
        try:
            return real_load(io, path)
        except SnapshotCorrupt:
            index, term, membership = read_snapshot_meta(io, path)
            return PartitionEngine(0), index, term, membership

    real_load = replica_module.load_engine
    with _patched(replica_module, "verify_snapshot", verify_envelope), \
            _patched(replica_module, "load_engine", load_or_empty):
        yield
