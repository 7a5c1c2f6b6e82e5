"""The history checker on hand-written histories: each invariant caught, valid runs pass."""

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


def _push(t: float, value: str, outcome: str = OK) -> list[tuple[float, str, str, str, object]]:
    return [(t, "p0", INVOKE, "push", value), (t + 0.01, "p0", outcome, "push", value)]


def _deliver(t: float, job: str, value: str, token: str, ack: str | None = OK) -> list[tuple[float, str, str, str, object]]:
    ops: list[tuple[float, str, str, str, object]] = [(t, "c0", INVOKE, "pull", None),
                                                      (t + 0.01, "c0", OK, "pull", (job, value, token))]
    if ack is not None:
        ops += [(t + 0.02, "c0", INVOKE, "ack", (job, token)), (t + 0.03, "c0", ack, "ack", (job, token))]
    return ops


def test_a_clean_history_is_valid() -> None:
    h = _history(_push(0, "a") + _push(1, "b", INFO) + _push(1.2, "c", FAIL) + _push(2, "d")
                 + _deliver(3, "0-1", "a", "0.1") + _deliver(4, "0-2", "b", "0.2") + _deliver(5, "0-4", "d", "0.3"),
                 [Fault("kill", 0.5, 1.5)])
    r = check(h)
    assert r.valid, r.problems()
    assert (r.attempted, r.acknowledged, r.indeterminate, r.delivered, r.acked) == (4, 2, 1, 3, 3)
    assert r.recovery == [{"fault": "kill", "start": 0.5, "end": 1.5, "after_fault_s": 1.51,
                           "after_heal_s": 0.51}]


def test_lost_duplicated_and_unexpected_are_caught() -> None:
    h = _history(_push(0, "a") + _push(1, "b") + _deliver(2, "0-2", "b", "0.1")
                 + _deliver(3, "0-3", "b", "0.2") + _deliver(4, "0-4", "zzz", "0.3"))
    r = check(h)
    assert not r.valid
    assert r.lost == ["a"] and r.duplicated == ["b"] and r.unexpected == ["zzz"]


def test_an_ack_with_a_superseded_token_is_caught() -> None:
    # Leased with 0.1, lease lapsed and re-leased as 0.2, then the ack with 0.1 was accepted.
    h = _history(_push(0, "a") + _deliver(1, "0-1", "a", "0.1", ack=None) + _deliver(2, "0-1", "a", "0.2", ack=None)
                 + [(3.0, "c0", INVOKE, "ack", ("0-1", "0.1")), (3.1, "c0", OK, "ack", ("0-1", "0.1"))])
    r = check(h)
    assert r.stale_acks == [("0-1", "0.1")] and not r.valid
    assert r.redelivered == 1


def test_redelivery_alone_is_allowed_and_refused_stale_acks_are_fine() -> None:
    h = _history(_push(0, "a") + _deliver(1, "0-1", "a", "0.1", ack=None) + _deliver(2, "0-1", "a", "0.2")
                 + [(3.0, "c0", INVOKE, "ack", ("0-1", "0.1")), (3.1, "c0", FAIL, "ack", ("0-1", "0.1"))])
    r = check(h)
    assert r.valid and r.redelivered == 1


def test_writes_that_never_come_back_break_recovery() -> None:
    h = _history(_push(0, "a") + _deliver(1, "0-1", "a", "0.1"), [Fault("isolate", 2.0, 3.0)])
    r = check(h, recovery_max_s=5)
    assert not r.valid and "isolate" in r.problems()[0]


def test_history_round_trips_through_jsonl(tmp_path: Path) -> None:
    h = _history(_push(0, "a") + _deliver(1, "0-1", "a", "0.1"), [Fault("kill", 0.5, 0.7, "n1")])
    h.save(tmp_path / "h.jsonl")
    again = History.load(tmp_path / "h.jsonl")
    assert again.ops == h.ops and again.faults == h.faults
