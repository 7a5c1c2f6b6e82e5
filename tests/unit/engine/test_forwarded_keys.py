"""The keys a forwarding node gives the adds it forwards (``node/state/_forwarded.py``): a copy sent
again finds the job the first made, on every path an add takes; first sends cost one record per
command; records live ``FORWARDED_KEY_WINDOW_MS`` and survive a snapshot."""

from __future__ import annotations

from typing import Any

import msgpack

from shoal.cluster.codec import Raw
from shoal.node.partition.pushes import replicated_form
from shoal.node.state import PartitionEngine, PushRun
from shoal.node.state._forwarded import FORWARDED_PURGE_LATE_MS
from shoal.node.state._model import FORWARDED_AGAIN_PREFIX, FORWARDED_KEY_PREFIX, FORWARDED_KEY_WINDOW_MS

T0 = 1_000_000


def first(n: int) -> str:
    return f"{FORWARDED_KEY_PREFIX}n2.0a1b2c3d4e5f:{n:x}"


def again(n: int) -> str:
    return f"{FORWARDED_AGAIN_PREFIX}n2.0a1b2c3d4e5f:{n:x}"


def run(keys: list[str | None]) -> PushRun:
    return PushRun("q", [msgpack.packb(i) for i in range(len(keys))], keys, None)


def waiting(e: PartitionEngine) -> int:
    counts = e.apply({"cmd": "GetJobCounts", "queue": "q"}, e.now_ms).result["counts"]
    return counts["waiting"] + counts.get("prioritized", 0)


def test_first_sends_are_one_record_and_a_copy_sent_again_finds_its_job() -> None:
    e = PartitionEngine(0)
    ids = [r["id"] for r in e.apply(run([first(i) for i in range(4)]), T0).result["results"]]
    assert len(e.forwarded) == 1 and e.idem.table is None  # one record for the command, no entry per key
    # A new leader gets two of them again, and a new add, in one entry.
    results = e.apply(run([again(1), again(3), first(4)]), T0 + 20_000).result["results"]
    assert [r["id"] for r in results[:2]] == [ids[1], ids[3]] and all(r.get("duplicate") for r in results[:2])
    assert "duplicate" not in results[2]
    # Sent a third time (another failover): still the same jobs, whichever copy made them.
    results = e.apply(run([again(3), again(4)]), T0 + 25_000).result["results"]
    assert [r["id"] for r in results] == [ids[3], results[1]["id"]] and all(r.get("duplicate") for r in results)
    assert waiting(e) == 5


def test_a_copy_sent_again_that_made_a_job_is_found_by_the_next_copy() -> None:
    e = PartitionEngine(0)
    made = e.apply(run([again(7)]), T0).result["results"][0]  # its first copy never committed
    assert "duplicate" not in made
    # two copies in one entry (a link lost and back to the same leader): one job
    both = e.apply(run([again(8), again(8)]), T0 + 1).result["results"]
    assert both[1] == {"id": both[0]["id"], "duplicate": True}
    assert e.apply(run([again(7)]), T0 + 2).result["results"][0] == {"id": made["id"], "duplicate": True}
    assert waiting(e) == 2


def test_the_per_job_path_and_pushb_dedupe_the_same_way() -> None:
    e = PartitionEngine(0)

    def push(key: str, **options: Any) -> dict[str, Any]:
        return e.apply({"cmd": "PUSH", "queue": "q", "data": msgpack.packb(1), "idempotencyKey": key,
                        **options}, T0).result

    made = push(first(1), priority=3)
    assert push(again(1), priority=3) == {"id": made["id"], "duplicate": True}
    batch = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": Raw(msgpack.packb(i)), "idempotencyKey": first(10 + i)}
                                                    for i in range(3)]}
    (replicated,), _ = replicated_form([batch], 0)
    ids = e.apply(replicated, T0).result["ids"]
    batch_again = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": msgpack.packb(0), "idempotencyKey": again(10),
                                                           "priority": 1}]}
    assert e.apply(batch_again, T0).result["ids"] == [ids[0]]
    assert waiting(e) == 4


def test_records_expire_with_their_window_and_survive_a_snapshot() -> None:
    e = PartitionEngine(0)
    ids = [r["id"] for r in e.apply(run([first(i) for i in range(3)]), T0).result["results"]]
    e.apply(run([again(0)]), T0 + 1)  # builds the lookup cache
    e.apply(run([first(3)]), T0 + 10_000)
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.snapshot() == e.snapshot() and restored.digest() == e.digest()
    assert e.next_due_ms() is not None and e.next_due_ms() <= T0 + FORWARDED_KEY_WINDOW_MS + FORWARDED_PURGE_LATE_MS
    for engine in (e, restored):
        assert engine.apply(run([again(2)]), T0 + 5).result["results"][0] == {"id": ids[2], "duplicate": True}
        engine.apply({"cmd": "_Tick"}, T0 + FORWARDED_KEY_WINDOW_MS + 5)
        assert len(engine.forwarded) == 1  # the first command's record is gone, the later one's kept
        assert "duplicate" not in engine.apply(run([again(1)]), T0 + FORWARDED_KEY_WINDOW_MS + 6).result["results"][0]
        assert engine.apply(run([again(3)]), T0 + FORWARDED_KEY_WINDOW_MS + 7).result["results"][0]["duplicate"]
    assert restored.digest() == e.digest()


def test_a_client_key_is_untouched_by_all_this() -> None:
    e = PartitionEngine(0)
    made = e.apply(run(["mine"]), T0).result["results"][0]
    assert e.apply(run(["mine"]), T0 + 60_000).result["results"][0] == {"id": made["id"], "duplicate": True}
    assert not e.forwarded and e._key_seq("q", "mine") == int(made["id"].split("-")[1])
