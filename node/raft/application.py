"""What a replica knows of the state machine it replicates: the application protocol.

A :class:`~.replica.PartitionReplica` orders opaque batches of commands into its log and
hands every committed data entry back to its :class:`Application`; it never looks inside a
command or the state. The application turns a batch into an entry's payload, applies
committed payloads, and writes and loads its state for snapshots. Which entries may be
written in the disk class, and which commands are refused while the disk is nearly full, is
decided above the replica (:meth:`shoal.node.partition.Partition.propose`). Shoal's queue
engine implements the protocol in :class:`shoal.node.partition.PartitionMachine`.

Everything but :meth:`Application.load_snapshot` and the iterator of
:meth:`Application.snapshot_chunks` runs on the node's event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

__all__ = ["Application"]


class Application(Protocol):
    """A deterministic state machine driven by a replica: the same committed entries applied in
    the same order give the same state on every replica."""

    def encode(self, now_ms: int, commands: list[Any]) -> bytes:
        """The payload of one data entry holding ``commands`` stamped with the leader's clock
        ``now_ms``; its first byte is :data:`~.messages.ENTRY_DATA`."""
        ...

    def apply(self, payload: bytes, term: int, *, leading: bool, replies: bool) -> list[Any]:
        """Apply a committed data entry (of ``term``); one result per command, in order (a reply,
        or the error that command met: each command is atomic).

        ``leading``: this replica leads its group now; ``replies``: someone here waits for the
        results (when neither, a result may be a placeholder)."""
        ...

    def link_snapshot_files(self, directory: str) -> bool:
        """Hard-link the files the state keeps its bulk in into ``directory`` (made afresh), on
        the loop right before a snapshot's fork; False when there are none (the snapshot then
        carries everything)."""
        ...

    def snapshot_chunks(self, files: str | None = None) -> Iterable[bytes]:
        """The state as snapshot content, in chunks of bounded size (called in a forked child
        holding a copy-on-write image of the state at the applied index). ``files``: the
        directory :meth:`link_snapshot_files` filled for this snapshot, whose files the content
        may refer to (the child syncs them, and a peer is sent them beside the snapshot);
        None: the content carries everything (for a peer that takes no files)."""
        ...

    def load_snapshot(self, chunks: Iterator[bytes], files: str | None = None) -> object:
        """A new state read from snapshot content (in a worker thread: the live state is not
        touched), with the directory of files it refers to; raises on content it cannot read."""
        ...

    def install(self, state: object) -> None:
        """Replace the live state by one :meth:`load_snapshot` returned (on the loop)."""
        ...

    def reset(self) -> None:
        """Go back to the empty state (a log replayed from its first entry follows)."""
        ...

    def describe(self) -> str:
        """A few words on the size of the state, for the log."""
        ...

    def snapshot_failed(self, message: str) -> None:
        """A snapshot of the state could not be written; ``message`` is the forked child's error
        (what :meth:`snapshot_chunks` raised there, a file it could not read, say)."""
        ...
