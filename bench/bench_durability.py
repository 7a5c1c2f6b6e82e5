"""Durability classes benchmark: the peer job-queue workload through Shoal's client.

A local 3-node, 8-partition cluster (real node processes). For each durability class
(``durable: true`` = fsync class, the default; ``durable: false`` = disk class) on a queue
created with that option:

- enqueue: ``add_bulk`` of ``--jobs`` jobs of 117 bytes (1,000 per call, 4 calls in flight);
- consume: ``pull_many`` + ``ack_many`` of all of them (100 per call, 8 lanes);
- lone PUSH latency: ``--lone`` sequential ``add`` calls, p50/p99;

each repeated ``--runs`` times, the classes interleaved, medians printed, with the CPU time
(user + system, from /proc) the three node processes spent per 1,000 jobs in each phase. With
``--strace`` one more enqueue round per class runs with ``strace -f -c -e
trace=fsync,fdatasync`` attached to every node, and the sync calls per acknowledged
``add_bulk`` call and per job are printed. The load average is printed at the start and the end.

    python bench/bench_durability.py [--jobs 100000] [--runs 3] [--lone 2000] [--strace]
                                     [--classes fsync,disk] [--node-python PATH]

``--node-python`` runs the nodes with another interpreter (another checkout's venv, for
an A/B of the node's CPU per job); ``--classes fsync`` alone then creates the queue
without options, for a version without the ``durable`` option.

Every loop is bounded by a job count and a time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time

import uvloop

from shoal.client import AsyncClient
from shoal.cluster.launcher import LocalCluster, free_base_port

DATA = b"x" * 117
PHASE_S_MAX = 120.0
CLASSES = (("fsync", True), ("disk", False))


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (threads included) so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


async def enqueue(client: AsyncClient, queue: str, jobs: int) -> float:
    q = client.queue(queue)
    done = 0
    t0 = time.perf_counter()
    while done < jobs and time.perf_counter() - t0 < PHASE_S_MAX:
        n = min(4, -(-(jobs - done) // 1000))
        await asyncio.gather(*(q.add_bulk([DATA] * 1000) for _ in range(n)))
        done += 1000 * n
    return done / (time.perf_counter() - t0)


async def consume(client: AsyncClient, queue: str, jobs: int, *,
                  keep_on_empty: float | None = None) -> tuple[int, float]:
    """``pull_many(100)`` + ``ack_many`` on 8 lanes until ``jobs`` are acked (or
    :data:`PHASE_S_MAX`): (jobs acked, jobs per second). An empty pull ends its lane, unless
    ``keep_on_empty`` is given: then pulls wait that many seconds and the lane goes on
    (flow control may hold ready jobs back for a while)."""
    q = client.queue(queue)
    done = 0
    t0 = time.perf_counter()
    wait = keep_on_empty or 0.0

    async def lane() -> None:
        nonlocal done
        while done < jobs and time.perf_counter() - t0 < PHASE_S_MAX:
            got = await q.pull_many(100, timeout=wait)
            if got:
                await q.ack_many(got)
                done += len(got)
            elif keep_on_empty is None:
                return

    await asyncio.gather(*(lane() for _ in range(8)))
    return done, done / (time.perf_counter() - t0)


async def lone_push(client: AsyncClient, queue: str, count: int) -> tuple[float, float]:
    q = client.queue(queue)
    lat: list[float] = []
    t0 = time.perf_counter()
    for _ in range(count):
        if time.perf_counter() - t0 > PHASE_S_MAX:
            break
        t = time.perf_counter()
        await q.add(DATA)
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def strace_nodes(pids: list[int], out_dir: str) -> list[subprocess.Popen[bytes]]:
    procs = []
    for pid in pids:
        out = os.path.join(out_dir, f"strace-{pid}.txt")
        procs.append(subprocess.Popen(["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out,
                                       "-p", str(pid)], stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # strace attaches to every thread
    return procs


def stop_strace(procs: list[subprocess.Popen[bytes]], out_dir: str) -> int:
    total = 0
    for p in procs:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for name in os.listdir(out_dir):
        if name.startswith("strace-"):
            with open(os.path.join(out_dir, name)) as f:
                for line in f:
                    m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)\s*$", line)
                    if m:
                        total += int(m.group(1))
            os.unlink(os.path.join(out_dir, name))
    return total


async def main_async(args: argparse.Namespace) -> None:
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        command = [args.node_python, "-m", "shoal.node"] if args.node_python else None
        with LocalCluster(nodes=3, partitions=8, data_dir=tmp, base_port=free_base_port(3, 8),
                          node_command=command) as cluster:
            cluster.wait_balanced()
            classes = [(c, d) for c, d in CLASSES if c in args.classes.split(",")]
            results: dict[str, dict[str, list[float]]] = {c: {"enq": [], "con": [], "p50": [], "p99": [],
                                                              "enq_cpu": [], "con_cpu": []}
                                                          for c, _ in classes}
            pids = list(cluster.pids.values())
            async with AsyncClient(cluster.addresses) as client:
                for run in range(args.runs):
                    for name, durable in classes:
                        queue = f"bd-{name}-{run}"
                        options = {} if args.classes == "fsync" else {"durable": durable}
                        await client.queue(queue).create(**options)
                        r = results[name]
                        c0 = cpu_s(pids)
                        r["enq"].append(await enqueue(client, queue, args.jobs))
                        c1 = cpu_s(pids)
                        r["con"].append((await consume(client, queue, args.jobs))[1])
                        c2 = cpu_s(pids)
                        r["enq_cpu"].append((c1 - c0) * 1e6 / args.jobs)
                        r["con_cpu"].append((c2 - c1) * 1e6 / args.jobs)
                        lone = f"bd-lone-{name}-{run}"
                        await client.queue(lone).create(**options)
                        p50, p99 = await lone_push(client, lone, args.lone)
                        r["p50"].append(p50)
                        r["p99"].append(p99)
                        print(f"run {run + 1} {name:5}: enqueue {r['enq'][-1]:9,.0f} jobs/s "
                              f"({r['enq_cpu'][-1]:.1f} node-CPU µs/job), consume+ack {r['con'][-1]:9,.0f} jobs/s "
                              f"({r['con_cpu'][-1]:.1f} µs/job), lone PUSH p50 {p50:.2f} ms p99 {p99:.2f} ms",
                              flush=True)
                for name, _ in classes:
                    r = results[name]
                    med = statistics.median
                    print(f"median {name:5}: enqueue {med(r['enq']):9,.0f} jobs/s ({med(r['enq_cpu']):.1f} µs/job), "
                          f"consume+ack {med(r['con']):9,.0f} jobs/s ({med(r['con_cpu']):.1f} µs/job), lone PUSH "
                          f"p50 {med(r['p50']):.2f} ms p99 {med(r['p99']):.2f} ms")
                if args.strace:
                    for name, durable in classes:
                        queue = f"bd-strace-{name}"
                        await client.queue(queue).create(durable=durable)
                        procs = strace_nodes(list(cluster.pids.values()), tmp)
                        await enqueue(client, queue, args.jobs)
                        syncs = stop_strace(procs, tmp)
                        calls = args.jobs // 1000
                        print(f"strace {name:5}: {syncs} fsync+fdatasync on 3 nodes for {calls} add_bulk calls "
                              f"({args.jobs} jobs): {syncs / calls:.2f} per call, {syncs / args.jobs:.4f} per job")
                        procs = strace_nodes(list(cluster.pids.values()), tmp)
                        n = min(args.lone, 500)
                        await lone_push(client, f"bd-lone-{name}-0", n)
                        syncs = stop_strace(procs, tmp)
                        print(f"strace {name:5}: {syncs} fsync+fdatasync on 3 nodes for {n} lone PUSH: "
                              f"{syncs / n:.2f} per PUSH")
    print(f"load average at end: {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Shoal durability classes benchmark")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lone", type=int, default=2_000)
    parser.add_argument("--strace", action="store_true")
    parser.add_argument("--classes", default="fsync,disk")
    parser.add_argument("--node-python", default=None)
    args = parser.parse_args()
    uvloop.install()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
