"""PULL and PULLB: leasing jobs one by one, and segment jobs as runs."""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from typing import Any

from shoal.cluster.errors import CommandError, ErrorCode

from ._commands import SessionPull
from ._decimal import decimal_run
from ._pulled import JobRun, pulled_jobs
from ._model import (JOB_WIRE_BYTES_OVERHEAD, SEQ_BITS, SEQ_MASK, REPLY_BYTES_OVERHEAD, Job, Queue,
                     wire_bytes_max)
from ._segments import SLOT_READY, SLOT_WAITING, Segment
from ._store import DEFAULT_NAME, Store
from ._transitions import ACTIVE, WAITING, check_transition

__all__ = ["PullOps", "TERM_LEASE_BITS"]

#: A run of fewer jobs than this in a pull's reply is written out as maps at once (a kept run's
#: template is encoded in pieces, which costs about as much as a dozen maps).
RUN_KEPT_MIN = 12

#: Lease numbers (the tokens' digits) of Raft term ``t`` start at ``t << TERM_LEASE_BITS``.
TERM_LEASE_BITS = 32


class PullOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def enter_term(self, term: int) -> None:
        """The commands applied next come from a log entry of Raft term ``term``.

        Lease numbers go on from at least ``term << TERM_LEASE_BITS``: a take answered before its
        entry was durable (a lone replica) and lost to a power cut is followed, after the restart,
        by takes of a later term, whose tokens can then never repeat the lost one's (the holder of
        that token could otherwise complete the job under the new lease). Every replica applies
        the same entries with the same terms, so they number leases alike.
        """
        floor = term << TERM_LEASE_BITS
        if self.lease_seq < floor:
            self.lease_seq = floor

    def _lease(self, q: Queue, job: Job, ttr_ms: int | None, session: str | None) -> str:
        self.lease_seq += 1
        token = f"{self.partition}.{self.lease_seq}"
        job.attempts += 1
        job.token = token
        job.session = session
        job.lease_deadline_ms = self.now_ms + (ttr_ms or job.ttr_ms or q.opts["ttr"])
        group = job.group
        if group is not None:
            # Before the state change, which exposes the group's next job if it may run more.
            q.group_active[group] = q.group_active.get(group, 0) + 1
        if q.limiter is not None:
            q.limiter.note_lease(job.group, self.now_ms)
        self._set_state(q, job, ACTIVE)
        heapq.heappush(self.leases, (job.lease_deadline_ms, job.seq, token, 0))
        if session is not None:
            self.sessions.hold_one(session, job.seq, self.lease_seq)
        return token

    def _pull(self, cmd: dict[str, Any], count: int, session: str | None,
              budget: int) -> tuple[list[dict[str, Any]], list[str]]:
        """Lease up to ``count`` jobs to ``session``; with a ``budget``, stop before the reply
        would outgrow that many bytes (the first job is always taken: its data fits a frame)."""
        q = self.queues.get(cmd["queue"])
        if q is not None and q.type == "log":
            raise CommandError(ErrorCode.INVALID, f"queue {q.name!r} is a log queue: read it with Read")
        group = cmd.get("group")
        if group is not None and q is not None and not q.preset["group"]:
            raise CommandError(ErrorCode.INVALID, f"group: queue {q.name!r} ({q.type}) has no groups")
        self._expire()
        if q is None:
            return [], []
        self._count(q, cmd["cmd"])
        if q.paused:
            return [], []
        lim = q.limiter
        if group is not None or cmd.get("ungrouped"):
            if group is None and lim is None:
                return self._pull_ungrouped(q, cmd, count, session, budget)  # the ready heap alone
            return self._pull_only(q, group, cmd, count, session, budget)
        if lim is None and not q.group_heads and not q.group_fifo:
            return self._pull_ungrouped(q, cmd, count, session, budget)
        jobs, tokens = [], []
        counts = q.counts
        used = REPLY_BYTES_OVERHEAD
        for _ in range(count):
            if lim is not None and not lim.queue_open(counts[ACTIVE], self.now_ms):
                break
            if budget:
                top = self._peek_ready(q)
                if top is None:
                    break
                used += wire_bytes_max(self._get(top[1]))  # type: ignore[arg-type]  # found by the peek
                if jobs and used > budget:
                    break
            job = self._pop_ready(q)
            if job is None:
                break
            tokens.append(self._lease(q, job, cmd.get("ttr"), session))
            jobs.append(self.pulled_job(job) if self._replies else None)
        return jobs, tokens

    def _pull_only(self, q: Queue, group: str | None, cmd: dict[str, Any], count: int, session: str | None,
                   budget: int) -> tuple[list[dict[str, Any]], list[str]]:
        """``_pull`` limited to the jobs of ``group`` (by their order within the group), or with
        ``group`` None to jobs without a group; the queue's and the group's limits hold as for
        any pull (:mod:`._ready`: how a one-group pull counts in the turns between groups)."""
        jobs, tokens = [], []
        lim = q.limiter
        counts = q.counts
        used = REPLY_BYTES_OVERHEAD
        for _ in range(count):
            if lim is not None and not lim.queue_open(counts[ACTIVE], self.now_ms):
                break
            if group is None:
                top = self._ungrouped_head(q)
                job = self.jobs[top[1]] if top is not None else None
            else:
                seq = self._group_ready(q, group)
                job = self._get(seq) if seq is not None else None
            if job is None:
                break
            if budget:
                used += wire_bytes_max(job)
                if jobs and used > budget:
                    break
            if group is None:
                heapq.heappop(q.ready)
            else:
                self._pop_group(q, group)
            tokens.append(self._lease(q, job, cmd.get("ttr"), session))
            jobs.append(self.pulled_job(job) if self._replies else None)
        return jobs, tokens

    def _pull_ungrouped(self, q: Queue, cmd: dict[str, Any], count: int, session: str | None,
                        budget: int) -> tuple[list[Any], list[str]]:
        """``_pull`` for a queue with no group jobs waiting: the ready heap alone orders it.

        The same steps as ``_pop_ready`` + ``_lease`` per job, with one heap look per job
        and the counters moved once per batch (the hot loop of every consumer). When the
        heap's top is a segment's lowest waiting job, the segment's consecutive waiting jobs
        that come before every other heap entry are leased as one run (``_lease_run``).
        """
        check_transition(WAITING, ACTIVE)  # once: the loop leases waiting jobs only
        jobs: list[Any] = []
        tokens: list[str] = []
        used = REPLY_BYTES_OVERHEAD
        ttr_ms = cmd.get("ttr")
        hold = self.sessions.hold_one
        ready, all_jobs, segments, leases, events = q.ready, self.jobs, self.segments, self.leases, self._events
        heappop, heappush = heapq.heappop, heapq.heappush
        name, now, default_ttr, prio_counts = q.name, self.now_ms, q.opts["ttr"], q.prio_counts
        replies = self._replies
        wire_job = self.pulled_job
        job_bytes_fixed = JOB_WIRE_BYTES_OVERHEAD + 4 * len(name)  # wire_bytes_max of a job with no texts
        prefix = f"{self.partition}."
        taken = 0
        full = False  # the reply's byte budget is spent
        while taken < count and ready and not full:
            key = ready[0]
            seq = key & SEQ_MASK
            job = all_jobs.get(seq)
            if job is None and segments:
                seg = segments.find(seq)
                if seg is not None and seg.queue == name:
                    i = seq - seg.first
                    code = seg.states[i]
                    if seg.low == seq and count - taken > 1:
                        k, full, used = self._lease_run(q, seg, count - taken, budget, used, taken > 0, ttr_ms,
                                                        session, jobs, tokens)
                        if k or full:
                            taken += k
                            continue
                    elif seg.low != seq and code != SLOT_WAITING and not self._cursor_entry(ready, key, seg, i):
                        continue  # a stale entry popped, or a cursor moved on to its next slot
                    elif seg.low == seq or (code == SLOT_READY and not seg.leased_as_job(i)):
                        if budget:
                            used += self._slot_bytes(seg, i, job_bytes_fixed)
                            if taken and used > budget:
                                break
                        self._lease_slot(q, seg, i, ttr_ms, session, jobs, tokens)
                        taken += 1
                        continue
                    # else a slot with a custom id or a tag, leased as a job object (the reply has them)
                job = self._materialize(seq, waiting_only=True)
            if (job is None or job.state != WAITING or job.group is not None or job.queue != name
                    or -job.priority != key >> SEQ_BITS):
                heappop(ready)  # stale entry (lazy deletion)
                continue
            if budget:
                if (job.custom_id is None and job.tag is None and job.error is None and job.result is None
                        and job.name is None and job.meta is None):
                    used += len(job.data) + job_bytes_fixed  # = wire_bytes_max(job), without the call
                else:
                    used += wire_bytes_max(job)
                if taken and used > budget:
                    break
            heappop(ready)
            self.lease_seq = lease_seq = self.lease_seq + 1
            token = prefix + str(lease_seq)
            job.attempts += 1
            job.token = token
            job.session = session
            job.lease_deadline_ms = deadline = now + (ttr_ms or job.ttr_ms or default_ttr)
            job.state = ACTIVE
            prio = job.priority
            left = prio_counts[prio] - 1
            if left:
                prio_counts[prio] = left
            else:
                del prio_counts[prio]
            q.counts[WAITING] -= 1
            q.counts[ACTIVE] += 1
            heappush(leases, (deadline, seq, token, 0))
            if session is not None:
                hold(session, seq, lease_seq)
            taken += 1
            if events is not None:
                events.append((name, seq, ACTIVE, WAITING))
            if replies:  # the leader's reply
                tokens.append(token)
                jobs.append(wire_job(job))
        return pulled_jobs(jobs, taken) if self.pulled_runs else jobs, tokens

    @staticmethod
    def _slot_bytes(seg: Segment, i: int, fixed: int) -> int:
        """:func:`~._model.wire_bytes_max` of slot ``i``'s job (``fixed``: its bytes beside data and name)."""
        size = seg.data_len(i) + fixed
        names = seg.names
        if names is not None and names[i] is not None:
            size += 8 * len(names[i])  # type: ignore[arg-type]
        return size

    def _lease_slot(self, q: Queue, seg: Segment, i: int, ttr_ms: int | None, session: str | None,
                    jobs: list[Any], tokens: list[str]) -> None:
        """Lease waiting slot ``i`` of ``seg``, the top of ``q``'s ready heap, in place: what
        ``_lease`` does to a job object (its lease entry is a one-job run's, ``_expire_run``);
        the reply's job and token go to ``jobs`` and ``tokens``."""
        check_transition(WAITING, ACTIVE)
        seq = seg.first + i
        self.lease_seq = lease_no = self.lease_seq + 1
        deadline = self.now_ms + (ttr_ms or seg.ttr_ms or q.opts["ttr"])
        ready = q.ready
        priorities = seg.priorities
        prio = priorities[i] if priorities is not None else 0
        if seg.lease_one(i, lease_no, deadline, session):
            if seg.left:
                heapq.heapreplace(ready, seg.low)
            else:
                heapq.heappop(ready)
        else:  # the slot its priority's cursor named
            self._top_cursor_moves_on(ready, seg, prio, i)
        token = f"{self.partition}.{lease_no}"
        heapq.heappush(self.leases, (deadline, seq, token, seq))
        self._drop_prio(q, prio)  # type: ignore[attr-defined]  # MoveOps
        counts = q.counts
        counts[WAITING] -= 1
        counts[ACTIVE] += 1
        if session is not None:
            self.sessions.hold_one(session, seq, lease_no)
        if self._events is not None:
            self._events.append((q.name, seq, ACTIVE, WAITING))
        if self._replies:
            tokens.append(token)
            job = self._slot_wire(q, seg, deadline)
            job["id"] = f"{self.partition}-{seq}"
            job["data"] = seg.stored(i)
            job["priority"] = prio
            names = seg.names
            if names is not None and names[i] is not None:
                job["name"] = names[i]
            if seg.createds is not None or seg.run_ats is not None:
                job["createdAt"] = float(seg.created(i))
                job["runAt"] = float(seg.run_at(i))
            jobs.append(job)

    def _slot_wire(self, q: Queue, seg: Segment, deadline: int) -> dict[str, Any]:
        """The wire form of a job of ``seg`` leased now until ``deadline`` (what a worker reads of
        :meth:`~._store.Store.pulled_job`'s record), but for its id, data and the fields a slot
        holds apart (priority, name, times): the caller sets those."""
        created = float(seg.created_ms)
        return {"id": None, "queue": q.name, "name": DEFAULT_NAME, "data": None, "priority": 0,
                "state": ACTIVE, "attempts": 0, "maxAttempts": seg.max_attempts, "backoff": seg.backoff_ms,
                "createdAt": created, "runAt": created, "startedAt": float(self.now_ms), "progress": 0,
                "leaseDeadline": float(deadline)}

    def _lease_run(self, q: Queue, seg: Segment, want: int, budget: int, used: int, any_taken: bool,
                   ttr_ms: int | None, session: str | None, jobs: list[Any],
                   tokens: list[str]) -> tuple[int, bool, int]:
        """Lease up to ``want`` consecutive waiting jobs of ``seg`` from its lowest, as one run.

        The run stops before the next job another heap entry ranks first (the heap's top is
        the segment's entry, so only its two children can), before a slot that is not
        waiting, and where the reply would outgrow ``budget``. The run's jobs stay in the
        segment (state, lease number, deadline and session per slot) and share one lease
        heap entry. Returns how many were leased, whether the budget stopped the run, and
        the reply bytes ``used`` so far (counted only with a budget).
        """
        ready = q.ready
        first = seg.low
        i = first - seg.first
        limit = min(len(seg.states), i + want)
        for child in ready[1:3]:
            if 0 <= child <= SEQ_MASK and child - seg.first < limit:  # priority 0: the key is the seq
                limit = child - seg.first
        end = seg.run_end(i, limit)
        full = False
        if budget:
            fixed = JOB_WIRE_BYTES_OVERHEAD + 4 * len(q.name)
            names, data_len = seg.names, seg.data_len
            # the whole run at once when it fits (the usual case: a frame's bound is megabytes)
            run_bytes = seg.data_bytes(i, end) + fixed * (end - i)
            if names is not None:
                run_bytes += 8 * sum(map(len, filter(None, names[i:end])))
            if used + run_bytes <= budget:
                used += run_bytes
            else:
                for j in range(i, end):
                    size = data_len(j) + fixed
                    if names is not None and names[j] is not None:
                        size += 8 * len(names[j])  # type: ignore[arg-type]  # as wire_bytes_max counts it
                    if used + size > budget and (any_taken or j > i):
                        end, full = j, True
                        break
                    used += size
        k = end - i
        if not k:
            return 0, full, used
        check_transition(WAITING, ACTIVE)  # the slots of a run are waiting (run_end)
        base = self.lease_seq
        self.lease_seq = base + k
        deadline = self.now_ms + (ttr_ms or seg.ttr_ms or q.opts["ttr"])
        seg.lease_run(i, k, base, deadline, session)
        if seg.left:
            heapq.heapreplace(ready, seg.low)
        else:
            heapq.heappop(ready)
        prefix = f"{self.partition}."
        last = first + k - 1
        heapq.heappush(self.leases, (deadline, first, prefix + str(base + 1), last))
        prio_counts = q.prio_counts
        left = prio_counts[0] - k
        if left:
            prio_counts[0] = left
        else:
            del prio_counts[0]
        q.counts[WAITING] -= k
        q.counts[ACTIVE] += k
        seqs = range(first, last + 1)
        if session is not None:
            self.sessions.hold_slots(session, first, k, base + 1, seg.first)
        events = self._events
        if events is not None:
            events.extend([(q.name, s, ACTIVE, WAITING) for s in seqs])
        if self._replies:
            tokens.extend(decimal_run(prefix, base + 1, k))
            template = self._slot_wire(q, seg, deadline)
            id_prefix = f"{self.partition}-"
            if self.pulled_runs and seg.names is None:
                runs = _job_runs(template, seg, i, end, id_prefix)
                if runs is not None:
                    for run in runs:
                        if run.count < RUN_KEPT_MIN:
                            jobs.extend(run.expand())
                        else:
                            jobs.append(run)
                    return k, full, used
            # The wire form of each job: copies of one template, then the fields that differ (a
            # third cheaper than a literal per job).
            wire = _wire_by_times(template, seg, i, end)
            for job, job_id, data in zip(wire, decimal_run(id_prefix, first, k), seg.run_data(i, end)):
                job["id"] = job_id
                job["data"] = data
            names = seg.names
            if names is not None:
                for job, job_name in zip(wire, names[i:end]):
                    if job_name is not None:
                        job["name"] = job_name
            jobs.extend(wire)
        return k, full, used

    def _op_PULL(self, cmd: dict[str, Any], session: str | None = None, bytes_max: int = 0) -> dict[str, Any]:
        jobs, tokens = self._pull(cmd, 1, session, bytes_max)
        return {"job": jobs[0], "token": tokens[0]} if jobs else {"job": None}

    def _op_PULLB(self, cmd: dict[str, Any], session: str | None = None, bytes_max: int = 0) -> dict[str, Any]:
        jobs, tokens = self._pull(cmd, cmd["count"], session, bytes_max)
        return {"jobs": jobs, "tokens": tokens}

    def _apply_session_pull(self, pull: SessionPull) -> dict[str, Any]:
        """A PULL or PULLB leased to the session of the connection that sent it."""
        cmd = pull.cmd
        if cmd["cmd"] == "PULLB":
            return self._op_PULLB(cmd, pull.session, pull.bytes_max)
        if cmd["cmd"] == "PULL":
            return self._op_PULL(cmd, pull.session, pull.bytes_max)
        raise CommandError(ErrorCode.INVALID, f"a session pull carries PULL or PULLB, not {cmd['cmd']!r}")


