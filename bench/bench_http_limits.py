"""The HTTP port's limits: what the guard costs a request, and a normal client beside slow clients.

``--overhead``: an aiohttp server with a trivial handler and a keep-alive aiohttp client (8
concurrent requests) in this process, on uvloop; runs alternate between aiohttp's own
``TCPSite`` and the node's ``GuardedSite`` (connection cap, header deadline and its middleware).
Printed per run: CPU time of the process (server and client together) per request; the
difference between the two is the guard's cost.

Default: a 1-node cluster (``LocalCluster``); the normal client pushes jobs over HTTP (keep-alive,
8 concurrent requests) for ``--seconds``; runs alternate alone / with slow clients in a second
process: 200 slow-header connections (one header line every 0.5 s), 200 silent connections and
50 bodies that stall half-way, each reopened when the node closes it. The node runs with a 2 s
header deadline, a 2 s body deadline and a 5 s keep-alive timeout, so the slow clients churn.
Printed per run: requests/s, the node's CPU time per request (utime+stime of its process) and
the refusals it counted (``shoal_http_refusals_total``).

    python bench/bench_http_limits.py --overhead [--requests 20000] [--pairs 3]
    python bench/bench_http_limits.py [--seconds 5] [--pairs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

from shoal.cluster.guard import NodeLimits
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.node.http.guard import GuardedSite, HttpGuard

CONCURRENCY = 8
_TICKS = os.sysconf("SC_CLK_TCK")


# --- the guard's cost per request ----------------------------------------------------------------

async def _serve_and_load(guarded: bool, requests: int) -> float:
    """CPU seconds of this process per request, server and client together."""
    guard = HttpGuard(NodeLimits(), SimpleNamespace(http_connections=0, http_refusals=defaultdict(int)))  # type: ignore[arg-type]

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[guard.middleware] if guarded else [])
    app.router.add_get("/", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    site = (GuardedSite(runner, "127.0.0.1", port, guard) if guarded
            else web.TCPSite(runner, "127.0.0.1", port, reuse_address=True))
    await site.start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:
            url = f"http://127.0.0.1:{port}/"

            async def worker(n: int) -> None:
                for _ in range(n):
                    async with session.get(url) as r:
                        await r.read()

            await asyncio.gather(*(worker(200) for _ in range(CONCURRENCY)))  # warm up
            started = time.process_time()
            await asyncio.gather(*(worker(requests // CONCURRENCY) for _ in range(CONCURRENCY)))
            return (time.process_time() - started) / (requests // CONCURRENCY * CONCURRENCY)
    finally:
        await runner.cleanup()


def overhead(requests: int, pairs: int) -> None:
    results: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(pairs):
        for guarded in (False, True):
            cpu = uvloop.run(_serve_and_load(guarded, requests))
            results[guarded].append(cpu)
            print(f"{'GuardedSite' if guarded else 'TCPSite':>12}: {cpu * 1e6:7.1f} µs CPU per request", flush=True)
    plain, guarded_ = statistics.median(results[False]), statistics.median(results[True])
    print(f"guard: {(guarded_ - plain) * 1e6:+.1f} µs per request ({guarded_ / plain - 1:+.1%}, medians)")


# --- a normal client beside slow clients ---------------------------------------------------------

def _open(address: tuple[str, int]) -> socket.socket | None:
    try:
        return socket.create_connection(address, timeout=2)
    except OSError:
        return None


def _slow_headers(address: tuple[str, int], stop: Any, count: int) -> None:
    socks: list[socket.socket | None] = [None] * count
    line = 0
    while not stop.wait(0.5):
        line += 1
        for i, s in enumerate(socks):
            try:
                if s is None:
                    s = socks[i] = _open(address)
                    if s is not None:
                        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n")
                    continue
                s.sendall(f"X-Slow-{line}: 1\r\n".encode())
            except OSError:
                if s is not None:
                    s.close()
                socks[i] = None
    for s in socks:
        if s is not None:
            s.close()


def _silent(address: tuple[str, int], stop: Any, count: int) -> None:
    socks: list[socket.socket | None] = [None] * count
    while not stop.wait(0.5):
        for i, s in enumerate(socks):
            if s is not None:
                s.setblocking(False)
                try:
                    closed = s.recv(1 << 16) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if not closed:
                    continue
                s.close()
            socks[i] = _open(address)
    for s in socks:
        if s is not None:
            s.close()


def _stalled_bodies(address: tuple[str, int], stop: Any, count: int) -> None:
    head = (b"POST /queues/stall/jobs HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"data\": \"")
    socks: list[socket.socket | None] = [None] * count
    while not stop.wait(0.5):
        for i, s in enumerate(socks):
            if s is not None:
                s.setblocking(False)
                try:
                    s.recv(1 << 16)  # the 408 or the close: answered
                    waiting = False
                except BlockingIOError:
                    waiting = True
                except OSError:
                    waiting = False
                if waiting:
                    continue
                s.close()
            s = socks[i] = _open(address)
            if s is not None:
                try:
                    s.sendall(head)
                except OSError:
                    s.close()
                    socks[i] = None
    for s in socks:
        if s is not None:
            s.close()


def slow_clients(address: tuple[str, int], stop: Any) -> None:
    threads = [threading.Thread(target=fn, args=(address, stop, n), daemon=True)
               for fn, n in ((_slow_headers, 200), (_silent, 200), (_stalled_bodies, 50))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


async def push_phase(url: str, seconds: float) -> int:
    done = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:
        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                async with session.post(url + "/queues/bench-http/jobs", json={"data": {"n": done}}) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def refusals(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/prometheus", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^shoal_http_refusals_total\{reason="(\w+)"\} (\S+)$', text, re.M)}


def beside_slow_clients(seconds: float, pairs: int) -> None:
    env = {"SHOAL_HTTP_HEADER_TIMEOUT_MS": "2000", "SHOAL_FRAME_TIMEOUT_MS": "2000",
           "SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS": "5000"}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(nodes=1, partitions=2, data_dir=tmp,
                                                             base_port=free_base_port(1, 2), extra_env=env) as cl:
        cl.wait_ready()
        n = cl.config.node("n1")
        url, pid = f"http://{n.host}:{n.http_port}", cl.pids["n1"]
        ctx = multiprocessing.get_context("spawn")
        results: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(pairs):
            for hostile in (False, True):
                stop = ctx.Event()
                proc = ctx.Process(target=slow_clients, args=((n.host, n.http_port), stop), daemon=True)
                if hostile:
                    proc.start()
                    time.sleep(3.0)  # the slow clients connect and the first deadlines pass
                before, cpu_before = refusals(url), cpu_s(pid)
                done = uvloop.run(push_phase(url, seconds))
                cpu, after = cpu_s(pid) - cpu_before, refusals(url)
                if hostile:
                    stop.set()
                    proc.join(30)
                    if proc.is_alive():
                        proc.kill()
                results[hostile].append(done / seconds)
                counted = ", ".join(f"{k} {after[k] - before.get(k, 0):,.0f}" for k in sorted(after))
                print(f"{'with slow clients' if hostile else 'alone':>17}: {done / seconds:7,.0f} pushes/s  "
                      f"node CPU {cpu / max(done, 1) * 1e6:6.0f} µs per push  refusals: {counted}", flush=True)
        alone, hostile_ = statistics.median(results[False]), statistics.median(results[True])
        print(f"with slow clients: {hostile_ / alone:.0%} of alone (medians)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overhead", action="store_true", help="only the guard's CPU cost per request")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    if args.overhead:
        overhead(args.requests, args.pairs)
    else:
        beside_slow_clients(args.seconds, args.pairs)


if __name__ == "__main__":
    main()
