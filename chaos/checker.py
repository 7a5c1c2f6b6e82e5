"""Check a queue history in the spirit of Jepsen's total-queue checker.

After the faults are healed and the queue drained, every acknowledged push must
have been delivered (lost = 0), no value may be enqueued as two jobs (duplicated
= 0: client retries carry idempotency keys), nothing may be delivered that was
never pushed (unexpected = 0), and no ack with a superseded lease token may be
accepted (lease exclusivity). Redeliveries are counted, not forbidden: delivery
is at least once. Recovery is the time from each fault (and from its healing) to
the first push that succeeded after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .history import FAIL, INFO, INVOKE, OK, History

__all__ = ["Result", "check", "RECOVERY_MAX_S"]

RECOVERY_MAX_S = 10.0


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

    @property
    def slow_recoveries(self) -> list[dict[str, Any]]:
        return [r for r in self.recovery
                if r["after_heal_s"] is None or r["after_heal_s"] > self.recovery_max_s]

    @property
    def valid(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.stale_acks
                    or self.double_acks or self.slow_recoveries)

    def problems(self) -> list[str]:
        """One line per broken invariant (empty when valid)."""
        out = []
        for name in ("lost", "duplicated", "unexpected", "stale_acks", "double_acks"):
            items = getattr(self, name)
            if items:
                out.append(f"{name}: {len(items)} (e.g. {items[:5]})")
        for r in self.slow_recoveries:
            out.append(f"writes not back within {self.recovery_max_s:.0f} s of healing {r['fault']}: {r}")
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
                acknowledged.add(op.value)
                push_ok_times.append((push_invoked.get((op.process, op.value), op.time), op.time))
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
        })
    return r


def _first_write_after(push_ok_times: list[tuple[float, float]], t: float) -> float | None:
    """Seconds from ``t`` to the completion of the first push invoked at or after ``t``."""
    done = [completed for invoked, completed in push_ok_times if invoked >= t]
    return round(min(done) - t, 3) if done else None


# Re-exported for callers that classify outcomes themselves.
OUTCOMES = (INVOKE, OK, FAIL, INFO)
