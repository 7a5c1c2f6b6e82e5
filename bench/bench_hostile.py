"""Hostile clients beside a normal client: does the normal client keep its throughput?

A 3-node cluster with a client token (``LocalCluster``). The normal client is a pipelined
driver in this process: PUSH (window 50) then PULLB+ACKB (100 jobs a pull) against the leader
of its queue, each phase ``--seconds`` long. The hostile clients run in a second process
against the same node, each case in a loop until told to stop:

- an unauthenticated 8 MB frame of empty maps, again and again;
- three authenticated connections each holding an unfinished 40 MiB frame;
- a sender of one byte per second;
- 200 idle unauthenticated connections, reopened as the node closes them;
- 200 ``GetJob`` of a 1 MiB job on a connection that never reads, reopened when cut off;
- a ``Subscribe`` that never reads;
- a PUSH whose data nests 10^6 arrays (a 1 MB frame), on a new connection each time;
- wrong ``Auth`` tokens as fast as the node answers them.

Each case repeats at most 10 times a second. Runs alternate (without, with, without, with ...) so both see the same machine; printed per
run: PUSH ops/s, PULLB+ACKB jobs/s, the node's event-loop lag p99 (from its
``shoal_event_loop_lag_seconds`` histogram, bucket upper bound) and its peak RSS (VmHWM).

    python bench/bench_hostile.py [--seconds 6] [--pairs 2] [--cases deep_nesting,wrong_tokens]
    python bench/bench_hostile.py --decode     # the depth check's cost in frame decoding
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import struct
import tempfile
import threading
import time
import urllib.request
from typing import Any

import msgpack

from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

TOKEN = "bench-token"
QUEUE = "bench-hostile"


# --- the normal client ---------------------------------------------------------------------------

class Conn:
    """A pipelined, authenticated v2 connection."""

    async def open(self, address: str) -> "Conn":
        host, port = address.rsplit(":", 1)
        self.reader, self.writer = await asyncio.open_connection(host, int(port))
        self.decoder = FrameDecoder(requests=False)
        self.waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.next_id = 0
        self.task = asyncio.get_running_loop().create_task(self._read())
        assert (await self.call({"cmd": "Auth", "token": TOKEN}))["ok"]
        await self.call({"cmd": "Hello", "protocolVersion": 2})
        return self

    async def _read(self) -> None:
        while data := await self.reader.read(1 << 18):
            self.decoder.feed(data)
            for frame in self.decoder:
                fut = self.waiters.pop(frame.get("reqId"), None)
                if fut is not None and not fut.done():
                    fut.set_result(frame)

    def call(self, frame: dict[str, Any]) -> "asyncio.Future[dict[str, Any]]":
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiters[self.next_id] = fut
        self.writer.write(encode({**frame, "reqId": self.next_id}))
        return fut

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


async def push_phase(address: str, seconds: float) -> float:
    conn = await Conn().open(address)
    done, deadline, window = 0, time.monotonic() + seconds, 50
    started = time.monotonic()
    inflight: set[asyncio.Future[dict[str, Any]]] = set()
    while time.monotonic() < deadline and done < 10_000_000:
        while len(inflight) < window:
            inflight.add(conn.call({"cmd": "PUSH", "queue": QUEUE, "data": b"x" * 100}))
        finished, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        done += sum(1 for f in finished if f.result().get("ok"))
    await asyncio.wait(inflight, timeout=10) if inflight else None
    conn.close()
    return done / (time.monotonic() - started)


async def pull_phase(address: str, seconds: float) -> float:
    conn = await Conn().open(address)
    done, deadline = 0, time.monotonic() + seconds
    started = time.monotonic()

    async def slot() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            got = await conn.call({"cmd": "PULLB", "queue": QUEUE, "count": 100})
            jobs = got.get("jobs") or []
            if not jobs:
                return
            acked = await conn.call({"cmd": "ACKB", "ids": [j["id"] for j in jobs], "tokens": got["tokens"]})
            done += acked.get("count", 0)

    await asyncio.gather(*(slot() for _ in range(8)))
    conn.close()
    return done / (time.monotonic() - started)


# --- the hostile clients (second process) --------------------------------------------------------

def _sock(address: str, timeout_s: float = 5.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def _authed(address: str) -> socket.socket:
    s = _sock(address)
    s.sendall(encode({"cmd": "Auth", "token": TOKEN, "reqId": 1}))
    s.recv(1 << 16)
    return s


def _quiet(fn: Any) -> Any:
    """Repeat an attack until ``stop``, at most 10 times a second: the attacker shares this
    2-core machine with the node, and its own CPU is not what is measured."""
    def run(address: str, stop: Any, job: str) -> None:
        while not stop.is_set():
            try:
                fn(address, stop, job)
            except OSError:
                pass
            stop.wait(0.1)
    run.__name__ = fn.__name__
    return run


@_quiet
def big_unauth_frame(address: str, stop: Any, job: str) -> None:
    body = b"\xdd" + struct.pack(">I", 8 << 20) + b"\x80" * (8 << 20)
    with _sock(address) as s:
        s.sendall(struct.pack(">I", len(body)) + body)


@_quiet
def unfinished_frames(address: str, stop: Any, job: str) -> None:
    socks = [_authed(address) for _ in range(3)]
    try:
        for s in socks:
            s.sendall(struct.pack(">I", 40 << 20) + b"\x00" * ((40 << 20) - 1))
        stop.wait(40)
    finally:
        for s in socks:
            s.close()


@_quiet
def slow_sender(address: str, stop: Any, job: str) -> None:
    with _authed(address) as s:
        s.sendall(struct.pack(">I", 1000))
        for _ in range(120):
            if stop.wait(1.0):
                return
            s.sendall(b"\xc0")


@_quiet
def idle_connections(address: str, stop: Any, job: str) -> None:
    socks = [_sock(address) for _ in range(200)]
    try:
        stop.wait(12)
    finally:
        for s in socks:
            s.close()


@_quiet
def never_reads_replies(address: str, stop: Any, job: str) -> None:
    with _authed(address) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(b"".join(encode({"cmd": "GetJob", "id": job, "reqId": 10 + i}) for i in range(200)))
        stop.wait(10)


@_quiet
def never_reads_events(address: str, stop: Any, job: str) -> None:
    with _authed(address) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(encode({"cmd": "Subscribe", "reqId": 2}))
        stop.wait(30)


@_quiet
def deep_nesting(address: str, stop: Any, job: str) -> None:
    body = b"\x84\xa3cmd\xa4PUSH\xa5queue\xa4deep\xa5reqId\x07\xa4data" + b"\x91" * 10**6 + b"\x00"
    with _authed(address) as s:
        s.sendall(struct.pack(">I", len(body)) + body)
        s.recv(1 << 16)


@_quiet
def wrong_tokens(address: str, stop: Any, job: str) -> None:
    with _sock(address) as s:
        for i in range(10):
            s.sendall(encode({"cmd": "Auth", "token": f"wrong-{i}", "reqId": i}))
            if not s.recv(1 << 16):
                return


CASES = (big_unauth_frame, unfinished_frames, slow_sender, idle_connections, never_reads_replies,
         never_reads_events, deep_nesting, wrong_tokens)


def hostile_process(address: str, job: str, stop: Any, names: list[str]) -> None:
    cases = [c for c in CASES if c.__name__ in names]
    threads = [threading.Thread(target=case, args=(address, stop, job), daemon=True) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


# --- measurement ---------------------------------------------------------------------------------

def lag_buckets(http: str) -> dict[float, float]:
    req = urllib.request.Request(http + "/prometheus", headers={"Authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("shoal_event_loop_lag_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    return out


def p99(before: dict[float, float], after: dict[float, float]) -> float:
    if not after:
        return float("nan")  # a node without the histogram (older code)
    total = after[float("inf")] - before[float("inf")]
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0) >= 0.99 * total:
            return bound
    return float("inf")


def vm_hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def decode_costs() -> None:
    """What the nesting-depth check adds to the node's frame decoding (no cluster needed)."""
    from shoal.cluster.codec import Raw

    def push(data: Any, i: int) -> bytes:
        return encode({"cmd": "PUSH", "queue": "q", "data": Raw(msgpack.packb(data)), "reqId": i})

    cases = {"100 B map (under 512 B: not checked)": lambda i: push({"n": i, "pad": "x" * 64}, i),
             "1 KB map": lambda i: push({"n": i, "pad": "x" * 1000}, i),
             "1 KB bytes (scalar data: not checked)": lambda i: push(b"x" * 1000, i),
             "deep 10^6 (1 MB, refused)": lambda i: _frame(b"\x84\xa3cmd\xa4PUSH\xa5queue\xa4deep\xa5reqId\x07"
                                                         b"\xa4data" + b"\x91" * 10**6 + b"\x00")}
    for name, make in cases.items():
        count = 20 if name.startswith("deep") else 5000
        data = b"".join(make(i) for i in range(count))
        best = float("inf")
        try:
            for _ in range(7):
                decoder = FrameDecoder(raw_data=True, plain_push=True)
                started = time.perf_counter()
                for off in range(0, len(data), 1 << 18):
                    decoder.drain(data[off:off + (1 << 18)])
                best = min(best, time.perf_counter() - started)
        except Exception as exc:  # the node code before the depth limit: the error escaped drain
            print(f"{name:>40}: {type(exc).__name__} escaped the decoder")
            continue
        print(f"{name:>40}: {best / count * 1e6:8.2f} us/frame")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", action="store_true", help="only time frame decoding with the depth check")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--cases", default=",".join(c.__name__ for c in CASES),
                    help="comma-separated attack cases run together (default: all)")
    args = ap.parse_args()
    if args.decode:
        decode_costs()
        return
    names = args.cases.split(",")
    unknown = set(names) - {c.__name__ for c in CASES}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}")
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
            nodes=3, partitions=8, data_dir=tmp, base_port=free_base_port(3, 8), tokens=(TOKEN,)) as cl:
        cl.wait_balanced()
        leader = cl.leader_of(partition_for(QUEUE, 8))
        assert leader is not None
        n = cl.config.node(leader)
        address, http = f"{n.host}:{n.port}", f"http://{n.host}:{n.http_port}"
        big_queue = next(q for q in (f"big-job-{i}" for i in range(1000))
                         if cl.leader_of(partition_for(q, 8)) == leader)
        with _authed(address) as s:  # the 1 MiB job the GetJob attack asks for, on the same node
            s.sendall(encode({"cmd": "PUSH", "queue": big_queue, "data": b"x" * (1 << 20), "reqId": 5}))
            dec = FrameDecoder(requests=False)
            while True:
                dec.feed(s.recv(1 << 16))
                reply = next(iter(dec), None)
                if reply is not None and reply.get("reqId") == 5:
                    break
        job = reply["id"]
        results: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        ctx = multiprocessing.get_context("spawn")
        for _ in range(args.pairs):
            for hostile in (False, True):
                stop = ctx.Event()
                proc = ctx.Process(target=hostile_process, args=(address, job, stop, names), daemon=True)
                if hostile:
                    proc.start()
                    time.sleep(2.0)
                before = lag_buckets(http)
                push = asyncio.run(push_phase(address, args.seconds))
                pull = asyncio.run(pull_phase(address, args.seconds))
                lag = p99(before, lag_buckets(http))
                if hostile:
                    stop.set()
                    proc.join(70)
                    if proc.is_alive():
                        proc.kill()
                results[hostile].append((push, pull, lag))
                print(f"{'with hostile clients' if hostile else 'alone':>21}: PUSH {push:9,.0f} ops/s  "
                      f"PULLB+ACKB {pull:9,.0f} jobs/s  loop lag p99 <= {lag * 1000:.1f} ms  "
                      f"node VmHWM {vm_hwm_mib(cl.pids[leader]):.0f} MiB", flush=True)
        for i, name in ((0, "PUSH"), (1, "PULLB+ACKB")):
            alone = statistics.median(r[i] for r in results[False])
            hostile_ = statistics.median(r[i] for r in results[True])
            print(f"{name}: with hostile clients {hostile_ / alone:.0%} of alone (medians)")


if __name__ == "__main__":
    main()
