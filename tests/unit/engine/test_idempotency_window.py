"""The idempotency window (``node/state/_idempotency.py``): a key answers the job it added for
IDEMPOTENCY_WINDOW_MS on every path an add takes, a key given again after its window is a new
job that the end of the first window does not drop, snapshots hold the window in the form
``docs/formats.md`` gives (and version 1's key strings still load), a key costs a few packed
slots, and the packed table answers as a dict of keys would while it fills, moves and shrinks."""

from __future__ import annotations

import statistics
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shoal.node.state import PartitionEngine, PushBatch, PushRun
from shoal.node.state import _idempotency, _key_table
from shoal.node.state._key_table import KeyTable, key_hash
from shoal.node.state._model import IDEMPOTENCY_WINDOW_MS, SNAPSHOT_VERSION

T0 = 1_000_000
WINDOW = IDEMPOTENCY_WINDOW_MS


def push(e: PartitionEngine, key: str, now: int, queue: str = "q", **extra: Any) -> dict[str, Any]:
    return e.apply({"cmd": "PUSH", "queue": queue, "data": msgpack.packb(1), "idempotencyKey": key, **extra},
                   now).result


def tick(e: PartitionEngine, now: int) -> None:
    e.apply({"cmd": "_Tick"}, now)


def test_a_key_answers_its_job_on_every_path_until_its_window_ends() -> None:
    e = PartitionEngine(0)
    single = push(e, "a", T0)["id"]
    run_ids = e.apply(PushRun("q", [b"\x01", b"\x02"], ["b", "c"], None), T0).result["results"]
    batch_ids = e.apply(PushBatch("q", [b"\x01"], ["d"], None), T0).result["ids"]
    prioritized = push(e, "e", T0, priority=3, delay=1_000)["id"]
    later = T0 + WINDOW - 1
    assert push(e, "a", later) == {"id": single, "duplicate": True}
    assert push(e, "b", later) == {"id": run_ids[0]["id"], "duplicate": True}
    assert e.apply(PushBatch("q", [b"\x03", b"\x04"], ["c", "d"], None), later).result["ids"] == \
        [run_ids[1]["id"], batch_ids[0]]
    assert push(e, "e", later) == {"id": prioritized, "duplicate": True}
    assert push(e, "a", later, queue="other")["id"] != single  # keys are per queue
    fresh = push(e, "a", T0 + WINDOW)  # the window is over, even before a _Tick drops the key
    assert "duplicate" not in fresh and fresh["id"] != single


def test_a_key_given_again_before_the_tick_outlives_the_first_window() -> None:
    e = PartitionEngine(0)
    push(e, "k", T0)
    second = push(e, "k", T0 + WINDOW)["id"]  # due but not dropped: a new job, a second run
    assert list(e.idem.runs) == [[T0 + WINDOW, 1, 1], [T0 + 2 * WINDOW, 2, 1]]
    tick(e, T0 + WINDOW + 10)  # drops the first run, not the key's new giving
    assert push(e, "k", T0 + WINDOW + 20) == {"id": second, "duplicate": True}
    tick(e, T0 + 2 * WINDOW)
    assert e.idem.table is None and not e.idem.runs and e.idem.live == 0


def test_the_snapshot_holds_the_window_in_its_documented_form() -> None:
    e = PartitionEngine(7)
    push(e, "k", T0)
    push(e, "j", T0, queue="b")
    e.apply(PushRun("q", [b"\x01", b"\x02"], ["m", "n"], None), T0 + 5)
    push(e, "k", T0 + WINDOW)  # given again: counted twice in the runs, its later job in the entries
    fields = msgpack.unpackb(e.snapshot(), raw=False, strict_map_key=False)
    assert fields[0] == SNAPSHOT_VERSION
    head, entries = fields[8], fields[9]
    assert head == [-1, [[T0 + WINDOW, 2, 2], [T0 + 5 + WINDOW, 4, 2], [T0 + 2 * WINDOW, 5, 1]]]
    assert entries == [[*key_hash("b", "j"), 2], [*key_hash("q", "m"), 3], [*key_hash("q", "n"), 4],
                       [*key_hash("q", "k"), 5]]
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    tick(restored, T0 + WINDOW + 10)
    assert push(restored, "k", T0 + WINDOW + 20) == {"id": "7-5", "duplicate": True}
    assert "duplicate" not in push(restored, "j", T0 + WINDOW + 20, queue="b")
    tick(e, T0 + WINDOW + 10)
    assert msgpack.unpackb(e.snapshot(), raw=False, strict_map_key=False)[8] == \
        [4, [[T0 + 2 * WINDOW, 5, 1]]]  # two runs dropped: keys up to seq 4 are over


