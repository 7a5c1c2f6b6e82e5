"""What the client's OpenTelemetry instrumentation costs ``queue.add`` (docs/benchmarks.md).

    python bench/bench_tracing.py [--calls 200000] [--rounds 5] [--node-seconds 3]
                                  [--baseline-rev REV] [--no-otel] [--sdk]

The first two measures are taken for the working tree's ``AsyncQueue`` and, with
``--baseline-rev``, for ``client/queue.py`` as it was at that git revision (read with ``git show``
and loaded into this same process), their rounds interleaved so both see the same machine:

- client side: ``AsyncQueue.add`` against an in-process client that answers at once, in ns of
  this process's CPU time per add (other work on the machine inflates wall time, much less CPU
  time): the client's own work for one add, which is where instrumentation adds work;
- through a node: pipelined adds (100 in flight) to a 1-node, 1-partition cluster, in adds/s;
- the hook alone: the ``_tracing.send`` call ``add`` makes and its test, in CPU ns per call (loop
  included): what tracing off costs an add, without the noise of the rest of the add.

``--no-otel`` runs as if ``opentelemetry-api`` were not installed; without it, when the package
is installed, tracing is off because no SDK provider is set (the API's no-op default);
``--sdk`` sets an SDK ``TracerProvider`` and ``MeterProvider`` (every span sampled, nothing
exported): the cost when tracing is on.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = b"x" * 100
NODE_ADDS_MAX = 2_000_000


class _Answering:
    """A queue's client that answers every command at once: only the client's own work is timed."""

    def __init__(self) -> None:
        self._shards: dict[str, int] = {}
        self.new_idempotency_key = itertools.count().__next__

    async def call(self, frame: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        return {"ok": True, "id": "0-1"}


def _baseline_queue_class(rev: str) -> type:
    """``AsyncQueue`` of ``client/queue.py`` at ``rev``, as a module of ``shoal.client``."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:client/queue.py"], check=True,
                            capture_output=True, text=True).stdout
    name = "shoal.client._bench_baseline_queue"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "shoal.client"
    sys.modules[name] = module
    exec(compile(source, f"{rev}:client/queue.py", "exec"), module.__dict__)
    return module.AsyncQueue  # type: ignore[no-any-return]


async def client_side_ns(queue_cls: type, calls: int) -> float:
    q = queue_cls(_Answering(), "bench")
    add = q.add
    t0 = time.process_time_ns()
    for _ in range(calls):
        await add(DATA)
    return (time.process_time_ns() - t0) / calls


def hook_ns(calls: int) -> float:
    from shoal.client import AsyncQueue, _tracing
    q = AsyncQueue(_Answering(), "bench")
    send = _tracing.send
    t0 = time.process_time_ns()
    for _ in range(calls):
        op = send(q, "bench")
        if op is not None and op.carrier:
            raise AssertionError("unreachable: the loop only times the call and the test")
    return (time.process_time_ns() - t0) / calls


async def node_adds(queue: Any, seconds: float, window: int = 100) -> tuple[float, float]:
    """(adds/s, this process's CPU us per add) of pipelined adds through a node."""
    done = 0
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    async def lane() -> None:
        nonlocal done
        while done < NODE_ADDS_MAX and time.perf_counter() - t0 < seconds:
            await queue.add(DATA)
            done += 1

    await asyncio.gather(*(lane() for _ in range(window)))
    return done / (time.perf_counter() - t0), (time.process_time() - cpu0) / done * 1e6


def _report(title: str, unit: str, results: dict[str, list[float]], best: Any = min) -> None:
    print(title)
    for variant, values in results.items():
        shown = ", ".join(f"{v:,.1f}" if v < 100 else f"{v:,.0f}" for v in values)
        median, top = statistics.median(values), best(values)
        print(f"  {variant:10} median {median:10,.1f}  best {top:10,.1f} {unit}   ({shown})")
    if len(results) == 2:  # rounds ran in pairs: the median of the pairs' differences
        tree, base = results.values()
        diff = statistics.median(t - b for t, b in zip(tree, base))
        print(f"  tree - baseline, median of the {len(tree)} paired rounds: {diff:+,.1f} {unit}")


async def main_async(args: argparse.Namespace, variants: dict[str, type]) -> None:
    from shoal.client import AsyncClient
    from shoal.cluster.launcher import LocalCluster, free_base_port

    await client_side_ns(next(iter(variants.values())), 10_000)  # warm up
    side: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant, cls in variants.items():
            side[variant].append(await client_side_ns(cls, args.calls))
    _report(f"client side, AsyncQueue.add, {args.calls:,} calls a round:", "ns/add", side)
    from shoal.client import _tracing
    if not _tracing.enabled():  # when on, send() starts a span each call: the add figures show it
        loop_only = [hook_ns(args.calls) for _ in range(args.rounds)]
        _report(f"the hook add calls (_tracing.send and its test), {args.calls:,} calls a round:", "ns/call",
                {"tree": loop_only})
    if args.node_seconds <= 0:
        return
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=1, partitions=1, data_dir=tmp, base_port=free_base_port(1, 1)) as cluster:
            async with AsyncClient(cluster.addresses) as client:
                await node_adds(client.queue("bt-warm"), 0.5)
                rates: dict[str, list[float]] = {v: [] for v in variants}
                cpu: dict[str, list[float]] = {v: [] for v in variants}
                for r in range(args.rounds):
                    order = list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))
                    for variant, cls in order:
                        rate, cpu_us = await node_adds(cls(client, f"bt-{variant}"), args.node_seconds)
                        rates[variant].append(rate)
                        cpu[variant].append(cpu_us)
    title = f"through a 1-node cluster, 100 adds in flight, {args.node_seconds:g} s a round"
    _report(f"{title}:", "adds/s", rates, max)
    _report(f"{title}, the client's CPU per add:", "us/add", {v: [round(x, 1) for x in xs] for v, xs in cpu.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description="the cost of the client's tracing hooks on queue.add")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--node-seconds", type=float, default=3.0, help="0: skip the node measure")
    parser.add_argument("--baseline-rev", help="also time client/queue.py of this git revision")
    parser.add_argument("--no-otel", action="store_true", help="as if opentelemetry-api were not installed")
    parser.add_argument("--sdk", action="store_true", help="set SDK tracer and meter providers (tracing on)")
    args = parser.parse_args()
    if args.no_otel:
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # makes "import opentelemetry" fail
    elif args.sdk:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
    import uvloop

    from shoal.client import AsyncQueue
    variants: dict[str, type] = {"tree": AsyncQueue}
    if args.baseline_rev:
        variants[args.baseline_rev[:10]] = _baseline_queue_class(args.baseline_rev)
    from shoal.client import _tracing
    print(f"tracing hooks: {'on' if _tracing.enabled() else 'off'}")
    uvloop.install()
    asyncio.run(main_async(args, variants))


if __name__ == "__main__":
    main()
