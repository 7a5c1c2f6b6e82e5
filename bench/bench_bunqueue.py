"""bunqueue's own client against bunqueue's own server (memory and SQLite) and Shoal (1 and 3 nodes).

Every workload is ``bench/bench_bunqueue.ts`` run by Bun with bunqueue's client and its connection
pool (4 connections, at most 100 commands in flight on each):

- ``bulk``: 100 x ``addBulk`` of 1,000 jobs (4 at once);
- ``single``: 20,000 ``add`` (one ``PUSH`` each, 400 in flight);
- ``drain``: 50,000 jobs taken and acked by a ``Worker`` (concurrency 50, ``PULLB`` of 10, ``ACKB``).

Rounds are interleaved (each round runs every target once per workload, in a rotated order), so
load on the machine hits every target alike; the table shows each cell's median of the rounds.
Shoal runs with its defaults (the fsync durability class); on 3 nodes the client connects to the
leader of the queue's partition; the target ``shoal-3-forwarded`` (the same cluster) and
``--through-follower`` (every Shoal target) connect to a node that leads none, so every command is
forwarded. ``--disk-class`` creates each Shoal queue with ``durable: false``
first (the disk class: entries reach the disk within ``sync_interval_ms`` instead of being
fsynced before the answer), the closest Shoal has to bunqueue's in-memory server. bunqueue's
server runs from the same npm package as the client, on loopback, with its per-client request
limit raised out of the way.

    python bench/bench_bunqueue.py --rounds 5
    python bench/bench_bunqueue.py --rounds 3 --workloads single,drain --targets bunqueue-memory,shoal-3,shoal-3-forwarded
    python bench/bench_bunqueue.py --rounds 5 --workloads drain --disk-class
    BQ_SINGLES=150000 python bench/bench_bunqueue.py --workloads single --targets shoal-3,shoal-3-forwarded --cpu

``--cpu`` adds the CPU time each process spent per job during each run (utime + stime from
``/proc`` before and after, divided by the jobs) and a table of its medians: bunqueue's client
(Bun), and each server process, a Shoal node named by its part (the leader of the queue's
partition, the node the client talks to when that is another, the other replicas). For Shoal it
also gives the frames each node wrote to the other nodes per 1,000 jobs
(``shoal_peer_frames_sent_total`` before and after): each one wakes a peer process. The workloads'
sizes come from ``BQ_BULK_BATCHES``, ``BQ_BULK_SIZE``, ``BQ_SINGLES`` and ``BQ_DRAIN``
(``bench_bunqueue.ts``); the default 20,000 single adds take under a second, too short for a
steady CPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_node import process_cpu_s  # noqa: E402 (bench/ is this script's directory)
from bench_snapshot import Conn  # noqa: E402

BUN_VERSION = "1.4.5"
BUNQUEUE_VERSION = "2.9.5"
HERE = Path(__file__).resolve().parent
WORKLOADS = ("bulk", "single", "drain")
TARGETS = ("bunqueue-sqlite", "bunqueue-memory", "shoal-1", "shoal-3", "shoal-3-forwarded")
LABELS = {"bunqueue-sqlite": "bunqueue, SQLite", "bunqueue-memory": "bunqueue, memory",
          "shoal-1": "Shoal 1 node", "shoal-3": "Shoal 3 nodes",
          "shoal-3-forwarded": "Shoal 3 nodes, through a node that leads none"}
#: The workloads' sizes, as ``bench_bunqueue.ts`` reads them.
_BULK = (int(os.environ.get("BQ_BULK_BATCHES", "100")), int(os.environ.get("BQ_BULK_SIZE", "1000")))
ROWS = {"bulk": f"bulk adds, {_BULK[0]:,} × {_BULK[1]:,}",
        "single": f"{int(os.environ.get('BQ_SINGLES', '20000')):,} single adds",
        "drain": f"drain {int(os.environ.get('BQ_DRAIN', '50000')):,} (PULLB 10 + ACKB, 50 in hand)"}
RUN_TIMEOUT_S = 600
SERVER_START_TIMEOUT_S = 30


def client_root() -> Path:
    """The pinned client and Bun (the cache the compatibility tests use), installed if missing."""
    base = os.environ.get("SHOAL_COMPAT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shoal", "compat")
    root = Path(base) / f"bunqueue-{BUNQUEUE_VERSION}-bun-{BUN_VERSION}"
    if not (root / "node_modules" / "bunqueue" / "package.json").exists():
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("npm is needed to install bunqueue's client")
        root.mkdir(parents=True, exist_ok=True)
        (root / "package.json").write_text(json.dumps({"name": "shoal-compat", "private": True}))
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(root),
                        f"bun@{BUN_VERSION}", f"bunqueue@{BUNQUEUE_VERSION}"], check=True, timeout=600)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


class BunqueueServer:
    """bunqueue's own server (``bunqueue start``) on loopback; stopped by its pid."""

    def __init__(self, root: Path, data_path: Path | None, log: Path) -> None:
        self.port = free_port()
        cmd = [str(root / "node_modules" / ".bin" / "bun"), str(root / "node_modules" / "bunqueue" / "dist" / "cli" /
               "index.js"), "start", "--host", "127.0.0.1", "--tcp-port", str(self.port),
               "--http-port", str(free_port())]
        if data_path is not None:
            cmd += ["--data-path", str(data_path)]
        env = {**os.environ, "RATE_LIMIT_MAX_REQUESTS": str(10**9)}  # its per-client request cap
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_port(self.port, SERVER_START_TIMEOUT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def queue_led_by(cluster: LocalCluster, node: str | None, tag: str, led: bool = True) -> str:
    """A fresh queue name whose partition ``node`` leads (or, with ``led`` false, does not)."""
    topo = cluster.topology()
    for i in range(100_000):
        name = f"bench-{tag}-{i}"
        leader = topo.partition_map[partition_for(name, cluster.config.partitions)].leader
        if node is None or (leader == node) == led:
            return name
    raise RuntimeError("no queue name fits")


def create_disk_class_queue(port: int, queue: str) -> None:
    """Create ``queue`` with ``durable: false`` through Shoal's own protocol."""
    conn = Conn(f"127.0.0.1:{port}")
    try:
        reply = conn.call({"cmd": "CreateQueue", "queue": queue, "options": {"durable": False}})
    finally:
        conn.close()
    if not reply.get("ok"):
        raise RuntimeError(f"CreateQueue {queue}: {reply}")


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (the Bun client after its run)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def server_parts(server: Any, queue: str, port: int) -> dict[str, int]:
    """{part: pid} of a target's server processes: bunqueue's server, or each Shoal node named
    by its part for ``queue`` (``leader``, ``entry`` when the client talks to another node,
    ``replica`` for the others)."""
    if not isinstance(server, LocalCluster):
        return {"server": server.proc.pid}
    leader = server.leader_of(partition_for(queue, server.config.partitions))
    parts: dict[str, int] = {}
    others: list[int] = []
    for node, pid in server.pids.items():
        if node == leader:
            parts["leader"] = pid
        elif int(server.address_of(node).rsplit(":", 1)[1]) == port:
            parts["entry"] = pid
        else:
            others.append(pid)
    for i, pid in enumerate(others, 1):
        parts["replica" if len(others) == 1 else f"replica{i}"] = pid
    return parts


def peer_frames(server: Any, queue: str, port: int) -> dict[str, float]:
    """{part: frames written to the other nodes so far} of a Shoal target's nodes (parts as
    :func:`server_parts` names them); empty for bunqueue's server."""
    if not isinstance(server, LocalCluster):
        return {}
    part_of = {pid: part for part, pid in server_parts(server, queue, port).items()}
    out: dict[str, float] = {}
    for node, pid in server.pids.items():
        part = part_of[pid]
        spec = server.config.node(node)
        with urllib.request.urlopen(f"http://{spec.host}:{spec.http_port}/prometheus", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("shoal_peer_frames_sent_total "):
                    out[part] = float(line.rsplit(" ", 1)[1])
    return out


def run_workload(root: Path, workdir: Path, port: int, queue: str, workload: str,
                 keep_queue: bool = False) -> dict[str, Any]:
    env = {**os.environ, "BQ_HOST": "127.0.0.1", "BQ_PORT": str(port), "BQ_QUEUE": queue, "BQ_WORKLOAD": workload,
           "BQ_KEEP_QUEUE": "1" if keep_queue else "0"}
    done = subprocess.run([str(root / "node_modules" / ".bin" / "bun"), "bench_bunqueue.ts"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{workload} on port {port} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--through-follower", action="store_true",
                        help="on 3 nodes, connect to a node that leads none of the queue's partition")
    parser.add_argument("--disk-class", action="store_true",
                        help="create each Shoal queue with durable: false (synced within sync_interval_ms)")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU time per job of the client and of each server process (see above)")
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    targets = [t for t in args.targets.split(",") if t]
    root = client_root()
    results: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], dict[str, list[float]]] = {}
    frames: dict[tuple[str, str], dict[str, list[float]]] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-bunqueue-") as tmp:
        tmpdir = Path(tmp)
        workdir = tmpdir / "client"
        workdir.mkdir()
        shutil.copy(HERE / "bench_bunqueue.ts", workdir)
        (workdir / "node_modules").symlink_to(root / "node_modules")
        servers: dict[str, Any] = {}
        if "bunqueue-memory" in targets:
            server = BunqueueServer(root, None, tmpdir / "bunqueue-memory.log")
            stack.callback(server.stop)
            servers["bunqueue-memory"] = server
        if "bunqueue-sqlite" in targets:
            server = BunqueueServer(root, tmpdir / "bunqueue.db", tmpdir / "bunqueue-sqlite.log")
            stack.callback(server.stop)
            servers["bunqueue-sqlite"] = server
        for nodes in (1, 3):
            if f"shoal-{nodes}" in targets or (nodes == 3 and "shoal-3-forwarded" in targets):
                cluster = stack.enter_context(LocalCluster(nodes=nodes, partitions=8, data_dir=tmpdir / f"shoal{nodes}",
                                                           base_port=free_base_port(nodes, 8)))
                if nodes > 1:
                    cluster.wait_balanced()
                servers[f"shoal-{nodes}"] = cluster
                if nodes == 3:
                    servers["shoal-3-forwarded"] = cluster
        for r in range(args.rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for workload in workloads:
                for target in order:
                    server = servers[target]
                    tag = f"{workload}-{r}-{target}"
                    if isinstance(server, LocalCluster):
                        node = server.node_ids[0]
                        forwarded = args.through_follower or target == "shoal-3-forwarded"
                        queue = queue_led_by(server, node if len(server.node_ids) > 1 else None, tag,
                                             led=not forwarded)
                        port = int(server.address_of(node).rsplit(":", 1)[1])
                        if args.disk_class:
                            create_disk_class_queue(port, queue)
                    else:
                        queue, port = f"bench-{tag}", server.port
                    parts = server_parts(server, queue, port) if args.cpu else {}
                    before = {part: process_cpu_s(pid) for part, pid in parts.items()}
                    frames_before = peer_frames(server, queue, port) if args.cpu else {}
                    client_before = children_cpu_s()
                    got = run_workload(root, workdir, port, queue, workload,
                                       keep_queue=args.disk_class and isinstance(server, LocalCluster))
                    if args.cpu:
                        used = {"client": children_cpu_s() - client_before,
                                **{part: process_cpu_s(pid) - before[part] for part, pid in parts.items()}}
                        got["cpu_us_per_job"] = {part: round(s * 1e6 / got["jobs"], 1) for part, s in used.items()}
                        for part, us in got["cpu_us_per_job"].items():
                            cpu.setdefault((workload, target), {}).setdefault(part, []).append(us)
                        if frames_before:
                            after = peer_frames(server, queue, port)
                            got["peer_frames_per_1k_jobs"] = {part: round((after[part] - n) * 1000 / got["jobs"], 1)
                                                              for part, n in frames_before.items()}
                            for part, n in got["peer_frames_per_1k_jobs"].items():
                                frames.setdefault((workload, target), {}).setdefault(part, []).append(n)
                    results.setdefault((workload, target), []).append(got["rate"])
                    print(json.dumps({"round": r, "target": target, **got}), flush=True)
    print()
    print("| jobs/s | " + " | ".join(LABELS[t] for t in targets) + " |")
    print("|---|" + "---|" * len(targets))
    for workload in workloads:
        cells = [f"{statistics.median(results[(workload, t)]):,.0f}" for t in targets]
        print(f"| {ROWS[workload]} | " + " | ".join(cells) + " |")
    if cpu:
        print()
        print("| CPU µs per job | target | client | total | by process |")
        print("|---|---|---|---|---|")
        for row, label, medians in _medians(cpu):
            by = ", ".join(f"{part} {us:.1f}" for part, us in medians.items() if part != "client")
            print(f"| {row} | {label} | {medians['client']:.1f} | {sum(medians.values()):.1f} | {by} |")
    if frames:
        print()
        print("| frames to other nodes per 1,000 jobs | target | total | by node |")
        print("|---|---|---|---|")
        for row, label, medians in _medians(frames):
            by = ", ".join(f"{part} {n:.0f}" for part, n in medians.items())
            print(f"| {row} | {label} | {sum(medians.values()):.0f} | {by} |")


def _medians(table: dict[tuple[str, str], dict[str, list[float]]]) -> Iterator[tuple[str, str, dict[str, float]]]:
    """(row name, target label, {part: median}) of each (workload, target) of ``table``."""
    for (workload, target), parts in table.items():
        yield ROWS[workload], LABELS[target], {part: statistics.median(values) for part, values in parts.items()}


if __name__ == "__main__":
    main()
