"""Backlog benchmark: the resident memory (RSS) a waiting job costs a node.

The baseline for moving job payloads to disk. Against a local cluster of real node processes
(``--nodes 1`` by default, or 3; ``--partitions 8``), with jobs of ``--payload-bytes`` of data
(default 1,024; varied, compressible text, a distinct payload per job):

1. ``single``: ``--single`` jobs (default 200,000) added one ``PUSH`` each, as the client's
   ``queue.add()`` sends them (data, ``priority``, ``delay`` in ms and an ``idempotencyKey``),
   ``--window`` (256) in flight on one connection to the queue's leader; priorities cycle
   0..6 and every other job is delayed one hour, so the queue holds waiting, prioritized and
   delayed jobs (``--plain``: no options, as ``queue.add(data)`` sends them, all waiting);
2. ``bulk``: ``--bulk`` jobs (default 500,000) to another queue in ``PUSHB`` frames of 1,000
   (each item data and an ``idempotencyKey``, as ``add_bulk`` sends them), 4 frames in flight;
   with ``--bulk-queues N``, split over N queues of distinct partitions, one phase each
   (``bulk-0`` ..), so that an added node takes some of the backlog.

For each phase: jobs added, add rate (jobs/s), every node's RSS (``VmRSS`` of
``/proc/<pid>/status``) before and after, and the growth per waiting job, ``(after - before) /
jobs``. RSS is read once the queue's leader counts every job and (3 nodes) every replica has
applied the queue's partition, after ``--settle`` seconds. Then, unless ``--no-restart``, every
node is stopped (SIGTERM) and started again: the restart time is from starting the processes
until the leader's ``GetJobCounts`` of every queue so far shows every job again, and RSS after
the restart gives the per-job cost of a node that rebuilt its state from its snapshot and
journal (``(after restart - before) / jobs``; the bulk phase's "before" is the RSS of the node
restarted after the single phase). Each phase ends by checking ``GetJobCounts``: waiting +
prioritized + delayed equal what was added (with the expected split), nothing else.

Each phase also reports, per node, the snapshot of the queue's partition as it stands once the
jobs are counted: the file's size, how many the replica wrote, and the last one's duration and
fork time (a snapshot is due after ``SHOAL_SNAPSHOT_INTERVAL_S`` once ``SHOAL_SNAPSHOT_ENTRIES_MIN``
entries were applied; ``--node-env`` sets both).

With ``--push-rate``: once the phases' jobs are held, and again at the very end after every queue
was removed (``Obliterate``), ``PUSH`` (each with an ``idempotencyKey``, as ``queue.add()`` sends
a job with no options; ``--window`` in flight) and ``PUSHB`` (1,000 per frame, 4 in flight) for
``--push-seconds`` each into queues of their own: the add rates with and without the backlog, and
their ratio. (At the end, so that no measurement's jobs weigh on the phases' RSS.) Each starts once
no node runs a child process writing its state: the ``Stats`` calls of this benchmark start a
digest of a big replica in a forked child, and a snapshot is one too; how many run when a
measurement ends is reported.

With ``--add-node`` (``--nodes 3``), once the phases' jobs are held: ``shoal cluster add-node``
(the operator's command, on this cluster's directory) adds a fourth node and waits until it holds
and leads its share of the partitions; the command's time, the new node's RSS, and every queue's
counts checked again. ``--move-rate`` (say ``256MiB``) sets the cluster's move rate first: the
snapshots the new node is sent go at that rate in all (8 MiB/s by default).

With ``--pull-rate``, at the end: first every job of the bulk queue and of a queue of 20,000
jobs (filled like ``bulk``) listed in ``GetJobs`` pages of 5,000 after the last seq (as the
Spark connector reads a queue): jobs/s, the slowest page, and the time of the last page asked
for by offset instead; then PULLB 100 + ACKB (16 in flight on one connection, as
``bench_node.py``) for ``--pull-seconds`` from each big queue and from the small one: jobs/s and
the big queues' rate as a share of the small one's.

With ``--sparse N``, at the end: N jobs in ``PUSHB`` frames of 1,000 where every
``--sparse-keep``-th (10th) is delayed an hour, then every ready job pulled and acked
(PULLB 100 + ACKB, 16 in flight), so the payload files are left mostly released with a few
jobs waiting in each. Per node, from the ``payloads`` of its ``Stats``: bytes appended, bytes
still referenced, bytes on disk before and after the drain and once compaction has settled
(no compaction under way or finished for 3 s), the bytes compactions copied (over bytes appended: the write
amplification), and how long compaction took; the delayed jobs counted again at the end.

The idempotency keys the client sends are kept by the node for 120 s (its dedupe window), so
the RSS right after a phase includes them; ``--no-idempotency-keys`` leaves them out.

    python bench/bench_backlog.py                                # 200,000 single + 500,000 bulk, 1 node
    python bench/bench_backlog.py --single 20000 --bulk 50000    # a quick check
    python bench/bench_backlog.py --nodes 3 --single 5000 --bulk 20000 --no-restart
    python bench/bench_backlog.py --payload-bytes 4096 --pull-rate --push-rate
    python bench/bench_backlog.py --nodes 3 --single 20000 --bulk 200000 --no-restart --add-node
    python bench/bench_backlog.py --single 0 --bulk 0 --sparse 1000000          # compaction of payload files
    python bench/bench_backlog.py --single 50000 --bulk 0 --settle 8 \
        --node-env SHOAL_SNAPSHOT_INTERVAL_S=3 --node-env SHOAL_SNAPSHOT_ENTRIES_MIN=2   # restart from a snapshot

Prints a Markdown summary table and one JSON line per phase. Every loop is bounded by a count
and by the time left of ``--timeout`` (1,800 s for the whole run); the cluster is stopped on
the way out, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import string
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_node import _ConsumeDriver, _Frames, drive  # noqa: E402 (bench/ is this script's directory)
from bench_snapshot import Conn  # noqa: E402

from shoal.cluster.codec import decode_response, encode  # noqa: E402
from shoal.cluster.launcher import READY_TIMEOUT_S, LocalCluster, free_base_port  # noqa: E402
from shoal.cluster.partitioning import partition_for  # noqa: E402

SINGLE_QUEUE = "backlog-single"
BULK_QUEUE = "backlog-bulk"
SMALL_QUEUE = "backlog-small"
SPARSE_QUEUE = "backlog-sparse"
PUSH_QUEUE = "backlog-push"    # PUSH_QUEUE-with, PUSH_QUEUEb-without, ...: the add-rate measurements
SMALL_JOBS = 20_000
BULK_BATCH = 1_000
BULK_WINDOW = 4
PULL_BATCH = 100
LIST_PAGE = 5_000              # GetJobs page of the listing rate (the Spark connector's default)
PULL_SLOTS = 16
PRIORITIES = 7                 # priorities cycle 0..6
DELAY_MS = 3_600_000           # every other single job: one hour
#: One counts/applied probe at most this often; waits for them at most this long (within --timeout).
POLL_S = 0.2
WAIT_S_MAX = 900.0
#: Bytes of text the payloads are cut from.
POOL_BYTES = 256 * 1024
MIB = 1024 * 1024
COUNTED = ("waiting", "prioritized", "delayed")


class Budget:
    """The time left of ``--timeout``: every wait takes the smaller of its own limit and this."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self, cap: float = float("inf")) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("--timeout reached")
        return min(cap, left)


