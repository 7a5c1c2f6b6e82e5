"""Spark connector benchmark: the plain client vs Spark ``local[2]`` vs a Spark standalone cluster.

    python bench/bench_spark.py [--rows 200000] [--rounds 3] [--shards 4] [--no-standalone]
    python bench/bench_spark.py --backlog 10000000 [--rows 200000] [--rounds 3]

One local 3-node Shoal cluster (RF 3, 8 partitions). Every round writes ``--rows`` rows
``{id, user, amount}`` into a fresh queue of ``--shards`` shards, then reads them all back:

- plain client: one Python process, ``add_bulk`` (2,000 jobs per PUSHB, pipelined), then
  ``GetJobs`` pages of 5,000 shard after shard;
- Spark: ``df.write.format("shoal")`` from a cached DataFrame of 4 partitions, then
  ``spark.read.format("shoal")`` (one task per shard) materialised with the ``noop`` sink.

Spark runs on ``local[2]``, then on a standalone master with two one-core workers started
from pyspark's ``spark-class`` (executors in their own JVMs, stopped by PID at the end).
Each Spark phase pays its start-up once, untimed (a 10,000-row write and read). The plain
client is measured in every round right before the Spark run it is compared with, so each
ratio comes from the same minutes of a shared machine. Prints rows/s per round and the median.
Every loop is bounded by the row count and the number of rounds.

With ``--backlog N`` it measures reads from a big queue instead: ``N`` rows go into one queue
of ``--shards`` shards through the plain client (``add_bulk``, 100,000 rows at a time), and
``--rows`` into another; then each round reads the big queue and the small one through Spark
``local[2]`` (``spark.read.format("shoal")``, materialised with ``noop``): rows/s of each and
their ratio. The queues' counts are checked before the reads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WARM_ROWS = 10_000


def _client_round(client: Any, queue: str, rows: list[dict[str, Any]], shards: int) -> tuple[float, float]:
    """Write then read back ``rows`` with the plain client; (write rows/s, read rows/s)."""
    q = client.queue(queue, shards=shards)
    t0 = time.perf_counter()
    q.add_bulk(rows, batch_size=2000)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = 0
    for shard in range(shards):
        offset = 0
        for _ in range(len(rows) // 5000 + 16):  # bounded: one page per 5,000 jobs, plus slack
            jobs = client.call({"cmd": "GetJobs", "queue": f"{queue}#{shard}", "limit": 5000,
                                "offset": offset})["jobs"]
            got += len(jobs)
            offset += len(jobs)
            if len(jobs) < 5000:
                break
    read_s = time.perf_counter() - t0
    assert got == len(rows), (got, len(rows))
    return len(rows) / write_s, len(rows) / read_s


def _spark_round(spark: Any, df: Any, seeds: str, queue: str, n: int, shards: int) -> tuple[float, float]:
    """Write then read back ``df`` through the connector; (write rows/s, read rows/s)."""
    t0 = time.perf_counter()
    df.write.format("shoal").option("seeds", seeds).option("queue", queue).option("shards", str(shards)) \
        .mode("append").save()
    write_s = time.perf_counter() - t0
    return n / write_s, _read_rate(spark, seeds, queue, n, shards)


def _phase(name: str, spark: Any, client: Any, seeds: str, rows: list[dict[str, Any]], args: argparse.Namespace,
           results: dict[str, list[tuple[float, float]]]) -> None:
    spark.sparkContext.setLogLevel("ERROR")
    n = len(rows)
    slug = "".join(ch for ch in name if ch.isalnum())  # queue names take no brackets or spaces

    def frame(count: int) -> Any:
        return spark.range(0, count, numPartitions=4).selectExpr(
            "id", "concat('user-', id % 1000) AS user", "id * 0.5 AS amount").cache()

    t0 = time.perf_counter()
    warm = frame(WARM_ROWS)
    warm.count()
    _spark_round(spark, warm, seeds, f"warm-{slug}", WARM_ROWS, args.shards)  # Python workers, discovery, JIT
    print(f"{name}: start-up round ({WARM_ROWS:,} rows, untimed) took {time.perf_counter() - t0:.1f} s", flush=True)
    df = frame(n)
    df.count()  # generate the rows before the clock starts
    for r in range(args.rounds):
        c = _client_round(client, f"client-{slug}-{r}", rows, args.shards)
        s = _spark_round(spark, df, seeds, f"spark-{slug}-{r}", n, args.shards)
        results.setdefault(f"client (beside {name})", []).append(c)
        results.setdefault(name, []).append(s)
        print(f"  round {r + 1}: client write {c[0]:9,.0f} read {c[1]:9,.0f} | {name} write {s[0]:9,.0f} "
              f"read {s[1]:9,.0f} rows/s | ratio write {s[0] / c[0]:4.0%} read {s[1] / c[1]:4.0%}", flush=True)


def _read_rate(spark: Any, seeds: str, queue: str, n: int, shards: int) -> float:
    """Rows/s of reading the ``n`` rows of ``queue`` through the connector (one task per shard)."""
    t0 = time.perf_counter()
    spark.read.format("shoal").option("seeds", seeds).option("queue", queue).option("shards", str(shards)) \
        .option("queueType", "jobs").load().write.format("noop").mode("overwrite").save()
    return n / (time.perf_counter() - t0)


def _held(client: Any, queue: str, shards: int) -> int:
    """Jobs waiting in ``queue``'s shards."""
    return sum(client.call({"cmd": "GetJobCounts", "queue": f"{queue}#{k}"})["counts"]["waiting"] for k in range(shards))


