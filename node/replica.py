"""One partition's Raft group member: a pysyncobj ``SyncObj`` around the engine.

Theory of operation: the leader's event loop hands whole batches of validated
commands to :meth:`PartitionReplica.propose`; pysyncobj replicates one log
entry per batch (group commit) and, once committed, every replica applies the
batch to its :class:`~shoal.node.state.PartitionEngine`.

pysyncobj runs *inside the node's event loop*, not in a tick thread of its
own: :class:`LoopPoller` maps pysyncobj's socket subscriptions onto
``loop.add_reader``/``add_writer`` and every socket event schedules one
``_onTick`` of that replica, except a follower's AppendEntries (answered inside the
event and applied a few entries at a time, see :data:`FOLLOWER_APPLY_BATCH`) and a
leader's ack of entries already committed; a leader's proposal is appended and sent
at once, without a tick. A command therefore crosses no thread boundary between the
client socket, Raft and the reply (no GIL hand-offs, no locks), and a read never sees a
half-applied batch because an apply runs to its end without yielding to the loop.

Snapshots use pysyncobj's custom serializer hook, so the dump file is the
engine's own compact snapshot (job data stays raw bytes) plus pysyncobj's
bookkeeping, never a pickle of the whole object.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pysyncobj.pickle as _pysyncobj_pickle
import pysyncobj.syncobj as _pysyncobj_syncobj
import pysyncobj.tcp_connection as _pysyncobj_tcp
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.poller import POLL_EVENT_TYPE, Poller

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from .state import PartitionEngine
from .state._segments import ack_run_of, split_plain

__all__ = ["PartitionReplica", "BatchResult", "LoopPoller", "raft_conf", "TICK_PERIOD_S"]

log = logging.getLogger(__name__)

# pysyncobj pickles log entries and Raft messages with protocol 2 (for Python 2 peers). Protocol 2
# has no binary-bytes opcode, so every job payload would take a slow latin-1 round trip through
# codecs on every replica; that was a quarter of a leader's CPU. Every Shoal node runs Python 3
# and this module, so all peers (and the journal) agree on protocol 5; loads reads any protocol.
setattr(_pysyncobj_pickle, "__protocol", pickle.HIGHEST_PROTOCOL)


def _zlib_stored(data: bytes, level: int = -1) -> bytes:
    """``data`` as a valid zlib stream of uncompressed ("stored") blocks.

    pysyncobj compresses every Raft message with zlib level 3: ~700 us per 800-job batch,
    once per follower, on the leader's only thread. Job payloads are usually compressed
    already and Raft links are local, so Shoal frames them uncompressed (~30 us); the
    receiver's ``zlib.decompress`` reads stored blocks like any other.
    """
    out = [b"\x78\x01"]
    size = len(data)
    pos = 0
    while True:
        chunk = data[pos:pos + 0xFFFF]
        pos += len(chunk)
        final = pos >= size
        out.append(struct.pack("<BHH", 1 if final else 0, len(chunk), len(chunk) ^ 0xFFFF))
        out.append(chunk)
        if final:
            break
    out.append(struct.pack(">I", zlib.adler32(data)))
    return b"".join(out)


# pysyncobj wakes its own tick thread through a pipe on every proposal (a write and a read
# syscall, and one more loop event, per Raft entry). Shoal ticks pysyncobj from the event loop
# and schedules a tick itself when it proposes (PartitionReplica.propose), so the pipe is never
# needed; the flag is read when a SyncObj is built and on every proposal.
_pysyncobj_syncobj.PIPE_NOTIFIER_ENABLED = False


def _read_available(self: Any) -> None:
    """pysyncobj's read step, minus two syscalls and an exception per socket event.

    pysyncobj reads until ``recv`` fails with EAGAIN and asks ``SO_ERROR`` after every read.
    A read shorter than the buffer has emptied the socket for now (the loop's level-triggered
    poll reports anything that arrives later), and a socket error surfaces from ``recv`` itself.
    """
    sock = self._TcpConnection__socket
    size = self._TcpConnection__recvBufferSize
    while True:
        try:
            incoming = sock.recv(size)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            break
        if not incoming:
            self.disconnect()
            break
        self._TcpConnection__readBuffer += incoming
        if len(incoming) < size:
            break
    self._TcpConnection__lastReadTime = _pysyncobj_tcp.monotonicTime()


_pysyncobj_tcp.TcpConnection._TcpConnection__tryReadBuffer = _read_available  # type: ignore[attr-defined]


class _StoredZlib:
    compress = staticmethod(_zlib_stored)
    decompress = staticmethod(zlib.decompress)


_pysyncobj_tcp.zlib = _StoredZlib  # type: ignore[assignment]

#: A batch's outcome: one reply dict (ok) or CommandError per command, in order.
BatchResult = list[Any]
_SNAPSHOT_MAGIC = b"SHOALSNAP1"
RECV_BUFFER_BYTES = 1024 * 1024
#: A follower applies committed entries on the periodic tick, or at once when this many wait.
#: Unbounded (only the 20 ms tick) cut its CPU most but made its ticks long enough to delay
#: its next answer: lone-PUSH p99 1.7-2.4 ms -> 2.2-2.4 ms; with 8, p99 1.4-1.8 ms.
FOLLOWER_APPLY_BATCH = 8
#: Idle tick: heartbeats, election timeouts, reconnects, log compaction, a follower's applies.
#: Every partition ticks, busy or not. 0.04 s saved ~2 % of a busy leader but seemed to slow
#: recovery in ``shoal chaos run flapping``; that stall was a race in noticing a lost leadership,
#: since fixed (``_state_changed``), so a longer tick is open again (README, Benchmarks).
TICK_PERIOD_S = 0.02
#: A follower that answered within this long gets a new entry at once (_fast_follower).
FAST_FOLLOWER_STALL_S = 0.01
#: The other followers get what they lack at most this often while entries keep coming.
LAZY_SEND_PERIOD_S = 0.005
#: How long a leader waits for its next entry to carry a new commit index before sending it alone.
COMMIT_ANNOUNCE_DELAY_S = 0.002
_LEADER = _pysyncobj_syncobj._RAFT_STATE.LEADER
_FOLLOWER = _pysyncobj_syncobj._RAFT_STATE.FOLLOWER
_STATE_NAMES = {_pysyncobj_syncobj._RAFT_STATE.FOLLOWER: "follower",
                _pysyncobj_syncobj._RAFT_STATE.CANDIDATE: "candidate", _LEADER: "leader"}
_READ = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
_WRITE = POLL_EVENT_TYPE.WRITE


class LoopPoller(Poller):
    """pysyncobj's poller interface on top of an asyncio loop.

    pysyncobj (re)subscribes a socket with a new mask on every state change,
    so only the difference from the current mask touches the loop. Errors
    surface as readability (pysyncobj then checks ``SO_ERROR`` itself).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None],
                 before_event: Callable[[], None] | None = None) -> None:
        self.loop = loop
        self.on_event = on_event
        self.before_event = before_event
        self._masks: dict[int, int] = {}
        self._callbacks: dict[int, Callable[[int, int], None]] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:  # noqa: N803
        old = self._masks.get(descr, 0)
        self._callbacks[descr] = callback
        if eventMask & _READ and not old & _READ:
            self.loop.add_reader(descr, self._fire, descr, POLL_EVENT_TYPE.READ)
        elif old & _READ and not eventMask & _READ:
            self.loop.remove_reader(descr)
        if eventMask & _WRITE and not old & _WRITE:
            self.loop.add_writer(descr, self._fire, descr, POLL_EVENT_TYPE.WRITE)
        elif old & _WRITE and not eventMask & _WRITE:
            self.loop.remove_writer(descr)
        self._masks[descr] = eventMask

    def unsubscribe(self, descr: int) -> None:
        old = self._masks.pop(descr, 0)
        self._callbacks.pop(descr, None)
        if old & _READ:
            self.loop.remove_reader(descr)
        if old & _WRITE:
            self.loop.remove_writer(descr)

    def poll(self, timeout: float) -> None:
        """The event loop polls; pysyncobj's own poll at the end of a tick is a no-op."""

    def close(self) -> None:
        for descr in list(self._masks):
            self.unsubscribe(descr)

    def _fire(self, descr: int, event: int) -> None:
        callback = self._callbacks.get(descr)
        if callback is None:
            return
        if self.before_event is not None:
            self.before_event()
        try:
            callback(descr, event)
        except Exception:  # a transport bug must not take the event loop down
            log.exception("raft socket callback failed")
        self.on_event()