class Payloads:
    """Job data: ``size`` bytes of word-like text from a fixed pool, a distinct cut (and index) per job."""

    def __init__(self, size: int, seed: int = 7) -> None:
        rng = random.Random(seed)
        words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(4096)]
        text = bytearray()
        while len(text) < POOL_BYTES + size:
            text += (" ".join(rng.choices(words, k=1000)) + " ").encode()
        self.pool = bytes(text)
        self.size = size
        self.span = len(self.pool) - size

    def __call__(self, i: int) -> bytes:
        off = (i * 7919) % self.span
        return (b"%010d " % i + self.pool[off:off + self.size])[:self.size]

    def compression_ratio(self) -> float:
        sample = b"".join(self(i) for i in range(200))
        return len(sample) / len(zlib.compress(sample, 6))


# --- node processes -------------------------------------------------------------------------------

def proc_memory(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak) of ``pid`` in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def rss(cluster: LocalCluster) -> dict[str, int]:
    return {node_id: proc_memory(pid)["VmRSS"] for node_id, pid in sorted(cluster.pids.items())}


def peak_rss(cluster: LocalCluster) -> dict[str, int]:
    return {node_id: proc_memory(pid)["VmHWM"] for node_id, pid in sorted(cluster.pids.items())}


def disk_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (journals, snapshots, logs of every node), a file with
    several names (a payload file and its snapshot's link) counted once."""
    total, seen = 0, set()
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def bulk_queues(count: int, partitions: int) -> list[str]:
    """``count`` queue names for the bulk phase: ``BULK_QUEUE`` alone, or as many names of
    distinct partitions as there are partitions (then names again)."""
    if count == 1:
        return [BULK_QUEUE]
    names: list[str] = []
    taken: set[int] = set()
    for k in range(100_000):
        name = f"{BULK_QUEUE}-{k}"
        p = partition_for(name, partitions)
        if p not in taken or len(taken) == partitions:
            taken.add(p)
            names.append(name)
            if len(names) == count:
                return names
    raise RuntimeError(f"no {count} queue names found")


def leader_address(cluster: LocalCluster, queue: str) -> str:
    topo = cluster.topology()
    node = topo.leader_of(partition_for(queue, topo.partitions))
    if node is None:
        raise RuntimeError(f"no leader for {queue}'s partition yet")
    return f"{node.host}:{node.port}"


def call(address: str, frame: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    conn = Conn(address, timeout_s=timeout_s)
    try:
        return conn.call(frame)
    finally:
        conn.close()


def job_counts(cluster: LocalCluster, queue: str) -> dict[str, int] | None:
    """The leader's ``GetJobCounts`` of ``queue``, or None while no leader answers."""
    try:
        reply = call(leader_address(cluster, queue), {"cmd": "GetJobCounts", "queue": queue}, 10.0)
    except (OSError, RuntimeError, ConnectionError):
        return None
    return {k: int(v) for k, v in reply["counts"].items()} if reply.get("ok") else None


def wait_counted(cluster: LocalCluster, expected: dict[str, dict[str, int]],
                 budget: Budget) -> dict[str, dict[str, int]]:
    """Poll the leaders until every queue's counts equal ``expected`` (states not named: 0); the counts."""
    deadline = time.monotonic() + budget.left(WAIT_S_MAX)
    last: dict[str, dict[str, int] | None] = {}
    while True:
        last = {q: job_counts(cluster, q) for q in expected}
        if all(c is not None and matches(c, expected[q]) for q, c in last.items()):
            return {q: c for q, c in last.items() if c is not None}
        if time.monotonic() > deadline:
            raise TimeoutError(f"counts never matched: expected {expected}, last seen {last}")
        time.sleep(POLL_S)


def matches(counts: dict[str, int], expected: dict[str, int]) -> bool:
    return all(counts.get(state, 0) == expected.get(state, 0) for state in {*counts, *expected})


def wait_applied(cluster: LocalCluster, queues: list[str], budget: Budget) -> None:
    """Every replica of the queues' partitions applied what its leader had committed (3 nodes)."""
    if len(cluster.node_ids) == 1:
        return  # the leader's counts are its applied state
    wait_applied_at(cluster.addresses, sorted({partition_for(q, cluster.config.partitions) for q in queues}), budget)


def wait_applied_at(addresses: list[str], partitions: list[int], budget: Budget) -> None:
    """Every replica at ``addresses`` of ``partitions`` applied the highest commit index any of them
    reported when this was called (the leader's among them)."""
    deadline = time.monotonic() + budget.left(WAIT_S_MAX)
    targets: dict[int, int] = {}
    for p in partitions:
        views = [call(a, {"cmd": "Stats", "local": True, "partition": p})["replicas"].get(str(p))
                 for a in addresses]
        targets[p] = max(v["commitIndex"] for v in views if v)
    while True:
        behind = []
        for a in addresses:
            for p in partitions:
                view = call(a, {"cmd": "Stats", "local": True, "partition": p})["replicas"].get(str(p))
                if view is not None and view["appliedIndex"] < targets[p]:
                    behind.append(f"{a} p{p}")
        if not behind:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas never applied everything: {behind}")
        time.sleep(POLL_S)


# --- adding jobs ------------------------------------------------------------------------------------

class _AddDriver(asyncio.Protocol):
    """Keeps ``window`` add frames in flight on one connection until ``total`` frames are answered,
    a reply is an error, or the deadline passes. ``make(k)`` returns frame ``k`` (no reqId) and
    how many jobs it adds."""

    def __init__(self, make: Callable[[int], tuple[dict[str, Any], int]], total: int, window: int,
                 deadline: float) -> None:
        self.make, self.total, self.window, self.deadline = make, total, window, deadline
        self.frames = _Frames()
        self.sent = 0
        self.jobs_ok = 0
        self.pending: dict[int, int] = {}
        self.errors: list[dict[str, Any]] = []
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(encode({"cmd": "Hello", "protocolVersion": 2, "reqId": 0}))

    def _send(self, n: int) -> None:
        if self.errors or time.perf_counter() > self.deadline:
            return
        chunks = []
        for _ in range(min(n, self.total - self.sent)):
            frame, jobs = self.make(self.sent)
            self.sent += 1
            frame["reqId"] = self.sent
            self.pending[self.sent] = jobs
            chunks.append(encode(frame))
        if chunks:
            self.transport.write(b"".join(chunks))

    def data_received(self, data: bytes) -> None:
        replies = 0
        for reply, body in self.frames.feed(data):
            if reply.reqId is None:
                continue  # a pushed event (topology), not a reply
            if reply.reqId == 0:
                self._send(self.window)
                continue
            jobs = self.pending.pop(reply.reqId, 0)
            if reply.ok:
                self.jobs_ok += jobs
            elif len(self.errors) < 5:
                self.errors.append(decode_response(body))
            replies += 1
        self._send(replies)
        if not self.pending and (self.sent >= self.total or self.errors or time.perf_counter() > self.deadline):
            if not self.finished.done():
                self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_exception(ConnectionError(f"closed by the node ({exc})"))


async def add_frames(address: str, make: Callable[[int], tuple[dict[str, Any], int]], total: int, window: int,
                     seconds: float) -> tuple[int, float]:
    """Send ``total`` frames ``window`` at a time; (jobs acknowledged, seconds taken)."""
    host, port = address.rsplit(":", 1)
    t0 = time.perf_counter()
    transport, proto = await asyncio.get_running_loop().create_connection(
        lambda: _AddDriver(make, total, window, t0 + seconds), host, int(port))
    try:
        await asyncio.wait_for(proto.finished, seconds + 30)
    finally:
        transport.close()
    dt = time.perf_counter() - t0
    if proto.errors:
        raise RuntimeError(f"{proto.errors[0]} (after {proto.jobs_ok:,} jobs)")
    return proto.jobs_ok, dt


def single_frames(queue: str, payload: Payloads, keys: str | None) -> Callable[[int], tuple[dict[str, Any], int]]:
    """PUSH frame ``i``: what ``queue.add(data, priority=i % 7, delay=3600 if i odd)`` sends."""
    def make(i: int) -> tuple[dict[str, Any], int]:
        frame: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": payload(i), "priority": i % PRIORITIES}
        if i % 2:
            frame["delay"] = DELAY_MS
        if keys is not None:
            frame["idempotencyKey"] = f"{keys}-{i}"
        return frame, 1
    return make


def single_expected(n: int) -> dict[str, int]:
    delayed = n // 2
    waiting = sum(1 for i in range(0, n, 2) if i % PRIORITIES == 0)
    return {"delayed": delayed, "waiting": waiting, "prioritized": n - delayed - waiting}


def plain_frames(queue: str, payload: Payloads, keys: str | None, first: int) -> Callable[[int], tuple[dict[str, Any], int]]:
    """PUSH frame ``i``: what ``queue.add(data)`` sends (data and an idempotency key, no options)."""
    def make(i: int) -> tuple[dict[str, Any], int]:
        frame: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": payload(first + i)}
        if keys is not None:
            frame["idempotencyKey"] = f"{keys}-{first + i}"
        return frame, 1
    return make


def bulk_frames(queue: str, payload: Payloads, keys: str | None, jobs: int,
                first: int) -> Callable[[int], tuple[dict[str, Any], int]]:
    """PUSHB frame ``k`` of ``BULK_BATCH`` items (the last one shorter): what ``add_bulk`` sends."""
    def make(k: int) -> tuple[dict[str, Any], int]:
        lo, hi = k * BULK_BATCH, min(jobs, (k + 1) * BULK_BATCH)
        items = []
        for i in range(first + lo, first + hi):
            item: dict[str, Any] = {"data": payload(i)}
            if keys is not None:
                item["idempotencyKey"] = f"{keys}-{i}"
            items.append(item)
        return {"cmd": "PUSHB", "queue": queue, "jobs": items}, hi - lo
    return make


# --- phases -----------------------------------------------------------------------------------------

class Phase:
    def __init__(self, name: str, queue: str, expected: dict[str, int]) -> None:
        self.name, self.queue, self.expected = name, queue, expected
        self.jobs = sum(expected.values())
        self.added = 0
        self.seconds = 0.0
        self.before: dict[str, int] = {}
        self.after: dict[str, int] = {}
        self.restart: dict[str, int] = {}
        self.restart_ready_s: float | None = None
        self.restart_s: float | None = None
        self.graceful_stop: bool | None = None
        self.counts: dict[str, int] = {}
        self.extra: dict[str, Any] = {}

    @property
    def rate(self) -> float:
        return self.added / self.seconds if self.seconds else 0.0

    def per_job(self, end: dict[str, int]) -> dict[str, float]:
        return {n: (end[n] - self.before[n]) / max(self.added, 1) for n in end if n in self.before}

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.name, "queue": self.queue, "jobs": self.added, "seconds": round(self.seconds, 3),
            "rate": round(self.rate), "rss_before": self.before, "rss_after": self.after,
            "bytes_per_job": {n: round(v) for n, v in self.per_job(self.after).items()},
            "counts": self.counts, **self.extra}
        if self.restart:
            out |= {"rss_after_restart": self.restart,
                    "bytes_per_job_after_restart": {n: round(v) for n, v in self.per_job(self.restart).items()},
                    "restart_ready_s": round(self.restart_ready_s or 0, 3), "restart_s": round(self.restart_s or 0, 3),
                    "graceful_stop": self.graceful_stop}
        return out


def settle_and_measure(cluster: LocalCluster, queues: list[str], expected: dict[str, dict[str, int]],
                       budget: Budget, settle_s: float) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Wait until every job is counted and applied everywhere, let the nodes settle; (counts, RSS)."""
    counts = wait_counted(cluster, expected, budget)
    wait_applied(cluster, queues, budget)
    time.sleep(budget.left(settle_s))
    return counts, rss(cluster)


def restart(cluster: LocalCluster, phase: Phase, queues: list[str], expected: dict[str, dict[str, int]],
            budget: Budget, settle_s: float) -> None:
    """Stop every node (SIGTERM), start them again; time until every queue's counts are back; RSS."""
    print(f"  restarting {len(cluster.node_ids)} node(s) ...", flush=True)
    cluster.stop()
    phase.graceful_stop = all(p.returncode == 0 for p in cluster.procs.values())
    t0 = time.perf_counter()
    cluster.start(timeout_s=budget.left(READY_TIMEOUT_S * 5))
    phase.restart_ready_s = time.perf_counter() - t0
    wait_counted(cluster, expected, budget)
    phase.restart_s = time.perf_counter() - t0
    wait_applied(cluster, queues, budget)
    time.sleep(budget.left(settle_s))
    phase.restart = rss(cluster)
    print(f"  restart: nodes ready {phase.restart_ready_s:.1f} s, every job counted {phase.restart_s:.1f} s "
          f"({'graceful stop' if phase.graceful_stop else 'a node was killed at stop'}); "
          f"RSS {fmt_mib(phase.restart)}", flush=True)


def fmt_mib(values: dict[str, int]) -> str:
    return ", ".join(f"{n} {v / MIB:,.1f} MiB" for n, v in values.items())


def run_adds(cluster: LocalCluster, phase: Phase, make: Callable[[int], tuple[dict[str, Any], int]], frames: int,
             window: int, budget: Budget) -> None:
    phase.added, phase.seconds = uvloop.run(
        add_frames(leader_address(cluster, phase.queue), make, frames, window, budget.left()))
    if phase.added < phase.jobs:
        raise TimeoutError(f"{phase.name}: only {phase.added:,} of {phase.jobs:,} jobs added before --timeout")


async def pull_rate(address: str, queue: str, seconds: float) -> tuple[int, float]:
    proto, dt = await drive(address, lambda deadline: _ConsumeDriver(queue, PULL_BATCH, PULL_SLOTS, deadline),
                            seconds)
    return proto.acked, dt


def pull_phase(cluster: LocalCluster, args: argparse.Namespace, payload: Payloads, keys: str | None,
               budget: Budget) -> dict[str, Any]:
    """PULLB 100 + ACKB from each big queue and from a 20,000-job queue, ``--pull-seconds`` each."""
    small = Phase("small", SMALL_QUEUE, {"waiting": SMALL_JOBS})
    run_adds(cluster, small, bulk_frames(SMALL_QUEUE, payload, keys, SMALL_JOBS, args.single + args.bulk),
             -(-SMALL_JOBS // BULK_BATCH), BULK_WINDOW, budget)
    wait_counted(cluster, {SMALL_QUEUE: small.expected}, budget)
    listed: dict[str, dict[str, Any]] = {}
    for queue, held in ((BULK_QUEUE, args.bulk), (SMALL_QUEUE, SMALL_JOBS)):
        if held:
            listed[queue] = list_rate(leader_address(cluster, queue), queue, held, budget)
            print(f"  GetJobs pages of {LIST_PAGE:,} after a seq over {queue} ({held:,} jobs): "
                  f"{listed[queue]['rate']:,} jobs/s, slowest page {listed[queue]['slowest_ms']:,.0f} ms; "
                  f"the last page by offset {listed[queue]['last_by_offset_ms']:,.0f} ms", flush=True)
    rates: dict[str, dict[str, Any]] = {}
    for queue, held in ((BULK_QUEUE, args.bulk), (SINGLE_QUEUE, args.single), (SMALL_QUEUE, SMALL_JOBS)):
        if not held:
            continue
        acked, dt = uvloop.run(pull_rate(leader_address(cluster, queue), queue, budget.left(args.pull_seconds)))
        rates[queue] = {"jobs_held": held, "acked": acked, "seconds": round(dt, 3), "rate": round(acked / dt)}
        print(f"  pull+ack from {queue} ({held:,} jobs): {acked:,} jobs in {dt:.1f} s, {acked / dt:,.0f} jobs/s",
              flush=True)
    base = rates[SMALL_QUEUE]["rate"]
    for r in rates.values():
        r["vs_small"] = round(r["rate"] / base, 3) if base else None
    return {"phase": "pull-rate", "batch": PULL_BATCH, "in_flight": PULL_SLOTS, "queues": rates, "listed": listed}


def list_rate(address: str, queue: str, held: int, budget: Budget) -> dict[str, Any]:
    """Every job of ``queue`` listed in ``GetJobs`` pages after the last seq (as the Spark
    connector reads), and the last page asked for by offset instead: jobs/s and page times."""
    conn = Conn(address, timeout_s=budget.left(120.0))
    try:
        frame = {"cmd": "GetJobs", "queue": queue, "limit": LIST_PAGE}
        after, listed, slowest = 0, 0, 0.0
        t0 = time.perf_counter()
        for _ in range(held // LIST_PAGE + 2):  # bounded: one page per LIST_PAGE jobs
            t = time.perf_counter()
            reply = conn.call({**frame, "afterSeq": after})
            slowest = max(slowest, time.perf_counter() - t)
            listed += len(reply["jobs"])
            after = reply["lastSeq"]
            if len(reply["jobs"]) < LIST_PAGE:
                break
        dt = time.perf_counter() - t0
        t = time.perf_counter()
        conn.call({**frame, "offset": max(0, held - LIST_PAGE)})
        by_offset = time.perf_counter() - t
    finally:
        conn.close()
    if listed != held:
        raise RuntimeError(f"{queue}: listed {listed:,} jobs of {held:,}")
    return {"jobs": listed, "seconds": round(dt, 3), "rate": round(listed / dt), "slowest_ms": round(slowest * 1000, 1),
            "last_by_offset_ms": round(by_offset * 1000, 1)}


def payload_stats(cluster: LocalCluster, queue: str) -> dict[str, dict[str, int]]:
    """Per node, the ``payloads`` of its replica of ``queue``'s partition (``Stats``)."""
    p = partition_for(queue, cluster.config.partitions)
    out = {}
    for node_id, address in zip(cluster.node_ids, cluster.addresses):
        view = call(address, {"cmd": "Stats", "local": True, "partition": p})["replicas"].get(str(p))
        if view is not None:
            out[node_id] = view["payloads"]
    return out


def sparse_frames(queue: str, payload: Payloads, keys: str | None, jobs: int, keep: int,
                  first: int) -> Callable[[int], tuple[dict[str, Any], int]]:
    """PUSHB frame ``k`` of ``BULK_BATCH`` items, every ``keep``-th delayed an hour."""
    def make(k: int) -> tuple[dict[str, Any], int]:
        lo, hi = k * BULK_BATCH, min(jobs, (k + 1) * BULK_BATCH)
        items = []
        for i in range(lo, hi):
            item: dict[str, Any] = {"data": payload(first + i)}
            if i % keep == 0:
                item["delay"] = DELAY_MS
            if keys is not None:
                item["idempotencyKey"] = f"{keys}-{first + i}"
            items.append(item)
        return {"cmd": "PUSHB", "queue": queue, "jobs": items}, hi - lo
    return make


def wait_drained(cluster: LocalCluster, queue: str, delayed: int, budget: Budget) -> dict[str, int]:
    """Poll until ``queue`` holds ``delayed`` delayed jobs and nothing waiting or active (the
    drained jobs are completed, as many kept as the queue's history keeps); the counts."""
    deadline = time.monotonic() + budget.left(WAIT_S_MAX)
    while True:
        got = job_counts(cluster, queue)
        if got is not None and got.get("delayed") == delayed and not any(
                got.get(state) for state in ("waiting", "prioritized", "active", "failed")):
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue}: never drained to {delayed:,} delayed jobs; last seen {got}")
        time.sleep(POLL_S)


def sparse_phase(cluster: LocalCluster, args: argparse.Namespace, payload: Payloads, keys: str | None,
                 budget: Budget) -> dict[str, Any]:
    """Fill a queue, every ``--sparse-keep``-th job delayed; drain the rest; watch compaction."""
    n, keep = args.sparse, args.sparse_keep
    delayed = -(-n // keep)
    phase = Phase("sparse", SPARSE_QUEUE, {"waiting": n - delayed, "delayed": delayed})
    run_adds(cluster, phase, sparse_frames(SPARSE_QUEUE, payload, keys, n, keep, 10_000_000),
             -(-n // BULK_BATCH), BULK_WINDOW, budget)
    settle_and_measure(cluster, [SPARSE_QUEUE], {SPARSE_QUEUE: phase.expected}, budget, 0)
    filled = payload_stats(cluster, SPARSE_QUEUE)
    print(f"sparse: {n:,} jobs added in {phase.seconds:.1f} s, one in {keep} delayed; payloads "
          + "; ".join(f"{k} {v}" for k, v in filled.items()), flush=True)
    acked, drain_s = 0, 0.0
    for _ in range(100):  # each drive ends when the queue has nothing ready
        got, dt = uvloop.run(pull_rate(leader_address(cluster, SPARSE_QUEUE), SPARSE_QUEUE, budget.left(600)))
        acked, drain_s = acked + got, drain_s + dt
        if acked >= n - delayed:
            break
    wait_drained(cluster, SPARSE_QUEUE, delayed, budget)
    wait_applied(cluster, [SPARSE_QUEUE], budget)
    t0 = time.perf_counter()
    drained = payload_stats(cluster, SPARSE_QUEUE)
    last, settled_at = drained, t0
    deadline = t0 + budget.left(WAIT_S_MAX)
    while time.perf_counter() - settled_at < 3.0:  # settled: no compaction or deletion for 3 s
        if time.perf_counter() > deadline:
            raise TimeoutError("payload files never settled")
        time.sleep(0.5)
        now = payload_stats(cluster, SPARSE_QUEUE)
        if any(v["compacting"] or v["compactions"] != last[k]["compactions"]
               or v["diskBytes"] != last[k]["diskBytes"] for k, v in now.items()):
            settled_at = time.perf_counter()
        last = now
    counts = wait_drained(cluster, SPARSE_QUEUE, delayed, budget)
    nodes = {k: {"appended": v["end"], "live": v["liveBytes"], "disk_filled": filled[k]["diskBytes"],
                 "disk_drained": drained[k]["diskBytes"], "disk_compacted": v["diskBytes"],
                 "copied": v["copiedBytes"], "compactions": v["compactions"],
                 "write_amplification": round(v["copiedBytes"] / max(v["end"], 1), 3)}
             for k, v in last.items()}
    for k, v in nodes.items():
        print(f"  {k}: appended {v['appended'] / MIB:,.1f} MiB, live {v['live'] / MIB:,.1f} MiB, disk "
              f"{v['disk_drained'] / MIB:,.1f} -> {v['disk_compacted'] / MIB:,.1f} MiB after "
              f"{v['compactions']} compactions copying {v['copied'] / MIB:,.1f} MiB", flush=True)
    return {"phase": "sparse", "jobs": n, "keep_every": keep, "add_rate": round(phase.rate),
            "drain_rate": round(acked / drain_s) if drain_s else 0, "acked": acked,
            "compaction_s": round(settled_at - t0, 1), "counts": counts, "nodes": nodes}


def snapshot_report(cluster: LocalCluster, data_dir: Path, queue: str) -> dict[str, dict[str, Any]]:
    """Per node, the snapshot of ``queue``'s partition: file bytes (0: none yet), how many the
    replica wrote, the last one's duration and fork time."""
    p = partition_for(queue, cluster.config.partitions)
    out: dict[str, dict[str, Any]] = {}
    for node_id in cluster.node_ids:
        view = call(cluster.address_of(node_id), {"cmd": "Stats", "local": True, "partition": p})["replicas"].get(str(p))
        files = list((data_dir / node_id).glob(f"**/p{p}.snap"))
        stats = view["snapshots"] if view else {}
        out[node_id] = {"bytes": sum(f.stat().st_size for f in files), "written": stats.get("written", 0),
                        "last_ms": stats.get("lastDurationMs", 0.0), "fork_ms": stats.get("lastForkMs", 0.0)}
    return out


def node_children(data_dir: Path) -> int:
    """Processes whose parent is one of the cluster's nodes (by their pid files): a snapshot or a
    digest a node forked to write its state."""
    nodes = set()
    for pid_file in data_dir.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            nodes.add(int(pid_file.read_text().strip()))
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        count += ppid in nodes
    return count


def wait_quiet(data_dir: Path, budget: Budget) -> float:
    """Wait until no node has a snapshot or digest child running (``Stats`` starts digests of big
    states, which would compete with a rate measurement for the CPU); seconds waited."""
    t0 = time.monotonic()
    deadline = t0 + budget.left(WAIT_S_MAX)
    while node_children(data_dir):
        if time.monotonic() > deadline:
            raise TimeoutError("the nodes' snapshot or digest children never finished")
        time.sleep(POLL_S)
    return time.monotonic() - t0


def push_rates(cluster: LocalCluster, data_dir: Path, args: argparse.Namespace, payload: Payloads,
               keys: str | None, when: str, held: int, budget: Budget) -> dict[str, Any]:
    """``PUSH`` and ``PUSHB`` add rates for ``--push-seconds`` each into queues of their own
    (``when``: ``with`` or ``without`` the backlog), each started once no node has a child
    process writing its state; ``forked``: such children running when a measurement ended."""
    first = 10_000_000_000 if when == "with" else 20_000_000_000  # payloads and keys of their own
    out: dict[str, Any] = {"when": when, "jobs_held": held, "added": 0, "forked": 0}
    for kind, queue, make, frames, window in (
            ("push", f"{PUSH_QUEUE}-{when}", plain_frames(f"{PUSH_QUEUE}-{when}", payload, keys, first), 10**9,
             args.window),
            ("pushb", f"{PUSH_QUEUE}b-{when}",
             bulk_frames(f"{PUSH_QUEUE}b-{when}", payload, keys, 10**9, first + 5_000_000_000), 10**6, BULK_WINDOW)):
        address = leader_address(cluster, queue)
        wait_quiet(data_dir, budget)
        jobs, dt = uvloop.run(add_frames(address, make, frames, window, budget.left(args.push_seconds)))
        out[kind] = round(jobs / dt)
        out["added"] += jobs
        out["forked"] += node_children(data_dir)
    print(f"  add rates {when} the backlog ({held:,} jobs held): PUSH {out['push']:,} jobs/s, "
          f"PUSHB {out['pushb']:,} jobs/s; snapshot or digest children at the end {out['forked']}", flush=True)
    return out


def remove_queues(cluster: LocalCluster, queues: list[str], budget: Budget) -> None:
    """``Obliterate`` each of ``queues`` at its leader; wait until none holds a job."""
    for queue in queues:
        reply = call(leader_address(cluster, queue), {"cmd": "Obliterate", "queue": queue}, budget.left(WAIT_S_MAX))
        if not reply.get("ok"):
            raise RuntimeError(f"Obliterate {queue}: {reply}")
    wait_counted(cluster, {q: {} for q in queues}, budget)


def add_node_phase(cluster: LocalCluster, data_dir: Path, phases: list[Phase], held: int,
                   node_env: dict[str, str], budget: Budget, move_rate: str | None = None) -> dict[str, Any]:
    """``shoal cluster add-node`` on this cluster's directory with ``held`` jobs in it, timed; the new
    node's RSS; the phases' counts checked again. ``move_rate``: ``shoal cluster settings
    --move-rate`` first (the cluster-wide rate of the snapshots the new node is sent)."""
    before = set(cluster.node_ids)
    if move_rate is not None:
        subprocess.run([sys.executable, "-m", "shoal.cli", "cluster", "settings", "--data", str(data_dir),
                        "--move-rate", move_rate], check=True, capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    print(f"add-node with {held:,} jobs held ...", flush=True)
    t0 = time.perf_counter()
    limit = budget.left(WAIT_S_MAX)
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "cluster", "add-node", "--data", str(data_dir),
                           "--timeout", str(int(limit))], capture_output=True, text=True, timeout=limit + 30,
                          stdin=subprocess.DEVNULL, env={**os.environ, **node_env})
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"shoal cluster add-node failed (exit {proc.returncode}): {proc.stderr or proc.stdout}")
    joined = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    pid_files = {f.stem: f for f in data_dir.glob("*.pid")}
    new_ids = sorted(set(pid_files) - before)
    if len(new_ids) != 1:
        raise RuntimeError(f"expected one new node's pid file, found {new_ids}")
    node_id = new_ids[0]
    node = cluster.topology().nodes[node_id]
    address = f"{node.host}:{node.port}"
    partitions = sorted(int(p) for p in call(address, {"cmd": "Stats", "local": True})["replicas"])
    t1 = time.perf_counter()
    wait_applied_at([*cluster.addresses, address], partitions, budget)  # the new node's partitions, everywhere
    caught_s = time.perf_counter() - t1
    counts = wait_counted(cluster, {p.queue: p.expected for p in phases}, budget)
    new_rss = {node_id: proc_memory(int(pid_files[node_id].read_text().strip()))["VmRSS"]}
    every = {n: proc_memory(int(f.read_text().strip())) for n, f in sorted(pid_files.items())}
    rss_all = {n: m["VmRSS"] for n, m in every.items()}
    peak_all = {n: m["VmHWM"] for n, m in every.items()}
    print(f"  {joined} ({seconds:.1f} s); it applied its partitions {partitions} {caught_s:.1f} s later; "
          f"RSS {fmt_mib(new_rss)}; counts verified; every node's RSS {fmt_mib(rss_all)}, peak "
          f"{fmt_mib(peak_all)}; disk {disk_bytes(data_dir) / 1e9:.1f} GB", flush=True)
    return {"phase": "add-node", "jobs_held": held, "seconds": round(seconds, 3), "joined": joined,
            "partitions": partitions, "caught_up_s": round(caught_s, 3), "rss": new_rss, "counts": counts,
            "rss_all": rss_all, "peak_rss_all": peak_all, "disk_bytes": disk_bytes(data_dir)}


def print_summary(phases: list[Phase], args: argparse.Namespace, pull: dict[str, Any] | None,
                  pushes: list[dict[str, Any]], added: dict[str, Any] | None,
                  sparse: dict[str, Any] | None = None) -> None:
    print()
    print(f"{args.nodes} node(s), {args.partitions} partitions, payload {args.payload_bytes:,} bytes, "
          f"idempotency keys {'on' if args.idempotency_keys else 'off'}")
    print()
    restarted = any(p.restart for p in phases)
    head = ["phase", "node", "jobs added", "add rate (jobs/s)", "RSS before (MiB)", "RSS after (MiB)",
            "growth/job (B)"]
    if restarted:
        head += ["RSS after restart (MiB)", "after restart/job (B)", "restart (s)"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))
    for p in phases:
        live, again = p.per_job(p.after), p.per_job(p.restart)
        for node in p.after:
            cells = [p.name, node, f"{p.added:,}", f"{p.rate:,.0f}", f"{p.before[node] / MIB:,.1f}",
                     f"{p.after[node] / MIB:,.1f}", f"{live[node]:,.0f}"]
            if restarted:
                cells += ([f"{p.restart[node] / MIB:,.1f}", f"{again[node]:,.0f}", f"{p.restart_s:.1f}"]
                          if node in p.restart else ["", "", ""])
            print("| " + " | ".join(cells) + " |")
    if len(phases) > 1:  # what the node holds for every job of every phase, from before the first
        first, last = phases[0], phases[-1]
        total = sum(p.added for p in phases)
        for node in last.after:
            if node not in first.before:
                continue
            grown = (last.after[node] - first.before[node]) / max(total, 1)
            cells = ["all phases", node, f"{total:,}", "", f"{first.before[node] / MIB:,.1f}",
                     f"{last.after[node] / MIB:,.1f}", f"{grown:,.0f}"]
            if restarted:
                cells += ([f"{last.restart[node] / MIB:,.1f}",
                           f"{(last.restart[node] - first.before[node]) / max(total, 1):,.0f}", ""]
                          if node in last.restart else ["", "", ""])
            print("| " + " | ".join(cells) + " |")
    snaps = [(p, node, v) for p in phases for node, v in p.extra.get("snapshots", {}).items()]
    if snaps:
        print()
        print("| phase | node | snapshot (MiB) | written | last write (ms) | fork (ms) |")
        print("|---|---|---:|---:|---:|---:|")
        for p, node, v in snaps:
            print(f"| {p.name} | {node} | {v['bytes'] / MIB:,.1f} | {v['written']} | {v['last_ms']:,.0f} | "
                  f"{v['fork_ms']:,.1f} |")
    if pushes:
        print()
        print("| add rate into a new queue | jobs held | PUSH (jobs/s) | PUSHB (jobs/s) | children at the end |")
        print("|---|---:|---:|---:|---:|")
        for r in pushes:
            print(f"| {r['when']} the backlog | {r['jobs_held']:,} | {r['push']:,} | {r['pushb']:,} | {r['forked']} |")
        if len(pushes) == 2 and pushes[1]["push"] and pushes[1]["pushb"]:
            print(f"| with the backlog / without | | {pushes[0]['push'] / pushes[1]['push']:.2f} | "
                  f"{pushes[0]['pushb'] / pushes[1]['pushb']:.2f} | |")
    if added:
        print()
        print(f"add-node with {added['jobs_held']:,} jobs held: {added['seconds']:.1f} s "
              f"({added['joined']}), its partitions applied {added['caught_up_s']:.1f} s later; "
              f"new node's RSS {fmt_mib(added['rss'])}")
    if pull:
        print()
        print("| pull+ack (PULLB 100 + ACKB) | jobs held | jobs/s | vs 20,000-job queue |")
        print("|---|---:|---:|---:|")
        for queue, r in pull["queues"].items():
            print(f"| {queue} | {r['jobs_held']:,} | {r['rate']:,} | {r['vs_small']:.2f} |")
        print()
        print(f"| listing (GetJobs {LIST_PAGE:,} after a seq) | jobs | jobs/s | slowest page (ms) | "
              "last page by offset (ms) |")
        print("|---|---:|---:|---:|---:|")
        for queue, r in pull["listed"].items():
            print(f"| {queue} | {r['jobs']:,} | {r['rate']:,} | {r['slowest_ms']:,.0f} | {r['last_by_offset_ms']:,.0f} |")
    if sparse:
        print()
        print(f"sparse: {sparse['jobs']:,} jobs, one in {sparse['keep_every']} delayed, the rest drained at "
              f"{sparse['drain_rate']:,} jobs/s; compaction settled {sparse['compaction_s']:.1f} s after the drain")
        print()
        print("| node | appended (MiB) | live (MiB) | on disk full (MiB) | drained (MiB) | compacted (MiB) "
              "| copied (MiB) | compactions | write amplification |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for node, v in sparse["nodes"].items():
            print(f"| {node} | {v['appended'] / MIB:,.1f} | {v['live'] / MIB:,.1f} | {v['disk_filled'] / MIB:,.1f} | "
                  f"{v['disk_drained'] / MIB:,.1f} | {v['disk_compacted'] / MIB:,.1f} | {v['copied'] / MIB:,.1f} | "
                  f"{v['compactions']} | {v['write_amplification']:.3f} |")
    print()
    for p in phases:
        print(json.dumps(p.record()))
    for record in (*pushes, *([added] if added else []), *([pull] if pull else []), *([sparse] if sparse else [])):
        print(json.dumps(record))


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress shows in a file
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--single", type=int, default=200_000, help="jobs added one PUSH each")
    parser.add_argument("--bulk", type=int, default=500_000, help="jobs added in PUSHB frames of 1,000")
    parser.add_argument("--bulk-queues", type=int, default=1,
                        help="queues the bulk jobs are split over (distinct partitions), one phase each")
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--window", type=int, default=256, help="PUSH frames in flight in the single phase")
    parser.add_argument("--plain", action="store_true",
                        help="single phase: PUSHes without options, as queue.add(data) sends them (all waiting)")
    parser.add_argument("--no-restart", dest="restart", action="store_false",
                        help="skip restarting the nodes after each phase")
    parser.add_argument("--no-idempotency-keys", dest="idempotency_keys", action="store_false",
                        help="send no idempotencyKey (the client sends one per add)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before each RSS reading")
    parser.add_argument("--pull-rate", action="store_true", help="PULLB+ACKB rate of big vs 20,000-job queues")
    parser.add_argument("--pull-seconds", type=float, default=5.0)
    parser.add_argument("--push-rate", action="store_true",
                        help="PUSH and PUSHB add rates with the phases' jobs held and once every queue is removed")
    parser.add_argument("--push-seconds", type=float, default=3.0)
    parser.add_argument("--add-node", action="store_true",
                        help="(--nodes 3) shoal cluster add-node with the phases' jobs held, timed")
    parser.add_argument("--move-rate", default=None, metavar="SIZE",
                        help="with --add-node: the cluster's move rate for it (shoal cluster settings --move-rate)")
    parser.add_argument("--sparse", type=int, default=0,
                        help="jobs of a queue left sparse (one in --sparse-keep delayed, the rest drained)")
    parser.add_argument("--sparse-keep", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1800.0, help="time limit of the whole run, seconds")
    parser.add_argument("--data-dir", default="",
                        help="the cluster's directory, kept afterwards with the nodes' logs (default: a "
                             "temporary one, removed)")
    parser.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of the nodes (repeatable), e.g. the snapshot settings")
    args = parser.parse_args()
    node_env = dict(item.split("=", 1) for item in args.node_env if "=" in item)
    if len(node_env) != len(args.node_env):
        parser.error("--node-env takes KEY=VALUE")
    if args.single < 0 or args.bulk < 0 or args.payload_bytes < 1 or not 1 <= args.window <= 10_000:
        parser.error("--single/--bulk must be >= 0, --payload-bytes >= 1, --window 1..10000")
    if args.sparse < 0 or args.sparse_keep < 1:
        parser.error("--sparse must be >= 0, --sparse-keep >= 1")
    if args.add_node and args.nodes != 3:
        parser.error("--add-node needs --nodes 3")
    budget = Budget(args.timeout)
    payload = Payloads(args.payload_bytes)
    keys = os.urandom(8).hex() if args.idempotency_keys else None
    print(f"load average at start: {os.getloadavg()}; payload {args.payload_bytes} bytes "
          f"(zlib ratio {payload.compression_ratio():.1f}x)")
    phases: list[Phase] = []
    pull: dict[str, Any] | None = None
    sparse: dict[str, Any] | None = None
    pushes: list[dict[str, Any]] = []
    added: dict[str, Any] | None = None
    spare = 1 if args.add_node else 0  # the added node's ports
    with (contextlib.nullcontext(args.data_dir) if args.data_dir else
          tempfile.TemporaryDirectory(prefix="shoal-backlog-")) as tmp, \
            LocalCluster(nodes=args.nodes, partitions=args.partitions, data_dir=tmp,
                         base_port=free_base_port(args.nodes + spare, args.partitions), extra_env=node_env) as cluster, \
            contextlib.ExitStack() as stack:
        if args.add_node:
            stack.callback(cluster.stop_all)  # also the node add-node starts, known by its pid file alone
        if args.nodes > 1:
            cluster.wait_balanced(budget.left(30.0))
        expected: dict[str, dict[str, int]] = {}
        plans = []
        if args.single:
            if args.plain:
                plans.append((Phase("single", SINGLE_QUEUE, {"waiting": args.single}),
                              plain_frames(SINGLE_QUEUE, payload, keys, 0), args.single, args.window))
            else:
                plans.append((Phase("single", SINGLE_QUEUE, single_expected(args.single)),
                              single_frames(SINGLE_QUEUE, payload, keys), args.single, args.window))
        names = bulk_queues(args.bulk_queues, args.partitions) if args.bulk else []
        for k, queue in enumerate(names):
            jobs = args.bulk // len(names) + (k < args.bulk % len(names))
            plans.append((Phase("bulk" if len(names) == 1 else f"bulk-{k}", queue, {"waiting": jobs}),
                          bulk_frames(queue, payload, keys, jobs, args.single + k * (args.bulk // len(names))),
                          -(-jobs // BULK_BATCH), BULK_WINDOW))
        for phase, make, frames, window in plans:
            time.sleep(budget.left(args.settle))
            phase.before = rss(cluster)
            print(f"{phase.name}: {phase.jobs:,} jobs to {phase.queue}; RSS before {fmt_mib(phase.before)}",
                  flush=True)
            run_adds(cluster, phase, make, frames, window, budget)
            expected[phase.queue] = phase.expected
            queues = list(expected)
            counts, phase.after = settle_and_measure(cluster, queues, expected, budget, args.settle)
            phase.counts = counts[phase.queue]
            phase.extra = {"peak_rss": peak_rss(cluster), "disk_bytes": disk_bytes(Path(tmp)),
                           "snapshots": snapshot_report(cluster, Path(tmp), phase.queue)}
            print(f"  added {phase.added:,} in {phase.seconds:.1f} s ({phase.rate:,.0f} jobs/s); RSS after "
                  f"{fmt_mib(phase.after)}; per job "
                  + ", ".join(f"{n} {v:,.0f} B" for n, v in phase.per_job(phase.after).items())
                  + f"; counts {phase.counts}", flush=True)
            if args.restart:
                restart(cluster, phase, queues, expected, budget, args.settle)
                phase.counts = wait_counted(cluster, expected, budget)[phase.queue]
            phases.append(phase)
        for phase in phases:  # finally, the leader's counts again: exactly what was added
            got = job_counts(cluster, phase.queue)
            if got is None or not matches(got, phase.expected):
                raise RuntimeError(f"{phase.queue}: counts {got}, expected {phase.expected}")
            phase.counts = got
        print("counts verified: " + "; ".join(
            f"{p.queue} " + " + ".join(f"{p.counts.get(s, 0):,} {s}" for s in COUNTED)
            + f" = {sum(p.counts.get(s, 0) for s in COUNTED):,} (added {p.added:,})" for p in phases))
        if args.push_rate:
            pushes.append(push_rates(cluster, Path(tmp), args, payload, keys, "with", sum(p.added for p in phases), budget))
        if args.add_node:
            held = sum(p.added for p in phases) + sum(r["added"] for r in pushes)
            added = add_node_phase(cluster, Path(tmp), phases, held, node_env, budget, args.move_rate)
        if args.pull_rate:
            pull = pull_phase(cluster, args, payload, keys, budget)
        if args.sparse:
            sparse = sparse_phase(cluster, args, payload, keys, budget)
        if args.push_rate:
            used = [p.queue for p in phases] + [f"{PUSH_QUEUE}-with", f"{PUSH_QUEUE}b-with"]
            remove_queues(cluster, used + ([SMALL_QUEUE] if args.pull_rate else []), budget)
            pushes.append(push_rates(cluster, Path(tmp), args, payload, keys, "without", 0, budget))
    print_summary(phases, args, pull, pushes, added, sparse)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
