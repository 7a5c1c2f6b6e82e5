"""What an open dashboard costs the cluster: bench_node's throughput phases, each run with no
viewer and with one page's worth of dashboard traffic, in interleaved pairs.

The viewer is what the page does while it shows the overview: it reads ``GET /cluster/stream``
from n1 (once a second n1 asks every node for ``/node``, and every leader records job events
for the timelines while that lasts). It runs in a thread of this process on its own socket.

    python bench/bench_dashboard.py [--seconds 5] [--rounds 3] [--partitions 8] [--phases push,pushb,pull]
    python bench/bench_dashboard.py --listing 1000000   (engine only: what the queue page's job list
                                                         costs the leader on a queue of that many jobs)
    python bench/bench_dashboard.py --idle 20 [--queues 50]
                                     (CPU seconds the nodes spend per second, idle, page closed vs open)

Every loop is bounded by a round count and a time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
import urllib.request

import uvloop
from bench_node import THROUGHPUT_PHASES  # bench/ is this script's sys.path[0]

from shoal.client import Client
from shoal.cluster.codec import raw_of
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.node.state import PartitionEngine


class Viewer:
    """A thread reading the overview stream, like an open dashboard page."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.events = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with urllib.request.urlopen(self.url, timeout=30) as resp:
            while not self.stop.is_set():
                line = resp.readline()
                if not line:
                    return
                if line.startswith(b"event: overview"):
                    self.events += 1

    def __enter__(self) -> "Viewer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)  # wakes at the next overview (one a second)


async def main_async(args: argparse.Namespace) -> None:
    phases = [p for p in THROUGHPUT_PHASES if p[0] in args.phases.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=args.partitions, data_dir=tmp,
                          base_port=free_base_port(3, args.partitions)) as cluster:
            n1 = cluster.config.nodes[0]
            url = f"http://{n1.host}:{n1.http_port}/cluster/stream?interval=1000"
            for name, label, unit, run in phases:
                ratios = []
                for r in range(args.rounds):
                    try:
                        # Each phase's queue grows run after run, which slows the later run of a pair:
                        # which half goes first alternates, so that drift does not count as a cost.
                        viewer = Viewer(url)
                        for open_page in ((False, True) if r % 2 == 0 else (True, False)):
                            cluster.wait_balanced(30.0)
                            if open_page:
                                with viewer:
                                    on = await run(cluster, args.seconds)
                            else:
                                off = await run(cluster, args.seconds)
                    except RuntimeError as exc:  # a leader moved mid-run (an election): this pair is void
                        print(f"{label:<26} round {r + 1}: void, {str(exc)[:100]}")
                        continue
                    ratios.append(on / off)
                    print(f"{label:<26} round {r + 1} ({'closed first' if r % 2 == 0 else 'open first'}): "
                          f"no viewer {off:10,.0f}  dashboard open {on:10,.0f} {unit}"
                          f"  ({on / off:.2f}x, {viewer.events} overviews read)")
                if ratios:
                    print(f"{label:<26} median ratio open/closed: {statistics.median(ratios):.2f}")


def _cpu_s(cluster: LocalCluster) -> float:
    """User + system CPU seconds of every node process so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for proc in cluster.procs.values():
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


def bench_idle(args: argparse.Namespace) -> None:
    """Node CPU per second on an idle cluster with ``--queues`` queues, page closed vs open, in pairs."""
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=args.partitions, data_dir=tmp,
                          base_port=free_base_port(3, args.partitions)) as cluster:
            cluster.wait_balanced(30.0)
            with Client(cluster.addresses) as client:
                for i in range(args.queues):
                    client.queue(f"idle-{i}").add_bulk([{"i": k} for k in range(100)])
            n1 = cluster.config.nodes[0]
            url = f"http://{n1.host}:{n1.http_port}/cluster/stream?interval=1000"
            for r in range(args.rounds):
                for open_page in ((False, True) if r % 2 == 0 else (True, False)):
                    viewer = Viewer(url) if open_page else None
                    if viewer:
                        viewer.__enter__()
                    before, started = _cpu_s(cluster), time.monotonic()
                    time.sleep(args.idle)
                    used = (_cpu_s(cluster) - before) / (time.monotonic() - started)
                    if viewer:
                        viewer.__exit__()
                    print(f"idle, {args.queues} queues, round {r + 1}, page {'open  ' if open_page else 'closed'}: "
                          f"nodes use {used * 1000:6.1f} ms CPU per second (sum of 3)")


def bench_listing(jobs: int) -> None:
    """GetJobs pages (50 jobs) of a queue of ``jobs`` batch-pushed jobs, a tenth of them leased and acked."""
    e = PartitionEngine(0)
    now = 1_000
    for start in range(0, jobs, 10_000):
        e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(start, min(jobs, start + 10_000))]},
                now)
    for _ in range(jobs // 10 // 100):
        got = e.apply({"cmd": "PULLB", "queue": "q", "count": 100}, now).result
        e.apply({"cmd": "ACKB", "ids": [j["id"] for j in got["jobs"]], "tokens": got["tokens"]}, now)
    for state, offset in (("waiting", 0), ("waiting", 10_000), ("completed", 0), (None, 0)):
        cmd = {"cmd": "GetJobs", "queue": "q", "offset": offset, "limit": 50, **({"state": state} if state else {})}
        started = time.perf_counter()
        rounds = 0
        while rounds < 200 and time.perf_counter() - started < 2.0:
            page = e.apply(cmd, now).result
            rounds += 1
        took = (time.perf_counter() - started) / rounds
        assert len(page["jobs"]) == 50
        print(f"GetJobs state={state or 'any':<9} offset={offset:<6} limit=50 of {jobs:,} jobs: {took * 1000:9.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time limit per throughput run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved pairs per phase")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--phases", default="push,pushb,pull", help="comma list of bench_node phases")
    parser.add_argument("--listing", type=int, default=0, metavar="JOBS", help="only time GetJobs pages (engine)")
    parser.add_argument("--idle", type=float, default=0, metavar="SECONDS", help="only measure idle node CPU")
    parser.add_argument("--queues", type=int, default=50, help="queues of the --idle cluster")
    args = parser.parse_args()
    if args.idle:
        bench_idle(args)
        return
    if args.listing:
        bench_listing(args.listing)
        return
    uvloop.install()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
