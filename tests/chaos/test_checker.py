"""The history checker on hand-written histories: each invariant caught, valid runs pass; stale
reads caught, reads concurrent with the writes they miss accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.chaos.checker import check
from shoal.chaos.history import FAIL, INFO, INVOKE, OK, Fault, History, Op

pytestmark = pytest.mark.chaos


def _history(ops: list[tuple[float, str, str, str, object]], faults: list[Fault] | None = None) -> History:
    h = History(started=0.0)
    h.ops = [Op(*op) for op in ops]
    h.faults = faults or []
    return h


Ops = list[tuple[float, str, str, str, object]]


def _push(t: float, value: str, outcome: str = OK, job: str | None = None) -> Ops:
    """A push of ``value``; acknowledged (``ok``) with id ``job`` (default ``0-<value>``) 10 ms later."""
    done = (value, job or f"0-{value}") if outcome == OK else value
    return [(t, "p0", INVOKE, "push", value), (t + 0.01, "p0", outcome, "push", done)]


def _read(t: float, kind: str, arg: object, result: object, where: str = "n1", process: str = "r-n1",
          took: float = 0.01) -> Ops:
    """A read invoked at ``t`` and answered ``result`` ``took`` seconds later."""
    return [(t, process, INVOKE, "read", (kind, where, arg)),
            (t + took, process, OK, "read", (kind, where, arg, result))]


def _deliver(t: float, job: str, value: str, token: str, ack: str | None = OK) -> list[tuple[float, str, str, str, object]]:
    ops: list[tuple[float, str, str, str, object]] = [(t, "c0", INVOKE, "pull", None),
                                                      (t + 0.01, "c0", OK, "pull", (job, value, token))]
    if ack is not None:
        ops += [(t + 0.02, "c0", INVOKE, "ack", (job, token)), (t + 0.03, "c0", ack, "ack", (job, token))]
    return ops


def test_a_clean_history_is_valid() -> None:
    h = _history(_push(0, "a", job="0-1") + _push(1, "b", INFO) + _push(1.2, "c", FAIL)
                 + _push(2, "d", job="0-4")
                 + _deliver(3, "0-1", "a", "0.1") + _deliver(4, "0-2", "b", "0.2") + _deliver(5, "0-4", "d", "0.3"),
                 [Fault("kill", 0.5, 1.5)])
    r = check(h)
    assert r.valid, r.problems()
    assert (r.attempted, r.acknowledged, r.indeterminate, r.delivered, r.acked) == (4, 2, 1, 3, 3)
    assert r.recovery == [{"fault": "kill", "start": 0.5, "end": 1.5, "after_fault_s": 1.51,
                           "after_heal_s": 0.51, "serving": False}]


def test_lost_duplicated_and_unexpected_are_caught() -> None:
    h = _history(_push(0, "a", job="0-1") + _push(1, "b", job="0-2") + _deliver(2, "0-2", "b", "0.1")
                 + _deliver(3, "0-3", "b", "0.2") + _deliver(4, "0-4", "zzz", "0.3"))
    r = check(h)
    assert not r.valid
    assert r.lost == ["a"] and r.duplicated == ["b"] and r.unexpected == ["zzz"]


def test_an_ack_with_a_superseded_token_is_caught() -> None:
    # Leased with 0.1, lease lapsed and re-leased as 0.2, then the ack with 0.1 was accepted.
    h = _history(_push(0, "a", job="0-1") + _deliver(1, "0-1", "a", "0.1", ack=None)
                 + _deliver(2, "0-1", "a", "0.2", ack=None)
                 + [(3.0, "c0", INVOKE, "ack", ("0-1", "0.1")), (3.1, "c0", OK, "ack", ("0-1", "0.1"))])
    r = check(h)
    assert r.stale_acks == [("0-1", "0.1")] and not r.valid
    assert r.redelivered == 1


def test_redelivery_alone_is_allowed_and_refused_stale_acks_are_fine() -> None:
    h = _history(_push(0, "a", job="0-1") + _deliver(1, "0-1", "a", "0.1", ack=None) + _deliver(2, "0-1", "a", "0.2")
                 + [(3.0, "c0", INVOKE, "ack", ("0-1", "0.1")), (3.1, "c0", FAIL, "ack", ("0-1", "0.1"))])
    r = check(h)
    assert r.valid and r.redelivered == 1


def test_writes_that_never_come_back_break_recovery() -> None:
    h = _history(_push(0, "a", job="0-1") + _deliver(1, "0-1", "a", "0.1"), [Fault("isolate", 2.0, 3.0)])
    r = check(h, recovery_max_s=5)
    assert not r.valid and "isolate" in r.problems()[0]


def test_wrote_since_counts_only_pushes_invoked_after_the_time() -> None:
    # What the scenario runner waits for after the last heal, as the recovery check reads it.
    h = _history(_push(1.0, "a") + _push(2.95, "b")[:1] + _push(3.5, "c", outcome=INFO) + _push(4.0, "d")[:1])
    h.ops.append(Op(4.2, "p0", OK, "push", ("b", "0-b")))  # invoked before 3.0, answered after it
    assert h.wrote_since(0.5)
    assert not h.wrote_since(3.0)
    h.ops.append(Op(4.3, "p0", OK, "push", ("d", "0-d")))
    assert h.wrote_since(3.0) and not h.wrote_since(4.1)


def test_a_fault_that_leaves_a_majority_must_not_stop_writes_until_healed() -> None:
    """A ``serving`` fault: the first write after it must complete before it is healed."""
    late = _history(_push(0, "a", job="0-1") + _push(3.5, "b", job="0-2") + _deliver(4, "0-1", "a", "0.1")
                    + _deliver(4.1, "0-2", "b", "0.2"), [Fault("pause-leader", 1.0, 3.0, "n1", serving=True)])
    r = check(late, recovery_max_s=5)
    assert not r.valid and "while pause-leader lasted" in r.problems()[0]
    back = _history(_push(0, "a", job="0-1") + _push(2.0, "b", job="0-2") + _push(3.5, "c", job="0-3")
                    + _deliver(4, "0-1", "a", "0.1") + _deliver(4.1, "0-2", "b", "0.2")
                    + _deliver(4.2, "0-3", "c", "0.3"),
                    [Fault("pause-leader", 1.0, 3.0, "n1", serving=True)])
    assert check(back, recovery_max_s=5).valid
    # The same late write after a fault that may stop writes (no majority promised) is fine.
    assert check(_history(late.ops, [Fault("kill-all", 1.0, 3.0)]), recovery_max_s=5).valid


# --- reads ------------------------------------------------------------------------------------------

def test_a_job_acknowledged_before_a_read_began_must_be_found() -> None:
    h = _history(_push(0, "a", job="0-1")                          # acknowledged at 0.01
                 + _read(0.005, "job", "0-1", None, where="n2", process="r-n2")  # began before the ack
                 + _read(1.0, "job", "0-1", "waiting")
                 + _read(1.1, "job", "0-1", None, where="n3", process="r-n3")
                 + _read(1.2, "state", "0-1", None, where="client", process="r-client")
                 + _deliver(2, "0-1", "a", "0.1"))
    r = check(h)
    assert not r.valid
    assert [(s["where"], s["read"], s["saw"]) for s in r.stale_reads] == [("n3", "job", "not found"),
                                                                          ("client", "state", "not found")]
    assert "push acknowledged at 0.010s" in r.stale_reads[0]["expected"]
    assert r.reads == {"n1": 1, "n2": 1, "n3": 1, "client": 1}
    assert "stale_reads: 2" in r.problems()[0]


def test_an_acked_job_never_reads_as_not_completed() -> None:
    # Pulled at 1.01, ack invoked at 1.02 and acknowledged at 1.03.
    h = _history(_push(0, "a", job="0-1") + _deliver(1, "0-1", "a", "0.1")
                 + _read(1.025, "state", "0-1", "active", process="r-n2")   # concurrent with the ack
                 + _read(1.5, "state", "0-1", "completed")
                 + _read(2.0, "job", "0-1", "waiting", where="n2", process="r-n2"))   # went back in time
    r = check(h)
    assert [(s["where"], s["saw"]) for s in r.stale_reads] == [("n2", "waiting")]
    assert r.stale_reads[0]["expected"].startswith("completed (since the ack acknowledged at 1.030s")


def test_what_a_read_saw_binds_the_reads_that_begin_after_it() -> None:
    # Nothing acknowledged says 0-7 is done (its push and ack outcomes are unknown), but a read saw
    # it completed at 1.01: a read that began later must not see it active.
    h = _history([(0.0, "p0", INVOKE, "push", "a"), (0.5, "p0", INFO, "push", "a")]
                 + _read(1.0, "job", "0-7", "completed")
                 + _read(1.005, "job", "0-7", "active", where="n2", process="r-n2")   # concurrent: fine
                 + _read(2.0, "job", "0-7", "active", where="n3", process="r-n3"))
    r = check(h)
    assert [s["where"] for s in r.stale_reads] == ["n3"]
    assert "read at 1.010s (r-n1 via n1) saw completed" in r.stale_reads[0]["expected"]


def test_counts_below_what_acknowledged_writes_imply_are_caught() -> None:
    ops = (_push(0, "a", job="0-1") + _push(0.1, "b", job="0-2") + _push(0.2, "c", job="0-3")
           + _deliver(1, "0-1", "a", "0.1"))                          # 0-1 completed at 1.03
    fine = {"waiting": 2, "active": 0, "delayed": 0, "completed": 1, "failed": 0, "paused": 0}
    h = _history(ops + _read(2.0, "counts", "chaos", fine)
                 # began before 0-3's push was acknowledged and before 0-1's ack: both may be missed
                 + _read(0.205, "counts", "chaos", {"waiting": 2, "completed": 0}, process="r-n2")
                 + _read(2.1, "counts", "chaos", {**fine, "waiting": 1, "prioritized": 0}, where="n2",
                         process="r-n2")
                 + _read(2.2, "counts", "chaos", {**fine, "completed": 0}, where="n3", process="r-n3"))
    r = check(h)
    stale = [(s["where"], s["saw"]) for s in r.stale_reads]
    assert ("n2", {"total": 2}) in stale and ("n2", {"to run": 1}) in stale
    assert ("n3", {"completed": 0}) in stale and ("n3", {"total": 2}) in stale
    assert all(s["time"] != 0.205 for s in r.stale_reads) and len(stale) == 4


def test_count_allows_for_pulls_under_way_and_pulls_of_unknown_outcome() -> None:
    ops = _push(0, "a", job="0-1") + _push(0.1, "b", job="0-2") + _push(0.2, "c", job="0-3")
    # A pull invoked before the read was answered took 0-1 (it returned at 1.06, after the read).
    taking = [(1.0, "c0", INVOKE, "pull", None), (1.06, "c0", OK, "pull", ("0-1", "a", "0.1"))]
    h = _history(ops + taking + _read(1.02, "count", "chaos", 2, took=0.03))
    assert check(h).stale_reads == []
    h = _history(ops + taking + _read(1.02, "count", "chaos", 1, took=0.03))
    assert [s["saw"] for s in check(h).stale_reads] == [{"to run": 1}]
    # A pull whose reply was lost may have taken one more job.
    lost_reply = [(1.01, "c1", INVOKE, "pull", None), (6.0, "c1", INFO, "pull", None)]
    h = _history(ops + taking + lost_reply + _read(1.02, "count", "chaos", 1, took=0.03))
    assert check(h).stale_reads == []
    # A pull invoked after the read was answered cannot excuse it.
    h = _history(ops + [(2.0, "c0", INVOKE, "pull", None), (2.01, "c0", OK, "pull", ("0-1", "a", "0.1"))]
                 + _read(1.02, "count", "chaos", 2, took=0.03))
    assert [s["saw"] for s in check(h).stale_reads] == [{"to run": 2}]


def test_reads_that_failed_or_timed_out_are_not_checked() -> None:
    h = _history(_push(0, "a", job="0-1")
                 + [(1.0, "r-n1", INVOKE, "read", ("job", "n1", "0-1")),
                    (2.0, "r-n1", INFO, "read", ("job", "n1", "0-1")),
                    (2.0, "r-n2", INVOKE, "read", ("job", "n2", "0-1")),
                    (2.1, "r-n2", FAIL, "read", ("job", "n2", "0-1"))]
                 + _deliver(3, "0-1", "a", "0.1"))
    r = check(h)
    assert r.valid and r.reads == {}


def test_history_round_trips_through_jsonl(tmp_path: Path) -> None:
    h = _history(_push(0, "a", job="0-1") + _deliver(1, "0-1", "a", "0.1")
                 + _read(2, "counts", "chaos", {"waiting": 0, "completed": 1}) + _read(2.1, "job", "0-1", "completed"),
                 [Fault("kill", 0.5, 0.7, "n1"), Fault("pause-leader", 0.8, 0.9, "n2", serving=True)])
    h.save(tmp_path / "h.jsonl")
    again = History.load(tmp_path / "h.jsonl")
    assert again.ops == h.ops and again.faults == h.faults
