"""ACK, ACKB (runs of segment jobs included), FAIL, Release, Bury, Kick and the lease commands."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from ._commands import AckRun
from ._decimal import consecutive_decimals, decimals_after, joined_decimal_run
from ._model import Job, Queue, pack
from ._segments import SLOT_ACTIVE, SLOT_COMPLETED, SLOT_GONE, Segment, ack_run_of, plain_ack
from ._store import Store, shoal_seq
from ._transitions import ACTIVE, CANCELLED, COMPLETED, FAILED, check_transition

__all__ = ["AckOps", "HEARTBEAT_WRITE_MIN_MS"]

#: A batched heartbeat that would move every lease it names by less than this (or by less than a
#: tenth of the lease, when that is shorter) changes nothing worth a log entry: the leader answers
#: it from its state. A worker sends one right after each pull, when every lease is fresh.
HEARTBEAT_WRITE_MIN_MS = 1_000


class AckOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _op_ACK(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.segments and cmd.get("result") is None and not cmd.get("removeOnComplete"):
            slot = self._active_slot(cmd["id"], cmd.get("token"))  # None at once for a job object
            if slot is not None:  # a leased segment job completes in place, as in an ACKB
                seg, i = slot
                q = self.queues[seg.queue]
                self._complete_slot(q, seg, i)
                if len(q.history) > q.opts["historyMax"]:
                    self._trim_history(q)
                return {}
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        result = cmd.get("result")
        if result is not None:
            job.result = result.packed if type(result) is Raw else pack(result)
        if cmd.get("removeOnComplete"):
            _set_meta(job, "removeOnComplete", True)
        self._count(q, "ACK")
        self._complete(q, job)
        return {}

    def _apply_ack_run(self, run: AckRun) -> dict[str, Any]:
        """The ACKB that ``run`` stands for: completed slice by slice when its jobs are still
        that leased run, else as the batch of ids (with the errors it has)."""
        done = self._ack_run(run.first, run.count, run.lease) if self.segments else 0
        if done:
            return {"count": done}
        return self._ack_ids(_ack_of_run(self.partition, run))

    def _op_ACKB(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.segments and plain_ack(cmd):
            run = ack_run_of(self.partition, cmd["ids"], cmd.get("tokens"))
            done = self._ack_run(*run) if run is not None else 0
            if done:
                return {"count": done}
        return self._ack_ids(cmd)

    def _ack_ids(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """ACKB job by job: every id checked first (the batch is atomic), then completed."""
        ids = cmd["ids"]
        tokens = cmd.get("tokens") or [None] * len(ids)
        results = cmd.get("results") or [None] * len(ids)
        removes = cmd.get("removeOnCompletes")
        # Per id: its Job, or the slot (segment, index) of a leased segment job acked without
        # a result, which completes in place (no object is made for it).
        targets: list[Any] = []
        find, all_jobs, segments = self._job, self.jobs, self.segments
        prefix = f"{self.partition}-"
        token_prefix = f"{self.partition}."
        cut = len(prefix)
        seg: Segment | None = None  # the segment of the previous slot
        for job_id, token, result in zip(ids, tokens, results):   # check all first: the batch is atomic
            # A validated id of this partition: the seq is the digits after the prefix. Anything
            # else (another partition, a bad id) takes ``_job`` and its errors.
            tail = job_id[cut:] if job_id.startswith(prefix) else ""
            seq = int(tail) if tail.isdigit() and tail.isascii() and len(job_id) <= 40 else 0
            job = all_jobs.get(seq) if seq else None
            if job is None and seq and segments and result is None and not removes:
                if seg is None or not 0 <= seq - seg.first < len(seg.states):
                    seg = segments.find(seq)
                if seg is not None:
                    i = seq - seg.first
                    if (seg.states[i] == SLOT_ACTIVE
                            and (token is None or str(token) == token_prefix + str(seg.lease_nos[i]))):
                        targets.append((seg, i))
                        continue
            if job is None:
                job = find(job_id)
            if job.state != ACTIVE or (token is not None and str(token) != job.token):
                self._require_active(job, {"token": token})  # raises the precise error
            targets.append(job)
        if len({t.seq if type(t) is Job else t[0].first + t[1] for t in targets}) != len(targets):
            raise CommandError(ErrorCode.INVALID, "ids: the same job appears twice")
        queues = self.queues
        touched: dict[str, Queue] = {}
        q = None
        complete = self._complete
        for i, (target, result) in enumerate(zip(targets, results)):
            if type(target) is Job:
                if q is None or q.name != target.queue:
                    q = touched[target.queue] = queues[target.queue]
                if result is not None:
                    target.result = result.packed if type(result) is Raw else pack(result)
                if removes is not None and removes[i]:
                    _set_meta(target, "removeOnComplete", True)
                q.calls["ACKB"] = q.calls.get("ACKB", 0) + 1
                complete(q, target, trim=False)
                continue
            seg, i = target
            if q is None or q.name != seg.queue:
                q = touched[seg.queue] = queues[seg.queue]
            self._complete_slots(q, seg, i, 1)
        for q in touched.values():
            if len(q.history) > q.opts["historyMax"]:
                self._trim_history(q)  # once per batch: the same jobs go as trimming after each ack
        return {"count": len(targets)}

    def _ack_run(self, first: int, k: int, lease: int) -> int:
        """ACKB of one segment's consecutive leased jobs ``first .. first+k-1`` (``ack_run_of``),
        their leases numbered from ``lease`` (-1: no tokens given).

        Checks and completes the run slice by slice: the same outcome as acking the jobs
        one by one. Returns 0, having changed nothing, when the jobs are not that run
        (the general path then handles the batch, errors included).
        """
        found = self._leased_run(first, k, lease)
        if found is None:
            return 0
        seg, i = found
        q = self.queues[seg.queue]
        self._complete_slots(q, seg, i, k)
        if len(q.history) > q.opts["historyMax"]:
            self._trim_history(q)
        return k

    def _leased_run(self, first: int, k: int, lease: int) -> tuple[Segment, int] | None:
        """The segment and slot of ``first`` when ``first .. first+k-1`` are one segment's
        active slots leased under the numbers from ``lease`` on (-1: not checked), else None."""
        seg = self.segments.find(first)
        if seg is None:
            return None
        i = first - seg.first
        end = i + k
        if end > len(seg.states) or seg.states.count(SLOT_ACTIVE, i, end) != k:
            return None
        if lease >= 0 and seg.lease_nos[i:end] != list(range(lease, lease + k)):
            return None
        return seg, i

    def _active_slot(self, job_id: Any, token: Any) -> tuple[Segment, int] | None:
        """The segment and slot of ``job_id`` when it is a leased segment job of this partition
        and ``token`` (if given) is its lease's, else None (the per-job path then answers)."""
        seq = shoal_seq(job_id, self.partition) if type(job_id) is str else None
        if seq is None or seq <= 0 or seq in self.jobs:
            return None
        seg = self.segments.find(seq)
        if seg is None:
            return None
        i = seq - seg.first
        if seg.states[i] != SLOT_ACTIVE or (token is not None and str(token) != f"{self.partition}.{seg.lease_nos[i]}"):
            return None
        return seg, i

    def _complete_slot(self, q: Queue, seg: Segment, i: int) -> None:
        """An ACK's completion of leased slot ``i`` of ``seg`` (``_complete_slots`` of one)."""
        check_transition(ACTIVE, COMPLETED)
        seq = seg.first + i
        seg.states[i] = SLOT_COMPLETED
        seg.finished[i] = self.now_ms
        session = seg.sessions[i]
        if session is not None:
            seg.sessions[i] = None
            self.sessions.let_go(session, seq)
        counts = q.counts
        counts[ACTIVE] -= 1
        counts[COMPLETED] += 1
        if self._events is not None:
            self._events.append((q.name, seq, COMPLETED, ACTIVE))
        q.history.append(seq)
        q.totals["completed"] += 1
        q.calls["ACK"] = q.calls.get("ACK", 0) + 1

    def _complete_slots(self, q: Queue, seg: Segment, i: int, k: int) -> None:
        """ACKB's completion of leased slots ``i .. i+k-1`` of ``seg``, without a result: the
        steps of ``_complete`` (lease ended, completed, into the history) done slice by slice.
        The caller checked them and trims the history."""
        check_transition(ACTIVE, COMPLETED)  # the callers found the slots active
        end = i + k
        first = seg.first + i
        seqs = range(first, first + k)
        seg.states[i:end] = bytes([SLOT_COMPLETED]) * k
        seg.finished[i:end] = [self.now_ms] * k
        held = seg.sessions[i:end]
        for session in set(held):
            if session is not None:
                self.sessions.let_go_slots(session, first, k, held.count(session))
        seg.sessions[i:end] = [None] * k
        counts = q.counts
        counts[ACTIVE] -= k
        counts[COMPLETED] += k
        events = self._events
        if events is not None:
            name = q.name
            events.extend([(name, seq, COMPLETED, ACTIVE) for seq in seqs])
        q.history.extend(seqs)
        q.totals["completed"] += k
        q.calls["ACKB"] = q.calls.get("ACKB", 0) + k

    def _op_FAIL(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """A failed attempt: retried after its backoff while attempts remain (``unrecoverable``:
        none remain), else dead-lettered (``removeOnFail``: removed). ``stack`` is kept, at most
        the job's ``stackTraceLimit`` lines (10 by default, as bunqueue)."""
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        self._count(q, "FAIL")
        job.error = cmd.get("error") or "failed"
        stack = cmd.get("stack")
        if stack:
            limit = job.meta.get("stackTraceLimit", STACK_LINES_DEFAULT) if job.meta else STACK_LINES_DEFAULT
            _set_meta(job, "stacktrace", list(stack[:limit]))
        if cmd.get("removeOnFail"):
            _set_meta(job, "removeOnFail", True)
        if job.attempts < job.max_attempts and not cmd.get("unrecoverable"):
            delay = cmd.get("delay")
            if delay is None:
                fixed = job.meta is not None and job.meta.get("backoffType") == "fixed"
                delay = job.backoff_ms if fixed else job.backoff_ms * (2 ** max(0, job.attempts - 1))
            q.totals["retried"] += 1
            self._to_waiting(q, job, delay)
        else:
            self._finish(q, job, FAILED)
        return {"state": job.state}

    def _op_Release(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        self._count(q, "Release")
        self._to_waiting(q, job, cmd.get("delay") or 0)
        return {"state": job.state}

    def _op_Bury(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._check_token(job, cmd)
        if job.state in (COMPLETED, FAILED, CANCELLED):
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is already {job.state}")
        q = self.queues[job.queue]
        self._count(q, "Bury")
        if cmd.get("error"):
            job.error = cmd["error"]
        self._finish(q, job, FAILED)
        return {}

    def _op_Kick(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        self._count(q, "Kick")
        return {"count": self._retry_dlq(q, list(q.dlq)[:cmd["count"]], reset=False)}

    def _touch(self, cmd: dict[str, Any], ttr_ms: int | None) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._require_active(job, cmd)
        q = self.queues[job.queue]
        self._count(q, cmd["cmd"])
        job.lease_deadline_ms = self.now_ms + (ttr_ms or job.ttr_ms)
        heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, job.token or "", 0))
        return {"deadline": job.lease_deadline_ms}

    def _op_Touch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return self._touch(cmd, cmd["ttr"])

    def _op_JobHeartbeat(self, cmd: dict[str, Any]) -> dict[str, Any]:
        reply = self._touch(cmd, cmd.get("ttr"))
        return {**reply, "data": {"ok": True}}

    def _op_JobHeartbeatB(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Extend the leases of several active jobs (bunqueue's batched heartbeat); the jobs no
        longer active or leased to another token are skipped, not errors."""
        ids = cmd["ids"]
        tokens = cmd.get("tokens") or [None] * len(ids)
        ttr_ms = cmd.get("ttr")
        count = 0
        for job_id, token in zip(ids, tokens):
            try:
                job = self._job(job_id)
                self._require_active(job, {"token": token})
            except CommandError:
                continue
            job.lease_deadline_ms = self.now_ms + (ttr_ms or job.ttr_ms)
            heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, job.token or "", 0))
            count += 1
        return {"count": count, "data": {"ok": True, "count": count}}

    def fresh_heartbeat(self, cmd: dict[str, Any], now_ms: int) -> dict[str, Any] | None:
        """The reply to the ``JobHeartbeatB`` ``cmd`` when applying it at ``now_ms`` would only move
        fresh leases by a little (:data:`HEARTBEAT_WRITE_MIN_MS`): each job it names that is active
        under the token given is leased to within that margin of what the heartbeat would set,
        later or earlier (the others the command skips). None when it must be written: a lease would move, or a job is
        named by a custom id. Reads only: nothing is materialized."""
        ids = cmd["ids"]
        tokens = cmd.get("tokens") or [None] * len(ids)
        if len(tokens) != len(ids):
            return None
        ttr_ms = cmd.get("ttr")
        if self.segments:
            fresh = self._fresh_runs(ids, cmd.get("tokens"), ttr_ms, now_ms)
            if fresh is not None:
                return {"count": fresh, "data": {"ok": True, "count": fresh}}
        partition = self.partition
        jobs = self.jobs
        segments = self.segments
        count = 0
        for job_id, token in zip(ids, tokens):
            seq = shoal_seq(job_id, partition) if type(job_id) is str else None
            if seq is None:
                return None
            job = jobs.get(seq) if seq > 0 else None
            if job is not None:
                if job.state != ACTIVE or (token is not None and str(token) != job.token):
                    continue
                lease_ms, deadline = ttr_ms or job.ttr_ms, job.lease_deadline_ms
            else:
                seg = segments.find(seq) if segments and seq > 0 else None
                if seg is None:
                    continue
                i = seq - seg.first
                if seg.states[i] != SLOT_ACTIVE or (token is not None and str(token) != f"{partition}.{seg.lease_nos[i]}"):
                    continue
                lease_ms, deadline = ttr_ms or seg.ttr_ms, seg.deadlines[i]
            if not lease_ms or abs(now_ms + lease_ms - deadline) > min(HEARTBEAT_WRITE_MIN_MS, lease_ms // 10):
                return None
            count += 1
        return {"count": count, "data": {"ok": True, "count": count}}

    def _fresh_runs(self, ids: list[Any], tokens: list[Any] | None, ttr_ms: int | None, now_ms: int) -> int | None:
        """:meth:`fresh_heartbeat` of the jobs a worker holds when they are runs of segments'
        slots, each run under consecutive tokens (what its pulls gave it, less what it acked): the
        count of those still leased when each of their leases is fresh, else None (the job-by-job
        check decides)."""
        prefix = f"{self.partition}-"
        # the jobs of one worker's pulls in a row are consecutive: one comparison says so
        seqs: Sequence[int] | None = consecutive_decimals(prefix, ids) or decimals_after(prefix, ids)
        if seqs is None:
            return None
        find, lease_prefix, k = self.segments.find, f"{self.partition}.", len(seqs)
        start = count = 0
        while start < k:
            first = seqs[start]
            seg = find(first)
            if seg is None:
                return None
            i = first - seg.first
            limit = min(k, start + len(seg.states) - i)  # a run ends where its segment does
            end = start + 1
            while end < limit and seqs[end] == first + end - start:
                end += 1
            n = end - start
            if seg.states.count(SLOT_GONE, i, i + n):
                return None  # a job made an object of its own: the job-by-job check finds it
            active = seg.states.count(SLOT_ACTIVE, i, i + n)
            if not active:
                start = end
                continue
            if tokens is not None:
                lease = seg.lease_nos[i]
                if seg.lease_nos[i:i + n] != list(range(lease, lease + n)):
                    return None
                try:
                    named = "\n".join(tokens[start:end])
                except TypeError:
                    return None
                if named != joined_decimal_run(lease_prefix, lease, n):
                    return None
            lease_ms = ttr_ms or seg.ttr_ms
            if not lease_ms:
                return None
            deadlines = seg.deadlines[i:i + n]
            if active < n:  # acked (or let go) since the worker sent this: skipped, as applying would
                deadlines = [d for d, state in zip(deadlines, seg.states[i:i + n]) if state == SLOT_ACTIVE]
            target, margin = now_ms + lease_ms, min(HEARTBEAT_WRITE_MIN_MS, lease_ms // 10)
            # |target - d| <= margin for every d: the lowest and highest decide
            if deadlines and (target - min(deadlines) > margin or max(deadlines) - target > margin):
                return None
            count += active
            start = end
        return count

    def _op_ReleaseAll(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        self._count(q, "ReleaseAll")
        self._materialize_active(q)
        active = [j for j in self.jobs.values() if j.queue == q.name and j.state == ACTIVE]
        for job in active:
            self._to_waiting(q, job)
        return {"count": len(active)}

    def _op_ReleaseSession(self, cmd: dict[str, Any]) -> dict[str, Any]:
        seqs = self.sessions.seqs(cmd["session"])
        for seq in seqs:
            job = self._get(seq)
            if job is not None and job.state == ACTIVE and job.session == cmd["session"]:
                self._to_waiting(self.queues[job.queue], job)
        self.sessions.forget(cmd["session"])
        return {"count": len(seqs)}


#: Stack lines a failure keeps when its job set no ``stackTraceLimit`` (bunqueue's default).
STACK_LINES_DEFAULT = 10


def _set_meta(job: Job, key: str, value: Any) -> None:
    if job.meta is None:
        job.meta = {key: value}
    else:
        job.meta[key] = value


def _ack_of_run(partition: int, run: AckRun) -> dict[str, Any]:
    """The ACKB that ``ack_run_of`` turned into ``run``."""
    first, k, lease = run.first, run.count, run.lease
    cmd: dict[str, Any] = {"cmd": "ACKB", "ids": [f"{partition}-{s}" for s in range(first, first + k)]}
    if lease >= 0:
        cmd["tokens"] = [f"{partition}.{n}" for n in range(lease, lease + k)]
    return cmd
