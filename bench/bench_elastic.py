"""Adding and removing a node under steady load: time to settle, write rate kept, p99 latency.

    python bench/bench_elastic.py [--rounds 3] [--rates 4M,16M,64M,10G] [--jobs 60000] [--data-bytes 1000]

Each run starts a fresh local 3-node cluster (real processes on loopback, 8 partitions, RF 3,
journals compacted every 200 entries as on a cluster that has run a while, so a new replica is
built from a snapshot), fills it with ``--jobs`` jobs of ``--data-bytes`` bytes (PUSHB frames of
100 over eight queues), sets the cluster-wide move rate (``PUT /admin/settings
moveRateBytesPerS``), and runs a steady closed-loop load: ``--lanes`` concurrent PUSHes of 100
bytes through the async client, one at a time per lane, each lane on one of the eight queues
(so a pause of one partition stalls its own lanes, not every lane). Then:

1. ``--before`` seconds of load alone (the baseline);
2. a fourth node is registered (``POST /admin/nodes``) and started; timed until the cluster is
   settled (every partition's voters are its target, no move runs) and every partition is led by
   its preferred node;
3. ``--between`` seconds of load on the four nodes (the rate *after* adding), then ``n1`` is
   decommissioned; timed until no partition lists it and the cluster is settled and balanced; it
   is removed and stopped.

For each phase: its length, the acknowledged writes per second as a share of the baseline's,
and the p99 latency of a write (the baseline's beside it); and the four nodes' rate after the
add settled as a share of the three nodes' before (on two cores a fourth node process takes its
share of the CPU whatever moves). Runs are interleaved over the rates
(the order turns each round) so the shared machine's load hits every rate alike; the summary
prints each rate's median and its range over the rounds. Every loop is bounded in count and
time; the nodes are stopped by pid at the end of each run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from shoal.client import AsyncClient, ShoalError
from shoal.cluster.admin_client import AdminClient, ClusterShape
from shoal.cluster.config import NodeSpec
from shoal.cluster.launcher import LocalCluster, free_base_port, write_cluster_file

PARTITIONS = 8
QUEUES = [f"elastic-{i}" for i in range(8)]
SNAPSHOT_ENTRIES = 200
PRELOAD_BATCH = 100
SETTLE_TIMEOUT_S = 600.0
OPS_MAX = 20_000_000
DATA = b"x" * 100


def parse_rate(text: str) -> int:
    """``4M`` → 4 MiB/s, ``10G``, ``512K``, or plain bytes."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def show_rate(rate: int) -> str:
    for unit, size in (("GiB/s", 1024 ** 3), ("MiB/s", 1024 ** 2), ("KiB/s", 1024)):
        if rate >= size:
            return f"{rate / size:g} {unit}"
    return f"{rate} B/s"


class Load(threading.Thread):
    """``lanes`` closed-loop PUSH lanes on one async client in its own thread; records (end, latency)."""

    def __init__(self, addresses: list[str], lanes: int) -> None:
        super().__init__(daemon=True)
        self.addresses, self.lanes = addresses, lanes
        self.samples: list[tuple[float, float]] = []
        self.errors = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with AsyncClient(self.addresses) as client:
            handles = [client.queue(q) for q in QUEUES]

            async def lane(k: int) -> None:
                queue = handles[k % len(handles)]  # a producer per queue: one partition's pause stalls its lanes only
                while not self.stop_flag.is_set() and len(self.samples) < OPS_MAX:
                    t0 = time.perf_counter()
                    try:
                        await queue.add(DATA)
                    except (ShoalError, OSError, asyncio.TimeoutError):
                        self.errors += 1
                        await asyncio.sleep(0.01)
                        continue
                    t1 = time.perf_counter()
                    self.samples.append((t1, t1 - t0))

            await asyncio.gather(*(lane(k) for k in range(self.lanes)))

    def window(self, t0: float, t1: float) -> tuple[float, float]:
        """(acknowledged writes per second, p99 latency in ms) of the writes that ended in [t0, t1]."""
        lat = sorted(latency for t, latency in self.samples if t0 <= t <= t1)
        if not lat or t1 <= t0:
            return 0.0, float("nan")
        return len(lat) / (t1 - t0), lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000


@dataclass
class Phase:
    seconds: float
    rate_share: float
    p99_ms: float


@dataclass
class Run:
    rate: int
    base_rate: float = 0.0
    base_p99_ms: float = 0.0
    four_share: float = float("nan")
    phases: dict[str, Phase] = field(default_factory=dict)


async def _preload(addresses: list[str], jobs: int, data: bytes) -> None:
    async with AsyncClient(addresses) as client:
        handles = [client.queue(q) for q in QUEUES]
        per_queue = jobs // len(handles)
        await asyncio.gather(*(h.add_bulk([data] * per_queue, batch_size=PRELOAD_BATCH) for h in handles))


def _holds(shape: ClusterShape, node: str) -> bool:
    return any(node in shape.replicas(p) for p in shape.placement) or any(
        node in (m.get("from"), m.get("to")) for m in shape.moves)


def _timed(admin: AdminClient, done: Any) -> float:
    t0 = time.perf_counter()
    admin.wait(done, SETTLE_TIMEOUT_S, poll_s=0.25)
    return time.perf_counter() - t0


