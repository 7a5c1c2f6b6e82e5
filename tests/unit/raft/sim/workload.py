"""Simulated clients: pushes with idempotency keys, pulls and acks, and a record of what was acknowledged.

Each client works against whichever replica says it leads (as a client following
topology hints would), through :meth:`~shoal.node.raft.replica.PartitionReplica.propose`
with the commands in their replicated form (:func:`shoal.node.pushes.replicated_form`).
It retries as the real client does (:func:`shoal.client._core.retry_action`): a command
that was never applied (``NO_LEADER``) always, one whose outcome is unknown (``TIMEOUT``,
or no answer at all because the node died) only when it is safe to repeat — pushes carry
idempotency keys, so a push is retried until it is acknowledged.

What the clients learn is recorded for the checkers (:mod:`.checkers`): every
acknowledged push (its key, id and data), every delivery of a job, and every job whose
ACK was acknowledged (completed, so never to be delivered again).
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
from shoal.node.pushes import fan_out, replicated_form
from shoal.node.raft.replica import FAIL_LOST, FAIL_NO_LEADER, PartitionReplica, fail_reason_error
from shoal.node.state import SessionPull

from .loop import SimLoop

__all__ = ["Workload", "PushRecord", "CLIENT_TIMEOUT_S"]

#: A client that hears nothing for this long takes the outcome as unknown (a dead connection).
CLIENT_TIMEOUT_S = 3.0
QUEUES = ("q1", "q2")
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


class Workload:
    """The simulated clients (see the module docstring)."""

    def __init__(self, loop: SimLoop, rng: random.Random, leaders: Callable[[], list[PartitionReplica]],
                 fail: Callable[[str], None], clients: int = 3, data_bytes: tuple[int, int] = (20, 300)) -> None:
        self.loop = loop
        self.rng = rng
        self._leaders = leaders
        self._fail = fail
        self.clients = clients
        self.data_bytes = data_bytes
        self.records = Records()
        self.stop_at = float("inf")
        self._next_key = 0
        self._leases: dict[int, list[Lease]] = {c: [] for c in range(clients)}
        #: Pushes sent and not yet acknowledged (retried until they are).
        self.pending: set[str] = set()
        #: Commands proposed whose answer (or timeout) has not come yet.
        self.inflight = 0

    def start(self, at: float) -> None:
        for c in range(self.clients):
            self.loop.call_at(at + self.rng.uniform(0.0, 0.2), self._next_op, c)

    # --- choosing operations --------------------------------------------------------------------

    def _next_op(self, client: int) -> None:
        now = self.loop.time()
        if now >= self.stop_at:
            return
        rng = self.rng
        kind = rng.random()
        leases = self._leases[client]
        if kind < 0.2 and leases:
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
        record = PushRecord(key, self.rng.choice(QUEUES), raw_of(key + "." * size).packed)
        self.records.pushes[key] = record
        self.pending.add(key)
        return record

    # --- sending ------------------------------------------------------------------------------------

    def _send(self, frames: list[dict[str, Any]], cmds: list[Any], sizes: list[int] | None,
              answer: Callable[[list[Any]], None]) -> None:
        """Propose ``cmds`` on a replica that says it leads; ``answer`` gets one result per frame
        (a reply dict or a CommandError, ``TIMEOUT`` when nothing came back in time)."""
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
        replica.propose(now_ms, cmds, done)

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
        if record.job_id is not None and record.job_id != job_id:
            self._fail(f"push {record.key} acknowledged twice with different ids: {record.job_id}, {job_id}")
        other = self.records.job_keys.get(job_id)
        if other is not None and other != record.key:
            self._fail(f"job {job_id} acknowledged for two pushes: {other} and {record.key}")
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

        self._send([frame], [SessionPull(frame, f"c{client}")], None, answer)

    def _pulled(self, client: int, reply: dict[str, Any], sent_at: float) -> None:
        records = self.records
        records.pulls_ok += 1
        ids = [job["id"] for job in reply.get("jobs", [])]
        for job_id in ids:
            records.deliveries += 1
            done_at = records.completed.get(job_id)
            if done_at is not None and done_at <= sent_at:
                self._fail(f"job {job_id} delivered again at {self.loop.time():.3f} after its ACK was "
                           f"acknowledged at {done_at:.3f}")
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

