"""Node benchmark: a raw pipelined protocol driver against a local 3-node cluster.

Measures PUSH ops/s (window 100; and summed over one such stream per node, each to a
queue that node leads), PUSHB jobs/s (100 jobs per frame, 16 frames in
flight), PULLB+ACKB jobs/s (16 pipelined consumer slots, 100 jobs per PULLB, draining
what the pushb phase left, or 1,000,000 jobs pushed first when it is not run), the
latency of a lone PUSH (p50/p99), the seconds from a leader SIGKILL to the
first successful write, PUSH and lone-PUSH latency of a one-node Shoal, and as a reference for the machine's speed in the same run, PUSH
ops/s against ``bare_server.py`` (uvloop + msgpack answering frames, no Raft). Each throughput phase also prints the CPU share of every
node and of the driver, and how many commands the Raft entries carried. The driver runs in this process; the
nodes are separate processes started with ``LocalCluster``.

    python bench/bench_node.py [--seconds 5] [--partitions 8] [--only push,pushb,pull]
                               [--profile DIR]   (phases: push,pushb,pull,spread,latency,failover,single,bare)

``--profile DIR`` records py-spy collapsed stacks of every node during each
throughput phase (``DIR/<phase>-<node>.txt``, loadable in speedscope or
flamegraph.pl) and prints each node's busiest functions.

Every loop is bounded by a job count and a time limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import msgspec
import uvloop
from frame_split import split_frames  # bench/ is this script's sys.path[0]

from shoal.cluster.codec import FrameDecoder, decode_response, encode, encode_body
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

DATA_100 = b"x" * 100  # packs as a 102-byte bin: ~100-byte job payload
#: The drivers talk to each queue's leader, as Shoal's client does, and say so as it does (a
#: client without ``routing`` is read in bunqueue's dialect; ``bench_bunqueue.py`` measures that).
HELLO = {"cmd": "Hello", "protocolVersion": 2}
HELLO_ROUTING = {**HELLO, "capabilities": ["routing"]}


class Conn:
    """Pipelined v2 connection: ``call`` returns a future resolved by reqId."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next_id = 0
        self.decoder = FrameDecoder(requests=False)
        self.hello: dict[str, Any] = {}

    @classmethod
    async def open(cls, address: str, *, routing: bool = False) -> "Conn":
        """A connection to ``address``; ``routing``: it talks to leaders only, as Shoal's client does."""
        self = cls()
        host, port = address.rsplit(":", 1)
        self.reader, self.writer = await asyncio.open_connection(host, int(port))
        self._task = asyncio.get_running_loop().create_task(self._read())
        self.hello = await self.call(dict(HELLO_ROUTING if routing else HELLO))
        return self

    async def _read(self) -> None:
        while True:
            data = await self.reader.read(1 << 18)
            if not data:
                for f in self.waiters.values():
                    if not f.done():
                        f.set_exception(ConnectionError("closed"))
                return
            self.decoder.feed(data)
            for frame in self.decoder:
                fut = self.waiters.pop(frame.get("reqId"), None)
                if fut is not None and not fut.done():
                    fut.set_result(frame)

    def send(self, frame: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        self.next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[self.next_id] = fut
        frame["reqId"] = self.next_id
        self.writer.write(encode(frame))
        return fut

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        return await self.send(frame)

    def close(self) -> None:
        self._task.cancel()
        self.writer.close()


async def leader_conn(cluster: LocalCluster, queue: str) -> Conn:
    topo = cluster.topology()
    node = topo.leader_of(partition_for(queue, topo.partitions))
    assert node is not None
    return await Conn.open(f"{node.host}:{node.port}", routing=True)


class _JobRef(msgspec.Struct):
    id: str


class _Reply(msgspec.Struct):
    """What the drivers read of a reply; other fields are skipped unread (msgspec, in C)."""

    reqId: int | None = None  # noqa: N815 (wire name)
    ok: bool = False
    jobs: list[_JobRef] | None = None
    tokens: list[str] | None = None
    count: int = 0


_decode_reply = msgspec.msgpack.Decoder(_Reply).decode


class _Frames:
    """Length-prefixed reply frames from a byte stream, decoded lean: the driver's own CPU
    competes with the three nodes for the machine's two cores, so it should cost little."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[_Reply, bytes]]:
        """Every whole frame now buffered, as (lean reply, raw body)."""
        self.buf += data
        return [(_decode_reply(body), body) for body in split_frames(self.buf)]


def frame_with_req_ids(frame: dict[str, Any]) -> Any:
    """Encoder of one unchanging request ``frame`` plus each command's ``reqId``.

    The body is encoded once with ``reqId`` last (map order is kept) and each command only
    swaps the value's bytes: the driver's CPU competes with the nodes for two cores.
    """
    body = encode_body({**frame, "reqId": 0})
    assert body.endswith(b"\x00")  # the 0 of reqId, a positive fixint
    head = body[:-1]
    pack = msgspec.msgpack.encode

    def make(req_id: int) -> bytes:
        b = head + pack(req_id)
        return len(b).to_bytes(4, "big") + b
    return make


class _WindowDriver(asyncio.Protocol):
    """Keeps ``window`` commands in flight: every reply sends the next command at once.

    ``make(req_id)`` returns the command's whole frame (length prefix included).
    """

    def __init__(self, make: Any, total: int, window: int, deadline: float) -> None:
        self.make, self.total, self.window, self.deadline = make, total, window, deadline
        self.frames = _Frames()
        self.sent = self.done = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(encode({**HELLO_ROUTING, "reqId": 0}))

    def _send(self, n: int) -> None:
        if time.perf_counter() > self.deadline:
            return
        n = min(n, self.total - self.sent)
        if n > 0:
            make, first = self.make, self.sent + 1
            self.sent += n
            self.transport.write(b"".join([make(i) for i in range(first, first + n)]))

    def data_received(self, data: bytes) -> None:
        replies = 0
        for reply, body in self.frames.feed(data):
            if reply.reqId is None:
                continue  # a pushed event (topology change), not a reply
            if reply.reqId == 0:
                self._send(self.window)
                continue
            if not reply.ok:
                self.error = decode_response(body)
            replies += 1
        self.done += replies
        self._send(replies)
        if self.done >= self.sent and (self.sent >= self.total or time.perf_counter() > self.deadline):
            if not self.finished.done():
                self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_exception(ConnectionError("closed"))


async def drive(address: str, make_driver: Any, seconds: float) -> tuple[Any, float]:
    """Run one driver protocol (built from its deadline) on a new connection; (driver, seconds taken)."""
    host, port = address.rsplit(":", 1)
    t0 = time.perf_counter()
    transport, proto = await asyncio.get_running_loop().create_connection(
        lambda: make_driver(t0 + seconds), host, int(port))
    try:
        await asyncio.wait_for(proto.finished, seconds + 30)
    finally:
        transport.close()
    if proto.error:
        raise RuntimeError(proto.error)
    return proto, time.perf_counter() - t0


async def windowed(address: str, make: Any, total: int, window: int, seconds: float) -> tuple[int, float]:
    """Keep ``window`` commands in flight on one connection until ``total`` are done or time runs out."""
    proto, dt = await drive(address, lambda deadline: _WindowDriver(make, total, window, deadline), seconds)
    return proto.done, dt


def leader_address(cluster: LocalCluster, queue: str) -> str:
    topo = cluster.topology()
    node = topo.leader_of(partition_for(queue, topo.partitions))
    assert node is not None
    return f"{node.host}:{node.port}"


async def bench_push(cluster: LocalCluster, seconds: float) -> float:
    n, dt = await windowed(leader_address(cluster, "bench-push"),
                           frame_with_req_ids({"cmd": "PUSH", "queue": "bench-push", "data": DATA_100}),
                           2_000_000, 100, seconds)
    return n / dt


def queues_led_by_each_node(cluster: LocalCluster) -> dict[str, str]:
    """One queue name per node whose partition that node leads: node id -> queue."""
    topo = cluster.topology()
    out: dict[str, str] = {}
    for i in range(10_000):
        queue = f"bench-spread-{i}"
        leader = topo.leader_of(partition_for(queue, topo.partitions))
        if leader is not None and leader.id not in out:
            out[leader.id] = queue
        if len(out) == len(topo.nodes):
            break
    return out


async def bench_spread(cluster: LocalCluster, seconds: float) -> float:
    """PUSH ops/s summed over one window-100 stream per node, each to a queue that node leads.

    Every node is then a leader for one stream and a follower for the others, as in a
    cluster whose partitions are all busy.
    """
    topo = cluster.topology()
    runs = []
    for node_id, queue in sorted(queues_led_by_each_node(cluster).items()):
        node = topo.nodes[node_id]
        runs.append(windowed(f"{node.host}:{node.port}",
                             frame_with_req_ids({"cmd": "PUSH", "queue": queue, "data": DATA_100}),
                             2_000_000, 100, seconds))
    done = await asyncio.gather(*runs)
    return sum(n for n, _ in done) / max(dt for _, dt in done)


async def bench_bare_push(seconds: float) -> float:
    """PUSH ops/s of the same driver against ``bare_server.py`` (the machine's speed right now)."""
    port = free_base_port(1, 0)
    server = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "bare_server.py"), str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        n, dt = await windowed(f"127.0.0.1:{port}",
                               frame_with_req_ids({"cmd": "PUSH", "queue": "bench-push", "data": DATA_100}),
                               5_000_000, 100, seconds)
    finally:
        server.kill()
        server.wait(10)
    return n / dt


async def bench_pushb(cluster: LocalCluster, seconds: float, frames: int = 100_000) -> float:
    jobs = [{"data": DATA_100} for _ in range(100)]
    n, dt = await windowed(leader_address(cluster, "bench-pushb"),
                           frame_with_req_ids({"cmd": "PUSHB", "queue": "bench-pushb", "jobs": jobs}), frames, 16,
                           seconds)
    return n * 100 / dt


#: Jobs the pull phase finds waiting when the pushb phase (which leaves them) is not run.
PULL_BACKLOG = 1_000_000


async def fill_pull_backlog(cluster: LocalCluster) -> None:
    """Push :data:`PULL_BACKLOG` jobs for the pull phase to drain, unmeasured (within 120 s)."""
    await bench_pushb(cluster, 120.0, frames=PULL_BACKLOG // 100)


class _ConsumeDriver(asyncio.Protocol):
    """``slots`` consumers on one connection, each PULLB -> ACKB -> PULLB ... without waiting idle.

    A PULLB reply sends its ACKB at once and the ACKB's reply sends the next PULLB, so
    ``slots`` commands are always in flight, as a pipelined consumer keeps them.
    """

    def __init__(self, queue: str, batch: int, slots: int, deadline: float) -> None:
        self.queue, self.batch, self.slots, self.deadline = queue, batch, slots, deadline
        self.frames = _Frames()
        self.next_id = 0
        self.acked = 0
        self.in_flight = 0
        self.drained = False
        self.error: Any = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _send(self, frame: dict[str, Any]) -> None:
        self.next_id += 1
        frame["reqId"] = self.next_id
        self.in_flight += 1
        self.transport.write(encode(frame))

    def _pull(self) -> None:
        if self.drained or time.perf_counter() > self.deadline:
            return
        self._send({"cmd": "PULLB", "queue": self.queue, "count": self.batch})

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(encode({**HELLO_ROUTING, "reqId": 0}))

    def data_received(self, data: bytes) -> None:
        for reply, body in self.frames.feed(data):
            req_id = reply.reqId
            if req_id is None:
                continue  # a pushed event, not a reply
            if req_id == 0:
                for _ in range(self.slots):
                    self._pull()
                continue
            self.in_flight -= 1
            if not reply.ok:
                self.error = decode_response(body)
                self.drained = True
            elif reply.jobs is not None:
                if reply.jobs:
                    self._send({"cmd": "ACKB", "ids": [j.id for j in reply.jobs], "tokens": reply.tokens})
                else:
                    self.drained = True  # queue empty: this slot stops
            else:
                self.acked += reply.count
                self._pull()
        if self.in_flight == 0 and not self.finished.done():
            self.finished.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_exception(ConnectionError("closed"))


async def bench_pull_ack(cluster: LocalCluster, seconds: float) -> float:
    proto, dt = await drive(leader_address(cluster, "bench-pushb"),
                            lambda deadline: _ConsumeDriver("bench-pushb", 100, 16, deadline), seconds)
    return proto.acked / dt


async def bench_latency(cluster: LocalCluster, samples: int) -> tuple[float, float]:
    conn = await leader_conn(cluster, "bench-lat")
    lat = []
    for _ in range(samples):
        t = time.perf_counter()
        r = await conn.call({"cmd": "PUSH", "queue": "bench-lat", "data": DATA_100})
        lat.append(time.perf_counter() - t)
        assert r["ok"], r
    conn.close()
    lat.sort()
    return statistics.median(lat) * 1000, lat[int(len(lat) * 0.99) - 1] * 1000


async def bench_failover(cluster: LocalCluster) -> float:
    topo = cluster.topology()
    p = partition_for("bench-fo", topo.partitions)
    victim = topo.partition_map[p].leader
    assert victim
    cluster.kill(victim)
    t0 = time.perf_counter()
    deadline = t0 + 30
    while time.perf_counter() < deadline:
        for address in cluster.addresses:
            if address == cluster.address_of(victim):
                continue
            try:
                conn = await asyncio.wait_for(Conn.open(address), 1)
            except (OSError, asyncio.TimeoutError):
                continue
            try:
                r = await asyncio.wait_for(conn.call({"cmd": "PUSH", "queue": "bench-fo", "data": 1}), 1)
            except (asyncio.TimeoutError, ConnectionError):
                continue
            finally:
                conn.close()
            if r.get("ok"):
                return time.perf_counter() - t0
        await asyncio.sleep(0.02)
    raise TimeoutError("no write within 30 s of the leader kill")


async def raft_batching(cluster: LocalCluster) -> tuple[int, int]:
    """(Raft entries proposed, commands they carried) over every node, from ``Prometheus``."""
    entries = commands = 0
    for address in cluster.addresses:
        conn = await Conn.open(address)
        try:
            text = (await conn.call({"cmd": "Prometheus"}))["text"]
        finally:
            conn.close()
        for line in text.splitlines():
            name, value = line.partition("{")[0], line.rsplit(" ", 1)[-1]
            if name == "shoal_raft_batches_total":
                entries += int(float(value))
            elif name == "shoal_raft_batched_commands_total":
                commands += int(float(value))
    return entries, commands


def process_cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` so far, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds each node and this driver used during one phase (from /proc and getrusage)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def _sample(self) -> dict[str, float]:
        out = {node_id: process_cpu_s(pid) for node_id, pid in self.cluster.pids.items()}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out["driver"] = usage.ru_utime + usage.ru_stime
        return out

    def __enter__(self) -> "CpuMeter":
        self.t0, self.before = time.perf_counter(), self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.t0
        after = self._sample()
        self.shares = {k: (after[k] - self.before.get(k, 0.0)) / wall for k in after}

    def summary(self) -> str:
        return "cpu " + ", ".join(f"{k} {v:.0%}" for k, v in self.shares.items())


def batching(before: tuple[int, int], after: tuple[int, int]) -> str:
    entries, commands = after[0] - before[0], after[1] - before[1]
    return f", {entries:,} Raft entries of {commands / max(entries, 1):.1f} commands"


def _py_spy() -> str:
    """py-spy from this interpreter's environment (the venv's bin), else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else (shutil.which("py-spy") or "py-spy")


class Profiler:
    """py-spy ``record`` on every node for the duration of one phase (optional)."""

    def __init__(self, cluster: LocalCluster, out: str | None, phase: str, seconds: float) -> None:
        self.cluster, self.out, self.phase, self.seconds = cluster, out, phase, seconds
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[tuple[str, str]] = []

    def __enter__(self) -> "Profiler":
        if self.out:
            os.makedirs(self.out, exist_ok=True)
            for node_id, pid in self.cluster.pids.items():
                out = os.path.join(self.out, f"{self.phase}-{node_id}.txt")
                self.files.append((node_id, out))
                self.procs.append(subprocess.Popen(
                    [_py_spy(), "record", "--pid", str(pid), "--duration", str(int(self.seconds) + 1),
                     "--rate", "200", "--format", "raw", "--output", out, "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(0.5)  # py-spy attaches before the load starts
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            try:
                proc.wait(self.seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for node_id, path in self.files:
            if os.path.exists(path):
                print(f"  {self.phase} {node_id}: " + ", ".join(
                    f"{name} {share:.0%}" for name, share in top_functions(path, 8)))


def top_functions(path: str, n: int) -> list[tuple[str, float]]:
    """The ``n`` functions with the most samples on the stack (inclusive), from collapsed stacks."""
    inclusive: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            total += int(count)
            for name in {frame.split(" (")[0] for frame in stack.split(";")}:
                inclusive[name] += int(count)
    # The entry chain (runpy, the CLI, run_node) is on almost every stack and says nothing.
    return [(name, c / max(total, 1)) for name, c in inclusive.most_common()
            if c < 0.9 * total][:n]


#: (phase, label, unit, run): each against a balanced cluster, with CPU shares and Raft batching.
THROUGHPUT_PHASES = [
    ("push", "PUSH (window 100):", "ops/s", bench_push),
    ("pushb", "PUSHB (100/frame):", "jobs/s", bench_pushb),
    ("pull", "PULLB+ACKB (100/frame):", "jobs/s", bench_pull_ack),
    ("spread", "PUSH, one stream a node:", "ops/s", bench_spread),
]


async def bench_single_node(args: argparse.Namespace) -> None:
    """PUSH throughput and lone-PUSH latency of a one-node Shoal (``shoal cluster up --nodes 1``)."""
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=1, partitions=args.partitions, data_dir=tmp,
                          base_port=free_base_port(1, args.partitions)) as cluster:
            cluster.wait_balanced(30.0)
            rate = await bench_push(cluster, args.seconds)
            p50, p99 = await bench_latency(cluster, args.samples)
    print(f"one node (RF 1):          PUSH {rate:,.0f} ops/s (window 100), lone PUSH p50 {p50:.2f} ms  p99 {p99:.2f} ms")


async def main_async(args: argparse.Namespace) -> None:
    only = (set(args.only.split(",")) if args.only
            else {"push", "pushb", "pull", "spread", "latency", "failover", "single", "bare"})
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=args.partitions, data_dir=tmp,
                          base_port=free_base_port(3, args.partitions)) as cluster:
            for name, label, unit, run in THROUGHPUT_PHASES:
                if name not in only:
                    continue
                if name == "pull" and "pushb" not in only:
                    await fill_pull_backlog(cluster)
                cluster.wait_balanced(30.0)
                entries = await raft_batching(cluster)
                with Profiler(cluster, args.profile, name, args.seconds), CpuMeter(cluster) as cpu:
                    rate = await run(cluster, args.seconds)
                print(f"{label:<26}{rate:12,.0f} {unit}" + "   " + cpu.summary()
                      + batching(entries, await raft_batching(cluster)))
            if "latency" in only:
                p50, p99 = await bench_latency(cluster, args.samples)
                print(f"lone PUSH latency:        p50 {p50:.2f} ms  p99 {p99:.2f} ms")
            if "failover" in only:
                fo = await bench_failover(cluster)
                print(f"leader SIGKILL -> write:  {fo:.2f} s")
    if "single" in only:
        await bench_single_node(args)
    if "bare" in only:
        bare = await bench_bare_push(args.seconds)
        print(f"reference, bare server:   {bare:12,.0f} ops/s   PUSH, window 100, to bench/bare_server.py "
              "(uvloop + msgpack, no Raft): this machine's speed in this run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time limit per throughput phase")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000, help="lone-PUSH latency samples")
    parser.add_argument("--only", default="",
                        help="comma list of phases: push,pushb,pull,spread,latency,failover,single,bare")
    parser.add_argument("--profile", default=None, metavar="DIR", help="py-spy flame graphs of each node per phase")
    args = parser.parse_args()
    # A SIGTERM (bench_ab.py's timeout, a kill) unwinds as Ctrl-C does, so the cluster's context
    # manager stops the node processes instead of leaving them running under the next run.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    uvloop.install()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
