"""One partition's Raft group member: a pysyncobj ``SyncObj`` around the engine.

Theory of operation: the leader's event loop hands whole batches of validated
commands to :meth:`PartitionReplica.propose`; pysyncobj replicates one log
entry per batch (group commit) and, once committed, every replica applies the
batch to its :class:`~shoal.node.state.PartitionEngine` in pysyncobj's tick
thread. The engine is guarded by ``lock`` so reads served by the event loop
never see a half-applied batch. Results come back to the event loop through
``call_soon_threadsafe`` once per batch, not once per command.

Snapshots use pysyncobj's custom serializer hook, so the dump file is the
engine's own compact snapshot (job data stays raw bytes) plus pysyncobj's
bookkeeping, never a pickle of the whole object.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections.abc import Callable
from typing import Any

import pysyncobj.pickle as _pysyncobj_pickle
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON

from shoal.cluster.errors import CommandError, ErrorCode

from .state import PartitionEngine

__all__ = ["PartitionReplica", "BatchResult", "raft_conf"]

log = logging.getLogger(__name__)

# pysyncobj pickles log entries and Raft messages with protocol 2 (for Python 2 peers). Protocol 2
# has no binary-bytes opcode, so every job payload would take a slow latin-1 round trip through
# codecs on every replica; that was a quarter of a leader's CPU. Every Shoal node runs Python 3
# and this module, so all peers (and the journal) agree on protocol 5; loads reads any protocol.
setattr(_pysyncobj_pickle, "__protocol", pickle.HIGHEST_PROTOCOL)

#: A batch's outcome: one reply dict (ok) or CommandError per command, in order.
BatchResult = list[Any]
_SNAPSHOT_MAGIC = b"SHOALSNAP1"


def raft_conf(data_dir: str, partition: int, secret: str, bind_host: str | None,
              on_state_changed: Callable[[int, int], None] | None = None,
              serializer: Callable[..., Any] | None = None,
              deserializer: Callable[..., Any] | None = None) -> SyncObjConf:
    """pysyncobj settings tuned for many small groups on few cores.

    ``appendEntriesUseBatch=False`` sends each entry at once (our own group
    commit does the batching), which takes a lone command from ~100 ms to
    sub-millisecond. Election timeouts are short so a killed leader is
    replaced within about a second.
    """
    kwargs: dict[str, Any] = dict(
        appendEntriesUseBatch=False,
        appendEntriesPeriod=0.05,
        raftMinTimeout=0.4,
        raftMaxTimeout=0.9,
        connectionTimeout=2.0,
        connectionRetryTime=0.3,
        autoTickPeriod=0.05,  # idle wake-up only: sockets and the notify pipe wake the thread at once
        commandsQueueSize=200_000,
        appendEntriesBatchSizeBytes=8 * 1024 * 1024,  # a group-committed batch travels as one message
        logCompactionMinEntries=20_000,
        logCompactionMinTime=120,
        dynamicMembershipChange=False,
        tcp_keepalive=(5, 1, 3),
        onStateChanged=on_state_changed,
    )
    if secret:
        kwargs["password"] = secret
    if bind_host:
        kwargs["bindAddress"] = bind_host  # "host:port", the listen side of this partition's Raft port
    # A data dir is mandatory: without files pysyncobj would snapshot nothing useful.
    kwargs["journalFile"] = os.path.join(data_dir, f"p{partition}.journal")
    kwargs["fullDumpFile"] = os.path.join(data_dir, f"p{partition}.dump")
    kwargs["serializer"] = serializer
    kwargs["deserializer"] = deserializer
    return SyncObjConf(**kwargs)


class PartitionReplica(SyncObj):
    """A partition's engine replicated by pysyncobj."""

    def __init__(self, partition: int, self_addr: str, peer_addrs: list[str], *, data_dir: str,
                 secret: str = "", bind_host: str | None = None) -> None:
        self.partition = partition
        self.engine = PartitionEngine(partition)
        self.lock = threading.Lock()
        #: Set by the node: called in the tick thread after every applied batch.
        self.on_applied: Callable[[int], None] | None = None
        self.applied_batches = 0
        conf = raft_conf(data_dir, partition, secret, bind_host,
                         serializer=self._write_snapshot, deserializer=self._read_snapshot)
        super().__init__(self_addr, peer_addrs, conf=conf)

    # --- replicated state machine -------------------------------------------------------------

    @replicated
    def apply_batch(self, now_ms: int, commands: list[dict[str, Any]]) -> BatchResult:
        """Apply a committed batch; each command is atomic, errors are per command."""
        results: BatchResult = []
        engine = self.engine
        with self.lock:
            for cmd in commands:
                try:
                    results.append(engine.apply(cmd, now_ms))
                except CommandError as exc:
                    results.append(exc)
                except Exception as exc:  # an engine bug must not kill the replica or diverge silently
                    log.exception("partition %d: engine failed on %s", self.partition, cmd.get("cmd"))
                    results.append(CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))
            self.applied_batches += 1
        hook = self.on_applied
        if hook is not None:
            hook(self.partition)
        return results

    def propose(self, now_ms: int, commands: list[dict[str, Any]],
                callback: Callable[[BatchResult | None, int], None]) -> None:
        """Replicate ``commands`` as one log entry; ``callback(results, fail_reason)`` runs in the tick thread."""
        self.apply_batch(now_ms, commands, callback=callback)

    # --- pipelining fix ------------------------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's name)
        """Keep ``nextIndex`` from moving backwards on a success reply.

        With several entries in flight, the reply to an older entry carries a lower
        ``next_node_idx``; pysyncobj then rewinds ``nextIndex`` and sends the newer entries
        again, which the follower truncates and re-appends ("truncating already-applied log
        entries"). A success reply only ever confirms a prefix, so the optimistic pointer may
        stay where it was; a *reset* (rejection) still rewinds it as Raft requires.
        """
        if type(message) is dict and message.get("type") == "next_node_idx" and message.get("success") \
                and not message.get("reset"):
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            SyncObj._SyncObj__onMessageReceived(self, node, message)  # type: ignore[attr-defined]
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)  # type: ignore[attr-defined]

    # --- reads --------------------------------------------------------------------------------

    def read(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """Answer a read-only command from the applied state."""
        with self.lock:
            return self.engine.apply(cmd, now_ms)

    def has_ready(self, queue: str) -> bool:
        with self.lock:
            return self.engine.has_ready(queue)

    # --- leadership ---------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self._isLeader()

    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return leader.address if leader is not None else None

    def term(self) -> int:
        return self.raftCurrentTerm

    # --- snapshots (pysyncobj custom serializer hooks) ----------------------------------------

    def _write_snapshot(self, filename: str, raft_data: Any) -> None:
        # Runs in the tick thread between applies, so the engine is exactly at the dump's index.
        with self.lock:
            state = self.engine.snapshot()
        meta = pickle.dumps(raft_data, protocol=pickle.HIGHEST_PROTOCOL)
        with open(filename, "wb") as f:
            f.write(_SNAPSHOT_MAGIC)
            f.write(len(meta).to_bytes(8, "big"))
            f.write(meta)
            f.write(state)
            f.flush()
            os.fsync(f.fileno())

    def _read_snapshot(self, filename: str) -> Any:
        with open(filename, "rb") as f:
            blob = f.read()
        if not blob.startswith(_SNAPSHOT_MAGIC):
            raise ValueError(f"{filename} is not a Shoal snapshot")
        pos = len(_SNAPSHOT_MAGIC)
        size = int.from_bytes(blob[pos:pos + 8], "big")
        pos += 8
        # The dump file is written by this node itself; peers' snapshots arrive through the
        # authenticated Raft transport, which already unpickles (hence the cluster secret rule).
        raft_data = pickle.loads(blob[pos:pos + size])
        engine = PartitionEngine.restore(blob[pos + size:])
        with self.lock:
            self.engine = engine
        return raft_data


def fail_reason_error(reason: int) -> CommandError:
    """Translate a pysyncobj failure into the retryable wire error."""
    if reason in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED,
                  FAIL_REASON.UNKNOWN_OUTCOME):
        return CommandError(ErrorCode.NO_LEADER, "leadership changed before the command committed; retry")
    if reason == FAIL_REASON.NOT_LEADER:
        return CommandError(ErrorCode.NOT_LEADER, "this node lost leadership of the partition; retry")
    if reason == FAIL_REASON.QUEUE_FULL:
        return CommandError(ErrorCode.OVERLOADED, "the partition's proposal queue is full; back off")
    return CommandError(ErrorCode.NO_LEADER, f"replication failed (reason {reason}); retry")
