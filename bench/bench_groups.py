"""What a pull costs among 10 groups and among 100,000 groups (fair, weighted turns).

    python bench/bench_groups.py [--rounds 5] [--jobs 200000] [--pulls 20000] [--base REV] [--node]

Engine level (one process, CPU time): a queue holds ``--jobs`` jobs of 100 bytes spread over 10
groups and over 100,000 groups (PUSHB of 10,000 items, one group each, round robin); then
``--pulls`` jobs are taken and acknowledged, and the CPU microseconds per job are reported:

- ``PULL+ACK``: one job at a time, ``groupConcurrency: 1`` (utube's rule: a group is out of
  the turns while its job runs);
- ``PULLB+ACKB``: 100 at a time, ``groupConcurrency: 0``;
- ``weighted PULL+ACK``: as the first, with ``groupWeights`` for 1,000 of the groups
  (weights 1 to 8).

The two group counts and the workloads run interleaved ``--rounds`` times; medians are printed.
``--base REV`` runs the same on ``node/state`` of a git revision beside this tree's (as
``bench/ab_engine.py`` loads it). ``--node`` adds an end-to-end figure: a local 1-node cluster
(a real node process), a raw connection without ``Hello`` (as bunqueue's client), the queue
filled the same way, and 2,000 ``PULL`` + ``ACK`` round trips one at a time; the median wall
time per round trip is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shoal.cluster.codec import Raw
import shoal.node.state as tree_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from ab_engine import leased, load_base, result  # noqa: E402  (the A/B benchmark's loader)

DATA = Raw(b"\xc4\x64" + b"x" * 100)  # a 100-byte bin payload, as a client would send it
GROUP_COUNTS = (10, 100_000)
BATCH = 100
NOW = 1_000
WEIGHTS = {f"g{i}": 1 + i % 8 for i in range(1_000)}
WORKLOADS: dict[str, dict[str, Any]] = {
    "PULL+ACK": {"groupConcurrency": 1},
    "PULLB+ACKB": {"groupConcurrency": 0},
    "weighted PULL+ACK": {"groupConcurrency": 1, "groupWeights": WEIGHTS},
}


def fill(engine: Any, groups: int, jobs: int, options: dict[str, Any]) -> None:
    engine.apply({"cmd": "CreateQueue", "queue": "q", "options": {"ttr": 3_600_000, **options}}, NOW)
    for start in range(0, jobs, 10_000):
        items = [{"data": DATA, "group": f"g{i % groups}"} for i in range(start, min(jobs, start + 10_000))]
        engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": items}, NOW)


def drain(engine: Any, workload: str, pulls: int) -> float:
    """CPU seconds per job to take and acknowledge ``pulls`` jobs."""
    done = 0
    started = time.process_time()
    if workload == "PULLB+ACKB":
        while done < pulls:
            r = result(engine.apply(leased(engine, {"cmd": "PULLB", "queue": "q", "count": BATCH}), NOW))
            engine.apply({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]}, NOW)
            done += len(r["jobs"])
    else:
        for _ in range(pulls):
            r = result(engine.apply(leased(engine, {"cmd": "PULL", "queue": "q"}), NOW))
            engine.apply({"cmd": "ACK", "id": r["job"]["id"], "token": r["token"]}, NOW)
            done += 1
    return (time.process_time() - started) / done


def engine_table(sides: dict[str, Any], rounds: int, jobs: int, pulls: int) -> None:
    samples: dict[tuple[str, str, int], list[float]] = {}
    for r in range(rounds):
        for label, engine_class in (sides.items() if r % 2 == 0 else reversed(sides.items())):
            for workload, options in WORKLOADS.items():
                for groups in (GROUP_COUNTS if r % 2 == 0 else reversed(GROUP_COUNTS)):
                    engine = engine_class(0)
                    fill(engine, groups, jobs, options)
                    samples.setdefault((label, workload, groups), []).append(drain(engine, workload, pulls))
    print(f"engine CPU µs per job taken and acknowledged, {jobs:,} jobs waiting, {pulls:,} taken, "
          f"median of {rounds} interleaved rounds")
    print(f"| engine | workload | {GROUP_COUNTS[0]:,} groups | {GROUP_COUNTS[1]:,} groups | ratio |")
    print("|---|---|---|---|---|")
    for label in sides:
        for workload in WORKLOADS:
            few, many = (statistics.median(samples[(label, workload, g)]) * 1e6 for g in GROUP_COUNTS)
            print(f"| {label} | {workload} | {few:.2f} | {many:.2f} | {many / few:.2f} |")


def node_table(rounds: int, jobs: int) -> None:
    from rawproto import RawConn

    from shoal.cluster.launcher import LocalCluster, free_base_port

    trips = 2_000
    samples: dict[int, list[float]] = {g: [] for g in GROUP_COUNTS}
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=1, partitions=1, data_dir=tmp, base_port=free_base_port(1, 1)) as cluster:
            with RawConn(cluster.addresses[0], timeout_s=60.0, hello=False) as conn:
                for r in range(rounds):
                    for groups in (GROUP_COUNTS if r % 2 == 0 else reversed(GROUP_COUNTS)):
                        queue = f"groups-{r}-{groups}"
                        assert conn.call({"cmd": "CreateQueue", "queue": queue})["ok"]
                        for start in range(0, jobs, 10_000):
                            items = [{"data": b"x" * 100, "groupId": f"g{i % groups}"}
                                     for i in range(start, min(jobs, start + 10_000))]
                            assert conn.call({"cmd": "PUSHB", "queue": queue, "jobs": items}, 60.0)["ok"]
                        took = []
                        for _ in range(trips):
                            t = time.perf_counter()
                            got = conn.call({"cmd": "PULL", "queue": queue})
                            assert conn.call({"cmd": "ACK", "id": got["job"]["id"], "token": got["token"]})["ok"]
                            took.append(time.perf_counter() - t)
                        samples[groups].append(statistics.median(took))
                        conn.call({"cmd": "Obliterate", "queue": queue}, 60.0)
    print(f"\none node, raw connection: median wall µs per PULL + ACK round trip ({trips:,} per round, "
          f"{jobs:,} jobs waiting, median of {rounds} rounds)")
    print(f"| {GROUP_COUNTS[0]:,} groups | {GROUP_COUNTS[1]:,} groups | ratio |")
    print("|---|---|---|")
    few, many = (statistics.median(samples[g]) * 1e6 for g in GROUP_COUNTS)
    print(f"| {few:.0f} | {many:.0f} | {many / few:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--pulls", type=int, default=20_000)
    parser.add_argument("--base", help="also run node/state of this git revision")
    parser.add_argument("--node", action="store_true", help="add the end-to-end figure on one node")
    args = parser.parse_args()
    if args.pulls > args.jobs:
        parser.error("--pulls must not exceed --jobs")
    with tempfile.TemporaryDirectory() as tmp:
        sides: dict[str, Any] = {"this tree": tree_engine.PartitionEngine}
        if args.base:
            sides[args.base] = load_base(args.base, Path(tmp)).PartitionEngine
        engine_table(sides, args.rounds, args.jobs, args.pulls)
    if args.node:
        node_table(args.rounds, args.jobs)


if __name__ == "__main__":
    main()
