"""Single-process engine benchmark: what one replica's apply costs.

    python bench/bench_engine.py [--jobs 200000] [--memory-jobs 1000000]

Prints jobs/s for push, batch push, pull+ack and batch pull+ack; bytes of engine
overhead per waiting 100-byte job (tracemalloc); and utube workloads:
(a) 30,000 groups with one task each, put all then take+ack all; (b) 10 groups x
150,000 tasks, 10 consumers taking and acking round-robin, with the ratio to
tarantool's best published figures (ready_buffer mode: (a) put 270 ms, take+ack
1.7 s; (b) 72 s). Every loop is bounded by its job count.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from shoal.cluster.codec import Raw
from shoal.node.state import PartitionEngine, SessionPull

DATA = Raw(b"\xc4\x64" + b"x" * 100)  # a 100-byte bin payload, as a client would send it
NOW = 1_000


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:12,.0f} jobs/s"


def bench_push(n: int) -> None:
    e = PartitionEngine(0)
    t = time.perf_counter()
    for _ in range(n):
        e.apply({"cmd": "PUSH", "queue": "q", "data": DATA}, NOW)
    print(f"PUSH                    {rate(n, time.perf_counter() - t)}")
    t = time.perf_counter()
    done = 0
    while done < n:
        r = e.apply(SessionPull({"cmd": "PULL", "queue": "q"}, "s"), NOW).result
        e.apply({"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]}, NOW)
        done += 1
    print(f"PULL+ACK                {rate(n, time.perf_counter() - t)}")


def bench_batches(n: int, size: int = 100) -> None:
    e = PartitionEngine(0)
    batch = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": DATA} for _ in range(size)]}
    t = time.perf_counter()
    for _ in range(n // size):
        e.apply(batch, NOW)
    print(f"PUSHB ({size}/batch)       {rate(n, time.perf_counter() - t)}")
    t = time.perf_counter()
    done = 0
    while done < n:
        r = e.apply(SessionPull({"cmd": "PULLB", "queue": "q", "count": size}, "s"), NOW).result
        if not r["jobs"]:
            break
        e.apply({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]}, NOW)
        done += len(r["jobs"])
    print(f"PULLB+ACKB ({size}/batch)  {rate(done, time.perf_counter() - t)}")


def bench_memory(n: int, options: dict[str, int] | None = None) -> None:
    """Engine bytes per waiting job: plain jobs (stored as segments), or with ``options`` (one object each)."""
    gc.collect()
    payloads = [b"\xc4\x64" + i.to_bytes(4, "big") * 25 for i in range(n)]  # distinct 102-byte payloads
    data_bytes = sum(len(p) for p in payloads)
    tracemalloc.start()
    e = PartitionEngine(0)
    before = tracemalloc.get_traced_memory()[0]
    for start in range(0, n, 1000):
        e.apply({"cmd": "PUSHB", "queue": "q",
                 "jobs": [{"data": Raw(p), **(options or {})} for p in payloads[start:start + 1000]]}, NOW)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # The payload bytes objects were allocated before tracing started and are shared by the
    # engine, so everything traced is engine overhead beyond the raw data.
    kind = f"jobs with {options}" if options else "plain jobs (segments)"
    print(f"memory: {n:,} waiting {kind}, {(after - before) / n:,.0f} bytes of engine overhead per job "
          f"(data itself: {data_bytes / n:.0f} bytes/job)")


def bench_utube_a(groups: int = 30_000) -> tuple[float, float]:
    e = PartitionEngine(0)
    e.apply({"cmd": "CreateQueue", "queue": "u", "type": "utube"}, NOW)
    t = time.perf_counter()
    for g in range(groups):
        e.apply({"cmd": "PUSH", "queue": "u", "data": DATA, "group": f"g{g}"}, NOW)
    put_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(groups):
        r = e.apply(SessionPull({"cmd": "PULL", "queue": "u"}, "s"), NOW).result
        e.apply({"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]}, NOW)
    return put_s, time.perf_counter() - t


def bench_utube_b(groups: int = 10, per_group: int = 150_000, consumers: int = 10) -> float:
    e = PartitionEngine(0)
    e.apply({"cmd": "CreateQueue", "queue": "u", "type": "utube"}, NOW)
    t = time.perf_counter()
    for g in range(groups):
        for start in range(0, per_group, 1000):
            e.apply({"cmd": "PUSHB", "queue": "u",
                     "jobs": [{"data": DATA, "group": f"g{g}"} for _ in range(min(1000, per_group - start))]}, NOW)
    total = groups * per_group
    done = 0
    while done < total:
        held = []
        for c in range(consumers):  # each consumer takes one, then all ack: round-robin
            r = e.apply(SessionPull({"cmd": "PULL", "queue": "u"}, f"c{c}"), NOW).result
            if r["job"] is not None:
                held.append((r["job"]["id"], r["token"]))
        if not held:
            raise RuntimeError("utube (b) stalled")
        for job_id, token in held:
            e.apply({"cmd": "ACK", "id": job_id, "token": token}, NOW)
        done += len(held)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description="Shoal engine benchmark (one replica, one process)")
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--memory-jobs", type=int, default=1_000_000)
    parser.add_argument("--skip-utube-b", action="store_true", help="skip the 1.5M-task utube workload")
    args = parser.parse_args()
    bench_push(args.jobs)
    bench_batches(args.jobs)
    bench_memory(args.memory_jobs)
    bench_memory(args.memory_jobs, {"priority": 1})
    put_s, take_s = bench_utube_a()
    print(f"utube (a) 30,000 groups: put {put_s * 1000:,.0f} ms (tarantool 270 ms: x{0.27 / put_s:.2f}), "
          f"take+ack {take_s:,.2f} s (tarantool 1.7 s: x{1.7 / take_s:.2f})")
    if not args.skip_utube_b:
        b_s = bench_utube_b()
        print(f"utube (b) 10 groups x 150,000, 10 consumers: {b_s:,.1f} s (tarantool 72 s: x{72 / b_s:.2f})")


if __name__ == "__main__":
    main()
