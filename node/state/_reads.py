"""Read-only commands: jobs, states, results, counts, listings, metrics. They never change state."""

from __future__ import annotations

import heapq
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from ._model import PAGE_DEFAULT, PAGE_LIMIT_MAX, Queue
from ._store import Store
from ._transitions import STATES

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
        job = self.jobs.get(seq) if seq is not None else None
        return {"job": self.wire_job(job) if job else None}

    def _op_GetState(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return {"state": self._job(cmd["id"]).state}

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
        return {"logs": [{"time": t, "message": m} for t, m in logs]}

    def _op_GetJobs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"jobs": [], "total": 0}
        state = cmd.get("state")
        tag = cmd.get("tag")
        offset = cmd.get("offset") or 0
        limit = cmd.get("limit") or PAGE_DEFAULT
        total = q.counts[state] if state else sum(q.counts.values())
        page: list[dict[str, Any]] = []
        matched = 0
        for job in self._queue_jobs(q.name, state):  # seq order, built lazily: a page costs its offset
            if tag is not None and job.tag != tag:
                continue
            matched += 1
            if matched <= offset or len(page) >= limit:
                if tag is None and len(page) >= limit:
                    break  # the total is known from the counters; with a tag it is counted here
                continue
            page.append(self.wire_job(job))
        return {"jobs": page, "total": matched if tag is not None else total}

    def _op_GetJobCounts(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        return {"counts": dict(q.counts) if q else {s: 0 for s in STATES}}

    def _op_GetCountsPerPriority(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        return {"counts": {str(p): n for p, n in sorted(q.prio_counts.items())} if q else {}}

    def _op_Count(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {"count": 0}
        state = cmd.get("state")
        if q.type == "log" and not state:
            return {"count": len(q.log)}
        return {"count": q.counts[state] if state else sum(q.counts.values())}

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
        q = self.queues.get(cmd["queue"])
        limit = cmd.get("limit") or PAGE_DEFAULT
        seqs = list(q.dlq)[:limit] if q else []
        return {"jobs": [self.wire_job(self.jobs[s]) for s in seqs]}

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