def _wire_by_times(template: dict[str, Any], seg: Segment, i: int, end: int) -> list[dict[str, Any]]:
    """Copies of ``template`` for slots ``i .. end-1`` of ``seg``, each with its own creation
    and due times. The slots a pull takes were mostly added by one batch and share them: then
    the times are set once, on the template (the check runs in C); else one by one."""
    k = end - i
    copy = template.copy
    if _times_once(template, seg, i, end):
        return [copy() for _ in range(k)]
    createds = seg.createds[i:end] if seg.createds is not None else None
    run_ats = seg.run_ats[i:end] if seg.run_ats is not None else None
    wire = [copy() for _ in range(k)]
    if createds is None:
        createds = array("q", [seg.created_ms]) * k
    if run_ats is None:
        run_ats = createds
    for job, created, run_at in zip(wire, map(float, createds), map(float, run_ats)):
        job["createdAt"] = created
        job["runAt"] = run_at
    return wire


def _job_runs(template: dict[str, Any], seg: Segment, i: int, end: int, id_prefix: str) -> list[JobRun] | None:
    """Slots ``i .. end-1`` of ``seg`` as runs of jobs that share their times (each a copy of
    ``template`` with them set), over one read of their data; None when the data are not
    stored one after another or cannot be read (then each job refers to its data)."""
    read = seg.run_blob(i, end)
    if read is None:
        return None
    blob, cuts = read
    runs: list[JobRun] = []
    at = i
    while at < end:
        stop = _same_times_end(seg, at, end)
        run_template = template if at == i and stop == end else template.copy()
        _times_once(run_template, seg, at, stop)
        runs.append(JobRun(run_template, id_prefix, seg.first + at, blob, cuts[at - i:stop - i + 1]))
        at = stop
    return runs


