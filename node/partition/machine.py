"""One partition's queue engine as the application its Raft replica replicates.

:class:`PartitionMachine` implements :class:`~shoal.node.raft.application.Application` for
:class:`~shoal.node.state.PartitionEngine`: the replica hands it committed batches, asks it
for the durability class of a batch and for the commands that take space, and has it write
and load snapshot content. It holds what the engine's applies produce for the node: the job
events of a leader's applies (until the node takes them) and the read-only
:class:`~.view.PartitionView` the edge reads the partition through.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from shoal.cluster.commands import SPACE_TAKING_COMMANDS as COMMAND_TABLE_SPACE_TAKING
from shoal.cluster.errors import CommandError, ErrorCode

from ..heap import trim_soon
from ..raft._io import FileIO
from ..raft.membership import Membership
from .payload_files import FileSpace, PayloadFiles
from ..raft.snapshots import load_snapshot, snapshot_content
from ..state import EVENTS_MAX, ChunkReader, Command, Event, PartitionEngine, PayloadSpace, command_name
from .log_format import decode_batch, encode_batch
from .view import PartitionView

__all__ = ["PartitionMachine", "SPACE_TAKING_COMMANDS", "SNAPSHOT_JOBS_PER_CHUNK", "FILES_TAG", "snapshot_chunks",
           "load_engine", "restore_engine"]

log = logging.getLogger(__name__)

#: Commands that bring new data into a partition: refused with NO_SPACE while free space is low
#: (the command table's, and ``PushRun``: the engine's form of PUSHes merged by the group commit).
SPACE_TAKING_COMMANDS = COMMAND_TABLE_SPACE_TAKING | {"PushRun"}
#: A snapshot child packs and writes this many jobs at a time (~1.5 MB of ~117-byte jobs).
SNAPSHOT_JOBS_PER_CHUNK = 10_000
#: First byte of snapshot content that starts with the manifest of the payload files it refers
#: to: a byte MessagePack never uses, where content that carries its data starts with the
#: engine's array.
FILES_TAG = b"\xc1"
_FILES_LEN = struct.Struct("<I")
#: Largest manifest read (4 bytes of checksum per 16 KiB of data: 256 MiB covers 1 TiB).
FILES_MANIFEST_MAX = 256 << 20


def _serving(engine: PartitionEngine) -> PartitionEngine:
    """``engine`` set up to serve a node: a pull's reply keeps runs of jobs for the frame encoder."""
    engine.pulled_runs = True
    return engine


