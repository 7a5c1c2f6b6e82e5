"""Raft with many partitions: start-up time and idle CPU per node of a local cluster.

For each partition count, starts a 3-node local cluster (real processes on
loopback), times it to "ready" (every partition has a leader, every node's
/ready says 200) and to "balanced" (every leader on its preferred replica),
lets it settle, then samples each node's CPU time from /proc over an idle
window and reports it as a percentage of one core. It finally pushes one job
into every partition (it serves) and counts the elections after "balanced"
(``shoal_raft_elections_total``: none expected while idle). With ``--load-seconds``
it then runs a steady load through the client (PUSHB of 100 jobs, PULLB of 100 and
their ACKB, round robin over four queues) and counts the elections and the writes
answered TIMEOUT during it (none expected either).

    python bench/bench_raft_scale.py                       # 256 and 1,024 partitions
    python bench/bench_raft_scale.py --partitions 256 --idle-seconds 20
    python bench/bench_raft_scale.py --partitions 8 --load-seconds 15
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from shoal.client import Client, ShoalError
from shoal.client.exceptions import CommandError, CommandTimeout
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

READY_TIMEOUT_S = 120.0
SETTLE_S = 3.0
PUSH_ATTEMPTS_MAX = 5
LOAD_QUEUES = 4
LOAD_BATCH = 100
LOAD_ROUNDS_MAX = 1_000_000


def steady_load(client: Client, seconds: float) -> tuple[int, int]:
    """PUSHB, PULLB and ACKB of :data:`LOAD_BATCH` jobs round robin over four queues for
    ``seconds`` (at most :data:`LOAD_ROUNDS_MAX` rounds); the jobs pushed and the writes
    answered TIMEOUT (leadership lost under a write)."""
    jobs = [{"data": b"x" * 100} for _ in range(LOAD_BATCH)]
    pushed = timeouts = 0
    deadline = time.monotonic() + seconds
    for i in range(LOAD_ROUNDS_MAX):
        if time.monotonic() >= deadline:
            break
        queue = f"steady-{i % LOAD_QUEUES}"
        try:
            client.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
            pushed += LOAD_BATCH
            pulled = client.call({"cmd": "PULLB", "queue": queue, "count": LOAD_BATCH})
            if pulled.get("jobs"):
                client.call({"cmd": "ACKB", "ids": [j["id"] for j in pulled["jobs"]], "tokens": pulled.get("tokens")})
        except (CommandError, CommandTimeout) as exc:
            if isinstance(exc, CommandError) and exc.code != "TIMEOUT":
                raise
            timeouts += 1
    return pushed, timeouts


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def elections(cluster: LocalCluster) -> int:
    """Elections every node's replicas started (the ``raft.elections`` line of each node's /stats)."""
    total = 0
    for node in cluster.config.nodes:
        with urllib.request.urlopen(f"http://{node.host}:{node.http_port}/stats", timeout=10) as reply:
            total += int(json.load(reply)["raft"]["elections"])
    return total


def run(partitions: int, idle_s: float, load_s: float, settle_s: float = SETTLE_S) -> None:
    with tempfile.TemporaryDirectory(prefix="shoal-scale-") as tmp:
        cluster = LocalCluster(nodes=3, partitions=partitions, data_dir=Path(tmp) / "c",
                               base_port=free_base_port(3, partitions))
        try:
            t0 = time.monotonic()
            cluster.start(wait=False)
            cluster.wait_ready(READY_TIMEOUT_S)
            ready_s = time.monotonic() - t0
            balanced = cluster.wait_balanced(READY_TIMEOUT_S)
            balanced_s = time.monotonic() - t0
            time.sleep(settle_s)
            with Client(cluster.addresses) as client:
                client.refresh_topology()
                before = elections(cluster)
                pids = cluster.pids
                start = {n: cpu_seconds(p) for n, p in pids.items()}
                t1 = time.monotonic()
                time.sleep(idle_s)
                wall = time.monotonic() - t1
                cpu = {n: 100.0 * (cpu_seconds(p) - start[n]) / wall for n, p in pids.items()}
                after = elections(cluster)
                queues: dict[int, str] = {}
                i = 0
                while len(queues) < partitions and i < 1_000_000:
                    queues.setdefault(partition_for(f"q{i}", partitions), f"q{i}")
                    i += 1
                t2 = time.monotonic()
                retries = 0
                for p, queue in queues.items():
                    for attempt in range(PUSH_ATTEMPTS_MAX):
                        try:
                            client.call({"cmd": "PUSH", "queue": queue, "data": b"x", "idempotencyKey": f"k{p}"})
                            break
                        except ShoalError:
                            retries += 1
                            if attempt == PUSH_ATTEMPTS_MAX - 1:
                                raise
                push_s = time.monotonic() - t2
                load = ""
                if load_s > 0:
                    before_load = elections(cluster)
                    pushed, timeouts = steady_load(client, load_s)
                    load = (f"; under {load_s:.0f} s of steady load ({pushed:,} jobs pushed, pulled and acked): "
                            f"{elections(cluster) - before_load} elections, {timeouts} writes answered TIMEOUT")
        finally:
            cluster.stop()
    cpus = ", ".join(f"{n} {c:.1f}%" for n, c in sorted(cpu.items()))
    print(f"{partitions:>5} partitions: ready {ready_s:5.1f} s, balanced {balanced_s:5.1f} s"
          f"{'' if balanced else ' (NOT balanced)'}; idle cpu over {wall:.0f} s: {cpus}; "
          f"elections while idle: {after - before}; one push per partition: {len(queues)} in {push_s:.1f} s"
          f" ({retries} retried){load}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--load-seconds", type=float, default=0.0, help="steady client load after the idle window")
    parser.add_argument("--settle-seconds", type=float, default=SETTLE_S,
                        help="wait after balanced before the idle window (the journals store their commit "
                             "hints once within 10 s of the start-up's last commit)")
    args = parser.parse_args()
    for partitions in args.partitions:
        run(partitions, args.idle_seconds, args.load_seconds, args.settle_seconds)


if __name__ == "__main__":
    main()