def _same_times_end(seg: Segment, at: int, end: int) -> int:
    """The end of the slots from ``at`` (before ``end``) that share slot ``at``'s creation and
    due times. A segment's times mostly grow with its slots: a bisection finds the end, and a
    check in C confirms it; where they do not, the first slot alone."""
    stop = end
    for times in (seg.createds, seg.run_ats):
        if times is not None:
            stop = min(stop, bisect_right(times, times[at], at, stop))
    for times in (seg.createds, seg.run_ats):
        if times is not None and not _one_value(times[at:stop]):
            return at + 1
    return stop


def _times_once(template: dict[str, Any], seg: Segment, i: int, end: int) -> bool:
    """Set the creation and due times of slots ``i .. end-1`` on ``template`` when they share
    them (the check runs in C); False, with ``template`` unchanged, when they differ."""
    createds = seg.createds[i:end] if seg.createds is not None else None
    run_ats = seg.run_ats[i:end] if seg.run_ats is not None else None
    if (createds is not None and not _one_value(createds)) or (run_ats is not None and not _one_value(run_ats)):
        return False
    created = float(createds[0] if createds is not None else seg.created_ms)
    template["createdAt"] = created
    template["runAt"] = float(run_ats[0]) if run_ats is not None else created
    return True


def _one_value(values: array) -> bool:
    """Do all ``values`` hold one number? Their bytes are compared, in C: no int per item."""
    raw = values.tobytes()
    return raw == raw[:values.itemsize] * len(values)
