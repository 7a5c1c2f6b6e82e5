"""Interleaved A/B of the engine's hot paths against another git revision, in CPU time per job.

    python bench/ab_engine.py BASE_REV [--rounds 9]

Loads ``node/state`` of ``BASE_REV`` (``git archive``) beside the working tree's engine in
one process and runs the same workloads on each, alternating A and B (and which goes first)
every round; prints the median CPU microseconds per job of each. One process and short
alternating rounds keep both sides under the same load on a shared machine; the figures are
process CPU time (``time.process_time``), not wall time. Both engines use this tree's
``shoal.cluster``. The workloads are ``bench_engine.py``'s: PUSH, PULL+ACK, PUSHB (100 per
batch), PULLB+ACKB (100 per batch) and utube (a)'s put and take+ack (10,000 groups); adds
with an idempotency key each (PUSH, PUSHB items, each PUSH sent again, the window's end); and
adds with a priority, a delay and a name (what ``queue.add()`` sends), then pulled and acked;
adds with a priority each, pulled and acked in batches;
``addBulk`` items with a priority, a group, a tag and a custom id, pulled and acked in batches;
and adds with a dedupe id each, then each sent again (absorbed by its entry).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from shoal.cluster.codec import Raw
import shoal.node.state as tree_engine

ROOT = Path(__file__).resolve().parents[1]
DATA = Raw(b"\xc4\x64" + b"x" * 100)  # a 100-byte bin payload, as a client would send it
NOW = 1_000
clock = time.process_time


def result(reply: Any) -> dict[str, Any]:
    """The reply fields: older engines answer a dict, newer ones ``Applied(result, events)``."""
    return getattr(reply, "result", reply)


def leased(engine: Any, frame: dict[str, Any]) -> Any:
    """``frame`` (a PULL/PULLB) leased to session "s" in the form ``engine`` takes: a typed
    ``SessionPull`` where its package has one, else the older ``_session`` field."""
    package = sys.modules[type(engine).__module__.rpartition(".")[0]]
    session_pull = getattr(package, "SessionPull", None)
    return session_pull(frame, "s") if session_pull is not None else {**frame, "_session": "s"}


def applying(engine: Any, cmds: list[dict[str, Any]], now: int) -> float:
    """CPU seconds ``engine`` takes to apply each of ``cmds`` at ``now``."""
    t = clock()
    for cmd in cmds:
        engine.apply(cmd, now)
    return clock() - t


def push_pull(engine: Any, n: int = 20_000) -> dict[str, float]:
    t = clock()
    for _ in range(n):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": DATA}, NOW)
    push_s = clock() - t
    t = clock()
    for _ in range(n):
        r = result(engine.apply(leased(engine, {"cmd": "PULL", "queue": "q"}), NOW))
        engine.apply({"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]}, NOW)
    return {"PUSH": push_s / n, "PULL+ACK": (clock() - t) / n}


def batches(engine: Any, n: int = 100_000, size: int = 100) -> dict[str, float]:
    batch = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": DATA} for _ in range(size)]}
    t = clock()
    for _ in range(n // size):
        engine.apply(batch, NOW)
    push_s = clock() - t
    return {"PUSHB": push_s / n, "PULLB+ACKB": drain(engine, "q", n, size)}


def timed_batches(engine: Any, n: int = 100_000, size: int = 100) -> dict[str, float]:
    """Bulk adds as a node applies them, each in an entry of its own time: a segment holds runs
    of jobs with different creation times."""
    batch = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": DATA} for _ in range(size)]}
    t = clock()
    for i in range(n // size):
        engine.apply(batch, NOW + i)
    push_s = clock() - t
    return {"PUSHB, timed": push_s / n, "PULLB+ACKB, timed": drain(engine, "q", n, size, NOW + n // size)}


def drain(engine: Any, queue: str, n: int, size: int, now: int = NOW) -> float:
    """CPU seconds per job of taking up to ``n`` jobs of ``queue``, ``size`` per PULLB at ``now``,
    each batch acked by one ACKB (bounded: every round takes a job or stops)."""
    t = clock()
    done = 0
    for _ in range(n):
        r = result(engine.apply(leased(engine, {"cmd": "PULLB", "queue": queue, "count": size}), now))
        if not r["jobs"]:
            break
        engine.apply({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]}, now)
        done += len(r["jobs"])
        if done >= n:
            break
    return (clock() - t) / max(done, 1)


def utube(engine: Any, groups: int = 10_000) -> dict[str, float]:
    engine.apply({"cmd": "CreateQueue", "queue": "u", "type": "utube"}, NOW)
    t = clock()
    for g in range(groups):
        engine.apply({"cmd": "PUSH", "queue": "u", "data": DATA, "group": f"g{g}"}, NOW)
    put_s = clock() - t
    t = clock()
    for _ in range(groups):
        r = result(engine.apply(leased(engine, {"cmd": "PULL", "queue": "u"}), NOW))
        engine.apply({"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]}, NOW)
    return {"utube put": put_s / groups, "utube take+ack": (clock() - t) / groups}


def keyed(engine: Any, n: int = 20_000, size: int = 100) -> dict[str, float]:
    """Adds as the client sends them, each with an idempotency key: PUSHes, PUSHB items, each
    PUSH sent again (a duplicate), and the ``_Tick`` that drops the window when it ends."""
    pushes = [{"cmd": "PUSH", "queue": "q", "data": DATA, "idempotencyKey": f"s-{i:08d}"} for i in range(n)]
    frames = [{"cmd": "PUSHB", "queue": "q", "jobs": [{"data": DATA, "idempotencyKey": f"b-{k:06d}.{i}"}
                                                      for i in range(size)]} for k in range(n // size)]
    push_s = applying(engine, pushes, NOW)
    pushb_s = applying(engine, frames, NOW)
    again_s = applying(engine, pushes, NOW + 1)
    t = clock()
    engine.apply({"cmd": "_Tick"}, NOW + 10 * 60_000)
    return {"keyed PUSH": push_s / n, "keyed PUSHB": pushb_s / n, "PUSH again": again_s / n,
            "window's end": (clock() - t) / (2 * n)}


def client_adds(engine: Any, n: int = 20_000) -> dict[str, float]:
    """Adds as ``queue.add()`` sends them with options (priorities 0..6, every other one delayed
    by 1 ms, a name), then each pulled and acked once due."""
    adds = [{"cmd": "PUSH", "queue": "c", "data": DATA, "priority": i % 7, "name": "mail",
             **({"delay": 1} if i % 2 else {})} for i in range(n)]
    t = clock()
    for cmd in adds:
        engine.apply(cmd, NOW)
    push_s = clock() - t
    t = clock()
    for _ in range(n):
        r = result(engine.apply(leased(engine, {"cmd": "PULL", "queue": "c"}), NOW + 10))
        engine.apply({"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]}, NOW + 10)
    return {"add (options)": push_s / n, "its PULL+ACK": (clock() - t) / n}


def prioritized(engine: Any, n: int = 20_000, size: int = 100) -> dict[str, float]:
    """Adds with a priority 0..6 each (one PUSH each), then pulled in batches of ``size`` and acked."""
    adds = [{"cmd": "PUSH", "queue": "p", "data": DATA, "priority": i % 7} for i in range(n)]
    return {"add (priority)": applying(engine, adds, NOW) / n, "PULLB+ACKB (priority)": drain(engine, "p", n, size)}


def bulk_options(engine: Any, n: int = 20_000, size: int = 100) -> dict[str, float]:
    """``addBulk`` items with options (a priority 0..6, one of 100 groups, a tag and a custom id
    each), then pulled in batches (a job of each group per pull) and acked."""
    frames = [{"cmd": "PUSHB", "queue": "o", "jobs": [
        {"data": DATA, "priority": i % 7, "group": f"g{i % 100}", "tag": "import", "customId": f"order-{k:06d}.{i}"}
        for i in range(size)]} for k in range(n // size)]
    t = clock()
    for cmd in frames:
        engine.apply(cmd, NOW)
    push_s = clock() - t
    return {"PUSHB options": push_s / n, "their PULLB+ACKB": drain(engine, "o", n, size)}


def deduped(engine: Any, n: int = 20_000) -> dict[str, float]:
    """Adds with a dedupe id each (an hour's TTL), then each sent again: answered by its entry."""
    def adds() -> list[dict[str, Any]]:
        return [{"cmd": "PUSH", "queue": "d", "data": DATA, "dedupe": {"id": f"order-{i:012d}", "ttlMs": 3_600_000}}
                for i in range(n)]

    first, again = adds(), adds()
    return {"dedupe add": applying(engine, first, NOW) / n, "dedupe again": applying(engine, again, NOW + 1) / n}


WORKLOADS: list[Callable[[Any], dict[str, float]]] = [push_pull, batches, timed_batches, utube, keyed, client_adds,
                                                      prioritized, bulk_options, deduped]


def load_base(rev: str, into: Path) -> ModuleType:
    """``node/state`` of ``rev`` as the package ``shoal_engine_base``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "node/state"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    state = into / "node" / "state"
    spec = importlib.util.spec_from_file_location("shoal_engine_base", state / "__init__.py",
                                                  submodule_search_locations=[str(state)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["shoal_engine_base"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the revision to compare with (A); B is the working tree")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(args.base, Path(tmp))
        sides = {"A": base.PartitionEngine, "B": tree_engine.PartitionEngine}
        per_job: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
        for i in range(args.rounds):
            order = ("A", "B") if i % 2 == 0 else ("B", "A")
            for label in order:
                for workload in WORKLOADS:
                    for key, seconds in workload(sides[label](0)).items():
                        per_job[label].setdefault(key, []).append(seconds)
    print(f"median CPU us per job over {args.rounds} interleaved rounds (A = {args.base}, B = working tree)")
    for key in per_job["A"]:
        a = statistics.median(per_job["A"][key]) * 1e6
        b = statistics.median(per_job["B"][key]) * 1e6
        print(f"  {key:15s} A {a:7.2f} us   B {b:7.2f} us   B/A {b / a:5.2f}")


if __name__ == "__main__":
    main()
