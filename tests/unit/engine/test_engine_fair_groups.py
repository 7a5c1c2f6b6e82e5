"""Fair, weighted turns between groups, and bunqueue's group ``maxSize`` admission (``_ready``).

Examples (round-robin, weights within 5 % over 10,000 pulls, priorities within a group,
concurrency, snapshots, ``groupMaxSize``), and ``GroupsVsModel``: the engine against a
reference that keeps a tag per group and scans for the least, through delays, retries,
releases, priority changes, removals, pulls limited to one group and restarts.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice
from typing import Any

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shoal.cluster.codec import raw_of, unraw
from shoal.cluster.commands import normalize, validate
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.state import PartitionEngine
from shoal.node.state._ready import FAIR_STRIDE

from fair_model import LONG_TTR_MS, engine_with, fair_pull, heap_operations, one_group_pull, run

def push(e: PartitionEngine, group: str | None, data: Any = None, **options: Any) -> str:
    cmd = {"cmd": "PUSH", "queue": "q", "data": raw_of(data), **options}
    if group is not None:
        cmd["group"] = group
    return str(run(e, cmd)["id"])


def pull_ack(e: PartitionEngine) -> dict[str, Any] | None:
    """One PULL and the ACK of what it took (the job, or None)."""
    r = run(e, {"cmd": "PULL", "queue": "q"})
    if r["job"] is not None:
        run(e, {"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]})
    return r["job"]  # type: ignore[no-any-return]


# --- turns -------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["standard", "utube", "utubettl"])
def test_a_burst_of_one_group_does_not_starve_another(qtype: str) -> None:
    e = engine_with(qtype=qtype)
    for i in range(200):
        push(e, "a", i)
    for i in range(5):
        push(e, "b", 1000 + i)
    order = [pull_ack(e)["group"] for _ in range(12)]  # type: ignore[index]
    assert order[:10] == ["a", "b"] * 5
    assert order[10:] == ["a", "a"]  # b is done: a alone


def test_ungrouped_jobs_keep_their_order_beside_the_group_turns() -> None:
    # An ungrouped job competes with the head of the group whose turn it is by (priority, age).
    e = engine_with({"groupConcurrency": 0})
    push(e, "a", "a1")
    push(e, None, "n1")
    push(e, "b", "b1")
    push(e, None, "urgent", priority=5)
    push(e, "a", "a2")
    got = [unraw(pull_ack(e)["data"]) for _ in range(5)]  # type: ignore[index]
    assert got == ["urgent", "a1", "n1", "b1", "a2"]


@pytest.mark.parametrize("weights,concurrency", [({"a": 3}, 0), ({"a": 3}, 1), ({"a": 5, "c": 2}, 0)])
def test_weights_are_honoured_within_5_percent_over_10000_pulls(weights: dict[str, int], concurrency: int) -> None:
    e = engine_with({"groupWeights": weights, "groupConcurrency": concurrency})
    groups = ["a", "b", "c"]
    # Every group stays backlogged for the whole run.
    run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": b"\x01", "group": g} for g in groups
                                                   for _ in range(10_000)]})
    counts: Counter[str] = Counter()
    for _ in range(10_000):
        r = run(e, {"cmd": "PULL", "queue": "q"})
        counts[r["job"]["group"]] += 1
        if concurrency:
            run(e, {"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]})
    total_weight = sum(weights.get(g, 1) for g in groups)
    for g in groups:
        expected = 10_000 * weights.get(g, 1) / total_weight
        assert abs(counts[g] - expected) <= 0.05 * expected, (g, counts, expected)


def test_a_weight_of_three_takes_three_turns_for_each_of_a_weight_of_one() -> None:
    e = engine_with({"groupWeights": {"heavy": 3}, "groupConcurrency": 0})
    for i in range(20):
        push(e, "heavy", i)
        push(e, "light", i)
    got = [run(e, {"cmd": "PULL", "queue": "q"})["job"]["group"] for _ in range(16)]
    assert Counter(got[:8]) == Counter(got[8:]) == {"heavy": 6, "light": 2}


def test_priorities_order_the_jobs_of_a_group_not_the_turns() -> None:
    e = engine_with()
    push(e, "a", "a-low", priority=0)
    push(e, "a", "a-high", priority=9)
    push(e, "b", "b-high", priority=100)
    push(e, "b", "b-low", priority=1)
    got = [unraw(pull_ack(e)["data"]) for _ in range(4)]  # type: ignore[index]
    # a and b alternate (a first: both arrived at the same virtual time, in name order); within
    # each group the higher priority goes first
    assert got == ["a-high", "b-high", "a-low", "b-low"]


def test_a_changed_priority_reorders_a_group() -> None:
    e = engine_with()
    first = push(e, "a", "first")
    push(e, "a", "second")
    third = push(e, "a", "third")
    run(e, {"cmd": "ChangePriority", "id": third, "priority": 4})
    run(e, {"cmd": "ChangePriority", "id": first, "priority": -1})
    got = [unraw(pull_ack(e)["data"]) for _ in range(3)]  # type: ignore[index]
    assert got == ["third", "second", "first"]


def test_group_concurrency_still_holds_while_groups_take_turns() -> None:
    e = engine_with({"groupConcurrency": 2})
    for g in ("a", "b", "c"):
        for i in range(5):
            push(e, g, i)
    r = run(e, {"cmd": "PULLB", "queue": "q", "count": 100})
    assert Counter(j["group"] for j in r["jobs"]) == {"a": 2, "b": 2, "c": 2}
    assert [j["group"] for j in r["jobs"]] == ["a", "b", "c"] * 2
    assert run(e, {"cmd": "PULL", "queue": "q"})["job"] is None
    run(e, {"cmd": "ACK", "id": r["jobs"][1]["id"], "token": r["tokens"][1]})  # one of b's
    assert run(e, {"cmd": "PULL", "queue": "q"})["job"]["group"] == "b"


def test_a_rate_limited_group_waits_while_the_others_take_turns() -> None:
    e = engine_with({"groupConcurrency": 0, "groupLimits": {"slow": {"max": 1, "durationMs": 1_000}}})
    for i in range(4):
        push(e, "slow", i)
        push(e, "fast", i)
    got = [run(e, {"cmd": "PULL", "queue": "q"}, 1_000)["job"] for _ in range(5)]
    assert [j and j["group"] for j in got] == ["fast", "slow", "fast", "fast", "fast"]
    # its window frees at 2000: its turn comes first, its tag being the oldest
    assert run(e, {"cmd": "PULL", "queue": "q"}, 2_000)["job"]["group"] == "slow"


def test_a_group_returning_from_a_long_job_gets_no_credit() -> None:
    e = engine_with()  # one active job per group
    for i in range(30):
        push(e, "a", i)
        push(e, "b", i)
        push(e, "long", i)
    assert [pull_ack(e)["group"] for _ in range(2)] == ["a", "b"]  # type: ignore[index]
    held = run(e, {"cmd": "PULL", "queue": "q"})  # long's first job, held while a and b run
    assert held["job"]["group"] == "long"
    assert [pull_ack(e)["group"] for _ in range(20)] == ["a", "b"] * 10  # type: ignore[index]
    run(e, {"cmd": "ACK", "id": held["job"]["id"], "token": held["token"]})
    got = [pull_ack(e)["group"] for _ in range(6)]  # type: ignore[index]
    assert got == ["long", "a", "b"] * 2  # one turn each, no burst of "long"


def test_a_pull_costs_a_few_heap_operations_among_100k_groups() -> None:
    e = engine_with({"groupConcurrency": 0, "groupWeights": {"g7": 4}})
    for start in range(0, 100_000, 10_000):
        run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": b"\x01", "group": f"g{i}"}
                                                       for i in range(start, start + 10_000)]})
    for _ in range(1_000):  # every group's tag moves on: the heap is not in push order any more
        run(e, {"cmd": "PULL", "queue": "q"})
    with heap_operations() as calls:
        r = run(e, {"cmd": "PULL", "queue": "q"})
    assert r["job"] is not None and len(calls) < 10


# --- replicated state --------------------------------------------------------------------------


def test_the_turns_survive_a_snapshot_and_replicas_agree() -> None:
    e = engine_with({"groupWeights": {"a": 2}})
    twin = engine_with({"groupWeights": {"a": 2}})
    for i in range(30):
        for g in ("a", "b", "c"):
            cmd = {"cmd": "PUSH", "queue": "q", "data": raw_of(i), "group": g}
            run(e, dict(cmd))
            twin.apply(dict(cmd), 1_000, replies=False, events=False)
    for _ in range(7):
        job = pull_ack(e)
        assert job is not None
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    assert [pull_ack(restored)["id"] for _ in range(40)] == [pull_ack(e)["id"] for _ in range(40)]  # type: ignore[index]
    assert restored.digest() == e.digest()


def test_a_snapshot_of_groups_that_took_no_turn_is_unchanged() -> None:
    # Tags at the present are left out: a partition whose groups have taken no turn writes
    # the snapshot it wrote before groups took turns (older snapshots and digests stay equal).
    e = engine_with()
    push(e, "a", 1)
    push(e, "a", 2)
    push(e, "b", 3)
    assert b"groups" not in e.snapshot()
    pull_ack(e)  # a took a turn: its tag is ahead of the present
    assert b"groups" in e.snapshot()


# --- groupMaxSize --------------------------------------------------------------------------------


def test_max_size_refuses_an_add_to_a_full_group() -> None:
    e = engine_with()
    for i in range(3):
        push(e, "a", i, groupMaxSize=3)
    with pytest.raises(CommandError) as err:
        push(e, "a", 3, groupMaxSize=3)
    assert err.value.code == ErrorCode.QUEUE_FULL
    assert str(err.value) == "Group a has reached its maximum size of 3"
    push(e, "b", 0, groupMaxSize=3)  # another group has room
    push(e, "a", 4)  # an add without maxSize is not limited
    push(e, "a", 5, groupMaxSize=10)  # each add names its own limit
    assert run(e, {"cmd": "Count", "queue": "q"})["count"] == 6


def test_max_size_counts_waiting_and_delayed_jobs_not_running_ones() -> None:
    e = engine_with()
    push(e, "a", 0, groupMaxSize=2)
    push(e, "a", 1, groupMaxSize=2, delay=5_000)
    with pytest.raises(CommandError):
        push(e, "a", 2, groupMaxSize=2)
    r = run(e, {"cmd": "PULL", "queue": "q"})  # the waiting one runs: room for one more
    push(e, "a", 2, groupMaxSize=2)
    run(e, {"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]})
    with pytest.raises(CommandError):
        push(e, "a", 3, groupMaxSize=2)


def test_a_bulk_add_past_max_size_is_refused_whole() -> None:
    e = engine_with()
    push(e, "a", 0)
    jobs = [{"data": raw_of(i), "group": "a", "groupMaxSize": 3} for i in range(3)]
    before = e.digest()
    with pytest.raises(CommandError) as err:
        run(e, {"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert err.value.code == ErrorCode.QUEUE_FULL and e.digest() == before
    assert len(run(e, {"cmd": "PUSHB", "queue": "q", "jobs": jobs[:2]})["ids"]) == 2


def test_max_size_on_the_wire() -> None:
    # bunqueue's client sends group: {id, maxSize} as groupId + groupMaxSize
    frame = normalize({"cmd": "PUSH", "queue": "q", "data": 1, "groupId": "t", "groupMaxSize": 5})
    assert validate(frame) == {"cmd": "PUSH", "queue": "q", "data": 1, "group": "t", "groupMaxSize": 5}
    for bad in ({"groupMaxSize": 0, "group": "t"}, {"groupMaxSize": 5}, {"groupMaxSize": "5", "group": "t"}):
        with pytest.raises(CommandError) as err:
            validate(normalize({"cmd": "PUSH", "queue": "q", "data": 1, **bad}))
        assert err.value.code == ErrorCode.INVALID and "groupMaxSize" in str(err.value)


def test_group_weights_on_the_wire() -> None:
    ok = {"cmd": "UpdateQueue", "queue": "q", "options": {"groupWeights": {"a": 3, "b": 1_000}}}
    assert validate(dict(ok)) == ok
    for bad in ({"a": 0}, {"a": 1_001}, {"a": 1.5}, [1], {"": 2}, {f"g{i}": 1 for i in range(1_001)}):
        with pytest.raises(CommandError) as err:
            validate({"cmd": "UpdateQueue", "queue": "q", "options": {"groupWeights": bad}})
        assert err.value.code == ErrorCode.INVALID and "groupWeights" in str(err.value)


def test_a_weight_change_applies_from_the_next_turn() -> None:
    e = engine_with({"groupConcurrency": 0})
    for i in range(40):
        push(e, "a", i)
        push(e, "b", i)
    first = Counter(run(e, {"cmd": "PULL", "queue": "q"})["job"]["group"] for _ in range(10))
    run(e, {"cmd": "UpdateQueue", "queue": "q", "options": {"groupWeights": {"b": 4}}})
    later = Counter(run(e, {"cmd": "PULL", "queue": "q"})["job"]["group"] for _ in range(20))
    assert first == {"a": 5, "b": 5} and later == {"a": 4, "b": 16}


# --- against a reference -------------------------------------------------------------------------

GROUPS = ["a", "b", "c", None]


class GroupsModel:
    """The turns as docs/commands.md states them, recomputed by scanning every job."""

    def __init__(self, weights: dict[str, int], conc: int) -> None:
        self.weights, self.conc = weights, conc
        self.jobs: dict[int, dict[str, Any]] = {}
        self.tags: dict[str, int] = {}
        self.vtime = 0
        self.now = 0

    def _live(self, group: str) -> bool:
        return any(j["group"] == group and j["state"] in ("waiting", "delayed", "active") for j in self.jobs.values())

    def moved(self, seq: int, state: str, run_at: int = 0) -> None:
        """Job ``seq`` goes to ``state`` (an active one ends its lease first)."""
        job = self.jobs[seq]
        group = job["group"]
        if job["state"] == "active" and group is not None:
            self.tags[group] = max(self.tags[group], self.vtime)
        job["state"], job["run_at"] = state, run_at
        if group is not None:
            if state in ("waiting", "delayed"):
                self.tags.setdefault(group, self.vtime)
            elif state != "active" and not self._live(group):
                self.tags.pop(group, None)

    def pull(self) -> int | None:
        for job in self.jobs.values():
            if job["state"] == "delayed" and job["run_at"] <= self.now:
                job["state"] = "waiting"
        seq, self.vtime = fair_pull(self.jobs, self.tags, self.vtime, self._may_run,
                                    lambda g: FAIR_STRIDE // self.weights.get(g, 1))
        return seq

    def pull_only(self, group: str | None) -> int | None:
        """A pull limited to ``group`` (None: to jobs without a group)."""
        for job in self.jobs.values():
            if job["state"] == "delayed" and job["run_at"] <= self.now:
                job["state"] = "waiting"
        return one_group_pull(self.jobs, self.tags, self.vtime, group, self._may_run,
                              lambda g: FAIR_STRIDE // self.weights.get(g, 1))

    def _may_run(self, group: str) -> bool:
        active = sum(1 for j in self.jobs.values() if j["group"] == group and j["state"] == "active")
        return not self.conc or active < self.conc


class GroupsVsModel(RuleBasedStateMachine):
    """Every way a group's job comes and goes, against :class:`GroupsModel`."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(0)
        self.twin = PartitionEngine(0)
        self.model = GroupsModel({}, 1)
        self.tokens: dict[int, str] = {}

    def apply(self, cmd: dict[str, Any]) -> dict[str, Any]:
        reply = self.engine.apply(dict(cmd), self.model.now).result
        self.twin.apply(dict(cmd), self.model.now, replies=False, events=False)
        return reply

    def _in(self, *states: str) -> list[int]:
        return sorted(s for s, j in self.model.jobs.items() if j["state"] in states)

    @initialize(weights=st.sampled_from([{}, {"a": 3}, {"b": 2, "c": 5}]), conc=st.sampled_from([1, 2, 0]),
                qtype=st.sampled_from(["standard", "utubettl"]))
    def create(self, weights: dict[str, int], conc: int, qtype: str) -> None:
        options: dict[str, Any] = {"ttr": LONG_TTR_MS, "groupWeights": weights, "attempts": 3, "backoff": 0}
        if qtype == "utubettl":
            conc = 1
        else:
            options["groupConcurrency"] = conc
        self.apply({"cmd": "CreateQueue", "queue": "q", "type": qtype, "options": options})
        self.model = GroupsModel(weights, conc)

    @rule(group=st.sampled_from(GROUPS), prio=st.integers(0, 2), delay=st.sampled_from([0, 0, 0, 700]))
    def push(self, group: str | None, prio: int, delay: int) -> None:
        cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "priority": prio, "delay": delay}
        if group is not None:
            cmd["group"] = group
        seq = int(self.apply(cmd)["id"].split("-")[1])
        m = self.model
        m.jobs[seq] = {"group": group, "prio": prio, "state": "new", "run_at": 0}
        m.moved(seq, "delayed" if delay else "waiting", m.now + delay)

    @rule(n=st.integers(1, 3))
    def pull(self, n: int) -> None:
        r = self.apply({"cmd": "PULLB", "queue": "q", "count": n})
        got = [int(j["id"].split("-")[1]) for j in r["jobs"]]
        assert got == list(islice(iter(self.model.pull, None), n))  # the model's pulls until one finds nothing
        self.tokens.update(zip(got, r["tokens"]))

    @rule(group=st.sampled_from(GROUPS), n=st.integers(1, 3))
    def pull_only(self, group: str | None, n: int) -> None:
        cmd: dict[str, Any] = {"cmd": "PULLB", "queue": "q", "count": n}
        if group is None:
            cmd["ungrouped"] = True
        else:
            cmd["group"] = group
        r = self.apply(cmd)
        got = [int(j["id"].split("-")[1]) for j in r["jobs"]]
        assert all(j.get("group") == group for j in r["jobs"])
        assert got == list(islice(iter(lambda: self.model.pull_only(group), None), n))
        self.tokens.update(zip(got, r["tokens"]))

    @precondition(lambda self: self._in("active"))
    @rule(data=st.data(), how=st.sampled_from(["ack", "fail", "fail-later", "release", "bury"]))
    def end(self, data: st.DataObject, how: str) -> None:
        seq = data.draw(st.sampled_from(self._in("active")))
        cmd: dict[str, Any] = {"id": f"0-{seq}", "token": self.tokens.pop(seq)}
        if how == "ack":
            self.apply({"cmd": "ACK", **cmd})
            self.model.moved(seq, "completed")
        elif how == "bury":
            self.apply({"cmd": "Bury", **cmd})
            self.model.moved(seq, "failed")
        else:
            delay = 500 if how == "fail-later" else 0
            state = self.apply({"cmd": "FAIL" if how.startswith("fail") else "Release", **cmd, "delay": delay})["state"]
            self.model.moved(seq, state, self.model.now + delay)

    @precondition(lambda self: self._in("waiting", "delayed", "failed"))
    @rule(data=st.data(), how=st.sampled_from(["cancel", "priority", "retry"]))
    def change(self, data: st.DataObject, how: str) -> None:
        seq = data.draw(st.sampled_from(self._in("waiting", "delayed", "failed")))
        state = self.model.jobs[seq]["state"]
        if how == "retry" and state == "failed":
            self.apply({"cmd": "RetryDlq", "queue": "q", "id": f"0-{seq}"})
            self.model.moved(seq, "waiting")
        elif how == "priority" and state != "failed":
            prio = data.draw(st.integers(-1, 3))
            self.apply({"cmd": "ChangePriority", "id": f"0-{seq}", "priority": prio})
            self.model.jobs[seq]["prio"] = prio
        elif how == "cancel":
            self.apply({"cmd": "Cancel", "id": f"0-{seq}"})
            self.model.moved(seq, "removed")
            del self.model.jobs[seq]

    @rule(dt=st.sampled_from([100, 600]))
    def advance(self, dt: int) -> None:
        self.model.now += dt
        self.apply({"cmd": "_Tick"})
        for job in self.model.jobs.values():
            if job["state"] == "delayed" and job["run_at"] <= self.model.now:
                job["state"] = "waiting"

    @rule()
    def restart(self) -> None:
        self.engine = PartitionEngine.restore(self.engine.snapshot())

    @invariant()
    def replicas_agree(self) -> None:
        digest = self.engine.digest()
        assert digest == self.twin.digest()
        assert PartitionEngine.restore(self.engine.snapshot()).digest() == digest
        q = self.engine.queues.get("q")
        if q is not None:
            assert set(q.group_tags) == set(self.model.tags)
            # The turns themselves: tags relative to the virtual time (what a snapshot keeps).
            assert {g: t - q.group_vtime for g, t in q.group_tags.items()} == \
                {g: t - self.model.vtime for g, t in self.model.tags.items()}
            listed = q.group_listed
            assert all(key <= q.group_tags[g] for g, key in listed.items())  # entries' keys are lower bounds
            live = Counter(g for key, g in q.group_heads if listed.get(g) == key)
            assert set(live) == set(listed)  # one live heap entry per listed group (a twin at most)
            assert q.group_sizes == dict(Counter(j["group"] for j in self.model.jobs.values()
                                                 if j["group"] is not None and j["state"] in ("waiting", "delayed")))


TestGroupsVsModel = GroupsVsModel.TestCase
TestGroupsVsModel.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
