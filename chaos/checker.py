"""Check a queue history in the spirit of Jepsen's total-queue checker, and its reads.

After the faults are healed and the queue drained, every acknowledged push must
have been delivered (lost = 0), no value may be enqueued as two jobs (duplicated
= 0: client retries carry idempotency keys), nothing may be delivered that was
never pushed (unexpected = 0), and no ack with a superseded lease token may be
accepted (lease exclusivity). Redeliveries are counted, not forbidden: delivery
is at least once. Recovery is the time from each fault (and from its healing) to
the first push that succeeded after it; for a fault that leaves a majority serving
(``Fault.serving``) writes must also be back before it is healed.

**Reads never go back in time.** A *fact* about a job is established at the
completion time of the operation that shows it:

- *j exists*: a push acknowledged with id j, a pull that returned j, an acknowledged
  ack of j, a read that found j;
- *j is completed*: an acknowledged ack of j, a read that saw j completed.

Facts never expire during a run: the workload creates its queue with a history
longer than any run and nothing deletes a job, and nothing re-runs a completed job.
For a read R invoked at ``t_inv`` and answered at ``t_ok`` (the facts that count are
those established strictly before ``t_inv``):

1. GetJob / GetState of j: if j exists, R finds it (not ``null``, not ``NOT_FOUND``);
   if j is completed, R sees ``completed``.
2. GetJobCounts: the sum over every state is at least the number of jobs that exist;
   ``completed`` is at least the number of jobs that are completed.
3. GetJobCounts' ``waiting + prioritized + delayed``, and Count (waiting + delayed): at
   least ``W - U``, where ``W`` counts the jobs whose push was acknowledged before
   ``t_inv`` and that no pull invoked before ``t_ok`` returned, and ``U`` counts the
   pulls invoked before ``t_ok`` whose outcome is unknown (each may have taken one job).
   Such a job was waiting when R began, only a pull takes a waiting job, a pull invoked
   after R was answered cannot have affected R, and a lapsed lease or a closed session
   only puts jobs back.

A read that breaks a rule is a *stale read* (its node answered from an older state
than acknowledged operations had made). Concurrent operations never count against a
read: a push, ack or read that completes after ``t_inv`` establishes nothing for it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from .history import FAIL, INFO, INVOKE, OK, History, Op

__all__ = ["Result", "check", "RECOVERY_MAX_S"]

RECOVERY_MAX_S = 10.0
#: Count keys that hold jobs still to run (``prioritized``: waiting jobs with a priority).
TO_RUN_STATES = ("waiting", "prioritized", "delayed")
#: Count keys that are no state of a job.
NOT_STATES = frozenset({"paused"})
STALE_EXAMPLES_MAX = 5


@dataclass
class Result:
    """What the checker found; ``valid`` is False when an invariant broke."""

    attempted: int = 0
    acknowledged: int = 0
    indeterminate: int = 0
    delivered: int = 0
    lost: list[Any] = field(default_factory=list)
    duplicated: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)
    redelivered: int = 0
    acked: int = 0
    stale_acks: list[Any] = field(default_factory=list)
    double_acks: list[Any] = field(default_factory=list)
    recovery: list[dict[str, Any]] = field(default_factory=list)
    recovery_max_s: float = RECOVERY_MAX_S
    #: Reads answered, by where they were sent (a node id, or ``client``).
    reads: dict[str, int] = field(default_factory=dict)
    #: Reads that went back in time: {time, process, where, read, arg, saw, expected}.
    stale_reads: list[dict[str, Any]] = field(default_factory=list)

    @property
    def slow_recoveries(self) -> list[dict[str, Any]]:
        out = []
        for r in self.recovery:
            late = r["after_heal_s"] is None or r["after_heal_s"] > self.recovery_max_s
            if r.get("serving"):
                during = r["after_fault_s"]
                late = late or during is None or during > self.recovery_max_s or (
                    r["end"] is not None and r["start"] + during > r["end"])
            if late:
                out.append(r)
        return out

    @property
    def valid(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.stale_acks
                    or self.double_acks or self.slow_recoveries or self.stale_reads)

    def problems(self) -> list[str]:
        """One line per broken invariant (empty when valid)."""
        out = []
        for name in ("lost", "duplicated", "unexpected", "stale_acks", "double_acks"):
            items = getattr(self, name)
            if items:
                out.append(f"{name}: {len(items)} (e.g. {items[:5]})")
        for r in self.slow_recoveries:
            if r.get("serving"):
                out.append(f"writes not back within {self.recovery_max_s:.0f} s while {r['fault']} lasted "
                           f"(a majority stayed up) or after its healing: {r}")
            else:
                out.append(f"writes not back within {self.recovery_max_s:.0f} s of healing {r['fault']}: {r}")
        if self.stale_reads:
            by_where: dict[str, int] = {}
            for s in self.stale_reads:
                by_where[s["where"]] = by_where.get(s["where"], 0) + 1
            out.append(f"stale_reads: {len(self.stale_reads)} (by where sent: {by_where}; e.g. "
                       f"{self.stale_reads[:STALE_EXAMPLES_MAX]})")
        return out


def check(history: History, recovery_max_s: float = RECOVERY_MAX_S) -> Result:
    """Check ``history`` (complete: the final drain is part of it)."""
    r = Result(recovery_max_s=recovery_max_s)
    attempted: set[Any] = set()
    acknowledged: set[Any] = set()
    value_jobs: dict[Any, set[str]] = {}
    pulls_of: dict[str, list[tuple[float, str]]] = {}   # job id -> [(completion time, token)]
    ack_invoked: dict[tuple[str, str], float] = {}
    acks_ok: list[tuple[float, str, str]] = []          # (invoke time, job id, token)
    push_ok_times: list[tuple[float, float]] = []       # (invoke time, completion time)
    push_invoked: dict[tuple[str, Any], float] = {}
    for op in history.ops:
        if op.f == "push":
            if op.type == INVOKE:
                attempted.add(op.value)
                push_invoked[(op.process, op.value)] = op.time
            elif op.type == OK:
                value = op.value[0]
                acknowledged.add(value)
                push_ok_times.append((push_invoked.get((op.process, value), op.time), op.time))
            elif op.type == INFO:
                r.indeterminate += 1
        elif op.f == "pull" and op.type == OK and op.value is not None:
            job_id, value, token = op.value
            r.delivered += 1
            value_jobs.setdefault(value, set()).add(job_id)
            pulls_of.setdefault(job_id, []).append((op.time, token))
        elif op.f == "ack":
            job_id, token = op.value
            if op.type == INVOKE:
                ack_invoked[(job_id, token)] = op.time
            elif op.type == OK:
                acks_ok.append((ack_invoked.get((job_id, token), op.time), job_id, token))
    r.attempted, r.acknowledged = len(attempted), len(acknowledged)
    delivered_values = set(value_jobs)
    r.lost = sorted(acknowledged - delivered_values, key=str)
    r.unexpected = sorted(delivered_values - attempted, key=str)
    r.duplicated = sorted((v for v, ids in value_jobs.items() if len(ids) > 1), key=str)
    r.redelivered = sum(len(p) - 1 for p in pulls_of.values())
    r.acked = len(acks_ok)
    completed: dict[str, str] = {}
    for invoked, job_id, token in acks_ok:
        if job_id in completed and completed[job_id] != token:
            r.double_acks.append((job_id, completed[job_id], token))
        completed.setdefault(job_id, token)
        # A newer lease (a pull with another token, finished before this ack began) supersedes it.
        mine = [t for t, tok in pulls_of.get(job_id, []) if tok == token]
        if mine and any(t > mine[0] and t < invoked and tok != token for t, tok in pulls_of[job_id]):
            r.stale_acks.append((job_id, token))
    for fault in history.faults:
        r.recovery.append({
            "fault": fault.name, "start": round(fault.start, 2),
            "end": round(fault.end, 2) if fault.end is not None else None,
            "after_fault_s": _first_write_after(push_ok_times, fault.start),
            "after_heal_s": _first_write_after(push_ok_times, fault.end) if fault.end is not None else None,
            "serving": fault.serving,
        })
    _check_reads(history.ops, r)
    return r


def _first_write_after(push_ok_times: list[tuple[float, float]], t: float) -> float | None:
    """Seconds from ``t`` to the completion of the first push invoked at or after ``t``."""
    done = [completed for invoked, completed in push_ok_times if invoked >= t]
    return round(min(done) - t, 3) if done else None


# --- reads ----------------------------------------------------------------------------------------

@dataclass
class _Read:
    invoked: float
    answered: float
    process: str
    kind: str
    where: str
    arg: Any
    result: Any


@dataclass
class _Facts:
    """When each fact was first established (see the module docstring), and what rule 3 needs."""

    exists: dict[str, tuple[float, str]] = field(default_factory=dict)      # job -> (time, by what)
    completed: dict[str, tuple[float, str]] = field(default_factory=dict)
    pushed: dict[str, float] = field(default_factory=dict)                 # job -> push acknowledged
    taken: dict[str, float] = field(default_factory=dict)                  # job -> first pull invoked
    unknown_pulls: list[float] = field(default_factory=list)               # invoke times

    def establish(self, facts: dict[str, tuple[float, str]], job: str, t: float, by: str) -> None:
        if job not in facts or t < facts[job][0]:
            facts[job] = (t, by)


def _completions(ops: list[Op], f: str) -> list[tuple[Op, Op | None]]:
    """Each ``invoke`` of ``f`` with its completion (the process's next entry of ``f``), or None."""
    pending: dict[str, Op] = {}
    out: list[tuple[Op, Op | None]] = []
    for op in ops:
        if op.f != f:
            continue
        if op.type == INVOKE:
            if op.process in pending:
                out.append((pending.pop(op.process), None))
            pending[op.process] = op
        elif op.process in pending:
            out.append((pending.pop(op.process), op))
    out.extend((inv, None) for inv in pending.values())
    return out


def _facts(ops: list[Op], reads: list[_Read]) -> _Facts:
    facts = _Facts()
    for op in ops:
        if op.type != OK:
            continue
        if op.f == "push":
            job = op.value[1]
            facts.establish(facts.exists, job, op.time, f"push acknowledged at {op.time:.3f}s ({op.process})")
            facts.pushed[job] = min(op.time, facts.pushed.get(job, op.time))
        elif op.f == "pull" and op.value is not None:
            facts.establish(facts.exists, op.value[0], op.time, f"pulled at {op.time:.3f}s ({op.process})")
        elif op.f == "ack":
            by = f"ack acknowledged at {op.time:.3f}s ({op.process})"
            facts.establish(facts.exists, op.value[0], op.time, by)
            facts.establish(facts.completed, op.value[0], op.time, by)
    for read in reads:
        if read.kind in ("job", "state") and read.result is not None:
            by = f"read at {read.answered:.3f}s ({read.process} via {read.where}) saw {read.result}"
            facts.establish(facts.exists, read.arg, read.answered, by)
            if read.result == "completed":
                facts.establish(facts.completed, read.arg, read.answered, by)
    for invoke, done in _completions(ops, "pull"):
        if done is not None and done.type == OK:
            if done.value is not None:
                job = done.value[0]
                facts.taken[job] = min(invoke.time, facts.taken.get(job, invoke.time))
        elif done is None or done.type == INFO:
            facts.unknown_pulls.append(invoke.time)
    facts.unknown_pulls.sort()
    return facts


def _reads(ops: list[Op]) -> list[_Read]:
    out = []
    for invoke, done in _completions(ops, "read"):
        if done is not None and done.type == OK:
            kind, where, arg, result = done.value
            out.append(_Read(invoke.time, done.time, invoke.process, kind, where, arg, result))
    return out


def _check_reads(ops: list[Op], r: Result) -> None:
    reads = _reads(ops)
    for read in reads:
        r.reads[read.where] = r.reads.get(read.where, 0) + 1
    if not reads:
        return
    facts = _facts(ops, reads)

    def stale(read: _Read, saw: Any, expected: str) -> None:
        r.stale_reads.append({"time": round(read.invoked, 3), "answered": round(read.answered, 3),
                              "process": read.process, "where": read.where, "read": read.kind,
                              "arg": read.arg, "saw": saw, "expected": expected})

    exist_times = sorted(t for t, _ in facts.exists.values())
    completed_times = sorted(t for t, _ in facts.completed.values())
    for read in reads:
        if read.kind in ("job", "state"):
            known = facts.exists.get(read.arg)
            if known is not None and known[0] < read.invoked and read.result is None:
                stale(read, "not found", f"the job (exists since the {known[1]})")
            done = facts.completed.get(read.arg)
            if done is not None and done[0] < read.invoked and read.result not in (None, "completed"):
                stale(read, read.result, f"completed (since the {done[1]})")
        elif read.kind == "counts" and isinstance(read.result, dict):
            total = sum(int(n) for state, n in read.result.items() if state not in NOT_STATES)
            exist = bisect.bisect_left(exist_times, read.invoked)
            if total < exist:
                stale(read, {"total": total}, f"at least {exist} jobs (that many were known to exist)")
            done_n = bisect.bisect_left(completed_times, read.invoked)
            if int(read.result.get("completed", 0)) < done_n:
                stale(read, {"completed": read.result.get("completed", 0)},
                      f"at least {done_n} completed (that many acks were acknowledged)")
    _check_to_run(reads, facts, stale)


def _check_to_run(reads: list[_Read], facts: _Facts, stale: Any) -> None:
    """Rule 3, by one sweep over the reads in invocation order: the jobs whose push was
    acknowledged before a read began, less those a pull invoked before it was answered took."""
    counted = [read for read in reads if read.kind in ("counts", "count")]
    counted.sort(key=lambda read: read.invoked)
    pushes = sorted((t, job) for job, t in facts.pushed.items())
    taken_before: list[float] = []    # first-pull invoke times of the pushes swept so far (inf: none)
    i = 0
    for read in counted:
        while i < len(pushes) and pushes[i][0] < read.invoked:
            bisect.insort(taken_before, facts.taken.get(pushes[i][1], float("inf")))
            i += 1
        waiting = i - bisect.bisect_left(taken_before, read.answered)
        unknown = bisect.bisect_left(facts.unknown_pulls, read.answered)
        floor = waiting - unknown
        if read.kind == "count":
            to_run = int(read.result) if isinstance(read.result, int) else None
        else:
            to_run = sum(int(read.result.get(k, 0)) for k in TO_RUN_STATES) if isinstance(read.result, dict) else None
        if to_run is not None and to_run < floor:
            stale(read, {"to run": to_run},
                  f"at least {floor} waiting ({waiting} acknowledged pushes not yet pulled, "
                  f"{unknown} pulls of unknown outcome)")


# Re-exported for callers that classify outcomes themselves.
OUTCOMES = (INVOKE, OK, FAIL, INFO)
