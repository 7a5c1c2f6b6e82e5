"""A follower far behind the leader's journal catches up by snapshot while the leader keeps serving.

    python bench/bench_catchup.py [--jobs 300000] [--per-entry 100] [--window 1] [--data-bytes 200]

Against a local 3-node cluster with 4 partitions and a snapshot every 1,000 entries (real node
processes):

1. one follower of the benchmark queue's partition is stopped (SIGSTOP);
2. ``--jobs`` jobs of ``--data-bytes`` bytes go to that partition as PUSHB frames of
   ``--per-entry`` jobs, one frame in flight (so one frame is one log entry), or ``--window``
   frames in flight (frames that reach the leader in one loop iteration share an entry; the
   number of entries is printed): the leader takes snapshots and compacts its journal far past
   the stopped follower's log;
3. a connection pings the leader every 5 ms from three seconds before the follower resumes
   (SIGCONT) until it has caught up: its applied index reaches the leader's commit index;
4. printed: catch-up time, the leader's Ping p50/p99/p99.9/max during it, the bytes the leader's
   Raft port sent meanwhile and in snapshot streams, and the elections on any node from the
   resume on, with how many of them were leadership transfers a leader asked for (the balancer
   hands a partition back to its preferred replica once that one holds every committed entry);
   elections beyond those mean the stopped follower's return deposed someone.

Every loop is bounded by a count and a time limit; the nodes are stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_node import Profiler  # noqa: E402 (bench/ is this script's directory)
from bench_snapshot import Conn, Pinger, percentiles  # noqa: E402

QUEUE = "catchup"
PARTITIONS = 4
PING_INTERVAL_S = 0.005
#: Pings before the resume, to compare with the machine's own noise.
BASELINE_S = 3.0
CATCHUP_WAIT_S = 600.0
PINGS_MAX = 1_000_000


def local(address: str, partition: int) -> dict[str, Any]:
    conn = Conn(address)
    try:
        return conn.call({"cmd": "Stats", "local": True, "partition": partition})
    finally:
        conn.close()


def push(address: str, jobs: int, per_entry: int, data: bytes, window: int = 1) -> float:
    """Push ``jobs`` jobs as PUSHB frames of ``per_entry`` with ``window`` frames in flight."""
    conn = Conn(address, timeout_s=120.0)
    t0 = time.perf_counter()
    try:
        if window <= 1:
            done = 0
            while done < jobs:
                n = min(per_entry, jobs - done)
                _check(conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": data}] * n}))
                done += n
        else:
            sizes = [min(per_entry, jobs - at) for at in range(0, jobs, per_entry)]
            frames = ({"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": data}] * n} for n in sizes)
            for reply in conn.pipeline(frames, window):
                _check(reply)
    finally:
        conn.close()
    return time.perf_counter() - t0


def _check(reply: dict[str, Any]) -> None:
    if not reply.get("ok"):
        raise RuntimeError(f"PUSHB refused: {reply}")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--per-entry", type=int, default=100)
    parser.add_argument("--window", type=int, default=1, help="PUSHB frames in flight (1: one entry per frame)")
    parser.add_argument("--data-bytes", type=int, default=200)
    parser.add_argument("--disk-class", action="store_true",
                        help="create the queue with durable: false (entries commit without waiting for fsync)")
    parser.add_argument("--snapshot-entries", type=int, default=1_000)
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="py-spy collapsed stacks of every node for --profile-seconds from the resume")
    parser.add_argument("--profile-seconds", type=float, default=6.0)
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: the stopped follower is resumed and every node stopped by pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = partition_for(QUEUE, PARTITIONS)
    env = {"SHOAL_SNAPSHOT_ENTRIES_MIN": str(args.snapshot_entries)}
    with tempfile.TemporaryDirectory(prefix="shoal-catchup-") as data_dir, \
            LocalCluster(nodes=3, partitions=PARTITIONS, data_dir=data_dir, base_port=free_base_port(3, PARTITIONS),
                         extra_env=env) as cluster:
        cluster.wait_balanced()
        leader = cluster.leader_of(p)
        assert leader is not None
        follower = next(n for n in cluster.node_ids if n != leader)
        laddr, faddr = cluster.address_of(leader), cluster.address_of(follower)
        stopped_elections = _elections(local(faddr, p))
        if args.disk_class:
            _check(Conn(laddr).call({"cmd": "CreateQueue", "queue": QUEUE, "options": {"durable": False}}))
        os.kill(cluster.pids[follower], signal.SIGSTOP)
        try:
            seconds = push(laddr, args.jobs, args.per_entry, b"x" * args.data_bytes, args.window)
        except BaseException:
            os.kill(cluster.pids[follower], signal.SIGCONT)
            raise
        view = local(laddr, p)
        commit = view["replicas"][str(p)]["commitIndex"]
        sent0 = view["raft"].get("bytesSent", 0)
        print(f"pushed {args.jobs} jobs of {args.data_bytes} B in {seconds:.1f} s "
              f"({args.jobs / seconds:,.0f} jobs/s); leader {leader} commit index {commit}, "
              f"snapshot at {view['replicas'][str(p)]['raft']['snapshot']}")
        others = [n for n in cluster.node_ids if n != follower]
        elections0 = _sum(_elections(local(cluster.address_of(n), p)) for n in others)
        pinger = Pinger(laddr, PING_INTERVAL_S, PINGS_MAX)
        pinger.start()
        profiler = Profiler(cluster, args.profile, "catchup", args.profile_seconds).__enter__()
        time.sleep(BASELINE_S)
        t0 = time.perf_counter()
        os.kill(cluster.pids[follower], signal.SIGCONT)
        deadline = time.monotonic() + CATCHUP_WAIT_S
        caught = None
        while time.monotonic() < deadline:
            try:
                applied = local(faddr, p)["replicas"][str(p)]["appliedIndex"]
            except (OSError, KeyError):
                applied = -1
            if applied >= commit:
                caught = time.perf_counter() - t0
                break
            time.sleep(0.05)
        pinger.stop_flag.set()
        pinger.join(10)
        t1 = time.perf_counter()
        profiler.__exit__(None, None, None)
        view = local(laddr, p)
        sent = view["raft"].get("bytesSent", 0) - sent0
        snap_sent = view["replicas"][str(p)]["raft"].get("snapshotBytesSent", 0)
        now_elections = _sum(_elections(local(cluster.address_of(n), p)) for n in cluster.node_ids)
        elections, transfers = (now_elections[k] - elections0[k] - stopped_elections[k] for k in (0, 1))
        during = [lat for t, lat in pinger.samples if t0 <= t <= t1]
        if caught is None:
            print(f"follower {follower} did NOT catch up within {CATCHUP_WAIT_S:.0f} s")
        else:
            print(f"follower {follower} caught up in {caught:.2f} s (applied index {commit})")
        print(f"leader Ping during catch-up: {percentiles(during)}")
        print(f"leader Ping in the second before (the machine's own noise): "
              f"{percentiles([lat for t, lat in pinger.samples if t < t0])}")
        resumed_at = time.time() - (time.perf_counter() - t0)
        for who, node in (("leader", leader), ("follower", follower)):
            for line in cluster.log_file(node).read_text(errors="replace").splitlines():
                if f"partition {p}:" in line and "snapshot" in line:
                    when = _log_time(line)
                    at = f"{when - resumed_at:+7.2f} s" if when is not None else "        "
                    print(f"  {at} {who} log:", line.split(" ", 2)[2][:200])
        print(f"leader Raft port sent {sent / 1e6:.1f} MB meanwhile; snapshot streams sent {snap_sent / 1e6:.1f} MB "
              f"in all; elections from the follower's resume on (every node, every partition): {elections}, "
              f"of which leadership transfers a leader asked for (the balancer handing a partition back "
              f"to its preferred replica): {transfers}")


def _log_time(line: str) -> float | None:
    """The wall time of a node log line (``%(asctime)s``: local time, milliseconds after a comma)."""
    try:
        stamp, millis = line[:23].split(",")
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
    except ValueError:
        return None


def _elections(stats: dict[str, Any]) -> tuple[int, int]:
    """A node's campaigns, and those of them that were requested leadership transfers."""
    raft = stats["raft"]
    return int(raft["elections"]), int(raft.get("transferElections", 0))


def _sum(pairs: Any) -> tuple[int, int]:
    elections = transfers = 0
    for e, t in pairs:
        elections, transfers = elections + e, transfers + t
    return elections, transfers


if __name__ == "__main__":
    main()