def _backlog_phase(spark: Any, client: Any, seeds: str, args: argparse.Namespace) -> None:
    spark.sparkContext.setLogLevel("ERROR")
    step = 100_000
    big, small = client.queue("backlog", shards=args.shards), client.queue("small", shards=args.shards)
    t0 = time.perf_counter()
    for start in range(0, args.backlog, step):
        big.add_bulk([{"id": i, "user": f"user-{i % 1000}", "amount": i * 0.5}
                      for i in range(start, min(args.backlog, start + step))], batch_size=2000)
    added_s = time.perf_counter() - t0
    small.add_bulk([{"id": i, "user": f"user-{i % 1000}", "amount": i * 0.5} for i in range(args.rows)],
                   batch_size=2000)
    held = (_held(client, "backlog", args.shards), _held(client, "small", args.shards))
    assert held == (args.backlog, args.rows), held
    print(f"added {args.backlog:,} rows to backlog in {added_s:.1f} s ({args.backlog / added_s:,.0f} rows/s), "
          f"{args.rows:,} to small; counts checked", flush=True)
    _read_rate(spark, seeds, "small", args.rows, args.shards)  # start-up: Python workers, discovery, JIT
    rates: list[tuple[float, float]] = []
    for r in range(args.rounds):
        rate_big = _read_rate(spark, seeds, "backlog", args.backlog, args.shards)
        rate_small = _read_rate(spark, seeds, "small", args.rows, args.shards)
        rates.append((rate_big, rate_small))
        print(f"  round {r + 1}: read {args.backlog:,} rows {rate_big:9,.0f} rows/s | {args.rows:,} rows "
              f"{rate_small:9,.0f} rows/s | ratio {rate_big / rate_small:.2f}", flush=True)
    print(f"\nmedians over {args.rounds} rounds, {args.shards} shards, Spark local[2]: read {args.backlog:,} rows "
          f"{statistics.median(b for b, _ in rates):,.0f} rows/s, {args.rows:,} rows "
          f"{statistics.median(s for _, s in rates):,.0f} rows/s, ratio {statistics.median(b / s for b, s in rates):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--no-standalone", action="store_true", help="skip the standalone-cluster phase")
    parser.add_argument("--backlog", type=int, default=0, help="read a queue of this many rows against --rows")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from shoal.client import Client
    from shoal.client.spark.standalone import StandaloneSpark
    from shoal.cluster.launcher import LocalCluster, free_base_port

    rows = [{"id": i, "user": f"user-{i % 1000}", "amount": i * 0.5} for i in range(args.rows)]
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=8, data_dir=Path(tmp, "shoal"), base_port=free_base_port(3, 8)) as cl:
            cl.wait_balanced()
            seeds = ",".join(cl.addresses)
            with Client(cl.addresses) as client:
                client.queue("warm-client").add_bulk(rows[:WARM_ROWS], batch_size=2000)
                spark = SparkSession.builder.master("local[2]").appName("shoal-bench") \
                    .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate()
                try:
                    if args.backlog:
                        _backlog_phase(spark, client, seeds, args)
                        return
                    _phase("local[2]", spark, client, seeds, rows, args, results)
                finally:
                    spark.stop()
                if not args.no_standalone:
                    with StandaloneSpark(Path(tmp, "spark"), workers=2, cores=1) as standalone:
                        spark = standalone.session("shoal-bench", **{"spark.ui.showConsoleProgress": "false"})
                        try:
                            _phase("standalone 2x1", spark, client, seeds, rows, args, results)
                        finally:
                            spark.stop()
    print(f"\nmedians over {args.rounds} rounds of {args.rows:,} rows, {args.shards} shards:")
    for name, values in results.items():
        write = statistics.median(v[0] for v in values)
        read = statistics.median(v[1] for v in values)
        print(f"  {name:32s} write {write:9,.0f} rows/s   read {read:9,.0f} rows/s")
    for name, values in results.items():
        beside = results.get(f"client (beside {name})")
        if beside:  # each round's Spark figure over the client figure measured just before it
            write = statistics.median(s[0] / c[0] for s, c in zip(values, beside))
            read = statistics.median(s[1] / c[1] for s, c in zip(values, beside))
            print(f"  {name} / client, median of the rounds' ratios: write {write:.0%}, read {read:.0%}")


if __name__ == "__main__":
    main()
