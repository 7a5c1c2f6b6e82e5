"""Queue-wide commands on a big backlog: what one replica's apply of each costs.

    python bench/bench_queue_ops.py [--jobs 1000000] [--completed 1000] [--events]

Every replica applies these commands in full, so one that looks at every job of a queue
holds every replica's loop for as long. For each command, a fresh engine (the pure
:class:`~shoal.node.state.PartitionEngine`, its job data in payload files in a temporary
directory, as a node keeps it) gets ``--jobs`` jobs of 100
bytes in ``PUSHB`` batches of 10,000 to one queue, of which the first ``--completed`` are
pulled and acked; then the command is applied once and timed, without job events (as a node
applies it while nobody subscribes to them) or, with ``--events``, with them. Prints, per command, the jobs
it removed or listed and the milliseconds its apply took. Every loop is bounded by the counts.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.cluster.codec import Raw
from shoal.node.partition.payload_files import PayloadFiles
from shoal.node.state import PartitionEngine

DATA = Raw(b"\xc4\x64" + b"x" * 100)  # a 100-byte bin payload, as a client would send it
BATCH = 10_000
NOW = 1_000


def backlog(payloads: PayloadFiles, jobs: int, completed: int) -> PartitionEngine:
    """An engine whose queue ``q`` holds ``jobs`` jobs, the first ``completed`` of them acked."""
    e = PartitionEngine(0, payloads.new())
    batch = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": DATA}] * BATCH}
    for _ in range(jobs // BATCH):
        e.apply(batch, NOW)
    left = completed
    while left > 0:
        r = e.apply({"cmd": "PULLB", "queue": "q", "count": min(left, 1_000), "ttr": 600_000}, NOW).result
        if not r["jobs"]:
            break
        e.apply({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]}, NOW)
        left -= len(r["jobs"])
    return e


#: (label, command); a command given as a callable is built from the engine (a cursor near the end).
COMMANDS: list[tuple[str, Callable[[PartitionEngine], dict[str, Any]]]] = [
    ("Clean completed, limit 100", lambda e: {"cmd": "Clean", "queue": "q", "state": "completed", "grace": 0,
                                              "limit": 100}),
    ("Clean completed", lambda e: {"cmd": "Clean", "queue": "q", "state": "completed", "grace": 0}),
    ("Clean waiting, limit 1,000", lambda e: {"cmd": "Clean", "queue": "q", "state": "waiting", "grace": 0,
                                              "limit": 1_000}),
    ("GetJobs completed, 100", lambda e: {"cmd": "GetJobs", "queue": "q", "state": "completed", "limit": 100}),
    ("GetJobs waiting, 100 after the last-but-100", lambda e: {"cmd": "GetJobs", "queue": "q", "state": "waiting",
                                                               "limit": 100, "afterSeq": e.seq - 100}),
    ("Drain", lambda e: {"cmd": "Drain", "queue": "q"}),
    ("Truncate", lambda e: {"cmd": "Truncate", "queue": "q"}),
    ("Obliterate", lambda e: {"cmd": "Obliterate", "queue": "q"}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--completed", type=int, default=1_000)
    ap.add_argument("--events", action="store_true", help="record job events (a removed event per job)")
    args = ap.parse_args()
    print(f"{args.jobs:,} jobs of 100 B in one queue, the first {args.completed:,} completed;"
          f" events {'on' if args.events else 'off'}")
    directory = Path(tempfile.mkdtemp(prefix="shoal-queue-ops-"))
    try:
        payloads = PayloadFiles(directory / "payloads")
        for label, make in COMMANDS:
            e = backlog(payloads, args.jobs, args.completed)
            cmd = make(e)
            held = e.job_count()
            gc.collect()
            t = time.perf_counter()
            reply = e.apply(cmd, NOW + 10_000, events=args.events).result
            ms = (time.perf_counter() - t) * 1000
            jobs = len(reply["jobs"]) if reply and "jobs" in reply else held - e.job_count()  # listed, or removed
            print(f"{label:<45} {jobs:>10,} jobs {ms:>10.1f} ms")
            payloads.discard(e.segments.space)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
