"""Command dispatch: route every frame to the right place and answer it.

- node-level commands (Hello, Auth, Ping, Identify, Subscribe, workers,
  Prometheus) are answered here;
- everything else is validated with the shared schema and submitted to its
  partition (queue name, job id, or ``partition`` field): the
  :class:`~.partition.Partition` while this node leads it, else, for a client that does not
  route, the :class:`~.partition.RemotePartition` that takes it to the leader (:mod:`.relay`),
  else refused with ``NOT_LEADER``; a partition led here hands it back to :meth:`Dispatcher.serve`:
  - reads run against the leader's applied state;
  - writes go through the partition's group commit (one Raft entry per batch);
- a write refused unproposed because this node stopped leading meanwhile (a leadership
  transfer) goes to the relay too, for a client that does not route;
- a ``PULL``/``PULLB`` with a timeout and nothing ready parks on the leader
  and is woken when the partition applies something that makes its queue
  ready; a ``PUSH`` refused with ``QUEUE_FULL`` waits the same way up to its
  ``timeout``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from shoal.cluster import limits as L
from shoal.cluster.codec import RECEIVED_BYTES, PlainBulk, PlainPush, Raw, ReceivedBytes, item_fields
from shoal.cluster.commands import (COMMANDS, LONG_POLL_COMMANDS, NEW_JOB_COMMANDS, NODE_COMMANDS,
                                    PRE_AUTH_COMMANDS, normalize, validate)
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.jobid import partition_of_job
from shoal.cluster.partitioning import partition_for

from .bunqueue import EventFrames, open_envelope, open_envelopes, push_flow_graph, push_repeating
from .partition import Parked, Partition, RemotePartition
from .ports import Clock, FlowHandler, Metrics, NodeInfo, PartitionDirectory, Replier
from .partition.pushes import bulk_batch, check_block, check_queue, each_result, session_pull
from .locator import JobLocator
from .sessions import SESSION_CHARS_MAX, SessionTable
from .state import loose_jobs
from .writes import PendingWrites

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shoal.cluster.config import ClusterConfig

    from .bunqueue import EventJobs
    from .partition.pushes import PushBatch, PushRun
    from .raft import PartitionReplica
    from .relay import Relay
    from .state import Event

__all__ = ["Dispatcher"]

log = logging.getLogger(__name__)

WORKERS_MAX = 10_000
#: Custom job ids being looked for in every partition at once (``Locate``).
LOCATES_MAX = 1_000
LOCATE_TIMEOUT_S = 5.0
#: Commands answered per partition and merged, over the whole cluster for a connection that
#: does not route for itself (only the partitions this node leads for one that does).
FAN_OUT_PARTS_TIMEOUT_S = 10.0


class Dispatcher:
    """Answers every frame of every connection of one node.

    It reaches the rest of the node only through what it is given: the partitions
    (``directory``), the node's identity and listeners (``info``), the ``metrics``,
    the ``clock`` and the ``flows`` service; connections hand themselves in as
    :class:`~.ports.Replier` s.
    """

    def __init__(self, config: "ClusterConfig", loop: asyncio.AbstractEventLoop, *, clock: Clock,
                 directory: PartitionDirectory, info: NodeInfo, metrics: Metrics, flows: FlowHandler) -> None:
        self.config = config
        self.flows = flows
        self._flow_commands = flows.commands
        self.loop = loop
        #: Connections with output to write (see :class:`~.writes.PendingWrites`).
        self.writes = PendingWrites(loop)
        self.clock = clock
        self.directory = directory
        self.info = info
        self.metrics = metrics
        self.partitions = config.partitions
        self.auth_required = bool(config.tokens)
        # Digests of both sides are compared, so not even a token's length shows in the timing.
        self._token_digests = [_digest(t) for t in config.tokens]
        limits = self.limits = config.limits
        self._connections_max = limits.connections_max
        self._per_address_max = limits.connections_per_address_max
        self._per_address: dict[str, int] = {}
        #: Set by the node's memory guard: new jobs are refused while True.
        self.overloaded: CommandError | None = None
        self.unfinished_bytes = 0
        self._unfinished_max = limits.unfinished_budget_bytes()
        self.sessions = SessionTable(info.node_id, loop, config.session_grace_ms, self._release_session)
        self.connections: set[Replier] = set()
        self.subscribers: set[Replier] = set()
        self.workers: dict[str, dict[str, Any]] = {}
        self._worker_ids = itertools.count(1)
        self.commands_total = 0
        self._queue_partitions: dict[str, int] = {}
        #: Forwarding to other nodes' leaders (set by the server when the node has peers).
        self.relay: Relay | None = None
        #: The partitions other nodes lead, as commands are submitted to them (:meth:`_remote`).
        self._remotes: dict[int, RemotePartition] = {}
        self.locator = JobLocator()
        self._locating = 0
        #: Connections subscribed to bunqueue's events (``SubscribeEvents``), by queue.
        self.event_subscribers: dict[str, set[Replier]] = {}

    # --- connection lifecycle ------------------------------------------------------------------

    def connection_opened(self, conn: Replier) -> CommandError | None:
        """Admit a new connection, or say why not (the connection limits); it then closes."""
        host = conn.peer_host
        if len(self.connections) >= self._connections_max:
            return CommandError(ErrorCode.OVERLOADED, f"this node already has {len(self.connections)} client "
                                f"connections (limits.connections_max = {self._connections_max})")
        count = self._per_address.get(host, 0)
        if count >= self._per_address_max:
            return CommandError(ErrorCode.OVERLOADED, f"{count} connections from {host} already "
                                f"(limits.connections_per_address_max = {self._per_address_max})")
        self._per_address[host] = count + 1
        self.connections.add(conn)
        self.sessions.attach(conn.session, conn.conn_id)
        return None

    def unfinished_add(self, delta: int) -> bool:
        """Grow (or shrink) the bytes held in large unfinished frames; False, and nothing
        changed, when growing would pass limits.unfinished_bytes_max."""
        if delta > 0 and self.unfinished_bytes + delta > self._unfinished_max:
            return False
        self.unfinished_bytes += delta
        return True

    def connection_closed(self, conn: Replier) -> None:
        if conn not in self.connections:
            return  # refused at connect: never counted
        self.connections.discard(conn)
        self.subscribers.discard(conn)
        for queue in list(conn.bunqueue_subscriptions or ()):
            conns = self.event_subscribers.get(queue)
            if conns is not None:
                conns.discard(conn)
                if not conns:
                    del self.event_subscribers[queue]
        if self.relay is not None:
            self.relay.connection_closed(conn)
        self.sessions.detach(conn.session, conn.conn_id)
        host = conn.peer_host
        count = self._per_address.get(host, 0) - 1
        if count > 0:
            self._per_address[host] = count
        else:
            self._per_address.pop(host, None)

    def _release_session(self, session: str, partitions: set[int]) -> None:
        for p in partitions:
            part = self.directory.partitions.get(p)
            if part is not None and part.replica.is_leader():
                part.group_commit.submit({"cmd": "_ReleaseSession", "session": session}, _ignore)

    # --- entry point ---------------------------------------------------------------------------

    def handle(self, conn: Replier, frame: dict[str, Any]) -> None:
        """Answer ``frame`` now or later; exactly one reply per frame."""
        self.commands_total += 1
        received = frame.get(RECEIVED_BYTES)
        if type(received) is ReceivedBytes:  # (a client's own field of that name is the schema's to refuse)
            del frame[RECEIVED_BYTES]
        else:
            received = None
        cmd = frame["cmd"]
        req_id = frame.get("reqId")
        if not conn.authed and cmd not in PRE_AUTH_COMMANDS:
            raise CommandError(ErrorCode.AUTH_REQUIRED, "authenticate with Auth {token} first")
        if cmd == "PUSHF":  # bunqueue's flow: a graph of jobs with their own ids
            if self.overloaded is not None:
                raise self.overloaded
            push_flow_graph(self._flow_tree, conn, frame, self.clock.now_ms())
            return
        if self.overloaded is not None and cmd in NEW_JOB_COMMANDS:
            raise self.overloaded
        if cmd in self._flow_commands:  # PushFlow and the flow commands peers send
            self.flows.handle(conn, frame)
            return
        if cmd == "PUSHB" and received is not None and self._sent_as_received(conn, frame, received.body):
            return
        if (cmd == "PUSH" or cmd == "PUSHB" or cmd == "Cron") and conn.bunqueue_envelope:
            open_envelope(frame)
            if cmd == "PUSHB" and push_repeating(self.handle, conn, frame):
                return  # bunqueue's repeating adds: job schedulers
        normalize(frame)
        cmd = frame["cmd"]
        if received is not None and cmd != "PUSHB" and self._sent_on(conn, frame, received.body):
            return
        validate(frame)
        if cmd in NODE_COMMANDS:
            conn.reply(req_id, self._node_command(conn, cmd, frame))
            return
        if cmd == "Stats" and frame.get("local"):
            conn.reply(req_id, self.info.local_stats(frame.get("partition")))
            return
        spec = COMMANDS[cmd]
        forwards = self.relay is not None and conn.wants_forwarding
        if spec.routing == "partition" and frame.get("partition") is None:
            if forwards:
                self._fan_out_cluster(conn, frame, spec.read_only)
            else:
                self._fan_out(conn, frame, spec.read_only)
            return
        if spec.routing == "id":
            job_id = _routing_job_id(frame)
            try:
                p = partition_of_job(job_id)
            except CommandError:
                # A custom id (bunqueue's jobId, a flow's own ids): its queue's partition.
                p = self.locator.get(job_id)  # type: ignore[assignment]
                if p is None:
                    self._locate_then_route(conn, frame, job_id)
                    return
                self._route(conn, frame, p, True)
                return
            if not 0 <= p < self.partitions:
                raise CommandError(ErrorCode.NOT_FOUND, f"partition {p} does not exist (cluster has {self.partitions})")
        else:
            p = self._partition_of(spec.routing, frame)
        self._route(conn, frame, p, forwards)

    def _sent_as_received(self, conn: Replier, frame: dict[str, Any], body: bytes) -> bool:
        """Send a ``PUSHB`` for a partition led elsewhere on to its leader as the client sent it
        (``body``), for the leader to check once, as it checks its own clients' frames;
        False, sending nothing, when it takes the general path: this node leads the partition,
        the client routes for itself, or the frame is not plainly a bulk add to a valid queue
        (the general path names what is wrong), or holds bunqueue's repeating jobs (which
        become job schedulers here)."""
        if self.relay is None or not conn.wants_forwarding:
            return False
        jobs = frame.get("jobs")
        if type(jobs) is not list or not jobs:
            return False
        fields = item_fields(jobs)  # in C: no look at each job here
        if fields is None:
            return False
        if conn.bunqueue_envelope and "repeat" in fields:
            return False
        p = self._partition_unchecked("queue", frame)
        if p is None or self.directory.leads(p):  # the relay's test too: it runs the frame here only then
            return False
        self._remote(p).submit_received(conn, frame, body, "customId" in fields or "jobId" in fields)
        return True

    def _sent_on(self, conn: Replier, frame: dict[str, Any], body: bytes) -> bool:
        """Send a command (normalized, not checked) for a partition led elsewhere on to its
        leader as the client sent it (``body``), for the leader to check once; False, sending
        nothing, when it takes the general path: this node leads the partition, the client
        routes for itself, the command is answered here (a node's command, a fan-out, a custom
        id whose partition this node must look up), or its partition cannot be told without
        the checks (which then name what is wrong)."""
        if self.relay is None or not conn.wants_forwarding:
            return False
        cmd = frame["cmd"]
        spec = COMMANDS.get(cmd) if type(cmd) is str else None
        if spec is None or cmd in NODE_COMMANDS or cmd == "Cron" or (cmd == "Stats" and frame.get("local")):
            return False
        p = self._partition_unchecked(spec.routing, frame)
        if p is None or self.directory.leads(p):
            return False
        self._remote(p).submit_received(conn, frame, body, cmd == "PUSH")
        return True

    def _partition_unchecked(self, routing: str, frame: dict[str, Any]) -> int | None:
        """The partition a command not checked yet goes to, when its routing field alone tells
        it; None otherwise (a fan-out, a custom id, a field the checks will refuse)."""
        if routing == "queue":
            field = frame.get("queue")
        elif routing == "id":  # the field _routing_job_id reads, if it is there
            ids = frame.get("ids")
            field = frame.get("id") if "id" in frame else (ids[0] if type(ids) is list and ids else None)
        elif routing == "partition":
            field = frame.get("partition")  # none: a fan-out
        else:
            return None
        if type(field) is not (int if routing == "partition" else str):
            return None  # missing, or of a type the checks name
        try:
            if routing == "queue":
                check_queue(field)
            return self._partition_of(routing, frame)
        except CommandError:
            return None  # a custom id (the general path looks its partition up), or no such partition

    def _flow_tree(self, conn: Replier, frame: dict[str, Any]) -> None:
        """One tree of a PUSHF graph: a PushFlow, or the PUSH of a lone job."""
        if frame["cmd"] == "PushFlow":
            self.flows.handle(conn, frame)
        else:
            self.handle(conn, frame)

    def _route(self, conn: Replier, frame: dict[str, Any], p: int, forwards: bool) -> None:
        """Submit a validated command to partition ``p``, led here or elsewhere (``forwards``:
        the client does not route for itself, or the job id names no partition)."""
        self._target(p, forwards).submit(conn, frame)

    def _target(self, p: int, forwards: bool) -> Partition | RemotePartition:
        """Partition ``p`` if this node leads it; else, when this node forwards, the
        :class:`~.partition.RemotePartition` that takes its commands to the leader; else
        ``NOT_LEADER`` (raised) with where the leader is."""
        part = self.directory.partitions.get(p)
        if part is not None and part.replica.is_leader():
            return part
        if forwards and self.relay is not None:
            return self._remote(p)
        raise self.directory.not_leader_error(p)

    def _remote(self, p: int) -> RemotePartition:
        remote = self._remotes.get(p)
        if remote is None:
            assert self.relay is not None, "a remote partition without a relay"
            remote = self._remotes[p] = RemotePartition(p, self.relay)
        return remote

    def serve(self, part: Partition, conn: Replier, frame: dict[str, Any]) -> None:
        """A validated command of ``part``, which this node leads: a read from the applied state
        (under the read lease, or after a ReadIndex round), a long poll, or a write."""
        replica = part.replica
        cmd = frame["cmd"]
        req_id = frame.get("reqId")
        if COMMANDS[cmd].read_only:
            if not replica.read_ready():
                raise CommandError(ErrorCode.NO_LEADER, f"partition {part.id}'s new leader has not applied its "
                                                        "first entry yet; retry")
            if replica.lease_held():
                self._read(conn, frame, replica)
            else:
                # No read lease (a new leader, a transfer in this term, a stalled loop): the read
                # waits for a majority to answer a round sent after it arrived (ReadIndex).
                replica.confirm_reads(lambda ok: self._read_confirmed(conn, frame, part.id, ok))
            return
        if cmd in LONG_POLL_COMMANDS:
            self._pull(conn, frame, part)
            return
        if cmd == "JobHeartbeatB" and replica.lease_held():
            # A worker's heartbeat right after its pull renews nothing yet: no entry, no fsync.
            fresh = replica.application.view.fresh_heartbeat(frame, self.clock.now_ms())
            if fresh is not None:
                conn.reply(req_id, fresh)
                return
        self._write(conn, frame, part)

    def _read(self, conn: Replier, frame: dict[str, Any], replica: "PartitionReplica") -> None:
        """Answer a read from ``replica``'s applied state (its leadership is confirmed)."""
        started = time.perf_counter()
        conn.reply(frame.get("reqId"), replica.application.view.read(frame, self.clock.now_ms()))
        self.metrics.observe(frame["cmd"], time.perf_counter() - started)

    def _read_confirmed(self, conn: Replier, frame: dict[str, Any], p: int, ok: bool) -> None:
        """A read waited for its ReadIndex round: answer it, or route it anew if leadership moved
        (forwarded for a client that does not route, or when its job id names no partition)."""
        if conn.closed:
            return
        part = self.directory.partitions.get(p)
        replica = part.replica if part is not None else None
        try:
            if ok and replica is not None and replica.is_leader() and replica.read_ready():
                self._read(conn, frame, replica)
            elif replica is not None and replica.is_leader():
                raise CommandError(ErrorCode.NO_LEADER, f"partition {p}'s leader could not confirm its "
                                                        "leadership in time; retry")
            else:
                self._route(conn, frame, p, self._forwards(conn) or _names_no_partition(frame))
        except CommandError as exc:
            conn.reply_error(frame.get("reqId"), exc)

    def _locate_then_route(self, conn: Replier, frame: dict[str, Any], job_id: str) -> None:
        """Find the partition of a custom job id (asking every partition), then answer the command."""
        if self._locating >= LOCATES_MAX:
            raise CommandError(ErrorCode.OVERLOADED, f"{LOCATES_MAX} job ids are being looked for on this node")
        self._locating += 1
        req_id = frame.get("reqId")

        async def run() -> None:
            try:
                p = await self._locate(job_id)
                if p is None:
                    if frame["cmd"] == "GetJob":
                        conn.reply(req_id, {"job": None})
                    else:
                        conn.reply_error(req_id, CommandError(ErrorCode.NOT_FOUND, f"job {job_id} does not exist"))
                    return
                self._route(conn, frame, p, True)
            except CommandError as exc:
                conn.reply_error(req_id, exc)
            except Exception as exc:
                log.exception("locating job %r failed", job_id)
                conn.reply_error(req_id, CommandError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}"))
            finally:
                self._locating -= 1

        self.loop.create_task(run())

    async def _locate(self, job_id: str) -> int | None:
        """The partition holding the job with custom id ``job_id``, or None (every partition asked)."""
        p = self.locator.get(job_id)
        if p is not None:
            return p
        probe = {"cmd": "Locate", "id": job_id}
        remote = []
        hosted = self.directory.partitions
        for q in range(self.partitions):
            part = hosted.get(q)
            if part is not None and part.replica.is_leader():
                if part.replica.application.read({**probe, "partition": q}, self.clock.now_ms()).get("found"):
                    self.locator.learn(job_id, q)
                    return q
            elif self.relay is not None:
                remote.append(q)
        if not remote:
            return None
        assert self.relay is not None
        replies = await asyncio.gather(*(self.relay.call(q, {**probe, "partition": q}, LOCATE_TIMEOUT_S)
                                         for q in remote), return_exceptions=True)
        for q, reply in zip(remote, replies):
            if isinstance(reply, dict) and reply.get("found"):
                self.locator.learn(job_id, q)
                return q
        errors = [r for r in replies if isinstance(r, CommandError)]
        if errors:
            raise CommandError(ErrorCode.NO_LEADER, f"job {job_id} was not found, and {len(errors)} partitions "
                                                    f"did not answer ({errors[0]}); retry")
        return None

    def _partition_of(self, routing: str, frame: dict[str, Any]) -> int:
        if routing == "queue":
            queue = frame["queue"]
            p = self._queue_partitions.get(queue)
            if p is None:
                if len(self._queue_partitions) > 100_000:
                    self._queue_partitions.clear()  # bound the cache; hashing again is cheap
                p = self._queue_partitions[queue] = partition_for(queue, self.partitions)
            return p
        if routing == "id":
            p = partition_of_job(_routing_job_id(frame))
        else:
            p = frame["partition"]
        if not 0 <= p < self.partitions:
            raise CommandError(ErrorCode.NOT_FOUND, f"partition {p} does not exist (cluster has {self.partitions})")
        return p

    # --- writes --------------------------------------------------------------------------------

    def handle_pushes(self, conn: Replier, frames: list[PlainPush]) -> None:
        """Answer consecutive plain PUSHes of one connection to one queue.

        Each frame gets the reply ``handle`` would give it; the block goes to its partition,
        led here (:meth:`serve_pushes`) or elsewhere (forwarded as one message), as one.
        Checks come first and answer nothing, so an unexpected error leaves every frame to
        the caller's error reply.
        """
        self.commands_total += len(frames)
        queue = frames[0].queue
        if conn.bunqueue_envelope:
            open_envelopes(frames)
        try:
            if self.overloaded is not None:
                raise self.overloaded
            check_queue(queue)
            target = self._target(self._partition_of("queue", {"queue": queue}), self._forwards(conn))
        except CommandError as exc:
            for frame in frames:
                conn.reply_error(frame.reqId, exc)
            return
        target.submit_pushes(conn, frames)

    def serve_pushes(self, part: Partition, conn: Replier, frames: list[PlainPush]) -> None:
        """A block of plain PUSHes of ``part``, which this node leads: the valid ones go to
        group commit as one ``PushRun`` (:func:`~.pushes.check_block`, the form it gives a run
        of plain pushes anyway), so the block costs one routing, one submit and one callback
        instead of one of each per push."""
        req_ids, run = check_block(frames, conn.reply_error)
        if run is None:
            return
        n = len(req_ids)
        p = part.id
        started = time.perf_counter()

        def done(result: Any) -> None:
            # The engine's per-push outcomes, or one error for the whole entry (e.g. NOT_LEADER).
            results = each_result(result, n)
            if _not_proposed(results[0]) and self._forwards(conn):
                self._forward_run(conn, run, req_ids, results, p)
                return
            conn.reply_many(req_ids, results, "PUSH", time.perf_counter() - started)

        part.group_commit.submit(run, done)

    def handle_bulk(self, conn: Replier, bulk: PlainBulk) -> None:
        """Answer a plain PUSHB (its jobs carry only ``data`` and maybe an ``idempotencyKey``) of an
        authenticated connection.

        Checked as a whole (:func:`~.pushes.bulk_batch`), it goes to its partition, led here
        (:meth:`serve_bulk`) or elsewhere (sent on as its client sent it), with no dict or
        ``Raw`` per job. A bunqueue client's (whose data is an envelope) and one that fails a
        check take the general path, which says what is wrong.
        """
        batch = None if conn.bunqueue_envelope else bulk_batch(bulk)
        if batch is None:
            frame = bulk.to_frame(Raw)
            frame[RECEIVED_BYTES] = ReceivedBytes(bulk.body)
            self.handle(conn, frame)
            return
        self.commands_total += 1
        if self.overloaded is not None:
            raise self.overloaded
        target = self._target(self._partition_of("queue", {"queue": batch.queue}), self._forwards(conn))
        target.submit_bulk(conn, bulk, batch)

    def serve_bulk(self, part: Partition, conn: Replier, bulk: PlainBulk, batch: PushBatch) -> None:
        """A plain PUSHB of ``part``, which this node leads, proposed as ``batch``, the
        ``PushBatch`` the general path makes of its dict (:func:`~.pushes.bulk_batch`)."""
        req_id = bulk.reqId
        p = part.id
        started = time.perf_counter()
        observe = self.metrics.observe

        def done(result: Any) -> None:
            observe("PUSHB", time.perf_counter() - started)
            if _not_proposed(result) and self._forwards(conn):
                # This node stopped leading before proposing it: the relay takes it to the new leader.
                try:
                    self._remote(p).submit(conn, bulk.to_frame(Raw), away=True)
                except CommandError as exc:
                    conn.reply_error(req_id, exc)
                return
            if isinstance(result, CommandError):
                conn.reply_error(req_id, result)
            else:
                conn.reply(req_id, result)

        part.group_commit.submit(batch, done)

    def _forwards(self, conn: Replier) -> bool:
        """Does this node forward ``conn``'s commands (a client that does not route for itself)?"""
        return self.relay is not None and conn.wants_forwarding and not conn.closed

    def _forward_run(self, conn: Replier, run: PushRun, req_ids: list[Any], results: list[Any], p: int) -> None:
        """A block of pushes refused here unproposed (this node stopped leading ``p``): the relay
        takes them to the new leader as one block, as it would have had this node not led ``p``."""
        away: list[PlainPush] = []
        for i, (req_id, result) in enumerate(zip(req_ids, results)):
            if not _not_proposed(result):
                conn.reply_many([req_id], [result], "PUSH", 0.0)
                continue
            away.append(PlainPush(queue=run.queue, data=msgspec.Raw(run.datas[i]), reqId=req_id,
                                  idempotencyKey=None if run.keys is None else run.keys[i],
                                  name=None if run.names is None else run.names[i]))
        if away:
            self._remote(p).submit_pushes(conn, away, away=True)

    def _write(self, conn: Replier, frame: dict[str, Any], part: Partition, deadline: float | None = None) -> None:
        """Submit one write; a PUSH with a ``timeout`` refused QUEUE_FULL parks until its
        ``deadline`` (loop time, set when it first parks)."""
        req_id = frame.get("reqId")
        p = part.id
        started = time.perf_counter()
        observe = self.metrics.observe
        # taken now, while the frame's items are in the CPU's caches: the answer comes after
        # the whole entry's applies, which push them out
        custom_ids = _custom_ids(frame)

        def done(result: Any) -> None:
            observe(frame["cmd"], time.perf_counter() - started)
            if custom_ids and type(result) is dict:
                learn = self.locator.learn
                for custom_id in custom_ids:
                    learn(custom_id, p)
            if _not_proposed(result) and self._forwards(conn):
                # This node stopped leading before proposing it: the relay takes it to the new
                # leader (the entry's job data lost its Raw wrapper on the way: restored).
                _rewrap_data(frame)
                try:
                    self._remote(p).submit(conn, frame, away=True)
                except CommandError as exc:
                    conn.reply_error(req_id, exc)
                return
            if isinstance(result, CommandError):
                if (result.code is ErrorCode.QUEUE_FULL and frame["cmd"] == "PUSH"
                        and frame.get("waitMs") and not conn.closed):
                    self._park_push(conn, frame, part, deadline)
                    return
                conn.reply_error(req_id, result)
            else:
                conn.reply(req_id, result)

        part.group_commit.submit(frame, done)

    def _park_push(self, conn: Replier, frame: dict[str, Any], part: Partition, deadline: float | None) -> None:
        if deadline is None:
            deadline = self.loop.time() + frame["waitMs"] / 1000
        if self.loop.time() >= deadline:
            conn.reply_error(frame.get("reqId"), CommandError(ErrorCode.QUEUE_FULL, "queue is full (waited timeout)"))
            return
        parked = Parked(conn, frame, part.id, frame["queue"], deadline)
        parked.timer = self.loop.call_at(deadline, self._expire_push, parked)
        part.park_push(parked)

    def _expire_push(self, parked: Parked[Replier]) -> None:
        if not parked.done:
            parked.done = True
            parked.conn.reply_error(parked.frame.get("reqId"),
                                    CommandError(ErrorCode.QUEUE_FULL, "queue is full (waited timeout)"))

    # --- pulls and long polls ------------------------------------------------------------------

    def _pull(self, conn: Replier, frame: dict[str, Any], part: Partition) -> None:
        if not frame.get("detach"):
            self.sessions.used_partition(conn.session, part.id)
        timeout_ms = frame.get("timeout") or 0
        if timeout_ms > 0 and not part.replica.application.view.has_ready(frame["queue"], frame.get("group"),
                                                                          bool(frame.get("ungrouped"))):
            self._park_pull(conn, frame, part, self.loop.time() + timeout_ms / 1000)
            return
        self._submit_pull(conn, frame, part, None)

    def _submit_pull(self, conn: Replier, frame: dict[str, Any], part: Partition, deadline: float | None) -> None:
        req_id = frame.get("reqId")
        p = part.id
        started = time.perf_counter()  # from submit: a long poll's parked time is not latency

        def done(result: Any) -> None:
            self.metrics.observe(frame["cmd"], time.perf_counter() - started)
            if isinstance(result, CommandError):
                conn.reply_error(req_id, result)
                return
            jobs = [result["job"]] if frame["cmd"] == "PULL" and result.get("job") else result.get("jobs")
            if not jobs and deadline is not None and self.loop.time() < deadline and not conn.closed:
                # Someone else took the job first; keep waiting for the rest of the timeout.
                self._park_pull(conn, frame, part, deadline)
                return
            if jobs:
                for job in loose_jobs(jobs):  # a run's jobs have no custom id
                    if "customId" in job:
                        self.locator.learn(job["id"], p)
            conn.reply(req_id, result)

        # A detached lease outlives this connection: only an ack or its TTR ends it (for
        # consumers that ack from another process, e.g. the Spark stream's commit). A PULLB's
        # byte bound is replicated with it, so every replica stops at the same job: a reply
        # that could not be sent would leave its jobs leased until their TTR ran out.
        session = None if frame.get("detach") else conn.session
        bytes_max = self.config.frame_bytes_max if frame["cmd"] == "PULLB" else 0
        part.group_commit.submit(session_pull(frame, session, bytes_max), done)

    def _park_pull(self, conn: Replier, frame: dict[str, Any], part: Partition, deadline: float) -> None:
        parked = Parked(conn, frame, part.id, frame["queue"], deadline)
        if not part.park_pull(parked):
            conn.reply_error(frame.get("reqId"), CommandError(ErrorCode.OVERLOADED, "too many parked pulls on this queue"))
            return
        parked.timer = self.loop.call_at(deadline, self._expire_pull, parked)

    def _expire_pull(self, parked: Parked[Replier]) -> None:
        if parked.done:
            return
        parked.done = True
        empty = {"job": None} if parked.frame["cmd"] == "PULL" else {"jobs": [], "tokens": []}
        parked.conn.reply(parked.frame.get("reqId"), empty)

    def wake(self, part: Partition) -> None:
        """``part``, which this node leads, applied entries: submit again the parked commands
        that may now succeed."""
        for parked in part.wake_pulls(part.replica.application.view.has_ready):
            self._submit_pull(parked.conn, parked.frame, part, parked.deadline)
        for parked in part.wake_pushes():
            self._write(parked.conn, parked.frame, part, parked.deadline)

    def fail_parked(self, part: Partition, error: CommandError) -> None:
        """This node no longer leads ``part`` (or no longer hosts it): answer everything parked on it."""
        for parked in part.drain_parked():
            parked.conn.reply_error(parked.frame.get("reqId"), error)

    # --- fan-out over the partitions this node leads -------------------------------------------

    def _fan_out(self, conn: Replier, frame: dict[str, Any], read_only: bool) -> None:
        req_id = frame.get("reqId")
        hosted = self.directory.partitions
        led = [p for p, part in sorted(hosted.items()) if part.replica.is_leader()]
        cmd = frame["cmd"]
        if read_only:
            self._fan_out_read(conn, frame, led)
            return
        results: dict[int, Any] = {}
        if not led:
            conn.reply(req_id, _merge(cmd, {}))
            return

        def collect(p: int, result: Any) -> None:
            results[p] = result
            if len(results) == len(led):
                ok = {q: r for q, r in results.items() if not isinstance(r, CommandError)}
                errors = [r for r in results.values() if isinstance(r, CommandError)
                          and r.code is not ErrorCode.NOT_FOUND]
                if errors and not ok:
                    conn.reply_error(req_id, errors[0])
                else:
                    conn.reply(req_id, _merge(cmd, ok))

        for p in led:
            hosted[p].group_commit.submit(frame, lambda r, p=p: collect(p, r))

    def _fan_out_read(self, conn: Replier, frame: dict[str, Any], led: list[int]) -> None:
        """A read over the partitions this node leads, each answered once its leadership is sure
        (read lease, else a ReadIndex round); a partition whose leadership is lost meanwhile is
        left out, as one led elsewhere is."""
        hosted = self.directory.partitions
        waiting = [p for p in led if not hosted[p].replica.lease_held()]
        confirmed: dict[int, bool] = {p: True for p in led if p not in waiting}

        def answer() -> None:
            if conn.closed:
                return
            now = self.clock.now_ms()
            parts = {p: hosted[p].replica.application.view.read(frame, now) for p in led
                     if confirmed.get(p) and hosted[p].replica.is_leader() and hosted[p].replica.read_ready()}
            conn.reply(frame.get("reqId"), _merge(frame["cmd"], parts, frame.get("limit")))

        if not waiting:
            answer()
            return

        def one(p: int, ok: bool) -> None:
            confirmed[p] = ok
            if len(confirmed) == len(led):
                answer()

        for p in waiting:
            hosted[p].replica.confirm_reads(lambda ok, p=p: one(p, ok))

    def _fan_out_cluster(self, conn: Replier, frame: dict[str, Any], read_only: bool) -> None:
        """A partition-routed command without ``partition`` for a client that does not route for
        itself: every partition answers (here or at its leader) and the replies are merged."""
        req_id = frame.get("reqId")
        cmd = frame["cmd"]
        relay = self.relay
        assert relay is not None

        async def one(p: int) -> Any:
            part = {**frame, "partition": p}
            part.pop("reqId", None)
            hosted = self.directory.partitions.get(p)
            if hosted is not None and hosted.replica.is_leader():
                replica = hosted.replica
                if read_only:
                    if not replica.lease_held():
                        sure: asyncio.Future[bool] = self.loop.create_future()
                        replica.confirm_reads(lambda ok: sure.done() or sure.set_result(ok))
                        if not await sure or not replica.is_leader():
                            raise CommandError(ErrorCode.NO_LEADER, f"partition {p}'s leadership could not be "
                                                                    "confirmed; retry")
                    return replica.application.read(part, self.clock.now_ms())
                future: asyncio.Future[Any] = self.loop.create_future()
                hosted.group_commit.submit(part, lambda r: future.done() or future.set_result(r))
                result = await future
                if isinstance(result, CommandError):
                    raise result
                return result
            reply = await relay.call(p, part, FAN_OUT_PARTS_TIMEOUT_S)
            reply.pop("ok", None)
            reply.pop("reqId", None)
            return reply

        async def run() -> None:
            replies = await asyncio.gather(*(one(p) for p in range(self.partitions)), return_exceptions=True)
            parts = {p: r for p, r in enumerate(replies) if isinstance(r, dict)}
            errors = [r for r in replies if isinstance(r, CommandError) and r.code is not ErrorCode.NOT_FOUND]
            if errors and (not read_only or len(parts) < self.partitions):
                conn.reply_error(req_id, CommandError(errors[0].code, f"{len(errors)} of {self.partitions} "
                                                                      f"partitions did not answer: {errors[0]}"))
                return
            conn.reply(req_id, _merge(cmd, parts, frame.get("limit")))

        self.loop.create_task(run())

    # --- node-level commands -------------------------------------------------------------------

    def _node_command(self, conn: Replier, cmd: str, frame: dict[str, Any]) -> dict[str, Any]:
        if cmd == "Ping":
            now = float(self.clock.now_ms())
            return {"pong": True, "time": now, "data": {"pong": True, "time": now}}  # bunqueue reads data.pong
        if cmd == "SubscribeEvents":
            return self._subscribe_events(conn, frame)
        if cmd == "Hello":
            version = min(frame["protocolVersion"], 2)
            capabilities = frame.get("capabilities")
            conn.upgrade(version)
            if capabilities and "routing" in capabilities:
                conn.wants_forwarding = False  # it routes for itself
                conn.bunqueue_envelope = False  # Shoal's own client: its data is never looked into
            reply = {"protocolVersion": version, "capabilities": ["pipelining", "routing"] if version >= 2 else [],
                     "nodeId": self.info.node_id, "clusterId": self.config.cluster_id,
                     "incarnation": self.info.incarnation,
                     "authRequired": self.auth_required}
            if conn.authed:  # the cluster's layout and the session only to authenticated clients
                reply["topology"] = self.info.topology.to_wire()
                reply["session"] = conn.session
            return reply
        if cmd == "Auth":
            token = frame["token"]
            if not self.auth_required:
                conn.authed = True
                return {}
            given = _digest(token)
            # Compare against every token so timing does not reveal which (or whether one) matched.
            matched = False
            for t in self._token_digests:
                matched |= hmac.compare_digest(given, t)
            if not matched:
                raise CommandError(ErrorCode.AUTH_FAILED, "invalid token")
            conn.authed = True
            return {"topology": self.info.topology.to_wire(), "session": conn.session}
        if cmd == "Identify":
            session = frame.get("session")
            if session is not None:
                if not 0 < len(session) <= SESSION_CHARS_MAX:
                    raise CommandError(ErrorCode.INVALID, f"session: must be a string of 1..{SESSION_CHARS_MAX} chars")
                if session != conn.session:
                    self.sessions.detach(conn.session, conn.conn_id)
                    conn.session = session
                    self.sessions.attach(session, conn.conn_id)
            return {"session": conn.session}
        if cmd == "Subscribe":
            queue = frame.get("queue")
            if conn.subscriptions is None:
                conn.subscriptions = set()
            conn.subscriptions.add(queue or "")
            self.subscribers.add(conn)
            self.info.events_wanted()
            return {}
        if cmd == "Prometheus":
            return {"text": self.metrics.exposition()}
        return self._worker_command(cmd, frame)

    def _worker_command(self, cmd: str, frame: dict[str, Any]) -> dict[str, Any]:
        now = self.clock.now_ms()
        if cmd == "ListWorkers":
            return {"workers": list(self.workers.values())}
        worker_id = frame.get("workerId")
        if worker_id == "":
            raise CommandError(ErrorCode.INVALID, "workerId: must not be empty")
        if cmd == "RegisterWorker":
            name = frame.get("name")
            queues = frame.get("queues") or []
            if worker_id is None:
                worker_id = f"{self.info.node_id}-w{next(self._worker_ids)}"
            if worker_id not in self.workers and len(self.workers) >= WORKERS_MAX:
                raise CommandError(ErrorCode.OVERLOADED, f"at most {WORKERS_MAX} registered workers per node")
            worker = {"id": worker_id, "workerId": worker_id, "name": name or worker_id, "queues": queues,
                      "registeredAt": float(now), "lastSeen": float(now), "status": "active"}
            for extra in ("concurrency", "hostname", "pid", "startedAt"):  # bunqueue's worker describes itself
                value = frame.get(extra)
                if value is not None:
                    worker[extra] = value
            self.workers[worker_id] = worker
            return {"workerId": worker_id, "data": worker}
        if worker_id is None:
            raise CommandError(ErrorCode.INVALID, "workerId: required")
        if cmd == "UnregisterWorker":
            if self.workers.pop(worker_id, None) is None:
                raise CommandError(ErrorCode.NOT_FOUND, f"worker {worker_id} is not registered")
            return {"data": {"removed": True}}
        # Heartbeat
        worker = self.workers.get(worker_id)
        if worker is None:
            raise CommandError(ErrorCode.NOT_FOUND, f"worker {worker_id} is not registered")
        worker["lastSeen"] = float(now)
        for count in ("activeJobs", "processed", "failed"):  # what bunqueue's worker reports
            if frame.get(count) is not None:
                worker[count] = frame[count]
        return {"data": {"ok": True}}

    def _subscribe_events(self, conn: Replier, frame: dict[str, Any]) -> dict[str, Any]:
        """bunqueue's ``SubscribeEvents {queue}``: that queue's job events, as ``{type: "event",
        event: {eventType, queue, jobId, timestamp, ...}}`` frames, wherever its leader is."""
        queue = frame["queue"]
        check_queue(queue)
        subs = conn.bunqueue_subscriptions
        if subs is None:
            subs = conn.bunqueue_subscriptions = set()
        subs.add(queue)
        self.event_subscribers.setdefault(queue, set()).add(conn)
        self.info.events_wanted()
        if self.relay is not None:
            self.relay.subscribe(conn, queue)  # its events come from its leader when that is another node
        return {}

    # --- events --------------------------------------------------------------------------------

    def wants_events(self) -> bool:
        """Does a connection here, a peer for its clients, or one of the node's listeners (the
        dashboard's, an event stream's) take job events?"""
        return bool(self.subscribers or self.event_subscribers or self.info.event_listeners
                    or (self.relay is not None and self.relay.peer_subscriptions))

    def publish(self, partition: int, events: Sequence[Event], view: EventJobs) -> None:
        """Send the job events one partition's engine recorded to subscribed connections (and
        the node's other listeners); ``view`` is that partition's applied state."""
        if self.info.event_listeners or self.subscribers:
            published = view.event_dicts(partition, events)
            for listener in self.info.event_listeners:
                listener(published)
            for conn in list(self.subscribers):
                subs = conn.subscriptions or set()
                for ev in published:
                    if "" in subs or ev.get("queue") in subs:
                        conn.send_frame(ev)
        if self.event_subscribers or (self.relay is not None and self.relay.peer_subscriptions):
            self._publish_bunqueue(partition, events, view)

    def _publish_bunqueue(self, partition: int, events: Sequence[Event], view: EventJobs) -> None:
        """bunqueue's events of the queues someone subscribed to, here or at a peer."""
        relay = self.relay
        frames = EventFrames(view, partition, self.clock.now_ms())
        # per local subscriber, its frames of the batch in order: written at once
        pending: dict[Any, list[bytes]] = {}
        # queue -> (its local subscribers' lists, whether a peer subscribed to it): once per batch
        targets: dict[str, tuple[list[list[bytes]], bool]] = {}

        def wanted(queue: str) -> bool:
            target = targets.get(queue)
            if target is None:
                local = self.event_subscribers.get(queue)
                target = targets[queue] = ([pending.setdefault(conn, []) for conn in local or ()],
                                           relay is not None and relay.wants_events(queue))
            return bool(target[0]) or target[1]

        for queue, data in frames.chunks(events, wanted):
            lists, remote = targets[queue]
            for out in lists:
                out.append(data)
            if remote:
                assert relay is not None
                relay.publish_to_peers(queue, lambda data=data: data)  # type: ignore[misc]
        for conn, chunks in pending.items():
            if not chunks:
                continue
            conn.send_encoded(b"".join(chunks))


