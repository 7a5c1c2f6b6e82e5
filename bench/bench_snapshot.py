"""Snapshot benchmark: a partition holding millions of jobs snapshots without stalling its nodes.

    python bench/bench_snapshot.py [--jobs 2000000] [--tail 100000]

Against a local 3-node cluster with one partition (real node processes):

1. loads ``--jobs`` jobs of ~117 bytes into the partition through the client (``add_bulk``,
   i.e. PUSHB, 1,000 jobs per call, 4 calls in flight), automatic snapshots off;
2. sends every node SIGUSR1 (snapshot now) and, on one connection per node, sends a ``Ping``
   every 2 ms from one second before until every node reports its snapshot durable:
   Ping latency p50/p99/p99.9/max per node during the snapshot, the snapshot's duration and
   the parent's fork time, elections before and after (all read from the node logs);
3. pushes ``--tail`` more jobs (journal after the snapshot), stops the cluster and measures
   the restart: from starting the processes until every node answers and a PULL-free count of
   the queue (``GetJobCounts`` on the leader) shows every job.

Every loop is bounded by a count and a time limit; the nodes are stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from shoal.client import AsyncClient
from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.launcher import LocalCluster, free_base_port

QUEUE = "snapbench"
DATA = b"x" * 100  # ~117 bytes per job on the wire with its envelope
BULK = 1_000
INFLIGHT = 4
SNAPSHOT_WAIT_S = 900.0
RESTART_WAIT_S = 900.0
PINGS_MAX = 5_000_000
#: One Ping per node every this long (a probe, not a load: back-to-back pings from three
#: threads would take a core of their own on this 2-core machine).
PING_INTERVAL_S = 0.002


class Conn:
    """One blocking connection speaking raw frames (Hello, then calls)."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(requests=False)
        self.next_id = 1
        self.call({"cmd": "Hello", "protocolVersion": 2})

    def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        req_id = self.next_id
        self.next_id += 1
        self.sock.sendall(encode({**frame, "reqId": req_id}))
        while True:
            reply = next(self.decoder, None)
            if reply is not None:
                if reply.get("reqId") == req_id:
                    return reply
                continue
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by node")
            self.decoder.feed(data)

    def pipeline(self, frames: Iterator[dict[str, Any]], window: int) -> Iterator[dict[str, Any]]:
        """Send ``frames`` with at most ``window`` unanswered; yield the replies as they come."""
        in_flight = 0
        pending = iter(frames)
        exhausted = False
        while True:
            while not exhausted and in_flight < window:
                frame = next(pending, None)
                if frame is None:
                    exhausted = True
                    break
                self.sock.sendall(encode({**frame, "reqId": self.next_id}))
                self.next_id += 1
                in_flight += 1
            if in_flight == 0:
                return
            reply = next(self.decoder, None)
            if reply is None:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("closed by node")
                self.decoder.feed(data)
                continue
            if "reqId" not in reply:  # an event (topology), not an answer
                continue
            in_flight -= 1
            yield reply

    def close(self) -> None:
        self.sock.close()


def local_stats(address: str) -> dict[str, Any]:
    conn = Conn(address)
    try:
        return conn.call({"cmd": "Stats", "local": True, "partition": 0})
    finally:
        conn.close()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def load(cluster: LocalCluster, jobs: int) -> float:
    client = AsyncClient(cluster.addresses)
    await client.connect()
    try:
        q = client.queue(QUEUE)
        t0 = time.perf_counter()
        done = 0
        while done < jobs:
            calls = min(INFLIGHT, -(-(jobs - done) // BULK))
            sizes = [min(BULK, jobs - done - k * BULK) for k in range(calls)]
            await asyncio.gather(*(q.add_bulk([DATA] * n) for n in sizes))
            done += sum(sizes)
        return time.perf_counter() - t0
    finally:
        await client.close()


def wait_all_applied(cluster: LocalCluster, timeout_s: float = 600.0, digests: bool = False) -> None:
    """Every replica applied what was committed when this was called (and, with ``digests``, its
    background /stats digest covers that index too, so no digest child overlaps what follows)."""
    deadline = time.monotonic() + timeout_s
    target = max(local_stats(a)["replicas"]["0"]["commitIndex"] for a in cluster.addresses)
    while time.monotonic() < deadline:
        views = [local_stats(a)["replicas"]["0"] for a in cluster.addresses]
        if all(v["appliedIndex"] >= target and (not digests or v["digestIndex"] >= target) for v in views):
            return
        time.sleep(1.0)
    raise TimeoutError("replicas did not converge")


def log_lines(cluster: LocalCluster, node_id: str, marker: str) -> list[str]:
    return [line for line in cluster.log_file(node_id).read_text(errors="replace").splitlines() if marker in line]


def elections(cluster: LocalCluster) -> int:
    """Campaigns started, from the node logs (a Stats call would start a digest child)."""
    return sum(len(log_lines(cluster, n, "-> candidate")) for n in cluster.node_ids)


class Pinger(threading.Thread):
    """A Ping every ``interval_s`` on its own connection (at most ``pings_max``), recording
    (send time, latency)."""

    def __init__(self, address: str, interval_s: float = PING_INTERVAL_S, pings_max: int = PINGS_MAX) -> None:
        super().__init__(daemon=True)
        self.conn = Conn(address)
        self.interval_s = interval_s
        self.pings_max = pings_max
        self.samples: list[tuple[float, float]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set() and len(self.samples) < self.pings_max:
            t0 = time.perf_counter()
            self.conn.call({"cmd": "Ping"})
            t1 = time.perf_counter()
            self.samples.append((t0, t1 - t0))
            time.sleep(max(0.0, self.interval_s - (t1 - t0)))
        self.conn.close()


def percentiles(latencies: list[float]) -> str:
    if not latencies:
        return "no samples"
    s = sorted(latencies)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))] * 1000

    return (f"n={len(s)} p50 {at(0.5):.2f} ms, p99 {at(0.99):.2f} ms, p99.9 {at(0.999):.2f} ms, "
            f"max {s[-1] * 1000:.2f} ms")


