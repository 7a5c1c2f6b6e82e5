"""Pulls limited to one group (``PULL``/``PULLB`` ``group``, bunqueue's ``groupAffinity``) and to
jobs without a group (``ungrouped``), in the engine (``_pull``, ``_ready``).

A limited pull takes only its group's jobs, in the group's order, within the queue's and the
group's limits; each job it takes counts as one turn of its group, and skips nobody else's.
``has_ready`` (what wakes a parked long poll) agrees with what the pull would take. The
interleavings with every other move of a job are in ``test_engine_fair_groups.GroupsVsModel``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shoal.cluster.codec import raw_of, unraw
from shoal.cluster.commands import normalize, validate
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.state import PartitionEngine
from shoal.node.state._ready import FAIR_STRIDE

from fair_model import engine_with, heap_operations, run

def push(e: PartitionEngine, group: str | None, data: Any = None, now: int = 1_000, **options: Any) -> str:
    cmd = {"cmd": "PUSH", "queue": "q", "data": raw_of(data), **options}
    if group is not None:
        cmd["group"] = group
    return str(run(e, cmd, now)["id"])


def pull(e: PartitionEngine, count: int = 1, now: int = 1_000, **only: Any) -> list[dict[str, Any]]:
    """The jobs one PULLB (limited by ``only``: ``group=…`` or ``ungrouped=True``) leased."""
    r = run(e, {"cmd": "PULLB", "queue": "q", "count": count, **only}, now)
    return [{**job, "token": token} for job, token in zip(r["jobs"], r["tokens"])]


def ack(e: PartitionEngine, jobs: list[dict[str, Any]], now: int = 1_000) -> None:
    for job in jobs:
        run(e, {"cmd": "ACK", "id": job["id"], "token": job["token"]}, now)


def pull_ack(e: PartitionEngine, **only: Any) -> dict[str, Any] | None:
    got = pull(e, **only)
    ack(e, got)
    return got[0] if got else None


def datas(jobs: list[dict[str, Any]]) -> list[Any]:
    return [unraw(j["data"]) for j in jobs]


# --- what a limited pull takes ----------------------------------------------------------------


def test_a_group_pull_takes_that_groups_jobs_in_the_groups_order() -> None:
    e = engine_with({"groupConcurrency": 0})
    for i in range(3):
        push(e, "a", f"a{i}")
        push(e, "b", f"b{i}")
        push(e, None, f"n{i}")
    push(e, "b", "b-urgent", priority=5)
    assert datas(pull(e, 10, group="b")) == ["b-urgent", "b0", "b1", "b2"]
    assert pull(e, 10, group="b") == [] and pull(e, group="nobody") == []
    assert datas(pull(e, 10, ungrouped=True)) == ["n0", "n1", "n2"]
    assert datas(pull(e, 10)) == ["a0", "a1", "a2"]


def test_an_ungrouped_pull_takes_plain_bulk_jobs_as_runs_and_no_group_job() -> None:
    e = engine_with({"groupConcurrency": 0})
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(50)]})  # one segment
    push(e, "a", "a0")
    got = pull(e, 100, ungrouped=True)
    assert datas(got) == list(range(50)) and all("group" not in j for j in got)
    assert datas(pull(e, 100)) == ["a0"]


def test_the_group_concurrency_holds() -> None:
    e = engine_with({"groupConcurrency": 2})
    for i in range(5):
        push(e, "a", i)
    first = pull(e, 5, group="a")
    assert datas(first) == [0, 1]
    assert pull(e, 5, group="a") == []
    ack(e, first[:1])
    assert datas(pull(e, 5, group="a")) == [2]


def test_a_utube_group_runs_one_job_at_a_time() -> None:
    e = engine_with(qtype="utube")
    for i in range(3):
        push(e, "a", i)
    got = pull(e, 3, group="a")
    assert datas(got) == [0]
    ack(e, got)
    assert datas(pull(e, 3, group="a")) == [1]


def test_the_group_rate_limit_holds_and_its_window_ticks_the_leader() -> None:
    e = engine_with({"groupConcurrency": 0, "groupLimit": {"max": 2, "durationMs": 1_000}})
    for i in range(5):
        push(e, "a", i, now=1_000)
    assert datas(pull(e, 5, now=1_000, group="a")) == [0, 1]
    assert pull(e, 5, now=1_500, group="a") == []
    assert not e.has_ready("q", "a")
    assert e.next_due_ms() == 2_000  # the group waits parked: the leader ticks when its window frees
    run(e, {"cmd": "_Tick"}, 2_000)
    assert e.has_ready("q", "a")
    assert datas(pull(e, 5, now=2_000, group="a")) == [2, 3]


def test_the_queue_limits_and_pause_hold() -> None:
    e = engine_with({"groupConcurrency": 0, "concurrency": 3})
    for i in range(5):
        push(e, "a", i)
    push(e, None, "n")
    assert len(pull(e, 5, group="a")) == 3
    assert pull(e, 5, ungrouped=True) == []  # the queue runs 3 already
    e2 = engine_with({"groupConcurrency": 0})
    push(e2, "a", 1)
    run(e2, {"cmd": "Pause", "queue": "q"})
    assert pull(e2, group="a") == [] and not e2.has_ready("q", "a")


def test_a_queue_type_without_groups_refuses_a_group_pull() -> None:
    e = engine_with(qtype="fifo")
    push(e, None, 1)
    before = e.digest()
    with pytest.raises(CommandError) as err:
        pull(e, group="a")
    assert err.value.code == ErrorCode.INVALID and "group" in str(err.value) and e.digest() == before
    assert e.has_ready("q", "a")  # a long poll is not parked: it gets its error at once
    assert datas(pull(e, ungrouped=True)) == [1]  # every job of a fifo queue is without a group


# --- the turns between groups -------------------------------------------------------------------


def test_a_one_group_pull_counts_as_that_groups_turn() -> None:
    e = engine_with()
    for i in range(10):
        push(e, "a", i)
        push(e, "b", i)
    for _ in range(3):
        assert pull_ack(e, group="a")["group"] == "a"  # type: ignore[index]
    # a took three turns: b's three come first, then they alternate again (ties: name order).
    assert [pull_ack(e)["group"] for _ in range(7)] == ["b", "b", "b", "a", "b", "a", "b"]  # type: ignore[index]


def test_a_one_group_pull_skips_no_other_group() -> None:
    # A round-robin cursor moved past c would skip b; the tags keep b's turn.
    e = engine_with()
    for g in ("a", "b", "c"):
        for i in range(3):
            push(e, g, i)
    assert pull_ack(e)["group"] == "a"  # type: ignore[index]
    assert pull_ack(e, group="c")["group"] == "c"  # type: ignore[index]
    assert [pull_ack(e)["group"] for _ in range(4)] == ["b", "a", "b", "c"]  # type: ignore[index]


def test_a_one_group_pull_moves_neither_the_virtual_time_nor_other_tags() -> None:
    e = engine_with({"groupWeights": {"a": 4}, "groupConcurrency": 0})
    for i in range(3):
        push(e, "a", i)
        push(e, "b", i)
    q = e.queues["q"]
    before = (q.group_vtime, q.group_tags["b"])
    pull(e, 3, group="a")
    assert (q.group_vtime, q.group_tags["b"]) == before
    assert q.group_tags["a"] == 3 * (FAIR_STRIDE // 4)
    pull(e, 3, ungrouped=True)
    assert q.group_tags["a"] == 3 * (FAIR_STRIDE // 4)  # nothing without a group to take: no change


def test_a_dedicated_consumer_keeps_the_heap_of_turns_small() -> None:
    """Many one-group pulls of a listed group leave one live entry of it, not one per pull."""
    e = engine_with({"groupConcurrency": 0})
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": b"\x01", "group": f"g{i % 10}"} for i in range(3_000)]})
    q = e.queues["q"]
    for _ in range(200):
        assert len(pull(e, group="g3")) == 1
    assert len(q.group_heads) <= 2 * len(q.group_listed)
    got = {j["group"] for j in pull(e, 9)}
    assert got == {f"g{i}" for i in range(10)} - {"g3"}  # g3 took 200 turns: the others' come first


def test_a_group_pull_costs_a_few_heap_operations_among_100k_groups() -> None:
    e = engine_with({"groupConcurrency": 0})
    for start in range(0, 100_000, 10_000):
        run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": b"\x01", "group": f"g{i}"}
                                                       for i in range(start, start + 10_000)]})
    for _ in range(1_000):  # every group's tag moves on: the heap is not in push order any more
        pull(e)
    with heap_operations() as calls:
        got = pull(e, group="g77777")
        ready = e.has_ready("q", "g12345")
    assert [j["group"] for j in got] == ["g77777"] and ready and len(calls) < 10


# --- replicated state ----------------------------------------------------------------------------


def test_replicas_and_a_restored_snapshot_agree() -> None:
    e = engine_with({"groupWeights": {"a": 2}})
    twin = engine_with({"groupWeights": {"a": 2}})
    for i in range(20):
        for g in ("a", "b", "c", None):
            cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(i)}
            if g is not None:
                cmd["group"] = g
            run(e, dict(cmd))
            twin.apply(dict(cmd), 1_000, replies=False, events=False)
    for only in ({"group": "c"}, {}, {"ungrouped": True}, {"group": "a"}, {}):
        cmd = {"cmd": "PULLB", "queue": "q", "count": 2, **only}
        r = run(e, dict(cmd))
        twin.apply(dict(cmd), 1_000, replies=False, events=False)
        for job, token in zip(r["jobs"], r["tokens"]):
            ack_cmd = {"cmd": "ACK", "id": job["id"], "token": token}
            run(e, dict(ack_cmd))
            twin.apply(dict(ack_cmd), 1_000, replies=False, events=False)
    assert twin.digest() == e.digest()
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    for only in ({"group": "b"}, {}, {"ungrouped": True}, {"group": "a"}) * 5:
        assert [j["id"] for j in pull(restored, **only)] == [j["id"] for j in pull(e, **only)]
    assert restored.digest() == e.digest()


def test_an_ungrouped_pull_leaves_the_snapshot_of_untouched_groups_unchanged() -> None:
    e = engine_with()
    push(e, "a", 1)
    push(e, None, 2)
    pull(e, ungrouped=True)
    assert b"groups" not in e.snapshot()  # no group took a turn


# --- what wakes a parked long poll ----------------------------------------------------------------

_GROUPS = ["a", "b", "c", None]


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["push", "push-later", "pull", "pull-only", "ack"]),
                                st.sampled_from(_GROUPS), st.integers(0, 2)), max_size=40),
       conc=st.sampled_from([0, 1, 2]), rate=st.booleans())
def test_has_ready_says_whether_a_limited_pull_would_take_a_job(steps: list[tuple[str, str | None, int]],
                                                                 conc: int, rate: bool) -> None:
    options: dict[str, Any] = {"groupConcurrency": conc}
    if rate:
        options["groupLimit"] = {"max": 2, "durationMs": 700}
    e = engine_with(options)
    held: list[dict[str, Any]] = []
    now = 1_000
    for action, group, n in steps:
        now += 100 * n
        if action.startswith("push"):
            push(e, group, 0, now=now, delay=300 if action == "push-later" else 0)
        elif action == "pull":
            held += pull(e, n + 1, now=now)
        elif action == "pull-only":
            held += pull(e, n + 1, now=now, **({"group": group} if group is not None else {"ungrouped": True}))
        elif held:
            ack(e, [held.pop(n % len(held))], now=now)
    run(e, {"cmd": "_Tick"}, now)  # the leader's tick: what is due is promoted
    for group in _GROUPS:
        only = {"group": group} if group is not None else {"ungrouped": True}
        ready = e.has_ready("q", group, group is None)
        copy = PartitionEngine.restore(e.snapshot())
        assert ready == bool(pull(copy, now=now, **only)), (group, ready)
        assert not ready or e.has_ready("q")  # a limited line is asked only when its queue is ready


# --- on the wire ----------------------------------------------------------------------------------


def test_bunqueues_group_pull_options_on_the_wire() -> None:
    # bunqueue's Worker with batch.groupAffinity sends group: {affinity}; null means jobs without a group.
    for cmd in ("PULL", "PULLB"):
        extra = {"count": 4} if cmd == "PULLB" else {}
        frame = normalize({"cmd": cmd, "queue": "q", **extra, "group": {"affinity": "tenant-a"}, "lockTtl": 5_000})
        assert validate(frame) == {"cmd": cmd, "queue": "q", **extra, "group": "tenant-a", "ttr": 5_000}
        frame = normalize({"cmd": cmd, "queue": "q", **extra, "group": {"affinity": None}})
        assert validate(frame) == {"cmd": cmd, "queue": "q", **extra, "ungrouped": True}
        assert validate(normalize({"cmd": cmd, "queue": "q", **extra, "group": {}})) == {"cmd": cmd, "queue": "q",
                                                                                         **extra}


@pytest.mark.parametrize("group, field", [
    ({"affinity": "a", "concurrency": 2}, "group.concurrency"),  # WorkerPro's per-pull group limits
    ({"limit": {"max": 1, "duration": 1_000}}, "group.limit"),
    ({"affinity": "a", "fairness": 1}, "group.fairness"),
    ({"affinity": ""}, "group"),
    ({"affinity": 7}, "group"),
    ({"affinity": "x" * 257}, "group"),
    ("", "group"),
    (["a"], "group"),
])
def test_bad_group_pull_options_are_refused_naming_the_field(group: Any, field: str) -> None:
    with pytest.raises(CommandError) as err:
        validate(normalize({"cmd": "PULLB", "queue": "q", "count": 2, "group": group}))
    assert err.value.code == ErrorCode.INVALID and str(err.value).startswith(f"{field}:")


def test_group_and_ungrouped_together_are_refused() -> None:
    with pytest.raises(CommandError) as err:
        validate({"cmd": "PULL", "queue": "q", "group": "a", "ungrouped": True})
    assert err.value.code == ErrorCode.INVALID and "ungrouped" in str(err.value)
    assert validate({"cmd": "PULL", "queue": "q", "group": "a", "ungrouped": False})["group"] == "a"
