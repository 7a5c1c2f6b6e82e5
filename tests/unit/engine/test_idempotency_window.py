"""The idempotency window (``node/state/_idempotency.py``): a key answers the job it added for
IDEMPOTENCY_WINDOW_MS on every path an add takes, a key given again after its window is a new
job that the end of the first window does not drop, snapshots hold the window in the form
``docs/formats.md`` gives, and a key costs a dict slot, a list slot and maybe an int beside its
string."""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack

from shoal.node.state import PartitionEngine, PushBatch, PushRun
from shoal.node.state._model import IDEMPOTENCY_WINDOW_MS

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
    assert [run[2] for run in e.idempotency_runs] == [["k"], ["k"]]
    tick(e, T0 + WINDOW + 10)  # drops the first run, not the key's new giving
    assert push(e, "k", T0 + WINDOW + 20) == {"id": second, "duplicate": True}
    tick(e, T0 + 2 * WINDOW)
    assert not e.idempotency and not e.idempotency_runs


def test_the_snapshot_holds_the_window_in_its_documented_form() -> None:
    e = PartitionEngine(7)
    push(e, "k", T0)
    push(e, "j", T0, queue="b")
    e.apply(PushRun("q", [b"\x01", b"\x02"], ["m", "n"], None), T0 + 5)
    push(e, "k", T0 + WINDOW)  # given again: both givings in the order, the last in the entries
    fields = msgpack.unpackb(e.snapshot(), raw=False, strict_map_key=False)
    order, entries = fields[8], fields[9]
    assert order == [[T0 + WINDOW, ["q", "k"]], [T0 + WINDOW, ["b", "j"]], [T0 + 5 + WINDOW, ["q", "m"]],
                     [T0 + 5 + WINDOW, ["q", "n"]], [T0 + 2 * WINDOW, ["q", "k"]]]
    assert entries == [["b", "j", "7-2", T0 + WINDOW], ["q", "m", "7-3", T0 + 5 + WINDOW],
                       ["q", "n", "7-4", T0 + 5 + WINDOW], ["q", "k", "7-5", T0 + 2 * WINDOW]]
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    tick(restored, T0 + WINDOW + 10)
    assert push(restored, "k", T0 + WINDOW + 20) == {"id": "7-5", "duplicate": True}
    assert "duplicate" not in push(restored, "j", T0 + WINDOW + 20, queue="b")


def test_a_key_costs_little_beside_its_string() -> None:
    """Keys of 10,000 coalesced adds: the window's own structures take under 100 bytes a key
    (a dict slot, a list slot, the seq's int where no job object holds it)."""
    e = PartitionEngine(0)
    keys = [f"key-{i:08d}" for i in range(10_000)]
    datas = [b"\x01"] * 50
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for k in range(0, len(keys), 50):
            e.apply(PushRun("q", datas, keys[k:k + 50], None), T0 + k)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    window = [t for t in after.compare_to(before, "filename") if t.traceback[0].filename.endswith("_idempotency.py")]
    assert sum(t.size_diff for t in window) / len(keys) < 100