@contextlib.contextmanager
def _poller_for_construction(poller: LoopPoller) -> Iterator[None]:
    # SyncObj.__init__ builds its poller through this module-level name and subscribes the
    # server socket and notify pipe right away, so ours must be in place before it runs.
    original = _pysyncobj_syncobj.createPoller
    _pysyncobj_syncobj.createPoller = lambda _kind: poller
    try:
        yield
    finally:
        _pysyncobj_syncobj.createPoller = original


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
        # A leader that has not heard from a majority for this long steps down (default 30 s), so
        # an isolated node stops serving reads and reports no leader instead of a stale one.
        leaderFallbackTimeout=2.0,
        # A restarted pod gets a new IP and a late peer must be found quickly: pysyncobj's
        # defaults cache DNS answers for 600 s and failures for 30 s.
        dnsCacheTime=5.0,
        dnsFailCacheTime=1.0,
        autoTick=False,  # ticked by the node's event loop (see LoopPoller)
        bindRetryTime=0.5,
        maxBindRetries=40,
        commandsQueueSize=200_000,
        appendEntriesBatchSizeBytes=8 * 1024 * 1024,  # a group-committed batch travels as one message
        # The kernel socket buffers (SO_SNDBUF/SO_RCVBUF), and pysyncobj's size for each recv().
        # A 4 MiB recv() costs ~6 us more per call than 1 MiB here (the allocation leaves the
        # heap), and a Raft link does one per message received (_read_available); 1 MiB still
        # reads a typical group-committed entry in one call.
        sendBufferSize=4 * 1024 * 1024,
        recvBufferSize=RECV_BUFFER_BYTES,
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


