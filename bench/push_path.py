"""Which of Shoal's modules a PUSH runs code in on the leader of a 3-node cluster, and how often.

Every node of a local 3-node cluster (one partition, three replicas) runs under a profile hook
that counts the calls of Shoal's own functions by the file they are in (``_traced_node.py``,
beside this script). The script measures the calls of an idle window (heartbeats, timers), then
sends ``--pushes`` PUSHes one after another (each its own Raft entry) through the partition's
leader, and prints, per unit, the calls each PUSH added on the leader beyond the idle rate.

A unit is what ``docs/architecture.md`` counts as one module of the path: a package entered
through one class counts once (``node/raft/`` through ``PartitionReplica``, ``node/state/``
through ``PartitionEngine``, ``node/partition/`` through ``Partition``), a private module
(``cluster/_fast_frames.py``, ``cluster/_fields.py``) counts with the public module it serves,
and every other file is a unit of its own. A unit runs on the path when each PUSH adds at
least :data:`ON_PATH_CALLS` calls there.

    python bench/push_path.py [--pushes 400] [--files]

``--files`` also lists the files inside each unit. The hook slows the nodes many times over:
the counts are what this measures, not the time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.client import Client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Calls per PUSH beyond the idle rate from which a unit counts as on the path.
ON_PATH_CALLS = 0.9
#: Packages the path enters through one class, each counted as one unit.
PACKAGES = ("node/raft/", "node/state/", "node/partition/")
#: Private modules and the public module each serves.
PRIVATE_OWNERS = {"cluster/_fast_frames.py": "cluster/codec.py", "cluster/_fields.py": "cluster/commands.py"}
IDLE_S = 3.0
SETTLE_S = 2.0
PUSH_TIMEOUT_S = 120.0


def unit_of(path: str) -> str:
    """The unit a Shoal file (relative to the repository) counts in."""
    for package in PACKAGES:
        if path.startswith(package):
            return package
    return PRIVATE_OWNERS.get(path, path)


def read_counts(path: Path) -> list[tuple[float, dict[str, int]]]:
    """The ``(time, {file: calls})`` snapshots a traced node wrote."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            stamp, counts = json.loads(line)
        except ValueError:
            continue  # a line cut short as the node was stopped
        rows.append((float(stamp), counts))
    return rows


def window(rows: list[tuple[float, dict[str, int]]], start: float, end: float) -> tuple[float, dict[str, int]]:
    """Seconds and calls per file between the last snapshot at or before ``start`` and the first at
    or after ``end``."""
    before = max((r for r in rows if r[0] <= start), key=lambda r: r[0])
    after = min((r for r in rows if r[0] >= end), key=lambda r: r[0])
    files = set(before[1]) | set(after[1])
    return after[0] - before[0], {f: after[1].get(f, 0) - before[1].get(f, 0) for f in files}


def per_push(rows: list[tuple[float, dict[str, int]]], idle: tuple[float, float], pushes: tuple[float, float],
             n: int) -> dict[str, float]:
    """Calls per PUSH by file: the push window's calls less the idle rate over its length."""
    idle_s, idle_calls = window(rows, *idle)
    push_s, push_calls = window(rows, *pushes)
    return {f: (calls - idle_calls.get(f, 0) / idle_s * push_s) / n for f, calls in push_calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pushes", type=int, default=400)
    parser.add_argument("--files", action="store_true", help="list the files inside each unit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="push-path-") as tmp:
        out = Path(tmp) / "counts"
        out.mkdir()
        with LocalCluster(nodes=3, partitions=1, data_dir=Path(tmp) / "cluster", base_port=free_base_port(3, 1),
                          node_command=[sys.executable, str(HERE / "_traced_node.py")],
                          extra_env={"SHOAL_TRACE_DIR": str(out), "SHOAL_TRACE_ROOT": str(ROOT)}) as cluster:
            cluster.start()
            leader = cluster.leader_of(0)
            assert leader is not None, "partition 0 has no leader"
            with Client([cluster.address_of(leader)]) as client:
                queue = client.queue("push-path")
                queue.add({"warm": True})
                time.sleep(SETTLE_S)
                idle = (time.time(), time.time() + IDLE_S)
                time.sleep(IDLE_S)
                started = time.time()
                deadline = started + PUSH_TIMEOUT_S
                sent = 0
                while sent < args.pushes and time.time() < deadline:
                    queue.add({"n": sent})
                    sent += 1
                pushed = (started, time.time())
                time.sleep(SETTLE_S)  # a snapshot after the window's end
            pid = cluster.pids[leader]
        rows = read_counts(out / f"{pid}.jsonl")
    calls = per_push(rows, idle, pushed, sent)
    units: dict[str, float] = defaultdict(float)
    files: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for f, c in calls.items():
        units[unit_of(f)] += c
        files[unit_of(f)].append((f, c))
    on_path = sorted(((u, c) for u, c in units.items() if c >= ON_PATH_CALLS), key=lambda uc: -uc[1])
    print(f"{sent} PUSHes, one at a time, through the leader of a 3-node cluster: calls per PUSH on the leader")
    print()
    print("| unit | calls per PUSH |")
    print("|---|---|")
    for unit, c in on_path:
        print(f"| `{unit}` | {c:.1f} |")
        if args.files:
            for f, fc in sorted(files[unit], key=lambda fc: -fc[1]):
                if fc >= 0.05:
                    print(f"|   `{f}` | {fc:.1f} |")
    print()
    print(f"{len(on_path)} units run code on each PUSH; {sum(c for _, c in on_path):.0f} calls per PUSH in all")


if __name__ == "__main__":
    main()
