"""What the node's long polls rely on: ``has_ready`` and ``next_due_ms`` under flow-control limits."""

from __future__ import annotations

from typing import Any

from shoal.cluster.codec import raw_of
from shoal.node.state import PartitionEngine


def engine(options: dict[str, Any], groups: list[str | None]) -> PartitionEngine:
    eng = PartitionEngine(0)
    eng.apply({"cmd": "CreateQueue", "queue": "q", "options": options}, 1_000)
    for group in groups:
        push: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(1)}
        if group is not None:
            push["group"] = group
        eng.apply(push, 1_000)
    return eng


def test_a_full_queue_window_is_not_ready_and_names_when_it_frees() -> None:
    eng = engine({"limit": {"max": 1, "durationMs": 1_000}}, [None, None])
    assert eng.apply({"cmd": "PULL", "queue": "q"}, 1_000).result["job"] is not None
    assert not eng.has_ready("q")
    assert eng.next_due_ms() == 2_000
    eng.apply({"cmd": "_Tick"}, 2_000)
    assert eng.has_ready("q")
    due = eng.next_due_ms()
    assert due is None or due > 2_000, "a tick must not leave a passed instant due (the leader would spin)"


def test_throttled_groups_are_not_ready_until_their_budget_returns() -> None:
    eng = engine({"groupLimit": {"max": 1, "durationMs": 500}, "groupConcurrency": 0}, ["a", "a", "b", "b"])
    got = eng.apply({"cmd": "PULLB", "queue": "q", "count": 4}, 1_000).result["jobs"]
    assert [j["group"] for j in got] == ["a", "b"]
    assert not eng.has_ready("q")
    assert eng.next_due_ms() == 1_500
    eng.apply({"cmd": "_Tick"}, 1_500)
    assert eng.has_ready("q")
    got = eng.apply({"cmd": "PULLB", "queue": "q", "count": 4}, 1_500).result["jobs"]
    assert [j["group"] for j in got] == ["a", "b"]


def test_concurrency_is_ready_again_after_an_ack() -> None:
    eng = engine({"concurrency": 1}, [None, None])
    reply = eng.apply({"cmd": "PULL", "queue": "q"}, 1_000).result
    assert not eng.has_ready("q")
    assert eng.next_due_ms() is None or eng.next_due_ms() > 1_000  # nothing to wait for but an ack
    eng.apply({"cmd": "ACK", "id": reply["job"]["id"], "token": reply["token"]}, 1_100)
    assert eng.has_ready("q")
