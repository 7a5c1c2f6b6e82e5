"""Pull throughput through real nodes for a queue of 10,000 groups, with and without flow control.

    python bench/bench_limits_node.py [--groups 10000] [--per-group 5] [--rounds 3]

A local 3-node, 8-partition cluster (real node processes) and Shoal's own client. Per workload
a fresh queue is created with its options, ``groups * per_group`` jobs of 100 bytes are pushed
(``PUSHB`` of 1,000, one group per job, round robin), then drained with ``pull_many(100)`` +
``ack_many`` on 8 lanes; the drain's jobs per second are reported (and the node CPU per job):

- ``none``: ``groupConcurrency: 0`` and no rate limit, the baseline;
- ``groupConcurrency=1``: one active job per group (utube's rule);
- ``groupLimit=100/1s``: a sliding-window rate limit on every group, loose enough (10,000
  groups x 100 per second) that the benchmark measures what the limiter costs, not the limit.

The workloads run interleaved ``--rounds`` times; medians are printed with each limited
workload's throughput as a share of the baseline. Every loop is bounded by a job count and a
time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from typing import Any

import uvloop
from bench_durability import PHASE_S_MAX, consume, cpu_s  # the durability benchmark's CPU count and drain loop

from shoal.client import AsyncClient
from shoal.cluster.launcher import LocalCluster, free_base_port

DATA = b"x" * 100
WORKLOADS: dict[str, dict[str, Any]] = {
    "none": {"group_concurrency": 0},
    "groupConcurrency=1": {"group_concurrency": 1},
    "groupLimit=100/1s": {"group_concurrency": 0, "group_limit": (100, 1.0)},
}
async def fill(client: AsyncClient, queue: str, groups: int, per_group: int) -> None:
    """Push ``groups * per_group`` jobs, one group each, in PUSHB frames of 1,000."""
    total = groups * per_group
    for start in range(0, total, 1000):
        jobs = [{"data": DATA, "group": f"g{i % groups}"} for i in range(start, min(total, start + 1000))]
        await client.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})


async def drain(client: AsyncClient, queue: str, total: int) -> float:
    """Jobs per second of ``pull_many(100)`` + ``ack_many`` on 8 lanes until ``total`` are acked."""
    done, rate = await consume(client, queue, total, keep_on_empty=0.2)
    if done < total:
        raise RuntimeError(f"{queue}: drained {done} of {total} jobs in {PHASE_S_MAX} s")
    return rate


async def main_async(args: argparse.Namespace) -> None:
    print(f"load average at start: {os.getloadavg()}")
    total = args.groups * args.per_group
    rates: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    cpus: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=8, data_dir=tmp, base_port=free_base_port(3, 8)) as cluster:
            cluster.wait_balanced()
            pids = list(cluster.pids.values())
            async with AsyncClient(cluster.addresses) as client:
                for r in range(args.rounds):
                    for k, (name, options) in enumerate(WORKLOADS.items()):
                        queue = f"lim-{r}-{k}"
                        await client.queue(queue).create(**options)
                        await fill(client, queue, args.groups, args.per_group)
                        c0 = cpu_s(pids)
                        rate = await drain(client, queue, total)
                        cpus[name].append((cpu_s(pids) - c0) * 1e6 / total)
                        rates[name].append(rate)
                        print(f"round {r + 1} {name:20} {rate:10,.0f} jobs/s  node CPU {cpus[name][-1]:6.1f} µs/job")
    base = statistics.median(rates["none"])
    print(f"medians of {args.rounds} interleaved rounds ({args.groups:,} groups x {args.per_group}):")
    for name in WORKLOADS:
        rate = statistics.median(rates[name])
        print(f"  {name:20} {rate:10,.0f} jobs/s  node CPU {statistics.median(cpus[name]):6.1f} µs/job"
              f"  {rate / base:6.0%} of none")
    print(f"load average at end: {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--per-group", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
