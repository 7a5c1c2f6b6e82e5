"""Commands on one job (cancel, promote, progress, logs) and on a whole queue (create, pause, drain, clean,
retry, purge), and log queues (Truncate, Read)."""

from __future__ import annotations

import heapq
import re
from operator import itemgetter
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from ._limits import LIMIT_OPTIONS, check_limit_options, group_concurrency_of, limiter_of
from ._model import DEFAULTS, JOB_LOGS_MAX, PAGE_DEFAULT, SEQ_BITS, SEQ_MASK, Queue, due_key, pack, ready_key
from ._reads import dlq_match
from ._store import Store, slot_runs
from ._segments import SLOT_ACTIVE, SLOT_COMPLETED, SLOT_DELAYED, SLOT_READY, SLOT_WAITING
from ._transitions import ACTIVE, CANCELLED, COMPLETED, DELAYED, FAILED, REMOVED, STATES, WAITING, check_transition

__all__ = ["ControlOps"]


class ControlOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _op_Cancel(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        q = self.queues[job.queue]
        if job.state == ACTIVE:
            self._count(q, "Cancel")
            self._cancel_active(q, job, cmd.get("by"))  # type: ignore[attr-defined]  # CancelOps
            return {"state": CANCELLED}
        if job.state == CANCELLED:
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is already cancelled")
        self._count(q, "Cancel")
        self._remove(q, job)
        return {"data": {"removed": True}}

    def _op_Promote(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        if job.state != DELAYED:
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is {job.state}, not delayed")
        q = self.queues[job.queue]
        self._count(q, "Promote")
        self._to_waiting(q, job)
        return {}

    def _op_PromoteJobs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Every delayed job of a queue (at most ``count``, soonest first) runs now."""
        q = self._queue(cmd["queue"])
        limit = cmd.get("count")
        seqs: list[int] = []
        for key in sorted(self.delayed):
            seq = key & SEQ_MASK
            job = self._delayed_job(seq, detached=True)
            # An entry counts only while it is the job's own (its run-at time): stale entries are
            # not in a restored engine's heap, so they must not decide which jobs come first.
            if (job is not None and job.state == DELAYED and job.queue == q.name and job.run_at_ms == key >> SEQ_BITS
                    and seq not in seqs):
                seqs.append(seq)
                if limit is not None and len(seqs) >= limit:
                    break
        for seq in seqs:
            self._to_waiting(q, self._delayed_job(seq))  # type: ignore[arg-type]  # found above
        self._count(q, "PromoteJobs")
        return {"count": len(seqs)}

    def _op_MoveToDelayed(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._check_token(job, cmd)
        if job.state not in (WAITING, ACTIVE, DELAYED):
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is {job.state}")
        q = self.queues[job.queue]
        self._count(q, "MoveToDelayed")
        if job.state == DELAYED:
            job.run_at_ms = self.now_ms + cmd["delay"]
            self.delayed.push(due_key(job.run_at_ms, job.seq))
        else:
            self._to_waiting(q, job, max(1, cmd["delay"]))
        return {}

    def _op_ChangePriority(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """A new priority for a job; a waiting one takes its new place in the queue at once."""
        job = self._job(cmd["id"])
        if job.state in (COMPLETED, FAILED, CANCELLED):
            raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is {job.state}")
        q = self.queues[job.queue]
        if not q.preset["priority"]:
            raise CommandError(ErrorCode.INVALID, f"priority: queue {q.name!r} ({q.type}) has no priorities")
        self._count(q, "ChangePriority")
        old = job.priority
        new = cmd["priority"]
        if new == old:
            return {}
        if job.state == WAITING:
            self._drop_prio(q, old)  # type: ignore[attr-defined]  # Moves
            q.prio_counts[new] = q.prio_counts.get(new, 0) + 1
            job.priority = new
            # The old entry goes stale; a group job takes its new place among its group's jobs.
            if job.group is None:
                heapq.heappush(q.ready, ready_key(new, job.seq))
            else:
                heapq.heappush(q.group_fifo.setdefault(job.group, []), ready_key(new, job.seq))
            return {}
        job.priority = new
        return {}

    def _op_Update(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Replace a job's data (bunqueue's ``updateData``)."""
        job = self._job(cmd["id"])
        data = cmd["data"]
        self._replace_data(job, data if type(data) is Raw else Raw(pack(data)))
        self._count(self.queues[job.queue], "Update")
        return {}

    def _op_ClearLogs(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        keep = cmd.get("keepLogs") or 0
        if job.logs:
            job.logs = job.logs[len(job.logs) - keep:] if keep else None
        self._count(self.queues[job.queue], "ClearLogs")
        return {}

    def _op_Progress(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        self._check_token(job, cmd)
        job.progress = cmd["progress"]
        if cmd.get("message") is not None:
            job.message = cmd["message"]
        self._count(self.queues[job.queue], "Progress")
        if self._events is not None:
            self._events.append((job.queue, job.seq, "progress", job.progress))
        return {}

    def _op_AddLog(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        logs = job.logs if job.logs is not None else []
        logs.append((self.now_ms, cmd["message"]))
        keep = job.meta.get("keepLogs", JOB_LOGS_MAX) if job.meta else JOB_LOGS_MAX
        if len(logs) > keep:
            del logs[:len(logs) - keep]  # bounded: the oldest lines go
        job.logs = logs or None
        self._count(self.queues[job.queue], "AddLog")
        return {"count": len(logs), "data": {"added": True}}

    def _op_CreateQueue(self, cmd: dict[str, Any]) -> dict[str, Any]:
        name = cmd["queue"]
        qtype = cmd.get("type") or "standard"
        opts = _stored_options(cmd)
        check_limit_options(opts, qtype)
        existing = self.queues.get(name)
        if existing is not None:
            if existing.type != qtype:
                raise CommandError(ErrorCode.INVALID, f"type: queue {name!r} exists as {existing.type}")
            self._set_options(existing, opts)
            return {"created": False}
        self.queues[name] = Queue(name, qtype, opts, custom_of=self._custom_of)
        return {"created": True}

    def _op_UpdateQueue(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=bool(cmd.get("create")))
        opts = _stored_options(cmd)
        check_limit_options(opts, q.type)
        self._set_options(q, opts)
        self._count(q, "UpdateQueue")
        return {}

    def _set_options(self, q: Queue, opts: dict[str, Any]) -> None:
        """Change ``q``'s options; limits change at once, their windows carry on."""
        q.opts.update(opts)
        old = q.limiter
        q.limiter = limiter_of(q.opts, old, self.now_ms)
        conc = group_concurrency_of(q.opts, q.type)
        if conc != q.group_conc or (old is not None and old.parked):
            # Groups set aside (full or throttled) may run now: list them again (their tags
            # are unchanged, so their place in the turns is too).
            q.group_conc = conc
            for group in list(q.group_fifo):
                self._list_group(q, group)  # type: ignore[attr-defined]  # ReadyIndex

    def _op_Pause(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        q.paused = True
        return {}

    def _op_Resume(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"], create=True)
        q.paused = False
        return {}

    def _remove_where(self, q: Queue, states: tuple[str, ...], older_than_ms: int | None = None,
                      limit: int | None = None, removed: list[str] | None = None) -> int:
        victims = []
        for job in self._queue_jobs_in(q.name, states):  # seq order; other slots not made jobs
            if job.state not in states:
                continue
            stamp = job.finished_ms or job.created_ms
            if older_than_ms is not None and stamp > older_than_ms:
                continue
            victims.append(job.seq)
            if limit is not None and len(victims) >= limit:
                break
        for seq in victims:
            job = self._get(seq)
            if removed is not None:
                removed.append(self._wire_id(job))  # type: ignore[arg-type]
            self._remove(q, job)  # type: ignore[arg-type]
        return len(victims)

    def _drop_slots(self, q: Queue, runs: re.Pattern[bytes]) -> int:
        """``q``'s segment slots that ``runs`` matches go a run of them at a time: their data
        released in one call, the queue's counters moved once per run, an active slot's
        session entry dropped, a ``removed`` event each; how many. Ready-, delayed- and
        lease-heap entries naming them are skipped as stale when they surface (the slot is
        gone, or its segment no longer found), as a removed job object's are."""
        segments, sessions, events, counts = self.segments, self.sessions, self._events, q.counts
        dropped = 0
        for seg in [s for s in segments if s.queue == q.name]:
            states = seg.states
            gone = 0
            for run in runs.finditer(states):
                i, j = run.span()
                for code in set(states[i:j]):
                    check_transition(SLOT_STATE[code], REMOVED)
                    counts[SLOT_STATE[code]] -= states.count(code, i, j)
                waiting = states.count(SLOT_WAITING, i, j) + states.count(SLOT_READY, i, j)
                if waiting and seg.priorities is None:
                    self._drop_prio(q, 0, waiting)  # type: ignore[attr-defined]  # Moves
                elif waiting:
                    for k in range(i, j):
                        if states[k] == SLOT_WAITING or states[k] == SLOT_READY:
                            self._drop_prio(q, seg.priorities[k])  # type: ignore[attr-defined]  # Moves
                if seg.custom_ids is not None:  # their custom ids are free again
                    customs = q.custom_ids
                    for k in range(i, j):
                        custom = seg.custom_ids[k]
                        if custom is not None:
                            customs.discard(custom, seg.first + k)
                if seg.groups is not None:  # grouped slots wait or are delayed: their groups shrink
                    groups, moved = seg.groups, self._group_moved  # type: ignore[attr-defined]  # ReadyIndex
                    for k in range(i, j):
                        if groups[k] is not None:
                            moved(q, groups[k], SLOT_STATE[states[k]], REMOVED)
                if seg.sessions is not None and states.find(SLOT_ACTIVE, i, j) >= 0:
                    for k in range(i, j):
                        session = seg.sessions[k]
                        if states[k] == SLOT_ACTIVE and session is not None:
                            sessions.let_go(session, seg.first + k)
                if events is not None:
                    events.extend((q.name, seg.first + k, "removed", SLOT_STATE[states[k]]) for k in range(i, j))
                seg.release(i, j)
                states[i:j] = bytes(j - i)  # SLOT_GONE
                gone += j - i
            if gone:
                seg.left = 0  # every waiting slot went (the callers' states include waiting)
                seg.low = 0
                segments.gone(seg, gone)
                dropped += gone
        return dropped

    def _drop_jobs(self, q: Queue, states: tuple[str, ...]) -> int:
        """Remove every job of ``q`` in ``states`` (waiting among them: the segments' waiting
        slots all go): segment slots a run at a time (:meth:`_drop_slots`), then job objects one
        by one; ``removed`` events in seq order."""
        events = self._events
        mark = len(events) if events is not None else 0
        runs = slot_runs(states)
        slots = self._drop_slots(q, runs) if runs is not None else 0
        objects = self._remove_where(q, states)
        if slots and objects and events is not None:
            events[mark:] = sorted(events[mark:], key=_event_seq)  # seq order, as one by one
        return slots + objects

    def _op_Drain(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        self._count(q, "Drain")
        return {"count": self._drop_jobs(q, (WAITING, DELAYED))}

    def _op_Clean(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        state = cmd.get("state") or COMPLETED
        if state == ACTIVE:
            raise CommandError(ErrorCode.INVALID, "state: active jobs cannot be cleaned (release them first)")
        self._count(q, "Clean")
        ids: list[str] = []
        count = self._remove_where(q, (state,), self.now_ms - cmd["grace"], cmd.get("limit"), ids)
        return {"count": count, "ids": ids}

    def _op_Obliterate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self.queues.get(cmd["queue"])
        if q is None:
            return {}
        self._drop_jobs(q, STATES)
        self.crons = {n: c for n, c in self.crons.items() if c["queue"] != q.name}
        del self.queues[q.name]
        return {}

    def _retry_dlq(self, q: Queue, seqs: list[int], reset: bool) -> int:
        for seq in seqs:
            job = self.jobs[seq]
            q.dlq.pop(seq, None)
            if reset:
                job.attempts = 0
            job.error = None
            job.finished_ms = 0
            self._to_waiting(q, job)
        return len(seqs)

    def _op_RetryDlq(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if cmd.get("id") is not None:
            job = self._job(cmd["id"])
            if job.queue != q.name or job.state != FAILED:
                raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is not in {q.name}'s DLQ")
            seqs = [job.seq]
        elif cmd.get("filter") is not None:  # bunqueue's retryDlqByFilter: Dlq's filter
            spec = cmd["filter"]
            seqs = [s for s in q.dlq if dlq_match(self.jobs[s], spec)]
            offset, limit = spec.get("offset") or 0, spec.get("limit")
            seqs = seqs[offset:offset + limit] if limit else seqs[offset:]
        else:
            seqs = list(q.dlq)
        self._count(q, "RetryDlq")
        return {"count": self._retry_dlq(q, seqs, reset=True)}

    def _op_RetryCompleted(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if cmd.get("id") is not None:
            job = self._job(cmd["id"])
            if job.queue != q.name or job.state != COMPLETED:
                raise CommandError(ErrorCode.INVALID_STATE, f"job {cmd['id']} is not completed in {q.name}")
            seqs = [job.seq]
        else:
            seqs = [s for s in q.history if (j := self._get(s)) is not None and j.state == COMPLETED]
        for seq in seqs:
            job = self.jobs[seq]
            job.attempts = 0
            job.result = None
            job.finished_ms = 0
            self._to_waiting(q, job)
        self._count(q, "RetryCompleted")
        return {"count": len(seqs)}

    def _op_PurgeDlq(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        seqs = list(q.dlq)
        for seq in seqs:
            self._remove(q, self.jobs[seq])
        self._count(q, "PurgeDlq")
        return {"count": len(seqs)}

    def _op_Truncate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if q.type != "log":
            return {"count": self._drop_jobs(q, (WAITING, DELAYED, COMPLETED, FAILED))}  # tarantool truncate
        before, tag = cmd.get("beforeSeq"), cmd.get("tag")
        victims = [s for s, (_, t, _) in q.log.items()
                   if (before is not None and s < before) or (tag is not None and t == tag)]
        if before is None and tag is None:
            victims = list(q.log)
        for s in victims:
            del q.log[s]
        self._count(q, "Truncate")
        return {"count": len(victims)}

    def _op_Read(self, cmd: dict[str, Any]) -> dict[str, Any]:
        q = self._queue(cmd["queue"])
        if q.type != "log":
            raise CommandError(ErrorCode.INVALID, f"queue {q.name!r} is not a log queue")
        limit = cmd.get("limit") or PAGE_DEFAULT
        records = []
        seq = max(1, cmd["fromSeq"])
        while seq < q.log_next and len(records) < limit:
            rec = q.log.get(seq)
            if rec is not None:
                item: dict[str, Any] = {"seq": seq, "data": Raw(rec[0]), "createdAt": rec[2]}
                if rec[1] is not None:
                    item["tag"] = rec[1]
                records.append(item)
            seq += 1
        return {"records": records, "next": seq}


def _stored_options(cmd: dict[str, Any]) -> dict[str, Any]:
    """The options of a CreateQueue/UpdateQueue the engine keeps (the others are the node's)."""
    return {k: v for k, v in (cmd.get("options") or {}).items()
            if v is not None and (k in DEFAULTS or k in LIMIT_OPTIONS)}


#: A segment slot's state as a job's (what a ``removed`` event names).
SLOT_STATE = {SLOT_WAITING: WAITING, SLOT_READY: WAITING, SLOT_ACTIVE: ACTIVE, SLOT_COMPLETED: COMPLETED,
              SLOT_DELAYED: DELAYED}
_event_seq = itemgetter(1)