def unwrap_job_data(cmd: dict[str, Any]) -> None:
    """Replace the ``Raw`` wrapper of pushed job data by its bytes, in place, before replication.

    Pickling a ``Raw`` costs a Python-level ``__reduce__`` and an ``__init__`` call per job
    (~1.3 µs, on every replica); plain bytes pickle ~8× faster. The engine stores job data
    as the packed bytes either way, so applying either form gives the same state.
    """
    name = cmd.get("cmd")
    if name == "PUSHB":
        items = cmd["jobs"]
        plain = split_plain(items)
        if plain is not None:
            # Items with nothing but data (and a key) travel as lists (``_datas``, ``_keys``):
            # a fraction of the pickling work of one dict per job, on the leader and every
            # follower, and the engine stores them as one segment.
            cmd["_datas"], keys = plain
            if keys is not None:
                cmd["_keys"] = keys
            del cmd["jobs"]
            return
        for item in items:
            data = item.get("data")
            if type(data) is Raw:
                item["data"] = data.packed
    elif name == "PUSH":
        data = cmd.get("data")
        if type(data) is Raw:
            cmd["data"] = data.packed


class PartitionReplica(SyncObj):
    """A partition's engine replicated by pysyncobj."""

    def __init__(self, partition: int, self_addr: str, peer_addrs: list[str], *, data_dir: str,
                 loop: asyncio.AbstractEventLoop, secret: str = "", bind_host: str | None = None) -> None:
        self.partition = partition
        self.engine = PartitionEngine(partition)
        self.loop = loop
        #: Set by the node: called on the loop after every applied batch.
        self.on_applied: Callable[[int], None] | None = None
        #: Set by the node: called on the loop when this replica stops leading its partition.
        self.on_leadership_lost: Callable[[int], None] | None = None
        self.applied_batches = 0
        self._tick_scheduled = False
        self._announce_due = False
        self._closed = False
        self._event_messages = 0
        self._event_tick_free = 0
        self._direct_send = False
        self._direct_sends = 0
        self._last_sent: dict[Any, float] = {}
        self._poller = LoopPoller(loop, self._after_socket_event, self._before_socket_event)
        conf = raft_conf(data_dir, partition, secret, bind_host, on_state_changed=self._state_changed,
                         serializer=self._write_snapshot, deserializer=self._read_snapshot)
        with _poller_for_construction(self._poller):
            super().__init__(self_addr, peer_addrs, conf=conf)
        by_address = {n.address: n for n in self.otherNodes}
        #: Followers in the order ``peer_addrs`` lists them (placement order: see _fast_follower).
        self._follower_order = [by_address[a] for a in peer_addrs if a in by_address]
        self._timer = loop.call_later(TICK_PERIOD_S, self._periodic_tick)

    # --- driving pysyncobj from the loop ------------------------------------------------------

    def schedule_tick(self) -> None:
        """Run one pysyncobj tick soon (coalesced): after socket events and proposals."""
        if not self._tick_scheduled and not self._closed:
            self._tick_scheduled = True
            self.loop.call_soon(self._tick)

    def _before_socket_event(self) -> None:
        self._event_messages = self._event_tick_free = 0

    def _after_socket_event(self) -> None:
        if self._event_messages and self._event_messages == self._event_tick_free:
            return  # nothing in this event needs a tick before the periodic one
        self.schedule_tick()

    def _tick(self) -> None:
        self._tick_scheduled = False
        if self._closed:
            return
        try:
            self._onTick(0.0)
        except Exception:
            log.exception("partition %d: raft tick failed", self.partition)

    def _periodic_tick(self) -> None:
        if self._closed:
            return
        self._tick()
        if self._SyncObj__raftState == _LEADER and not self._closed:
            self._send_lagging(_pysyncobj_tcp.monotonicTime())  # entries proposed, then a pause
        self._timer = self.loop.call_later(TICK_PERIOD_S, self._periodic_tick)

    def close(self) -> None:
        """Stop ticking and close every Raft socket."""
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        self.destroy()  # autoTick=False: pysyncobj tears the transport down at once
        self._poller.close()

    def _state_changed(self, old: int, new: int) -> None:
        # Runs inside a tick. A deposed leader's unanswered proposals must be answered at once:
        # polling the leader (the topology loop) misses a step-down and re-election between two
        # polls, and pysyncobj itself answers them only once other entries fill their indexes.
        log.info("partition %d: %s -> %s (term %d)", self.partition, _STATE_NAMES.get(old, old),
                 _STATE_NAMES.get(new, new), self.raftCurrentTerm)
        if old == _LEADER and new != _LEADER and self.on_leadership_lost is not None and not self._closed:
            self.loop.call_soon(self.on_leadership_lost, self.partition)

    # --- replicated state machine -------------------------------------------------------------

    @replicated
    def apply_batch(self, now_ms: int, commands: list[dict[str, Any]]) -> BatchResult:
        """Apply a committed batch; each command is atomic, errors are per command."""
        results: BatchResult = []
        engine = self.engine
        engine.replies = self._isLeader()
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
        """Replicate ``commands`` as one log entry; ``callback(results, fail_reason)`` runs on the loop."""
        for cmd in commands:
            unwrap_job_data(cmd)
            if cmd["cmd"] == "ACKB":
                # A consumer's ack of one pull, checked once here instead of on every replica:
                # replicated as (first seq, count, first lease number); the engine still checks
                # the jobs' states and leases when it applies it. None: not such a batch (the
                # replicas need not look again).
                run = None if cmd.get("results") else ack_run_of(self.partition, cmd["ids"], cmd.get("tokens"))
                cmd["_ackRun"] = run
                if run is not None:
                    del cmd["ids"]
                    cmd.pop("tokens", None)
        self.apply_batch(now_ms, commands, callback=callback)
        if self._SyncObj__raftState == _LEADER and self._SyncObj__transport.ready:
            # Append and send the entry now rather than in a tick a loop iteration later: the
            # rest of a tick (commit index, applies, timers) has nothing to do until a follower
            # answers, and that answer schedules one.
            self._direct_send = True
            try:
                self._checkCommandsToApply()
            finally:
                self._direct_send = False
            if not self._SyncObj__otherNodes:
                # A lone replica commits in the next tick. (A tick appends proposals only after
                # computing the commit index, so before this it waited for the periodic one.)
                self.schedule_tick()
        else:
            self.schedule_tick()

    # --- one follower at once, the others a little later --------------------------------------

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 (pysyncobj's name)
        """Send a proposal's entry to one responsive follower; the others get it lazily.

        A commit needs one follower's ack out of two. Sending every entry to both costs the
        leader a send and an ack per follower per entry, and on two cores a second follower
        woken per entry competes with the leader for a core. So a new entry goes at once to
        the first follower in placement order that answered within
        :data:`FAST_FOLLOWER_STALL_S` (a preferred leader that is following stays caught up
        for the balancer's hand-back); the others receive everything pending in one message
        at most every :data:`LAZY_SEND_PERIOD_S`, on the periodic tick and on pysyncobj's
        heartbeat. If no follower answered lately, every follower gets the entry at once.
        Commit still needs a majority; only the order of sends changes.
        """
        if self._direct_send:
            now = _pysyncobj_tcp.monotonicTime()
            fast = self._fast_follower(now)
            if fast is not None and self._send_entries_to(fast, now):
                self._send_lagging(now, fast)
                return
        SyncObj._SyncObj__sendAppendEntries(self)  # type: ignore[attr-defined]

    def _fast_follower(self, now: float) -> Any:
        connected = self._SyncObj__connectedNodes
        last = self._SyncObj__lastResponseTime
        for node in self._follower_order:
            if node in connected and now - last.get(node, 0.0) < FAST_FOLLOWER_STALL_S:
                return node
        return None

    def _send_lagging(self, now: float, skip: Any = None) -> None:
        """Catch up the followers not sent to for :data:`LAZY_SEND_PERIOD_S`."""
        for node in self._follower_order:
            if node is not skip and now - self._last_sent.get(node, 0.0) >= LAZY_SEND_PERIOD_S \
                    and node in self._SyncObj__connectedNodes:
                self._send_entries_to(node, now)

    def _send_entries_to(self, node: Any, now: float) -> bool:
        """Send ``node`` every entry it lacks in one AppendEntries; False when that takes
        pysyncobj's own path (a snapshot, an entry over the batch size) or nothing is due."""
        raft_log = self._SyncObj__raftLog
        next_idx = self._SyncObj__raftNextIndex.get(node)
        if next_idx is None or next_idx <= raft_log[0][1] or next_idx > raft_log[-1][1]:
            return False
        prev = self._SyncObj__getEntries(next_idx - 1, 1)
        limit = self._SyncObj__conf.appendEntriesBatchSizeBytes
        entries = self._SyncObj__getEntries(next_idx, None, limit)
        if not prev or not entries or (len(entries) == 1 and len(entries[0][0]) >= limit):
            return False
        self._SyncObj__raftNextIndex[node] = entries[-1][1] + 1
        self._last_sent[node] = now
        self._direct_sends += 1
        self._SyncObj__transport.send(node, {
            "type": "append_entries", "term": self.raftCurrentTerm,
            "commit_index": self._SyncObj__raftCommitIndex, "entries": entries,
            "prevLogIdx": next_idx - 1, "prevLogTerm": prev[0][2]})
        return True

    # --- pipelining fix ------------------------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's name)
        """Keep ``nextIndex`` from moving backwards on a success reply.

        With several entries in flight, the reply to an older entry carries a lower
        ``next_node_idx``; pysyncobj then rewinds ``nextIndex`` and sends the newer entries
        again, which the follower truncates and re-appends ("truncating already-applied log
        entries"). A success reply only ever confirms a prefix, so the optimistic pointer may
        stay where it was; a *reset* (rejection) still rewinds it as Raft requires.

        Also counts the messages of the current socket event that need no tick of their own.
        """
        self._event_messages += 1
        kind = message.get("type") if type(message) is dict else None
        if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            SyncObj._SyncObj__onMessageReceived(self, node, message)  # type: ignore[attr-defined]
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before
            if self._SyncObj__raftMatchIndex.get(node, 0) <= self._SyncObj__raftCommitIndex:
                # An ack of entries already committed (the slower follower's, usually) cannot
                # move the commit index, which is all a tick after an ack is for.
                self._event_tick_free += 1
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)  # type: ignore[attr-defined]
        if kind == "append_entries" and self._SyncObj__raftState == _FOLLOWER \
                and "prevLogIdx" in message and "transmission" not in message \
                and self._SyncObj__raftCommitIndex - self._SyncObj__raftLastApplied < FOLLOWER_APPLY_BATCH:
            # A follower has appended the entries and answered inside this call; applying them
            # is all a tick would add, and nothing waits for a follower's apply (reads and
            # replies come from the leader), so they are applied a few at a time.
            self._event_tick_free += 1

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 (pysyncobj's name)
        """Apply committed entries; announce the new commit index a moment later, if still needed.

        With ``appendEntriesUseBatch=False`` pysyncobj follows every apply on the leader with
        an AppendEntries round to every follower, which often carries nothing but the new commit
        index, and each follower answers it: half of a leader's Raft messages under pipelined
        load. Here that round waits :data:`COMMIT_ANNOUNCE_DELAY_S`; if any AppendEntries left
        meanwhile (the next entry, carrying the commit index), it is skipped. Followers that lag
        (after a restart) still catch up round after round at that pace.
        """
        applied = SyncObj._SyncObj__applyLogEntries(self)  # type: ignore[attr-defined]
        if applied and not self._announce_due and self._isLeader():
            self._announce_due = True
            self.loop.call_later(COMMIT_ANNOUNCE_DELAY_S, self._announce_commit,
                                 (self._SyncObj__newAppendEntriesTime, self._direct_sends))
        return False

    def _announce_commit(self, sent_mark: Any) -> None:
        self._announce_due = False
        if self._closed or not self._isLeader():
            return
        if (self._SyncObj__newAppendEntriesTime, self._direct_sends) == sent_mark:  # nothing sent since
            try:
                self._SyncObj__sendAppendEntries()  # type: ignore[attr-defined]
            except Exception:
                log.exception("partition %d: announcing the commit index failed", self.partition)

    # --- reads --------------------------------------------------------------------------------

    def read(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """Answer a read-only command from the applied state."""
        self.engine.replies = True
        return self.engine.apply(cmd, now_ms)

    def has_ready(self, queue: str) -> bool:
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
        # Runs inside a tick, between applies, so the engine is exactly at the dump's index.
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
        self.engine = PartitionEngine.restore(blob[pos + size:])
        return raft_data


def fail_reason_error(reason: int) -> CommandError:
    """Translate a pysyncobj failure into a wire error.

    ``NO_LEADER``/``OVERLOADED`` mean the entry was never appended, so any command may be
    sent again. When leadership changed after the entry was appended, the entry may still be
    committed by the next leader: that is ``TIMEOUT`` (outcome unknown), which a client only
    retries for commands that are safe to repeat (pushes carry idempotency keys).
    """
    if reason == FAIL_REASON.MISSING_LEADER:
        return CommandError(ErrorCode.NO_LEADER, "no leader for the partition; retry")
    if reason == FAIL_REASON.QUEUE_FULL:
        return CommandError(ErrorCode.OVERLOADED, "the partition's proposal queue is full; back off")
    return CommandError(ErrorCode.TIMEOUT, "leadership changed while the command was being replicated; "
                        "its outcome is unknown")
