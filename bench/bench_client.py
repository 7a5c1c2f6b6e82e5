"""Client benchmark against a local 3-node, 8-partition cluster (real node processes).

    python bench/bench_client.py [--seconds 3]

Prints, each bounded by a job count and a time limit:
- pipelined ``Queue.add`` (PUSH) ops/s with 100 in flight, on one queue and spread over 8 queues
  (several partition leaders), and v1 sequential mode (``pipelining=False``) for comparison;
- ``add_bulk`` jobs/s (1,000 jobs per call, 4 calls in flight);
- ``pull`` + ``ack`` jobs/s (one job per round trip, 32 lanes) and ``pull_many`` + ``ack_many``
  jobs/s (100 per call, 8 lanes).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import uvloop

from shoal.client import AsyncClient, ConnectionOptions
from shoal.cluster.launcher import LocalCluster, free_base_port

DATA = b"x" * 100
TOTAL_MAX = 2_000_000


async def pipelined_add(client: AsyncClient, seconds: float, queues: list[str], window: int = 100) -> float:
    handles = [client.queue(q) for q in queues]
    done = 0
    t0 = time.perf_counter()

    async def lane(k: int) -> None:
        nonlocal done
        q = handles[k % len(handles)]
        while done < TOTAL_MAX and time.perf_counter() - t0 < seconds:
            await q.add(DATA)
            done += 1

    await asyncio.gather(*(lane(k) for k in range(window)))
    return done / (time.perf_counter() - t0)


async def bulk_add(client: AsyncClient, seconds: float, queue: str) -> float:
    q = client.queue(queue)
    done = 0
    t0 = time.perf_counter()
    while done < TOTAL_MAX and time.perf_counter() - t0 < seconds:
        await asyncio.gather(*(q.add_bulk([DATA] * 1000) for _ in range(4)))
        done += 4000
    return done / (time.perf_counter() - t0)


async def pull_ack(client: AsyncClient, seconds: float, queue: str, batch: int, lanes: int) -> float:
    q = client.queue(queue)
    done = 0
    t0 = time.perf_counter()

    async def lane() -> None:
        nonlocal done
        while time.perf_counter() - t0 < seconds:
            if batch == 1:
                job = await q.pull()
                if job is None:
                    return
                await q.ack(job)
                done += 1
            else:
                jobs = await q.pull_many(batch)
                if not jobs:
                    return
                await q.ack_many(jobs)
                done += len(jobs)

    await asyncio.gather(*(lane() for _ in range(lanes)))
    return done / (time.perf_counter() - t0)


async def main_async(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=8, data_dir=tmp, base_port=free_base_port(3, 8)) as cluster:
            cluster.wait_balanced()
            async with AsyncClient(cluster.addresses) as client:
                r = await pipelined_add(client, seconds, ["cb-add"])
                print(f"PUSH pipelined, 1 queue, 100 in flight:    {r:12,.0f} ops/s")
                r = await pipelined_add(client, seconds, [f"cb-spread-{i}" for i in range(8)])
                print(f"PUSH pipelined, 8 queues, 100 in flight:   {r:12,.0f} ops/s")
                r = await bulk_add(client, seconds, "cb-bulk")
                print(f"add_bulk (1,000 per call, 4 in flight):    {r:12,.0f} jobs/s")
                r = await pull_ack(client, seconds, "cb-bulk", 1, 32)
                print(f"pull + ack (1 per call, 32 lanes):         {r:12,.0f} jobs/s")
                r = await pull_ack(client, seconds, "cb-bulk", 100, 8)
                print(f"pull_many + ack_many (100 per call, 8):    {r:12,.0f} jobs/s")
            v1 = ConnectionOptions(pipelining=False)
            async with AsyncClient(cluster.addresses, options=v1) as client:
                r = await pipelined_add(client, seconds, ["cb-v1"], window=4)
                print(f"PUSH v1 sequential (pool of 4, 4 lanes):   {r:12,.0f} ops/s")


def main() -> None:
    parser = argparse.ArgumentParser(description="Shoal client benchmark")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    uvloop.install()
    asyncio.run(main_async(args.seconds))


if __name__ == "__main__":
    main()
