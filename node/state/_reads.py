"""Read-only commands: jobs, states, results, counts, listings, metrics. They never change state."""

from __future__ import annotations

import heapq
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from ._model import PAGE_DEFAULT, PAGE_LIMIT_MAX, SEQ_MASK, Queue
from ._store import Store, wire_state
from ._transitions import ACTIVE, DELAYED, STATES, WAITING

#: bunqueue's state for waiting jobs with a priority (counted and listed apart from ``waiting``).
PRIORITIZED = "prioritized"

__all__ = ["ReadOps"]


class ReadOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _op_GetJob(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"job": self.wire_job(self._job(cmd["id"]))}
        except CommandError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                return {"job": None}
            raise

    def _op_GetJobByCustomId(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        seq = q.custom_ids.get(cmd["customId"]) if q else None
        job = self._peek(seq) if seq is not None else None
        return {"job": self.wire_job(job) if job else None}

    def _op_GetState(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"id": cmd["id"], "state": wire_state(self._job(cmd["id"]))}

    def _op_Locate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Whether a job of this partition has the (custom) id ``id``: how a node finds the
        partition of a custom id it has not seen."""
        try:
            self._job(cmd["id"])
        except CommandError:
            return {"found": False, "partition": self.partition}
        return {"found": True, "partition": self.partition}

    def _op_GetResult(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        return {"result": Raw(job.result) if job.result is not None else None, "state": job.state}

    def _op_GetProgress(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        out: dict[str, Any] = {"progress": job.progress}
        if job.message is not None:
            out["message"] = job.message
        return out

    def _op_GetLogs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        logs = job.logs or []
        limit = cmd.get("limit")
        if limit:
            logs = logs[-limit:]
        start, end = cmd.get("start"), cmd.get("end")
        total = len(logs)
        if start is not None or end is not None:
            logs = logs[(start or 0):(end + 1 if end is not None else None)]
        lines = [{"timestamp": float(t), "level": "info", "message": m} for t, m in logs]
        return {"logs": lines, "data": {"logs": lines, "count": total}}

    def _op_GetJobs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"jobs": [], "total": 0, **({"lastSeq": cmd["afterSeq"]} if "afterSeq" in cmd else {})}
        state = cmd.get("state")
        tag = cmd.get("tag")
        offset = cmd.get("offset") or 0
        limit = cmd.get("limit") or PAGE_DEFAULT
        after = cmd.get("afterSeq")
        if after is not None and cmd.get("asc") is False:
            raise CommandError(ErrorCode.INVALID, "afterSeq pages in ascending order: leave asc out or true")
        # bunqueue lists waiting jobs with a priority as "prioritized", apart from "waiting".
        by_priority = None
        if state == WAITING or state == PRIORITIZED:
            by_priority = state == PRIORITIZED
            state = WAITING
            if tag is None:
                tag_free = q.prio_counts.get(0, 0)
                total = q.counts[WAITING] - tag_free if by_priority else tag_free
        if by_priority is None or tag is not None:
            total = q.counts[state] if state else sum(q.counts.values())
        page: list[dict[str, Any]] = []
        matched = 0
        last = after or 0
        # Seq order, built lazily: a page costs its offset, or, given afterSeq, only itself.
        for job in self._queue_jobs(q.name, state, after or 0):
            if tag is not None and job.tag != tag:
                continue
            if by_priority is not None and bool(job.priority) != by_priority:
                continue
            matched += 1
            if matched <= offset or len(page) >= limit:
                if (tag is None or after is not None) and len(page) >= limit:
                    break  # the total is known from the counters; with a tag it is counted here
                continue
            page.append(self.wire_job(job))
            last = job.seq
        if cmd.get("asc") is False:
            page.reverse()
        reply: dict[str, Any] = {"jobs": page, "total": matched if tag is not None and after is None else total}
        if after is not None:
            reply["lastSeq"] = last  # the afterSeq of the next page
        return reply

    def _op_GetJobCounts(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Jobs by state, as bunqueue counts them: ``waiting`` (priority 0) apart from
        ``prioritized``, and ``paused`` 0 (a paused queue keeps its jobs waiting)."""
        q = self.queues.get(cmd["queue"])
        counts = dict(q.counts) if q else {s: 0 for s in STATES}
        plain = q.prio_counts.get(0, 0) if q else 0
        counts[PRIORITIZED] = counts[WAITING] - plain
        counts[WAITING] = plain
        counts["paused"] = 0
        return {"counts": counts}

    def _op_GetCountsPerPriority(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Jobs still to run (waiting and delayed, as bunqueue counts them) per priority."""
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"counts": {}}
        counts = dict(q.prio_counts)
        if q.counts[DELAYED]:
            seen: set[int] = set()
            for key in self.delayed:
                seq = key & SEQ_MASK
                job = self._delayed_job(seq, detached=True)
                if job is not None and job.state == DELAYED and job.queue == q.name and seq not in seen:
                    seen.add(seq)
                    counts[job.priority] = counts.get(job.priority, 0) + 1
        return {"counts": {str(p): n for p, n in sorted(counts.items())}}

    def _op_Count(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"count": 0}
        state = cmd.get("state")
        if q.type == "log" and not state:
            return {"count": len(q.log)}
        if state == PRIORITIZED:
            return {"count": q.counts[WAITING] - q.prio_counts.get(0, 0)}
        # Without a state: the jobs still to run (bunqueue's count), waiting and delayed.
        return {"count": q.counts[state] if state else q.counts[WAITING] + q.counts[DELAYED]}

    def _op_GetQueueLimits(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The queue's rate limit and concurrency as bunqueue reports them."""
        q = self.queues.get(cmd["queue"])
        opts = q.opts if q else {}
        limit = opts.get("limit") or {}
        rate = {"max": limit["max"], "duration": limit["durationMs"]} if limit.get("max") else None
        concurrency = opts.get("concurrency") or None
        maxed = bool(q and q.limiter is not None and not q.limiter.queue_open(q.counts[ACTIVE], self.now_ms))
        ttl = -2 if rate is None else 0
        if maxed and q is not None and q.limiter is not None:
            due = q.limiter.next_budget_ms(q.counts[ACTIVE])
            ttl = max(0, due - self.now_ms) if due is not None else 0
        limits = {"rateLimit": rate, "rateLimitTtl": ttl, "concurrencyLimit": concurrency, "maxed": maxed}
        return {"data": {"limits": limits}}

    def _op_IsPaused(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        return {"paused": bool(q and q.paused)}

    def _op_ListQueues(self, cmd: dict[str, Any]) -> dict[str, Any]:
        # One page in name order after ``after``: a reply of every name of a partition with a
        # million queues would be built, encoded and sent in one go on the node's loop.
        after, limit = cmd.get("after"), cmd.get("limit") or PAGE_LIMIT_MAX
        names = heapq.nsmallest(limit + 1, self.queues if after is None else (n for n in self.queues if n > after))
        return {"queues": names[:limit], "more": len(names) > limit}

    def _op_Dlq(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The dead-lettered jobs, oldest first, and bunqueue's DLQ entries of them (``filter``:
        by reason, age, a page)."""
        q = self.queues.get(cmd["queue"])
        spec = cmd.get("filter") or {}
        limit = spec.get("limit") or cmd.get("limit") or PAGE_DEFAULT
        offset = spec.get("offset") or 0
        jobs = []
        for seq in (q.dlq if q else ()):
            job = self.jobs[seq]
            if not dlq_match(job, spec):
                continue
            jobs.append(job)
            if len(jobs) >= offset + limit:
                break
        wire = [self.wire_job(j) for j in jobs[offset:]]
        entries = [{"job": w, "enteredAt": float(j.finished_ms), "reason": _dlq_reason(j), "error": j.error,
                    "attempts": [], "retryCount": 0, "lastRetryAt": None, "nextRetryAt": None, "expiresAt": None}
                   for j, w in zip(jobs[offset:], wire)]
        return {"jobs": wire, "entries": entries}

    def _op_GetDlqStats(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The dead-letter queue in numbers, in bunqueue's form."""
        q = self.queues.get(cmd["queue"])
        seqs = list(q.dlq) if q else []
        times = [self.jobs[s].finished_ms for s in seqs]
        reasons = dict.fromkeys(("explicit_fail", "max_attempts_exceeded", "timeout", "stalled", "ttl_expired",
                                 "worker_lost", "unknown"), 0)
        for s in seqs:
            reasons[_dlq_reason(self.jobs[s])] += 1
        stats = {"total": len(seqs), "byReason": reasons, "byQueue": {q.name: len(seqs)} if q and seqs else {},
                 "pendingRetry": 0, "expired": 0, "oldestEntry": float(min(times)) if times else None,
                 "newestEntry": float(max(times)) if times else None}
        return {"data": {"stats": stats}}

    def _queue_metrics(self, q: Queue) -> dict[str, Any]:
        return {"type": q.type, "paused": q.paused, "durability": "fsync" if q.opts.get("durable", True) else "disk",
                "counts": dict(q.counts), "totals": dict(q.totals),
                "calls": dict(q.calls), "options": dict(q.opts),
                **({"logRecords": len(q.log), "nextSeq": q.log_next} if q.type == "log" else {})}

    def _op_Metrics(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        return {"metrics": self._queue_metrics(q)}

    def _op_Stats(self, cmd: dict[str, Any]) -> dict[str, Any]:
        totals = {s: 0 for s in STATES}
        for q in self.queues.values():
            for s, n in q.counts.items():
                totals[s] += n
        return {"stats": {"partition": self.partition, "queues": {n: self._queue_metrics(q)
                                                                   for n, q in self.queues.items()},
                          "jobs": totals, "sessions": len(self.sessions), "crons": len(self.crons),
                          "lastSeq": self.seq, "now": self.now_ms}}


def _dlq_reason(job: Any) -> str:
    """Why a job is in the DLQ, in bunqueue's words."""
    if job.error is not None and job.error.startswith("lease expired"):
        return "stalled"
    if job.attempts < job.max_attempts:
        return "explicit_fail"  # buried, unrecoverable, or a child's failure
    return "max_attempts_exceeded"


def dlq_match(job: Any, spec: dict[str, Any]) -> bool:
    """Does a dead-lettered job pass bunqueue's DLQ filter (reason, age; nothing expires here)?"""
    if spec.get("reason") is not None and _dlq_reason(job) != spec["reason"]:
        return False
    if spec.get("olderThan") is not None and job.finished_ms >= spec["olderThan"]:
        return False
    if spec.get("newerThan") is not None and job.finished_ms <= spec["newerThan"]:
        return False
    if spec.get("expired"):  # nothing expires from Shoal's DLQ
        return False
    return spec.get("retriable") is not False  # every entry can be retried
