"""What the payload files' checksums cost: appends written, and runs of jobs read back from the disk.

    python bench/bench_payload_checks.py [--jobs 200000] [--sizes 100,1024] [--run 100] [--rounds 3]

For each job size, a :class:`~shoal.node.partition.payload_files.FileSpace` in a temporary directory gets
``--jobs`` jobs appended and flushed (the writes a node's apply makes), then every job is read
back in runs of ``--run`` jobs, each run one read from the disk (the page cache) as a pull's is,
with the space's last block forgotten before each run. Done once with the checksums as the node
keeps them and once with them switched off in this process (a plain ``pread``, no CRC32C per
block written), ``--rounds`` times in turns; prints the median microseconds per job of each.
Every loop is bounded by the counts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shoal.node.partition import payload_files
from shoal.node.payload_checks import BlockChecks
from shoal.node.partition.payload_files import FileSpace


@contextmanager
def checks_off() -> Iterator[None]:
    """The space without checksums: reads are plain ``pread`` calls and writes record nothing."""
    read, wrote = payload_files.read_checked, BlockChecks.wrote

    def plain_read(fd: int, path: Path, checks: Any, start: int, end: int) -> bytes:
        return os.pread(fd, end - start, start)

    payload_files.read_checked = plain_read  # type: ignore[assignment]
    BlockChecks.wrote = lambda self, at, data: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        payload_files.read_checked = read  # type: ignore[assignment]
        BlockChecks.wrote = wrote  # type: ignore[method-assign]


def one_round(directory: Path, jobs: int, size: int, run: int) -> tuple[float, float]:
    """(µs per job appended and written, µs per job read back in runs) for one fresh space."""
    blob = os.urandom(size)
    space = FileSpace(directory)
    started = time.perf_counter()
    for _ in range(jobs):
        space.append(blob)
    space.flush()
    wrote = time.perf_counter() - started
    started = time.perf_counter()
    for first in range(0, jobs, run):
        space._cache = b""  # noqa: SLF001 - each run read from the disk, as a pull deep in a queue is
        space.read(first * size, min(first + run, jobs) * size)
    read = time.perf_counter() - started
    space.discard()
    return wrote / jobs * 1e6, read / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--sizes", default="100,1024", help="job sizes in bytes, comma-separated")
    parser.add_argument("--run", type=int, default=100, help="jobs per read (a pull's run)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-checks-"))
    try:
        print(f"{args.jobs:,} jobs per size, runs of {args.run}, {args.rounds} rounds (medians, µs per job)")
        print(f"{'size':>6} {'write, checked':>15} {'write, plain':>13} {'read, checked':>14} {'read, plain':>12}")
        for size in (int(s) for s in args.sizes.split(",")):
            checked: list[tuple[float, float]] = []
            plain: list[tuple[float, float]] = []
            for k in range(args.rounds):
                order = (True, False) if k % 2 == 0 else (False, True)
                for with_checks in order:
                    directory = root / f"s{size}-{k}-{int(with_checks)}"
                    if with_checks:
                        checked.append(one_round(directory, args.jobs, size, args.run))
                    else:
                        with checks_off():
                            plain.append(one_round(directory, args.jobs, size, args.run))
                    shutil.rmtree(directory, ignore_errors=True)
            cw, cr = (statistics.median(x) for x in zip(*checked))
            pw, pr = (statistics.median(x) for x in zip(*plain))
            print(f"{size:>6} {cw:>15.3f} {pw:>13.3f} {cr:>14.3f} {pr:>12.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
