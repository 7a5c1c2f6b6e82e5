"""Jobs/s through the single-job ``Worker`` and the ``BatchWorker`` on a local 1-node cluster.

    python bench/bench_batch_worker.py [--jobs 20000] [--size 100] [--rounds 3]

Each phase adds ``--jobs`` jobs to a fresh queue with ``add_bulk`` (not timed), then times a
worker with a no-op async handler from ``start()`` until every job is acked (checked with the
worker's count and the queue's counts). Phases run in interleaved rounds (the machine is
shared); the median of each is printed. Each phase is bounded by ``--limit`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable

import uvloop

from shoal.client import AsyncClient, Batch, BatchOptions, BatchWorker, Job, Worker
from shoal.cluster.launcher import LocalCluster, free_base_port

DATA = {"payload": "x" * 64}


async def one(job: Job) -> None:
    return None


async def many(batch: Batch) -> None:
    return None


async def phase(client: AsyncClient, queue: str, jobs: int, make: Callable[[AsyncClient, str], Worker],
                limit_s: float) -> float:
    q = client.queue(queue)
    await q.add_bulk([DATA] * jobs, batch_size=5_000)
    worker = make(client, queue)
    t0 = time.perf_counter()
    worker.start()
    try:
        while worker.processed < jobs and time.perf_counter() - t0 < limit_s:
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
    finally:
        await worker.close(5.0)
    counts = await q.counts()
    left = counts["waiting"] + counts["delayed"] + counts["active"] + counts["failed"]
    if worker.processed != jobs or left:  # completed ones are trimmed to the queue's history cap
        raise SystemExit(f"{queue}: {worker.processed} of {jobs} acked within {limit_s:g} s: {counts}")
    await q.obliterate()
    return jobs / elapsed


async def main_async(jobs: int, size: int, rounds: int, limit_s: float) -> None:
    phases: dict[str, Callable[[AsyncClient, str], Worker]] = {
        "Worker, concurrency 1": lambda c, q: Worker(c, q, one, poll_timeout=0.2),
        "Worker, concurrency 32": lambda c, q: Worker(c, q, one, concurrency=32, poll_timeout=0.2),
        f"BatchWorker, size {size}, concurrency 1":
            lambda c, q: BatchWorker(c, q, many, batch=BatchOptions(size=size), poll_timeout=0.2),
        f"BatchWorker, size {size}, concurrency 4":
            lambda c, q: BatchWorker(c, q, many, batch=BatchOptions(size=size), concurrency=4, poll_timeout=0.2),
    }
    rates: dict[str, list[float]] = {name: [] for name in phases}
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=1, partitions=4, replication=1, data_dir=tmp, base_port=free_base_port(1, 4)) as cl:
            async with AsyncClient(cl.addresses) as client:
                for r in range(rounds):
                    for i, (name, make) in enumerate(phases.items()):
                        rate = await phase(client, f"bw-bench-{r}-{i}", jobs, make, limit_s)
                        rates[name].append(rate)
                        print(f"round {r + 1}  {name:<36} {rate:10,.0f} jobs/s", flush=True)
    print(f"\nmedians of {rounds} rounds, {jobs:,} jobs each:")
    for name, values in rates.items():
        print(f"  {name:<36} {statistics.median(values):10,.0f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description="Single-job Worker against BatchWorker")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds one phase may take")
    args = parser.parse_args()
    if not 1 <= args.jobs <= 2_000_000 or not 1 <= args.rounds <= 20:
        raise SystemExit("--jobs must be in 1..2,000,000 and --rounds in 1..20")
    uvloop.install()
    asyncio.run(main_async(args.jobs, args.size, args.rounds, args.limit))


if __name__ == "__main__":
    main()