def _ignore(_: Any) -> None:
    pass


#: Refusals of a command this node never proposed because it does not (or no longer) lead its partition.
_NOT_PROPOSED = frozenset({ErrorCode.NOT_LEADER, ErrorCode.NO_LEADER})


def _routing_job_id(frame: dict[str, Any]) -> Any:
    """The job id a command routed by id goes by: its ``id``, or the first of its ``ids``."""
    return frame["id"] if "id" in frame else frame["ids"][0]


def _names_no_partition(frame: dict[str, Any]) -> bool:
    """Is ``frame`` routed by a custom job id, whose partition only forwarding reaches
    (a client cannot route it for itself)?"""
    if COMMANDS[frame["cmd"]].routing != "id":
        return False
    try:
        partition_of_job(_routing_job_id(frame))
    except CommandError:
        return True
    return False


def _custom_ids(frame: dict[str, Any]) -> list[Any] | None:
    """The custom ids an add names (for the locator to learn once it is answered); None for any
    other command, or a bulk add without them, which is told in C without a look at each item."""
    cmd = frame["cmd"]
    if cmd == "PUSH":
        return [frame["customId"]] if "customId" in frame else None
    if cmd != "PUSHB":
        return None
    jobs = frame["jobs"]
    fields = item_fields(jobs)
    if fields is not None and "customId" not in fields:
        return None
    return [item["customId"] for item in jobs if "customId" in item]