def one_run(rate: int, args: argparse.Namespace) -> Run:
    run = Run(rate)
    env = {"SHOAL_SNAPSHOT_ENTRIES_MIN": str(SNAPSHOT_ENTRIES)}
    with tempfile.TemporaryDirectory(prefix="shoal-elastic-") as data_dir:
        base = free_base_port(4, PARTITIONS)
        with LocalCluster(nodes=3, partitions=PARTITIONS, data_dir=data_dir, base_port=base,
                          extra_env=env) as cluster:
            cluster.wait_balanced()
            asyncio.run(_preload(cluster.addresses, args.jobs, b"d" * args.data_bytes))
            n1 = cluster.config.node("n1")
            admin = AdminClient(f"http://127.0.0.1:{n1.http_port}")
            admin.settings(moveRateBytesPerS=rate)
            admin.wait(lambda s: s.settled() and s.leaders_balanced(), SETTLE_TIMEOUT_S)
            load = Load(cluster.addresses, args.lanes)
            load.start()
            try:
                time.sleep(1.0)  # connections up, partitions' leaders known
                t0 = time.perf_counter()
                time.sleep(args.before)
                t1 = time.perf_counter()
                run.base_rate, run.base_p99_ms = load.window(t0, t1)

                n4 = NodeSpec("n4", "127.0.0.1", base + 6, base + 7, base + 103)
                cluster.config = replace(cluster.config, nodes=cluster.config.nodes + (n4,),
                                         bootstrap_nodes=("n1", "n2", "n3"))
                write_cluster_file(cluster.config_path, cluster.config)
                t_add = time.perf_counter()
                admin.add_node("n4", n4.host, n4.port, n4.http_port, n4.raft_port)
                cluster.start_node("n4")
                seconds = _timed(admin, lambda s: _holds(s, "n4") and s.settled() and s.leaders_balanced())
                rate_now, p99 = load.window(t_add, t_add + seconds)
                run.phases["add"] = Phase(seconds, rate_now / run.base_rate, p99)

                t_four = time.perf_counter()
                time.sleep(args.between)
                run.four_share = load.window(t_four, time.perf_counter())[0] / run.base_rate
                admin = AdminClient(f"http://127.0.0.1:{cluster.config.node('n2').http_port}")
                t_rm = time.perf_counter()
                admin.decommission("n1")
                seconds = _timed(admin, lambda s: not _holds(s, "n1") and s.settled() and s.leaders_balanced())
                rate_now, p99 = load.window(t_rm, t_rm + seconds)
                run.phases["remove"] = Phase(seconds, rate_now / run.base_rate, p99)
                admin.remove("n1")
                cluster.stop_node("n1")
            finally:
                load.stop_flag.set()
                load.join(30)
            if load.errors:
                print(f"    ({load.errors} writes answered an error and were retried by the lane)")
    return run


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rates", default="4M,16M,64M,10G", help="cluster-wide move rates to compare")
    parser.add_argument("--jobs", type=int, default=60_000, help="jobs in the cluster before the load")
    parser.add_argument("--data-bytes", type=int, default=1000)
    parser.add_argument("--lanes", type=int, default=16, help="concurrent PUSH lanes of the steady load")
    parser.add_argument("--before", type=float, default=6.0, help="seconds of baseline load")
    parser.add_argument("--between", type=float, default=5.0, help="seconds of load on four nodes, settled")
    args = parser.parse_args()
    rates = [parse_rate(r) for r in args.rates.split(",")]
    runs: dict[int, list[Run]] = {r: [] for r in rates}
    for k in range(args.rounds):
        order = rates[k % len(rates):] + rates[:k % len(rates)]
        for rate in order:
            try:
                run = one_run(rate, args)
            except TimeoutError as exc:  # a phase that never settled: reported, the other runs go on
                print(f"round {k + 1} rate {show_rate(rate)}: {exc}")
                continue
            runs[rate].append(run)
            print(f"round {k + 1} rate {show_rate(rate)}: baseline {run.base_rate:,.0f} writes/s p99 "
                  f"{run.base_p99_ms:.1f} ms; four nodes settled {run.four_share:.0%}; " + "; ".join(
                      f"{name} {ph.seconds:.1f} s, {ph.rate_share:.0%} of the write rate, p99 {ph.p99_ms:.1f} ms"
                      for name, ph in run.phases.items()))
    print(f"\n{args.rounds} rounds, {args.jobs:,} jobs of {args.data_bytes} B, {args.lanes} lanes; "
          "median (min – max) over the rounds")
    print("| move rate | phase | time to settled + balanced | write rate kept | p99 during | p99 before |"
          " four nodes settled |")
    print("|---|---|---|---|---|---|---|")
    for rate in rates:
        for name in ("add", "remove"):
            phases = [r.phases[name] for r in runs[rate] if name in r.phases]
            if not phases:
                continue

            def spread(values: list[float], fmt: str) -> str:
                return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))} – {fmt.format(max(values))})"

            print(f"| {show_rate(rate)} | {name} | {spread([p.seconds for p in phases], '{:.1f} s')} | "
                  f"{spread([p.rate_share * 100 for p in phases], '{:.0f} %')} | "
                  f"{spread([p.p99_ms for p in phases], '{:.1f} ms')} | "
                  f"{spread([r.base_p99_ms for r in runs[rate]], '{:.1f} ms')} | "
                  f"{spread([r.four_share * 100 for r in runs[rate]], '{:.0f} %')} |")


if __name__ == "__main__":
    main()
