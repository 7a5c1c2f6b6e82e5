"""Interleaved A/B pairs of ``bench_node.py`` in two checkouts, with the nodes' CPU time per operation.

On a shared or noisy machine wall throughput swings by tens of percent within minutes; the CPU
the node processes spend per operation swings far less. This runs ``bench_node.py`` of checkout
A and of checkout B, ``--rounds`` times, in turns (A first in even rounds, B first in odd ones;
each with its own virtualenv's Python), and prints per phase the median wall rate and the
median CPU microseconds per operation of the three nodes together and of the busiest node (the
leader of the benchmark's queue), from the CPU shares ``bench_node.py`` prints (utime + stime of
each node over the phase ÷ operations).

Both sides run checkout B's ``bench_node.py`` (the same driver, so only the nodes differ), each
with its own checkout's package; ``--own-driver`` runs each checkout's own script instead.

    python bench/bench_ab.py A_DIR B_DIR [--rounds 5] [--seconds 5] [--only push,pushb,pull,latency]

Every run is bounded by ``--timeout``; a failed run is reported and left out of the medians.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

#: Seconds a timed-out run has after its SIGTERM to stop its nodes before it is killed.
STOP_GRACE_S = 60.0
_RATE = re.compile(r"^(?P<label>[A-Z][^:]*?):?\s{2,}(?P<rate>[\d,]+) (?:ops|jobs)/s\s+cpu (?P<cpu>.*?)(?:,\s*[\d,]+ Raft|$)")
_SHARE = re.compile(r"(n\d+) (\d+)%")
_LATENCY = re.compile(r"lone PUSH latency:\s+p50 ([\d.]+) ms\s+p99 ([\d.]+) ms")
_FAILOVER = re.compile(r"leader SIGKILL -> write:\s+([\d.]+) s")


def run_once(checkout: Path, script: Path, args: argparse.Namespace) -> dict[str, float]:
    """One run of the driver ``script`` against ``checkout``'s nodes: {metric: value}."""
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), str(script), "--seconds", str(args.seconds),
           "--only", args.only]
    with subprocess.Popen(cmd, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            out, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM first: the driver then stops its cluster's nodes, which a SIGKILL would
            # leave running under every later round.
            proc.terminate()
            try:
                proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            print(f"  {checkout}: timed out after {args.timeout}s", file=sys.stderr)
            return {}
    metrics: dict[str, float] = {}
    for line in out.splitlines():
        m = _RATE.match(line)
        if m:
            label = m["label"].strip()
            rate = float(m["rate"].replace(",", ""))
            shares = [int(v) / 100 for _, v in _SHARE.findall(m["cpu"])]
            metrics[f"{label} wall /s"] = rate
            if rate > 0 and shares:
                metrics[f"{label} cpu us/op, nodes"] = sum(shares) / rate * 1e6
                metrics[f"{label} cpu us/op, busiest"] = max(shares) / rate * 1e6
        elif (m := _LATENCY.search(line)):
            metrics["lone PUSH p50 ms"], metrics["lone PUSH p99 ms"] = float(m[1]), float(m[2])
        elif (m := _FAILOVER.search(line)):
            metrics["failover s"] = float(m[1])
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="checkout A (with its own .venv)")
    parser.add_argument("b", type=Path, help="checkout B (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", default="push,pushb,pull,latency")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one bench_node.py run may take")
    parser.add_argument("--own-driver", action="store_true", help="each checkout runs its own bench_node.py")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    sides = (("A", args.a), ("B", args.b))
    for i in range(args.rounds):
        # A then B in even rounds, B then A in odd ones: going second can favour a run on this
        # machine, and alternating puts that on both sides alike.
        for side, checkout in (sides if i % 2 == 0 else sides[::-1]):
            driver = checkout if args.own_driver else args.b
            metrics = run_once(checkout.resolve(), driver.resolve() / "bench" / "bench_node.py", args)
            results[side].append(metrics)
            print(f"round {i + 1} {side}: " + ", ".join(f"{k} {v:,.2f}" for k, v in metrics.items()), flush=True)
    keys = list(dict.fromkeys(k for side in results.values() for run in side for k in run))
    print(f"\nmedians over {args.rounds} interleaved rounds (A = {args.a}, B = {args.b}); paired: the geometric"
          " mean of each round's B/A (the two runs of a round are minutes apart at most, so a machine whose"
          " speed drifts moves both)")
    print(f"{'metric':<34}{'A':>12}{'B':>12}{'B/A':>8}{'paired':>8}")
    for key in keys:
        a = [run[key] for run in results["A"] if key in run]
        b = [run[key] for run in results["B"] if key in run]
        if a and b:
            ma, mb = statistics.median(a), statistics.median(b)
            pairs = [rb[key] / ra[key] for ra, rb in zip(results["A"], results["B"])
                     if ra.get(key) and rb.get(key)]
            paired = statistics.geometric_mean(pairs) if pairs else float("nan")
            print(f"{key:<34}{ma:>12,.2f}{mb:>12,.2f}{mb / ma if ma else float('nan'):>8.2f}{paired:>8.2f}")


if __name__ == "__main__":
    main()
