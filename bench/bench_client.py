"""Client benchmark against a local 3-node cluster (nodes in their own processes).

    python bench/bench_client.py [--seconds 4]

Pipelined ``Queue.add`` ops/s (100 in flight), ``add_bulk`` jobs/s (1,000 per call,
batches of 1,000), and ``pull_many`` + ``ack_many`` jobs/s (100 per call). Loops are
bounded by a job count and a time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import uvloop

from shoal.client import AsyncClient
from shoal.cluster.launcher import LocalCluster, free_base_port

DATA = b"x" * 100


async def pipelined_add(client: AsyncClient, seconds: float, window: int = 100, total: int = 1_000_000) -> float:
    q = client.queue("cb-add")
    done = 0
    t0 = time.perf_counter()

    async def lane() -> None:
        nonlocal done
        while done < total and time.perf_counter() - t0 < seconds:
            await q.add(DATA)
            done += 1

    await asyncio.gather(*(lane() for _ in range(window)))
    return done / (time.perf_counter() - t0)


async def bulk_add(client: AsyncClient, seconds: float, total: int = 2_000_000) -> float:
    q = client.queue("cb-bulk")
    done = 0
    t0 = time.perf_counter()
    while done < total and time.perf_counter() - t0 < seconds:
        await asyncio.gather(*(q.add_bulk([DATA] * 1000) for _ in range(4)))
        done += 4000
    return done / (time.perf_counter() - t0)


async def pull_ack(client: AsyncClient, seconds: float) -> float:
    q = client.queue("cb-bulk")
    done = 0
    t0 = time.perf_counter()

    async def lane() -> None:
        nonlocal done
        while time.perf_counter() - t0 < seconds:
            jobs = await q.pull_many(100)
            if not jobs:
                return
            await q.ack_many(jobs)
            done += len(jobs)

    await asyncio.gather(*(lane() for _ in range(8)))
    return done / (time.perf_counter() - t0)


async def main_async(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=8, data_dir=tmp, base_port=free_base_port(3, 8)) as cluster:
            async with AsyncClient(cluster.addresses) as client:
                print(f"Queue.add, 100 in flight:     {await pipelined_add(client, seconds):12,.0f} ops/s")
                print(f"Queue.add_bulk (1,000/call):  {await bulk_add(client, seconds):12,.0f} jobs/s")
                print(f"pull_many + ack_many (100):   {await pull_ack(client, seconds):12,.0f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description="Shoal client benchmark")
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    uvloop.install()
    asyncio.run(main_async(args.seconds))


if __name__ == "__main__":
    main()
