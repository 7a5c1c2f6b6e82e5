"""What a flow costs the cluster: PushFlow of a parent and its children on other partitions,
the children worked in batches, until every parent is released (``waiting``).

    python bench/bench_flows.py [--flows 500] [--children 3] [--partitions 8] [--rounds 3]

Per round, on a fresh 3-node cluster on loopback: ``--flows`` PushFlows (pipelined, 64 at a
time), then workers take every child with PULLB and ACKB them, then the script waits until
every parent is waiting (each child's report went through its leader's forwarder to the
parent's partition). Prints wall seconds of each phase and the node processes' CPU
milliseconds per flow (utime + stime from /proc), the figure to compare on a shared machine.
Every loop is bounded by a count and a time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from shoal.client import AsyncClient
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

PHASE_S_MAX = 120.0
PUSH_WINDOW = 64


def node_cpu_s(cluster: LocalCluster) -> float:
    """User + system CPU seconds of every node process so far (Linux /proc)."""
    total = 0
    for proc in cluster.procs.values():
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / 100  # clock ticks (USER_HZ = 100 on Linux)


def queues(partitions: int, n: int) -> list[str]:
    """``n`` queue names on distinct partitions (bounded search)."""
    found: dict[int, str] = {}
    for i in range(10_000):
        found.setdefault(partition_for(f"bf{i}", partitions), f"bf{i}")
        if len(found) == n:
            break
    return list(found.values())


async def one_round(cluster: LocalCluster, flows: int, children: int) -> dict[str, float]:
    parent_q, *child_qs = queues(cluster.config.partitions, children + 1)
    async with AsyncClient(cluster.addresses) as client:
        out: dict[str, float] = {}
        cpu0, t0 = node_cpu_s(cluster), time.monotonic()
        window = asyncio.Semaphore(PUSH_WINDOW)

        async def push(i: int) -> str:
            async with window:
                tree = await client.flow({"queue": parent_q, "data": i},
                                         [{"queue": q, "data": [i, j]} for j, q in enumerate(child_qs)])
                return str(tree["id"])

        parents = await asyncio.gather(*(push(i) for i in range(flows)))
        out["push_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        for q in child_qs:
            left = flows
            deadline = time.monotonic() + PHASE_S_MAX
            while left and time.monotonic() < deadline:
                r = await client.call({"cmd": "PULLB", "queue": q, "count": min(left, 500), "timeout": 1000})
                if r["jobs"]:
                    await client.call({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"],
                                       "results": [j["data"] for j in r["jobs"]]})
                    left -= len(r["jobs"])
            assert left == 0, f"{left} children of {q} never came"
        out["work_s"] = time.monotonic() - t1
        t2 = time.monotonic()
        deadline = time.monotonic() + PHASE_S_MAX
        while time.monotonic() < deadline:
            counts = (await client.call({"cmd": "GetJobCounts", "queue": parent_q}))["counts"]
            if counts["waiting"] == flows:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"parents not released: {counts}")
        out["release_s"] = time.monotonic() - t2
        out["cpu_ms_per_flow"] = (node_cpu_s(cluster) - cpu0) * 1000 / flows
        assert len(set(parents)) == flows
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, default=500)
    ap.add_argument("--children", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as data, LocalCluster(
                nodes=3, partitions=args.partitions, data_dir=data,
                base_port=free_base_port(3, args.partitions)) as cluster:
            cluster.wait_balanced()
            results.append(asyncio.run(one_round(cluster, args.flows, args.children)))
    print(f"{args.flows} flows of 1 parent + {args.children} children on {args.children + 1} partitions, "
          f"3 nodes, {args.partitions} partitions; median of {args.rounds} rounds")
    for key in ("push_s", "work_s", "release_s", "cpu_ms_per_flow"):
        print(f"  {key:16s} {statistics.median(r[key] for r in results):8.3f}")


if __name__ == "__main__":
    main()
