"""What time moves: delayed jobs coming due, lapsed leases and TTLs, crons, the idempotency window, _Tick."""

from __future__ import annotations

import heapq
from datetime import datetime, timezone
from itertools import islice
from typing import Any

from croniter import croniter

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.jobid import parse_job_id

from ._model import PAGE_LIMIT_MAX, SEQ_BITS, SEQ_MASK, Job, pack
from ._segments import SLOT_ACTIVE
from ._store import Store
from ._transitions import ACTIVE, CANCELLED, COMPLETED, DELAYED, FAILED, WAITING

__all__ = ["TimerOps"]


class TimerOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _expire(self) -> None:
        now = self.now_ms
        delayed = self.delayed
        while delayed.due_ms <= now:
            key = delayed.pop()
            run_at, seq = key >> SEQ_BITS, key & SEQ_MASK
            job = self.jobs.get(seq)
            if job is None:
                if self.segments:
                    self._slot_due(seq, run_at)
                continue
            if job.state == DELAYED and job.run_at_ms == run_at:
                q = self.queues[job.queue]
                self._set_state(q, job, WAITING)
                self._enqueue_ready(q, job)
        leases = self.leases
        while leases and leases[0][0] <= now:
            deadline, seq, token, last = heapq.heappop(leases)
            if last:
                self._expire_run(deadline, seq, token, last)
                continue
            job = self.jobs.get(seq)
            if job is None or job.state != ACTIVE or job.token != token or job.lease_deadline_ms != deadline:
                continue
            self._reclaim(job)
        ttls = self.ttls
        while ttls and ttls[0][0] <= now:
            deadline, seq = heapq.heappop(ttls)
            job = self.jobs.get(seq)
            if job is not None and job.ttl_deadline_ms == deadline and job.state in (WAITING, DELAYED):
                q = self.queues[job.queue]
                q.totals["expired"] += 1
                self._remove(q, job)

    def _expire_run(self, deadline: int, first: int, token: str, last: int) -> None:
        """Reclaim the jobs of one run lease (seqs ``first .. last``) still under it.

        A run is contiguous, so handling it in seq order here is the order in which its
        jobs' own lease entries would surface. A job materialized since keeps the run's
        token and deadline unless something (a touch, a new lease) changed its lease.
        """
        prefix = f"{self.partition}."
        base = int(token[len(prefix):]) - first  # lease number of seq s: base + s
        segments = self.segments
        for s in range(first, last + 1):
            job = self.jobs.get(s)
            if job is None:
                seg = segments.find(s)
                if seg is None:
                    continue
                i = s - seg.first
                if seg.states[i] != SLOT_ACTIVE or seg.deadlines[i] != deadline or seg.lease_nos[i] != base + s:
                    continue
                job = self._materialize(s)
                assert job is not None
            elif job.state != ACTIVE or job.lease_deadline_ms != deadline or job.token != prefix + str(base + s):
                continue
            self._reclaim(job)

    def _reclaim(self, job: Job) -> None:
        """An active job's lease lapsed: back to waiting, or dead-lettered after maxDeliveries."""
        q = self.queues[job.queue]
        q.totals["reclaimed"] += 1
        if job.attempts >= q.opts["maxDeliveries"]:
            job.error = f"lease expired after {job.attempts} deliveries"
            self._finish(q, job, FAILED)
        else:
            self._to_waiting(q, job)

    def _fire_crons(self) -> None:
        for name in [n for n, c in self.crons.items() if c["nextRunAt"] <= self.now_ms]:
            cron = self.crons[name]
            if cron.get("afterCompletion") and cron.get("lastJobId") is not None:
                last = self.jobs.get(parse_job_id(cron["lastJobId"])[1])
                if last is not None and last.state in (FAILED, CANCELLED):
                    del self.crons[name]  # bunqueue's repeat: a job that did not complete ends it
                    continue
                if last is not None and last.state != COMPLETED:
                    cron["nextRunAt"] = _next_run(cron, self.now_ms)  # still to run: this run is skipped
                    continue
            self._fire_cron(cron)

    def _fire_cron(self, cron: dict[str, Any]) -> str:
        """Make one job of ``cron`` now (it ends once it made its ``limit``); its id."""
        q = self._queue(cron["queue"], create=True)
        options: dict[str, Any] = {"priority": cron["priority"]}
        if cron.get("jobName") is not None:
            options["name"] = cron["jobName"]
        job = self._new_job(q, cron["data"], options)
        cron["count"] += 1
        cron["lastRunAt"] = self.now_ms
        cron["lastJobId"] = job_id = self._id(job)
        if cron["limit"] and cron["count"] >= cron["limit"]:
            del self.crons[cron["name"]]
        else:
            cron["nextRunAt"] = _next_run(cron, self.now_ms)
        return job_id

    def _op_Tick(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._expire()
        self._fire_crons()
        self._purge_idempotency()  # type: ignore[attr-defined]  # IdempotencyWindow
        self._purge_forwarded()  # type: ignore[attr-defined]  # ForwardedKeys
        self._purge_dedupe()  # type: ignore[attr-defined]  # DedupeOps
        for q in self.queues.values():
            lim = q.limiter
            if lim is not None:
                # Slide the windows and bring back groups whose budget returned, so that
                # next_due_ms stops naming an instant that has passed.
                lim.queue_open(q.counts[ACTIVE], self.now_ms)
                for group in lim.unpark(self.now_ms):
                    self._list_group(q, group)  # type: ignore[attr-defined]  # ReadyIndex
            if q.history:
                self._trim_history(q)
        return {}

    def _op_Cron(self, cmd: dict[str, Any]) -> dict[str, Any]:
        schedule, every = cmd.get("schedule"), cmd.get("repeatEvery")
        if (schedule is None) == (every is None):
            raise CommandError(ErrorCode.INVALID, "schedule: give exactly one of schedule and repeatEvery")
        data = cmd.get("data")
        cron = {"name": cmd["name"], "queue": cmd["queue"], "schedule": schedule, "repeatEvery": every,
                "data": data.packed if type(data) is Raw else pack(data), "priority": cmd.get("priority") or 0,
                "limit": cmd.get("limit") or 0, "count": 0, "createdAt": self.now_ms}
        if cmd.get("jobName") is not None:
            cron["jobName"] = cmd["jobName"]
        if cmd.get("afterCompletion"):
            cron["afterCompletion"] = True
        cron["nextRunAt"] = _next_run(cron, self.now_ms)
        old = self.crons.get(cmd["name"])
        self.crons[cmd["name"]] = cron
        self._queue(cmd["queue"], create=True)
        first = None
        if cmd.get("immediately"):
            if old is None:
                first = self._fire_cron(cron)  # a new schedule's first job, now
            else:
                # Sent again (or replaced): the runs it made stand, and none is added.
                for key in ("count", "lastRunAt", "lastJobId"):
                    if key in old:
                        cron[key] = old[key]
                first = old.get("lastJobId")
                if cron["limit"] and cron["count"] >= cron["limit"]:
                    del self.crons[cmd["name"]]
        reply = {"name": cmd["name"], "nextRunAt": cron["nextRunAt"], "cron": _cron_wire(cron)}
        if first is not None:
            reply["id"] = first  # what an add with bunqueue's ``repeat`` answers
        return reply

    def _op_CronGet(self, cmd: dict[str, Any]) -> dict[str, Any]:
        cron = self.crons.get(cmd["name"])
        return {"cron": _cron_wire(cron) if cron is not None else None}

    def _op_CronDelete(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"deleted": self.crons.pop(cmd["name"], None) is not None}

    def _op_CronList(self, cmd: dict[str, Any]) -> dict[str, Any]:
        limit = cmd.get("limit") or PAGE_LIMIT_MAX
        crons = list(islice(self.crons.values(), limit + 1))
        return {"crons": [_cron_wire(c) for c in crons[:limit]], "more": len(crons) > limit}


def _cron_wire(cron: dict[str, Any]) -> dict[str, Any]:
    """A schedule on the wire: Shoal's fields and bunqueue's (``nextRun``, ``executions``, ...)."""
    out = {k: (Raw(v) if k == "data" else v) for k, v in cron.items()}
    out.update({"jobName": cron.get("jobName") or cron["name"], "nextRun": float(cron["nextRunAt"]),
                "executions": cron["count"], "maxLimit": cron["limit"] or None, "timezone": None})
    return out


def _next_run(cron: dict[str, Any], now_ms: int) -> int:
    if cron["repeatEvery"]:
        return now_ms + cron["repeatEvery"]
    start = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc)
    return int(croniter(cron["schedule"], start).get_next(float) * 1000)