def test_a_version_1_snapshot_with_key_strings_is_read_by_hashing_them() -> None:
    e = PartitionEngine(7)
    push(e, "k", T0)
    push(e, "j", T0, queue="b")
    e.apply(PushRun("q", [b"\x01", b"\x02"], ["m", "n"], None), T0 + 5)
    push(e, "k", T0 + WINDOW)
    fields = msgpack.unpackb(e.snapshot(), raw=False, strict_map_key=False)
    # What engine state version 1 held: every giving in order, then the live keys' strings.
    fields[0] = 1
    fields[8] = [[T0 + WINDOW, ["q", "k"]], [T0 + WINDOW, ["b", "j"]], [T0 + 5 + WINDOW, ["q", "m"]],
                 [T0 + 5 + WINDOW, ["q", "n"]], [T0 + 2 * WINDOW, ["q", "k"]]]
    fields[9] = [["b", "j", "7-2", T0 + WINDOW], ["q", "m", "7-3", T0 + 5 + WINDOW],
                 ["q", "n", "7-4", T0 + 5 + WINDOW], ["q", "k", "7-5", T0 + 2 * WINDOW]]
    upgraded = PartitionEngine.restore(msgpack.packb(fields, use_bin_type=True))
    assert upgraded.digest() == e.digest()  # written anew, the same window as version 2
    assert push(upgraded, "m", T0 + WINDOW) == {"id": "7-3", "duplicate": True}
    assert "duplicate" not in push(upgraded, "j", T0 + WINDOW, queue="b")


def test_a_key_costs_a_few_packed_slots() -> None:
    """200,000 keys of coalesced adds: a slot is 20 bytes, and the tables the window holds
    (between 30 % and 60 % full, plus the one being replaced while its keys move over) come to
    at most 100 bytes a key right after the table grows and about 60 on average."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = KeyTable(1 << 16)
        assert (tracemalloc.get_traced_memory()[0] - before) / table.size < 20.1
    finally:
        tracemalloc.stop()
    e = PartitionEngine(0)
    datas = [b"\x01"] * 50
    per_key = []
    for k in range(0, 200_000, 50):
        e.apply(PushRun("q", datas, [f"key-{i:08d}" for i in range(k, k + 50)], None), T0 + k)
        if (k + 50) % 2_000 == 0:
            slots = e.idem.table.size + (e.idem.moving.size if e.idem.moving is not None else 0)
            per_key.append(20 * slots / (k + 50))
    assert max(per_key[10:]) <= 100 and statistics.mean(per_key[10:]) < 65  # past the smallest tables


class WindowMachine(RuleBasedStateMachine):
    """Adds (single and in runs), re-givings, time, ticks and restores, against the window's
    definition: a key answers its latest job until that giving is WINDOW old. The tables are
    tiny (MIN_SLOTS 8, set by the test), so they fill, move and shrink within a few adds."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(0)
        self.model: dict[tuple[str, str], tuple[str, int]] = {}  # (queue, key) -> (job id, expires)
        self.now = T0

    def _check(self, queue: str, items: list[str], got: list[str]) -> None:
        for item, job_id in zip(items, got):
            earlier = self.model.get((queue, item))
            if earlier is not None and earlier[1] > self.now:
                assert job_id == earlier[0], (queue, item)
            else:
                assert earlier is None or job_id != earlier[0]
                self.model[queue, item] = (job_id, self.now + WINDOW)

    @rule(queue=st.sampled_from(("q", "r")), key=st.integers(0, 60))
    def add(self, queue: str, key: int) -> None:
        self._check(queue, [f"k{key}"], [push(self.engine, f"k{key}", self.now, queue=queue)["id"]])

    @rule(queue=st.sampled_from(("q", "r")), keys=st.lists(st.integers(0, 60), min_size=1, max_size=12))
    def add_run(self, queue: str, keys: list[int]) -> None:
        items = [f"k{k}" for k in keys]
        results = self.engine.apply(PushRun(queue, [b"\x01"] * len(items), items, None), self.now).result["results"]
        self._check(queue, items, [r["id"] for r in results])

    @rule(ms=st.sampled_from((1, 50, 5_000, WINDOW // 2, WINDOW)))
    def wait(self, ms: int) -> None:
        self.now += ms

    @rule()
    def tick(self) -> None:
        tick(self.engine, self.now)

    @rule()
    def restore(self) -> None:
        restored = PartitionEngine.restore(self.engine.snapshot())
        assert restored.digest() == self.engine.digest()
        self.engine = restored

    @invariant()
    def live_keys_answer(self) -> None:
        now = self.engine.now_ms  # the time of the last command applied: what a lookup sees
        for (queue, key), (job_id, expires) in self.model.items():
            seq = self.engine._key_seq(queue, key)
            if expires > now:
                assert seq is not None and f"0-{seq}" == job_id, (queue, key)
            else:
                assert seq is None, (queue, key)


def test_the_window_answers_as_a_dict_of_keys_would_through_resizes_and_restores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_key_table, "MIN_SLOTS", 8)
    monkeypatch.setattr(_idempotency, "MIN_SLOTS", 8)
    run_state_machine_as_test(WindowMachine, settings=settings(max_examples=150, stateful_step_count=60,
                                                               deadline=None))
    e = PartitionEngine(0)
    for i in range(200):  # and a window that empties frees its table
        push(e, f"k{i}", T0 + i)
    tick(e, T0 + 200 + WINDOW)
    assert e.idem.table is None and e.idem.live == 0
