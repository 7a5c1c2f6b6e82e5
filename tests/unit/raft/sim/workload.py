"""Simulated clients: pushes with idempotency keys, pulls and acks, and a record of what was acknowledged.

Each client works against whichever replica says it leads (as a client following
topology hints would), through :meth:`~shoal.node.raft.replica.PartitionReplica.propose`
with the commands in their replicated form (:func:`shoal.node.partition.pushes.replicated_form`).
It retries as the real client does (:func:`shoal.client._core.retry_action`): a command
that was never applied (``NO_LEADER``) always, one whose outcome is unknown (``TIMEOUT``,
or no answer at all because the node died) only when it is safe to repeat — pushes carry
idempotency keys, so a push is retried until it is acknowledged.

What the clients learn is recorded for the checkers (:mod:`.checkers`): every
acknowledged push (its key, id and data), every delivery of a job, and every job whose
ACK was acknowledged (completed, so never to be delivered again).

Queue ``q2`` is of the disk class (``durable: false``) when the run says so: its adds and
acks are acknowledged once a majority appended them, so a power cut after the
acknowledgement may lose them (never more: a job kept is the job pushed). Takes are answered
as the node answers them, before the entry is durable on a lone voter. Every token a take
hands out must be new: a repeated one would let a consumer whose take was lost complete a
job leased to another.

Clients also read (``GetJob``) as the node's dispatcher does: from the applied state of a
replica that says it leads, at once while its read lease holds, else after a ReadIndex
round. A read must reflect every write acknowledged before it began: a job whose push was
acknowledged is found, and one whose ACK was acknowledged is completed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shoal.client._core import Action, retry_action, retry_pause_s
from shoal.client.exceptions import error_from_reply
from shoal.cluster.codec import Raw, raw_of
from shoal.cluster.errors import CommandError
from shoal.node.partition import Partition
from shoal.node.partition.pushes import fan_out, replicated_form
from shoal.node.raft.replica import FAIL_LOST, FAIL_NO_LEADER, PartitionReplica, fail_reason_error
from shoal.node.state import SessionPull

from .loop import SimLoop

__all__ = ["Workload", "PushRecord", "CLIENT_TIMEOUT_S"]

#: A client that hears nothing for this long takes the outcome as unknown (a dead connection).
CLIENT_TIMEOUT_S = 3.0
QUEUES = ("q1", "q2")
#: The queue that is of the disk class in runs that have one.
DISK_QUEUE = "q2"
#: Lease of a pulled job: short enough that lost acks make jobs come back within a run.
TTR_MS = (1_500, 6_000)


@dataclass
class PushRecord:
    """One logical push (one idempotency key) and what the client learnt of it."""

    key: str
    queue: str
    #: The job's data as MessagePack bytes (what the engine stores).
    data: bytes
    job_id: str | None = None
    attempts: int = 0
    acked_at: float | None = None
    #: Pushed to the disk-class queue.
    disk: bool = False


@dataclass
class Lease:
    ids: list[str]
    tokens: list[str]
    at: float


@dataclass
class Records:
    """What the clients were told, for the checkers."""

    pushes: dict[str, PushRecord] = field(default_factory=dict)
    #: job id -> key of the acknowledged push that created it.
    job_keys: dict[str, str] = field(default_factory=dict)
    #: job id -> when its ACK was acknowledged.
    completed: dict[str, float] = field(default_factory=dict)
    #: Jobs whose ACK had an unknown outcome (they may be completed).
    ack_unknown: set[str] = field(default_factory=set)
    deliveries: int = 0
    pulls_ok: int = 0
    acks_ok: int = 0
    reads_ok: int = 0
    #: Every token a take handed out.
    tokens: set[str] = field(default_factory=set)
    #: job id -> the disk-class queue's job (its writes may be lost to a power cut).
    disk_jobs: set[str] = field(default_factory=set)


class Workload:
    """The simulated clients (see the module docstring)."""

    def __init__(self, loop: SimLoop, rng: random.Random, leaders: Callable[[], list[PartitionReplica]],
                 fail: Callable[[str], None], clients: int = 3, data_bytes: tuple[int, int] = (20, 300),
                 disk_class: bool = False, reads: float = 0.0,
                 power_cut_at: Callable[[], float] | None = None) -> None:
        """``disk_class``: queue ``q2`` is of the disk class; ``reads``: the share of operations
        that are reads; ``power_cut_at()``: when the last power cut of any node happened."""
        self.loop = loop
        self.rng = rng
        self._leaders = leaders
        self._fail = fail
        self.clients = clients
        self.data_bytes = data_bytes
        self.disk_class = disk_class
        self.reads = reads
        self._power_cut_at = power_cut_at or (lambda: float("-inf"))
        self._disk_queue_ready = not disk_class
        self.records = Records()
        self.stop_at = float("inf")
        self._next_key = 0
        self._leases: dict[int, list[Lease]] = {c: [] for c in range(clients)}
        #: Pushes sent and not yet acknowledged (retried until they are).
        self.pending: set[str] = set()
        #: Commands proposed whose answer (or timeout) has not come yet.
        self.inflight = 0

    def start(self, at: float) -> None:
        if self.disk_class:
            self.loop.call_at(at, self._create_disk_queue)
        for c in range(self.clients):
            self.loop.call_at(at + self.rng.uniform(0.0, 0.2), self._next_op, c)

    def maybe_lost(self, acked_at: float | None, disk: bool) -> bool:
        """A write acknowledged at ``acked_at`` may be gone: of the disk class, with a power cut since."""
        return disk and acked_at is not None and self._power_cut_at() >= acked_at

    def _create_disk_queue(self, attempt: int = 1) -> None:
        frame = {"cmd": "CreateQueue", "queue": DISK_QUEUE, "options": {"durable": False}}

        def answer(results: list[Any]) -> None:
            result = results[0]
            if isinstance(result, dict) or (isinstance(result, CommandError) and result.code.value == "INVALID"):
                self._disk_queue_ready = True  # created (INVALID: it exists already, from a retry)
            elif self.loop.time() < self.stop_at:
                self.loop.call_later(retry_pause_s(attempt, self.rng.random()), self._create_disk_queue, attempt + 1)

        self._send([frame], [dict(frame)], None, answer)

    # --- choosing operations --------------------------------------------------------------------

    def _next_op(self, client: int) -> None:
        now = self.loop.time()
        if now >= self.stop_at:
            return
        rng = self.rng
        kind = rng.random()
        leases = self._leases[client]
        if self.reads and rng.random() < self.reads:
            self._read(client)
        elif kind < 0.2 and leases:
            self._ack(client, leases.pop(rng.randrange(len(leases))))
        elif kind < 0.4:
            self._pull(client)
        else:
            self._push(client, [self._new_push() for _ in range(rng.choice((1, 1, 1, 2, 5)))])
        self.loop.call_later(rng.expovariate(1 / 0.15), self._next_op, client)

    def _new_push(self) -> PushRecord:
        self._next_key += 1
        key = f"k{self._next_key}"
        size = self.rng.randint(*self.data_bytes)
        queues = QUEUES if self._disk_queue_ready else QUEUES[:1]
        queue = self.rng.choice(queues)
        record = PushRecord(key, queue, raw_of(key + "." * size).packed, disk=self.disk_class and queue == DISK_QUEUE)
        self.records.pushes[key] = record
        self.pending.add(key)
        return record

    # --- sending ------------------------------------------------------------------------------------

    def _send(self, frames: list[dict[str, Any]], cmds: list[Any], sizes: list[int] | None,
              answer: Callable[[list[Any]], None], early: bool = False) -> None:
        """Propose ``cmds`` on a replica that says it leads; ``answer`` gets one result per frame
        (a reply dict or a CommandError, ``TIMEOUT`` when nothing came back in time). ``early``:
        the batch takes jobs, answered before the entry is durable where the node does so."""
        leaders = self._leaders()
        if not leaders:
            answer([fail_reason_error(FAIL_NO_LEADER)] * len(frames))
            return
        replica = self.rng.choice(leaders)
        settled = False
        self.inflight += 1

        def done(results: Any, reason: int) -> None:
            nonlocal settled
            if settled:
                return
            settled = True
            self.inflight -= 1
            timer.cancel()
            if results is None or reason != 0:
                answer([fail_reason_error(reason)] * len(frames))
                return
            out: list[Any] = []
            fan_out([out.append] * len(frames), results, sizes)
            if len(out) != len(frames):
                self._fail(f"{len(frames)} commands proposed, {len(out)} results came back: {out!r}")
            answer(out)

        def timed_out() -> None:
            nonlocal settled
            if not settled:
                settled = True
                self.inflight -= 1
                answer([fail_reason_error(FAIL_LOST)] * len(frames))

        timer = self.loop.call_later(CLIENT_TIMEOUT_S, timed_out)
        now_ms = int(self.loop.time() * 1000)
        answers_early = early and replica.commits_alone()
        # through the node's own write policies (no space, durability class), as the node proposes
        Partition(replica.partition, replica).propose(now_ms, cmds, done,
                                                      (lambda results: done(results, 0)) if answers_early else None)

    def _retry(self, error: CommandError, frame: dict[str, Any]) -> bool:
        """The real client's decision on the node's ``error`` for ``frame``."""
        wire = error_from_reply({"ok": False, "code": error.code.value, "error": str(error)})
        return retry_action(wire, frame) is Action.RETRY

    # --- pushes -------------------------------------------------------------------------------------

    def _push(self, client: int, records: list[PushRecord], attempt: int = 1) -> None:
        frames = [{"cmd": "PUSH", "queue": r.queue, "data": Raw(r.data), "idempotencyKey": r.key}
                  for r in records]
        for r in records:
            r.attempts += 1
        cmds, sizes = replicated_form([dict(f) for f in frames], 0)

        def answer(results: list[Any]) -> None:
            again = []
            for record, frame, result in zip(records, frames, results):
                if isinstance(result, dict):
                    self._pushed(record, result)
                elif isinstance(result, CommandError) and self._retry(result, frame):
                    again.append(record)
                else:
                    self._fail(f"push {record.key} refused: {result!r}")
            if again:
                pause = retry_pause_s(attempt, self.rng.random())
                self.loop.call_later(pause, self._push, client, again, attempt + 1)

        self._send(frames, cmds, sizes, answer)

    def _pushed(self, record: PushRecord, reply: dict[str, Any]) -> None:
        job_id = reply.get("id")
        if not isinstance(job_id, str):
            self._fail(f"push {record.key}: reply without an id: {reply!r}")
            return
        if record.job_id is not None and record.job_id != job_id \
                and not self.maybe_lost(record.acked_at, record.disk):
            self._fail(f"push {record.key} acknowledged twice with different ids: {record.job_id}, {job_id}")
        other = self.records.job_keys.get(job_id)
        if other is not None and other != record.key:
            earlier = self.records.pushes[other]
            if not self.maybe_lost(earlier.acked_at, earlier.disk):
                self._fail(f"job {job_id} acknowledged for two pushes: {other} and {record.key}")
        if record.disk:
            self.records.disk_jobs.add(job_id)
        record.job_id = job_id
        if record.acked_at is None:
            record.acked_at = self.loop.time()
        self.records.job_keys[job_id] = record.key
        self.pending.discard(record.key)

    # --- pulls and acks -----------------------------------------------------------------------------

    def _pull(self, client: int, attempt: int = 1) -> None:
        rng = self.rng
        frame = {"cmd": "PULLB", "queue": rng.choice(QUEUES), "count": rng.randint(1, 8),
                 "ttr": rng.randint(*TTR_MS)}
        sent_at = self.loop.time()

        def answer(results: list[Any]) -> None:
            result = results[0]
            if isinstance(result, dict):
                self._pulled(client, result, sent_at)
            elif isinstance(result, CommandError) and self._retry(result, frame) and self.loop.time() < self.stop_at:
                self.loop.call_later(retry_pause_s(attempt, rng.random()), self._pull, client, attempt + 1)

        self._send([frame], [SessionPull(frame, f"c{client}")], None, answer, early=True)

    def _pulled(self, client: int, reply: dict[str, Any], sent_at: float) -> None:
        records = self.records
        records.pulls_ok += 1
        ids = [job["id"] for job in reply.get("jobs", [])]
        for job_id, token in zip(ids, reply.get("tokens", [])):
            records.deliveries += 1
            done_at = records.completed.get(job_id)
            if done_at is not None and done_at <= sent_at and not self.maybe_lost(done_at, job_id in records.disk_jobs):
                self._fail(f"job {job_id} delivered again at {self.loop.time():.3f} after its ACK was "
                           f"acknowledged at {done_at:.3f}")
            if token in records.tokens:
                self._fail(f"job {job_id} delivered with token {token}, which an earlier take handed out")
            records.tokens.add(token)
        if ids:
            self._leases[client].append(Lease(ids, list(reply["tokens"]), self.loop.time()))

    def _ack(self, client: int, lease: Lease, attempt: int = 1) -> None:
        frame = {"cmd": "ACKB", "ids": lease.ids, "tokens": lease.tokens}
        cmds, sizes = replicated_form([dict(frame)], 0)

        def answer(results: list[Any]) -> None:
            result = results[0]
            records = self.records
            if isinstance(result, dict):
                records.acks_ok += 1
                now = self.loop.time()
                for job_id in lease.ids:
                    records.completed.setdefault(job_id, now)
            elif isinstance(result, CommandError):
                if self._retry(result, frame):
                    self.loop.call_later(retry_pause_s(attempt, self.rng.random()), self._ack, client, lease,
                                         attempt + 1)
                elif result.code.value == "TIMEOUT":
                    records.ack_unknown.update(lease.ids)

        self._send([frame], cmds, sizes, answer)

    # --- reads ----------------------------------------------------------------------------------------

    def _read(self, client: int) -> None:
        """``GetJob`` of an acknowledged push's job, answered as the node's dispatcher answers it."""
        acked = [r for r in self.records.pushes.values() if r.job_id is not None]
        if not acked:
            return
        record = self.rng.choice(acked)
        leaders = [r for r in self._leaders() if r.read_ready()]
        if not leaders:
            return
        replica = self.rng.choice(leaders)
        began = self.loop.time()
        job_id = record.job_id
        assert job_id is not None

        def serve(ok: bool) -> None:
            if not ok or not replica.is_leader() or not replica.read_ready():
                return  # refused (NO_LEADER): the client would retry elsewhere
            try:
                job = replica.application.read({"cmd": "GetJob", "id": job_id}, int(self.loop.time() * 1000)).get("job")
            except CommandError:
                job = None
            self._check_read(record, job_id, job, began, replica.node_id)

        if replica.lease_held():
            serve(True)
        else:
            replica.confirm_reads(serve)

    def _check_read(self, record: PushRecord, job_id: str, job: dict[str, Any] | None, began: float,
                    node: str) -> None:
        records = self.records
        records.reads_ok += 1
        if record.acked_at is None or record.acked_at >= began or record.job_id != job_id:
            return
        if self.maybe_lost(record.acked_at, record.disk):
            return
        if job is None:
            self._fail(f"{node} read job {job_id} as missing at {began:.3f}, though its push was acknowledged "
                       f"at {record.acked_at:.3f} (a stale read)")
            return
        done_at = records.completed.get(job_id)
        if done_at is not None and done_at < began and job["state"] != "completed" \
                and not self.maybe_lost(done_at, record.disk):
            self._fail(f"{node} read job {job_id} as {job['state']} at {began:.3f}, though its ACK was "
                       f"acknowledged at {done_at:.3f} (a stale read)")