def _not_proposed(result: Any) -> bool:
    return isinstance(result, CommandError) and result.code in _NOT_PROPOSED


def _rewrap_data(frame: dict[str, Any]) -> None:
    """Job data as the connection decoded it (``Raw``), after group commit unwrapped it to bytes."""
    data = frame.get("data")
    if type(data) is bytes:
        frame["data"] = Raw(data)
    for item in frame.get("jobs") or ():
        if type(item) is dict and type(item.get("data")) is bytes:
            item["data"] = Raw(item["data"])


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _merge(cmd: str, parts: dict[int, dict[str, Any]], limit: int | None = None) -> dict[str, Any]:
    """Combine one partition-routed command's replies from several partitions (a listing keeps
    its page size: the first ``limit`` items, ``more`` when any partition or the merge had more)."""
    covered = sorted(parts)
    limit = limit or L.page_limit_max
    more = any(r.get("more") for r in parts.values())
    if cmd == "ListQueues":
        names = sorted({q for r in parts.values() for q in r.get("queues", [])})
        return {"queues": names[:limit], "more": more or len(names) > limit, "partitions": covered}
    if cmd == "CronList":
        crons = [c for r in parts.values() for c in r.get("crons", [])]
        return {"crons": crons[:limit], "more": more or len(crons) > limit, "partitions": covered}
    if cmd == "CronDelete":
        return {"deleted": any(r.get("deleted") for r in parts.values()), "partitions": covered}
    if cmd == "CronGet":
        found = [r["cron"] for r in parts.values() if r.get("cron") is not None]
        return {"cron": found[0] if found else None, "partitions": covered}
    if cmd == "Stats":
        return {"stats": {str(p): r.get("stats") for p, r in parts.items()}, "partitions": covered}
    merged: dict[str, Any] = {"partitions": covered}
    for p, r in parts.items():
        merged[str(p)] = r
    return merged