def job_count(cluster: LocalCluster) -> int | None:
    leader = cluster.leader_of(0)
    if leader is None:
        return None
    try:
        conn = Conn(cluster.address_of(leader), timeout_s=5.0)
    except OSError:
        return None
    try:
        reply = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})
    finally:
        conn.close()
    return sum(reply["counts"].values()) if reply.get("ok") else None


def snapshot_round(cluster: LocalCluster) -> None:
    """SIGUSR1 to every node; Ping each node until every node logged its snapshot durable.

    Progress is read from the node logs, not Stats: Stats would start /stats digest children
    (the partition's state moves with the leader's periodic entries) beside the snapshots."""
    before = {n: len(log_lines(cluster, n, "durable in")) for n in cluster.node_ids}
    e0 = elections(cluster)
    pingers = [Pinger(a) for a in cluster.addresses]
    for p in pingers:
        p.start()
    time.sleep(1.0)
    t0 = time.perf_counter()
    for node_id in cluster.node_ids:
        os.kill(cluster.pids[node_id], signal.SIGUSR1)
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while time.monotonic() < deadline:
        if all(len(log_lines(cluster, n, "durable in")) > before[n] for n in cluster.node_ids):
            break
        time.sleep(0.2)
    else:
        raise TimeoutError("snapshots did not finish")
    t1 = time.perf_counter()
    time.sleep(0.5)
    for p in pingers:
        p.stop_flag.set()
    for p in pingers:
        p.join(10)
    e1 = elections(cluster)
    print(f"snapshot round: {t1 - t0:.2f} s from SIGUSR1 until every node's snapshot was durable")
    for node_id, p in zip(cluster.node_ids, pingers):
        during = [lat for t, lat in p.samples if t0 <= t <= t1]
        base = [lat for t, lat in p.samples if t < t0]
        worst = max(((lat, t) for t, lat in p.samples if t0 <= t <= t1), default=(0.0, t0))
        started = log_lines(cluster, node_id, "started in child")[-1]
        durable = log_lines(cluster, node_id, "durable in")[-1]
        fork = started.rsplit("(fork ", 1)[1].rstrip(")")
        took = durable.rsplit("durable in ", 1)[1]
        print(f"  {node_id}: snapshot {took}, fork {fork}; Ping during: {percentiles(during)} "
              f"(max at +{worst[1] - t0:.2f} s); before: {percentiles(base)}")
    print(f"elections (all nodes, from the logs): before {e0}, after {e1}")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when redirected to a file
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2_000_000)
    parser.add_argument("--tail", type=int, default=100_000)
    parser.add_argument("--malloc-hugepages", action="store_true",
                        help="run the nodes with PYTHONMALLOC=malloc GLIBC_TUNABLES=glibc.malloc.hugetlb=1: "
                             "the heap on transparent huge pages, far fewer page-table entries to copy at fork")
    args = parser.parse_args()
    never = {"SHOAL_SNAPSHOT_ENTRIES_MIN": str(10**9), "SHOAL_SNAPSHOT_INTERVAL_S": str(10**9)}
    if args.malloc_hugepages:
        never |= {"PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    with tempfile.TemporaryDirectory(prefix="shoal-snapbench-") as data_dir, \
            LocalCluster(nodes=3, partitions=1, data_dir=data_dir, base_port=free_base_port(3, 1),
                         extra_env=never) as cluster:
        cluster.wait_balanced()
        seconds = asyncio.run(load(cluster, args.jobs))
        print(f"loaded {args.jobs} jobs in {seconds:.1f} s ({args.jobs / seconds:,.0f} jobs/s)")
        t0 = time.perf_counter()
        wait_all_applied(cluster, digests=True)  # a digest child must not overlap the snapshots
        rss = ", ".join(f"{n} {rss_mib(pid):.0f} MiB" for n, pid in cluster.pids.items())
        print(f"replicas applied everything and computed their /stats digest {time.perf_counter() - t0:.1f} s "
              f"after the load; RSS {rss}")
        snapshot_round(cluster)

        if args.tail:
            asyncio.run(load(cluster, args.tail))
            wait_all_applied(cluster)
        total = args.jobs + args.tail
        cluster.stop()
        t0 = time.perf_counter()
        cluster.start()
        ready = time.perf_counter() - t0
        deadline = time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline and job_count(cluster) != total:
            time.sleep(0.2)
        counted = time.perf_counter() - t0
        print(f"restart ({args.jobs} jobs in the snapshot + {args.tail} in the journal after it): "
              f"nodes ready {ready:.1f} s, all {total} jobs counted on the leader {counted:.1f} s")
        wait_all_applied(cluster)
        rss = ", ".join(f"{n} {rss_mib(pid):.0f} MiB" for n, pid in cluster.pids.items())
        print(f"after the restart, every replica applied everything: RSS {rss}")


if __name__ == "__main__":
    main()
