"""What a waiting job of each kind costs one replica's memory: plain, prioritized, delayed, with a
custom id, a group, a tag, a dedupe entry.

    python bench/bench_job_kinds.py [--jobs 200000] [--kinds plain,priority,...] [--bulk 100]

For each kind, a fresh :class:`~shoal.node.state.PartitionEngine` with its job data in payload
files (a temporary directory, as a node keeps it) gets ``--jobs`` jobs of 100 bytes, each added
by its own ``PUSH`` as ``queue.add()`` sends it (with an ``idempotencyKey``), or with ``--bulk N``
as the items of ``PUSHB`` frames of N (``addBulk``), to one queue of the standard type. The
memory the engine holds afterwards, less what it held empty, divided by the jobs, is the kind's
cost per job: Python's allocations as ``tracemalloc`` counts them (the
objects themselves; the node's RSS adds the allocator's slack on top). The idempotency window's
keys are counted too; run with ``--no-keys`` to leave them out. Every loop is bounded by the
counts.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.cluster.codec import Raw
from shoal.node.partition.payload_files import PayloadFiles
from shoal.node.state import PartitionEngine

DATA = Raw(b"\xc4\x64" + b"x" * 100)  # a 100-byte bin payload, as a client would send it
NOW = 1_000_000

#: kind -> the options of job ``i`` of that kind.
KINDS: dict[str, Callable[[int], dict[str, Any]]] = {
    "plain": lambda i: {},
    "priority": lambda i: {"priority": i % 7},
    "delayed": lambda i: {"delay": 3_600_000},
    "custom id": lambda i: {"customId": f"order-{i:012d}"},
    "group": lambda i: {"group": f"tenant-{i % 1000}"},
    "tag": lambda i: {"tag": "import"},
    "dedupe": lambda i: {"dedupe": {"id": f"d-{i:012d}", "ttlMs": 3_600_000}},
}


def cost(directory: Path, kind: str, jobs: int, keys: bool, bulk: int = 0) -> float:
    """Bytes per job the engine holds once ``jobs`` jobs of ``kind`` wait."""
    options = KINDS[kind]
    payloads = PayloadFiles(directory)
    gc.collect()
    tracemalloc.start()
    engine = PartitionEngine(0, payloads.new())
    engine.apply({"cmd": "PUSH", "queue": "q", "data": DATA}, NOW)  # the queue exists before the count
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    items: list[dict[str, Any]] = []
    for i in range(jobs):
        cmd = {"cmd": "PUSH", "queue": "q", "data": DATA, **options(i)}
        if keys:
            cmd["idempotencyKey"] = f"k-{i:012d}"
        if not bulk:
            engine.apply(cmd, NOW)
            continue
        del cmd["cmd"], cmd["queue"]
        items.append(cmd)
        if len(items) == bulk or i == jobs - 1:
            engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": items}, NOW)
            items = []
    payloads.collect()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    counts = engine.apply({"cmd": "GetJobCounts", "queue": "q"}, NOW).result["counts"]
    assert sum(counts.values()) == jobs + 1, counts
    payloads.close()
    return (after - before) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    parser.add_argument("--no-keys", dest="keys", action="store_false", help="adds without an idempotencyKey")
    parser.add_argument("--bulk", type=int, default=0, metavar="N", help="add the jobs N to a PUSHB frame")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-kinds-"))
    try:
        how = f"PUSHB frames of {args.bulk}" if args.bulk else "one PUSH each"
        print(f"{args.jobs:,} waiting jobs of 100 B per kind, {how}, idempotency keys "
              f"{'on' if args.keys else 'off'}; bytes per job the engine holds (tracemalloc)")
        for kind in args.kinds.split(","):
            held = cost(root / kind.replace(' ', '-'), kind, args.jobs, args.keys, args.bulk)
            print(f"  {kind:<10} {held:8.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
