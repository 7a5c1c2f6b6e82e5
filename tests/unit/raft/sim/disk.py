"""Disks of simulated nodes: a snapshotter without fork, and damage to journal and snapshot files.

:class:`SimSnapshotter` has :class:`~shoal.node.raft.snapshots.ForkSnapshotter`'s interface
(``start``/``poll``/``cancel``/``in_progress``/``stats``/``on_slot``/``waiting``). Where the
real one forks a child that writes the application's state as it was at the fork, this one
serialises the state at :meth:`~SimSnapshotter.start` (the same instant) and writes the file through
:func:`~shoal.node.raft.snapshot_file.write_snapshot` on the node's
:class:`~shoal.node.raft._io.SimIO` when a drawn duration has passed, so a snapshot can
be cancelled, overtaken by one from the leader, or lost to a crash while it "runs".

:func:`damage` picks a journal segment or the snapshot of a stopped node and flips bits in
it or cuts it short (:meth:`SimIO.flip_bits`, :meth:`SimIO.cut_file`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable
from typing import Any

from shoal.node.raft._io import SimIO
from shoal.node.raft.journal import SEGMENT_HEADER_BYTES, SyncMark, read_sync_mark
from shoal.node.raft.membership import Membership
from shoal.node.raft.snapshot_file import SnapshotCorrupt, write_snapshot
from shoal.node.raft.snapshots import SnapshotFile, SnapshotSettings, snapshot_content, verify_snapshot

__all__ = ["SimSnapshotter", "damage", "Damage"]

#: How long a simulated snapshot child runs (seconds).
SNAPSHOT_DURATION_MIN_S = 0.01
SNAPSHOT_DURATION_MAX_S = 0.5
RETRY_S = 1.0


class SimSnapshotter:
    """Writes one partition's snapshots on the simulated disk (see the module docstring)."""

    def __init__(self, path: str, partition: int, io: Any, settings: SnapshotSettings,
                 clock: Callable[[], float], rng: random.Random) -> None:
        self.path = path
        self.partition = partition
        self._io = io
        self.settings = settings
        self._clock = clock
        self._rng = rng
        self._job: tuple[int, int, list[bytes], float] | None = None
        self._retry_at = 0.0
        self.on_slot: Callable[[], None] | None = None
        self.waiting = False
        self.written = 0
        self.failed = 0

    @property
    def in_progress(self) -> bool:
        return self._job is not None

    def stats(self) -> dict[str, object]:
        return {"written": self.written, "failed": self.failed, "inProgress": self.in_progress}

    def start(self, state: Callable[..., Iterable[bytes]], index: int, term: int, membership: Membership,
              prepare: Callable[[], str | None] | None = None) -> bool:
        if self._job is not None or self._clock() < self._retry_at:
            return False
        files = prepare() if prepare is not None else None
        name = files.rsplit("/", 1)[-1] if files is not None else None
        chunks = list(snapshot_content(index, term, membership, state(files) if prepare is not None else state(),
                                       name))
        done_at = self._clock() + self._rng.uniform(SNAPSHOT_DURATION_MIN_S, SNAPSHOT_DURATION_MAX_S)
        self._job = (index, term, chunks, done_at)
        return True

    def poll(self) -> SnapshotFile | None:
        job = self._job
        if job is None or self._clock() < job[3]:
            return None
        self._job = None
        index, term, chunks, _ = job
        try:
            write_snapshot(self._io, self.path, index, term, chunks)
            snap = verify_snapshot(self._io, self.path)
        except (OSError, SnapshotCorrupt):
            self.failed += 1
            self._retry_at = self._clock() + RETRY_S
            return None
        self.written += 1
        return snap

    def cancel(self) -> None:
        self._job = None


class Damage:
    """What :func:`damage` did, for the run's trace and the refusal check."""

    def __init__(self, path: str, kind: str, offset: int) -> None:
        self.path = path
        self.kind = kind
        self.offset = offset

    def __repr__(self) -> str:
        return f"{self.kind} {self.path} at {self.offset}"


def damage(io: SimIO, data_dir: str, partition: int, rng: random.Random, *,
           synced: SyncMark | None = None) -> Damage | None:
    """Flip bits in, or cut short, one journal segment or the snapshot of a stopped node.

    Only damage a replica can tell from a power cut's is chosen: the snapshot, or a journal
    segment past its header (a segment header torn by a power cut is rewritten, by design).
    The last segment only with ``synced``, the journal's synced mark as its syncs reported it
    before the node stopped, and only in the bytes that mark names (see :func:`_reported`):
    the journal must refuse or restore a flip in any of them, and refuse a cut within the
    bytes its ``synced`` file names (a cut past them is what the journal leaves unprotected).
    Past them is the unsynced tail, where damage is a torn tail to the journal by design.
    """
    journal_dir = os.path.join(data_dir, f"p{partition}.raft")
    segments = sorted(os.path.join(journal_dir, n) for n in io.listdir(journal_dir) if n.endswith(".wal"))
    #: path -> the end of the bytes that may be flipped or cut away
    reach = {p: _size(io, p) for p in segments[:-1]}
    if synced is not None and segments:
        reach[segments[-1]] = _reported(io, segments[-1], synced)
    snapshot = os.path.join(data_dir, f"p{partition}.snap")
    candidates = [p for p in reach if reach[p] > SEGMENT_HEADER_BYTES]
    if io.exists(snapshot):
        candidates.append(snapshot)
        reach[snapshot] = _size(io, snapshot)
    if not candidates:
        return None
    path = rng.choice(candidates)
    low = SEGMENT_HEADER_BYTES if path.endswith(".wal") else 0
    offset = rng.randrange(low, reach[path])
    flip = rng.random() < 0.7
    if not flip and segments and path == segments[-1] and synced is not None:
        # A file cut short takes every record past the cut with it, so only a ``synced`` file
        # naming bytes past the cut tells it from a torn write (the journal's docstring, "What
        # is left"): the cut falls in what the file names, or the damage is a flip there.
        named = _named_on_disk(io, journal_dir, path)
        if named > low:
            offset = low + (offset - low) * (named - low) // (reach[path] - low)
        else:
            flip = True
    if flip:
        io.flip_bits(path, offset, 1 << rng.randrange(8))
        return Damage(path, "flip", offset)
    io.cut_file(path, offset)
    return Damage(path, "cut", offset)


def _named_on_disk(io: SimIO, journal_dir: str, path: str) -> int:
    """The end of the bytes of the last segment ``path`` its ``synced`` file names now."""
    mark = read_sync_mark(io, journal_dir)
    return SEGMENT_HEADER_BYTES if mark is None else _reported(io, path, mark)


def _reported(io: SimIO, path: str, synced: SyncMark) -> int:
    """The end of the bytes of the last segment ``path`` that ``synced`` reported durable.

    Taken from the journal as it ran, not from the disk: a mark that did not reach stable
    storage before a power cut would let recovery take damage to reported bytes for a torn
    tail, and the run's checkers see what that costs.
    """
    first = int(os.path.basename(path)[:-4])
    if synced.segment == first:
        return min(synced.offset, _size(io, path))
    # A mark naming a later segment: that one is gone, and all of this one was synced.
    return _size(io, path) if synced.segment > first else SEGMENT_HEADER_BYTES


def _size(io: SimIO, path: str) -> int:
    handle = io.open(path, create=False)
    try:
        return handle.size
    finally:
        handle.close()
