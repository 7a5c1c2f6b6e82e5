"""cProfile inside every node of a local 3-node cluster while one client sends lone PUSHes.

Where a lone PUSH's time goes on the leader and on the followers, per push: each node
process is started with a ``sitecustomize`` that turns cProfile on and off on SIGUSR2,
the driver sends ``--pushes`` lone PUSHes (one in flight) between the two signals, and
the script prints each node's functions by own time (microseconds per push; cProfile's
overhead inflates every figure, compare them with each other).

    python bench/profile_lone_push.py [--pushes 2000] [--top 25] [--out DIR]

Every loop is bounded by a count and a time limit; the cluster's processes are stopped
when the script ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_node import DATA_100, leader_conn  # noqa: E402 (bench/ is this script's directory)

_SITECUSTOMIZE = '''
import os, sys
if os.environ.get("SHOAL_PROFILE_DIR") and "shoal.node" in " ".join(getattr(sys, "orig_argv", [])):
    import cProfile, signal
    _profile = [None]
    def _toggle(signum, frame):
        if _profile[0] is None:
            _profile[0] = cProfile.Profile()
            _profile[0].enable()
        else:
            _profile[0].disable()
            _profile[0].dump_stats(os.path.join(os.environ["SHOAL_PROFILE_DIR"], f"{os.getpid()}.prof"))
            _profile[0] = None
    signal.signal(signal.SIGUSR2, _toggle)
'''


async def drive(cluster: LocalCluster, pushes: int, seconds: float) -> int:
    """Warm up, then send lone PUSHes between the two SIGUSR2s; the number sent."""
    conn = await leader_conn(cluster, "bench-lat")
    for _ in range(300):
        await conn.call({"cmd": "PUSH", "queue": "bench-lat", "data": DATA_100})
    for pid in cluster.pids.values():
        os.kill(pid, signal.SIGUSR2)
    await asyncio.sleep(0.3)
    sent = 0
    deadline = time.perf_counter() + seconds
    while sent < pushes and time.perf_counter() < deadline:
        reply = await conn.call({"cmd": "PUSH", "queue": "bench-lat", "data": DATA_100})
        assert reply["ok"], reply
        sent += 1
    for pid in cluster.pids.values():
        os.kill(pid, signal.SIGUSR2)
    await asyncio.sleep(1.0)  # the nodes write their profiles
    conn.close()
    return sent


def report(out: Path, pids: dict[str, int], leader: str, sent: int, top: int) -> None:
    for node_id, pid in sorted(pids.items()):
        path = out / f"{pid}.prof"
        if not path.exists():
            print(f"{node_id}: no profile written")
            continue
        stats = pstats.Stats(str(path))
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
        role = "leader" if node_id == leader else "follower"
        print(f"\n{node_id} ({role}): {stats.total_tt / sent * 1e6:.0f} us of own time per push (profiled), "  # type: ignore[attr-defined]
              f"{stats.total_calls / sent:.0f} calls per push")  # type: ignore[attr-defined]
        for (file, line, func), (_cc, calls, own, cumulative, _callers) in rows:
            where = f"{Path(file).name}:{line}" if file != "~" else "built-in"
            print(f"  {own / sent * 1e6:7.1f} us own {cumulative / sent * 1e6:7.1f} us cum "
                  f"{calls / sent:6.2f} calls  {func} ({where})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=30.0, help="time limit of the profiled pushes")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None, help="keep the .prof files here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or os.path.join(tmp, "profiles"))
        out.mkdir(parents=True, exist_ok=True)
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        os.environ["SHOAL_PROFILE_DIR"] = str(out)
        with LocalCluster(nodes=3, partitions=8, data_dir=os.path.join(tmp, "data"),
                          base_port=free_base_port(3, 8),
                          extra_env={"SHOAL_PROFILE_DIR": str(out)}) as cluster:
            cluster.wait_balanced(30.0)
            uvloop.install()
            sent = asyncio.run(drive(cluster, args.pushes, args.seconds))
            leader = cluster.leader_of(partition_for("bench-lat", cluster.topology().partitions)) or ""
            (out / "pids.json").write_text(json.dumps(cluster.pids))
            report(out, dict(cluster.pids), leader, sent, args.top)


if __name__ == "__main__":
    main()
