"""Pull throughput of a queue with 10,000 groups under flow-control limits, in engine CPU time.

    python bench/bench_limits.py [--groups 10000] [--per-group 5] [--rounds 5]

Each workload pushes ``groups * per_group`` jobs (one group each, round robin) and then
drains the queue with PULLB (100) + ACKB, the clock moving 10 ms per batch, and reports
the process CPU microseconds per job (pull + ack) and jobs per CPU second:

- ``none``: groupConcurrency 0 (no per-group limit at all), no rate limit: the baseline;
- ``groupConcurrency=1``: one active job per group (utube's rule);
- ``groupLimit=1/1s``: at most one lease per group per sliding second, so with 10,000
  groups and 10 ms per batch of 100 every lease parks its group until its window frees.

The three run interleaved, ``--rounds`` times, in one process; medians are printed with
each limited workload's throughput as a share of the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from shoal.cluster.codec import Raw
from shoal.node.state import PartitionEngine

DATA = Raw(b"\xc4\x64" + b"x" * 100)  # a 100-byte bin payload, as a client would send it
BATCH = 100
STEP_MS = 10
WORKLOADS: dict[str, dict[str, Any]] = {
    "none": {"groupConcurrency": 0},
    "groupConcurrency=1": {"groupConcurrency": 1},
    "groupLimit=1/1s": {"groupConcurrency": 0, "groupLimit": {"max": 1, "durationMs": 1000}},
}


def run(options: dict[str, Any], groups: int, per_group: int) -> float:
    """CPU seconds per job to drain the queue with PULLB + ACKB."""
    eng = PartitionEngine(0)
    now = 1_000
    eng.apply({"cmd": "CreateQueue", "queue": "q", "options": {"ttr": 3_600_000, **options}}, now)
    names = [f"tenant-{i}" for i in range(groups)]
    total = groups * per_group
    for start in range(0, total, 1000):
        jobs = [{"data": DATA, "group": names[i % groups]} for i in range(start, min(total, start + 1000))]
        eng.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, now)
    done = 0
    batches_max = 100 * total // BATCH + 1000  # bounded even if a limit starved the queue
    started = time.process_time()
    for _ in range(batches_max):
        if done >= total:
            break
        now += STEP_MS
        reply = eng.apply({"cmd": "PULLB", "queue": "q", "count": BATCH}, now).result
        ids = [j["id"] for j in reply["jobs"]]
        if ids:
            eng.apply({"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"]}, now)
            done += len(ids)
    spent = time.process_time() - started
    assert done == total, f"drained {done} of {total}"
    return spent / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--per-group", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in WORKLOADS}
    order = list(WORKLOADS)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else reversed(order):
            samples[name].append(run(WORKLOADS[name], args.groups, args.per_group))
    base = statistics.median(samples["none"])
    print(f"{args.groups} groups x {args.per_group} jobs, PULLB {BATCH} + ACKB, median of {args.rounds} rounds")
    for name, values in samples.items():
        per_job = statistics.median(values)
        print(f"  {name:20s} {per_job * 1e6:7.2f} us CPU/job  {1 / per_job:9.0f} jobs/CPU-s  "
              f"{100 * base / per_job:5.1f} % of none")


if __name__ == "__main__":
    main()