class PartitionMachine:
    """The engine of partition ``partition`` behind the replica's application protocol.

    :attr:`engine` is replaced (never mutated in place) when a snapshot is installed;
    everything outside this package reads it through :attr:`view`.
    """

    def __init__(self, partition: int, payloads: PayloadFiles | None = None) -> None:
        self.partition = partition
        #: Where each engine keeps its segments' job data: files on disk, or process memory.
        self.payloads = payloads
        self.engine = _serving(PartitionEngine(partition, self._space()))
        self.view = PartitionView(lambda: self.engine)  # what the edge reads; never the engine itself
        #: Set by the node: False while nobody listens to job events (the engine then skips them).
        self.record_events = True
        #: Job events of applied batches while leading, until the node takes them (bounded).
        self.events: deque[Event] = deque(maxlen=EVENTS_MAX)

    # --- the application protocol ---------------------------------------------------------------

    def encode(self, now_ms: int, commands: list[Command]) -> bytes:
        """The entry payload of a batch (:func:`~.log_format.encode_batch`)."""
        return encode_batch(now_ms, commands)

    def apply(self, payload: bytes, term: int, *, leading: bool, replies: bool) -> list[Any]:
        """Apply a committed batch (of an entry of ``term``); each command is atomic, errors are per
        command. Replies are built when ``replies``; job events recorded while ``leading``."""
        now_ms, commands = decode_batch(payload)
        results: list[Any] = []
        engine = self.engine
        engine.enter_term(term)
        apply = engine.apply
        record = leading and self.record_events
        events = self.events
        for cmd in commands:
            try:
                applied = apply(cmd, now_ms, replies=replies, events=record)
                results.append(applied.result)
                if applied.events:
                    events.extend(applied.events)
            except CommandError as exc:
                results.append(exc)
            except Exception as exc:  # an engine bug must not kill the replica or diverge silently
                log.exception("partition %d: engine failed on %s", self.partition, command_name(cmd))
                results.append(CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))
        return results

    def disk_class(self, commands: list[Command]) -> bool:
        """True when every command of the batch writes to an existing ``durable: false`` queue
        (:meth:`~shoal.node.state.PartitionEngine.disk_class`).

        A command naming jobs rather than a queue (an ACKB, a FAIL) has the class of their
        queues. A command whose queues are not known (the leader's timer tick, a job named by a
        custom id or already gone) counts as fsync class. The partition asks only while the
        replica's applied state holds every committed entry (a committed ``UpdateQueue`` may
        have made a queue durable: :meth:`~shoal.node.raft.PartitionReplica.state_current`).
        """
        disk_class = self.engine.disk_class
        return all(disk_class(cmd) for cmd in commands)

    def takes_space(self, command: Command) -> bool:
        """True for a command in :data:`SPACE_TAKING_COMMANDS`."""
        return command_name(command) in SPACE_TAKING_COMMANDS

    def link_snapshot_files(self, directory: str) -> bool:
        """Hard-link the payload files the engine's data is in into ``directory`` (on the loop,
        right before the snapshot's fork): True when the snapshot may refer to them; False when
        the data is not in files here (a memory space), there is none, or the files cannot be
        linked, and the snapshot carries the data."""
        space = self.engine.segments.space
        if not isinstance(space, FileSpace):
            return False
        try:
            return space.link_files(Path(directory)) > 0
        except OSError as exc:
            log.warning("partition %d: cannot link payload files into %s (%s); the snapshot carries "
                        "the data", self.partition, directory, exc)
            return False

    def snapshot_chunks(self, files: str | None = None) -> Iterator[bytes]:
        """The engine's snapshot (MessagePack), :data:`SNAPSHOT_JOBS_PER_CHUNK` jobs at a time;
        with ``files`` (where :meth:`link_snapshot_files` linked them), the manifest of those
        files (:data:`FILES_TAG`) and the engine's content referring to them instead of
        carrying the data. The files are synced before the first chunk is given."""
        if files is None:
            return self.engine.snapshot_chunks(SNAPSHOT_JOBS_PER_CHUNK)
        space = self.engine.segments.space
        if not isinstance(space, FileSpace):
            raise TypeError(f"partition {self.partition}: the engine's data is not in payload files")
        manifest = msgpack.packb(space.snapshot_manifest(Path(files)), use_bin_type=True)
        return itertools.chain((FILES_TAG + _FILES_LEN.pack(len(manifest)) + manifest,),
                               self.engine.snapshot_chunks(SNAPSHOT_JOBS_PER_CHUNK, refs=True))

    def load_snapshot(self, chunks: Iterator[bytes], files: str | None = None) -> PartitionEngine:
        """A new engine restored from snapshot content (the live one is not touched); its job
        data goes to a payload space of its own as it is read, data the content refers to
        read from the payload files in ``files``."""
        space = self._space()
        try:
            return restore_engine(chunks, files, space)
        except BaseException:
            self._discard(space)
            raise

    def install(self, state: object) -> None:
        """Make an engine :meth:`load_snapshot` built the partition's state."""
        if not isinstance(state, PartitionEngine):
            raise TypeError(f"partition {self.partition}: cannot install a {type(state).__name__} as the engine")
        old, self.engine = self.engine, _serving(state)
        self._discard(old.segments.space)
        trim_soon()  # the load's decoded chunks, and the old engine, were just freed

    def reset(self) -> None:
        """An empty engine replaces the state."""
        old, self.engine = self.engine, _serving(PartitionEngine(self.partition, self._space()))
        self._discard(old.segments.space)

    def _space(self) -> PayloadSpace | None:
        return self.payloads.new() if self.payloads is not None else None

    def _discard(self, space: PayloadSpace) -> None:
        if self.payloads is not None:
            self.payloads.discard(space)

    def describe(self) -> str:
        return f"{self.engine.job_count()} jobs"

    def snapshot_failed(self, message: str) -> None:
        """A snapshot child that could not read a payload file (its error names the file) tells
        the node as a read of its own would: on a follower, the child may be its only reader."""
        payloads = self.payloads
        if payloads is not None and payloads.on_damage is not None and f"{payloads.root}{os.sep}" in message:
            payloads.on_damage(OSError(message))

    # --- for the node ---------------------------------------------------------------------------

    def read(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """Answer a read-only command from the applied state."""
        return self.engine.apply(cmd, now_ms, events=False).result

    def take_events(self) -> list[Event]:
        """The job events applied since the last call, oldest first."""
        out = list(self.events)
        self.events.clear()
        return out


def snapshot_chunks(engine: PartitionEngine, index: int, term: int, membership: Membership) -> Iterator[bytes]:
    """The whole snapshot content of ``engine`` at entry ``(index, term)``, as a replica writes it."""
    return snapshot_content(index, term, membership, engine.snapshot_chunks(SNAPSHOT_JOBS_PER_CHUNK))


def load_engine(io: FileIO, path: str) -> tuple[PartitionEngine, int, int, Membership]:
    """``(engine, index, term, membership)`` of the snapshot file at ``path``
    (:func:`~shoal.node.raft.snapshots.load_snapshot`), its data in memory."""
    return load_snapshot(io, path, lambda chunks, files: restore_engine(chunks, files, None))


def restore_engine(chunks: Iterator[bytes], files: str | None, space: PayloadSpace | None) -> PartitionEngine:
    """The engine of snapshot content ``chunks`` (:meth:`PartitionMachine.snapshot_chunks`), its
    data in ``space``; content that starts with a manifest (:data:`FILES_TAG`) is read with the
    payload files in ``files``: a space of files adopts them (hard links, no data read or
    written), any other is given the data read from them. ValueError on a manifest that does
    not fit, OSError on files missing or damaged."""
    reader = ChunkReader(chunks)
    if reader.peek(1) != FILES_TAG:
        return PartitionEngine.restore_chunks(reader.rest(), space)
    head = reader.read(1 + _FILES_LEN.size)
    if len(head) < 1 + _FILES_LEN.size:
        raise ValueError("snapshot content ends within its payload files manifest's length")
    (size,) = _FILES_LEN.unpack(head[1:])
    if size > FILES_MANIFEST_MAX:
        raise ValueError(f"payload files manifest of {size} bytes is larger than {FILES_MANIFEST_MAX}")
    packed = reader.read(size)
    if len(packed) < size:
        raise ValueError(f"snapshot content ends within its payload files manifest of {size} bytes")
    manifest = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    if files is None:
        raise ValueError("the snapshot refers to payload files, and none are beside it")
    if isinstance(space, FileSpace) and space.file_bytes == manifest.get("fileBytes"):
        space.adopt_files(Path(files), manifest)  # the files become the new engine's: nothing is copied
        engine = PartitionEngine.restore_chunks(reader.rest(), space, space)
        space.adopted()
        return engine
    source = FileSpace.snapshot_source(Path(files), manifest)
    try:
        return PartitionEngine.restore_chunks(reader.rest(), space, source)
    finally:
        source.close()
