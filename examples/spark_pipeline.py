"""Example pipeline: ingest a generated DataFrame into Shoal in parallel, then read it back.

    python examples/spark_pipeline.py [--rows 1000000] [--seeds host:port,...] [--master local[2]|standalone|spark://...]

Without ``--seeds`` it starts a local 3-node cluster (RF 3) in a temporary directory and
stops it at the end. ``--master standalone`` starts a Spark standalone master and two workers
on loopback from pyspark's own scripts, and stops them at the end. Needs ``pip install 'shoal[spark]'`` and Java 17.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def cluster_seeds(seeds: str | None, partitions: int) -> Iterator[str]:
    """The given seeds, or those of a local 3-node cluster started for the run."""
    if seeds:
        yield seeds
        return
    from shoal.cluster.launcher import LocalCluster, free_base_port

    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=partitions, data_dir=tmp,
                          base_port=free_base_port(3, partitions)) as cluster:
            cluster.wait_balanced()
            yield ",".join(cluster.addresses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seeds", default=None, help="host:port,... of a running cluster")
    parser.add_argument("--queue", default="pipeline")
    parser.add_argument("--shards", type=int, default=4, help="spread the queue over this many sub-queues")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=8, help="cluster partitions (local cluster only)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from shoal.client import Client

    with cluster_seeds(args.seeds, args.partitions) as seeds:
        with Client(seeds.split(",")) as client:
            client.queue(args.queue, shards=args.shards).create(shards=args.shards)
        with contextlib.ExitStack() as stack:
            if args.master == "standalone":
                from shoal.client.spark.standalone import StandaloneSpark

                work = stack.enter_context(tempfile.TemporaryDirectory())
                spark = stack.enter_context(StandaloneSpark(Path(work), workers=2, cores=1)).session("shoal-pipeline")
            else:
                spark = SparkSession.builder.master(args.master).appName("shoal-pipeline") \
                    .config("spark.ui.enabled", "false").getOrCreate()
            stack.callback(spark.stop)
            spark.sparkContext.setLogLevel("ERROR")
            run(spark, seeds, args)


def run(spark: Any, seeds: str, args: argparse.Namespace) -> None:
    """Ingest the generated rows, then read them back and check every row came once."""
    df = spark.range(0, args.rows, numPartitions=8).selectExpr(
        "id", "concat('user-', id % 1000) AS user", "rand(7) * 100 AS amount")
    t0 = time.perf_counter()
    df.write.format("shoal").option("seeds", seeds).option("queue", args.queue) \
        .option("shards", str(args.shards)).option("groupColumn", "user").mode("append").save()
    wrote_s = time.perf_counter() - t0
    print(f"ingested {args.rows:,} rows in {wrote_s:.1f} s: {args.rows / wrote_s:,.0f} rows/s "
          f"({args.master}, {args.shards} shards)")
    t0 = time.perf_counter()
    back = spark.read.format("shoal").option("seeds", seeds).option("queue", args.queue) \
        .option("shards", str(args.shards)).load()
    count, distinct = back.selectExpr("count(*)", "count(DISTINCT id)").first()
    read_s = time.perf_counter() - t0
    print(f"read back {count:,} jobs ({distinct:,} distinct ids) in {read_s:.1f} s: "
          f"{count / read_s:,.0f} rows/s, {back.rdd.getNumPartitions()} Spark partitions")
    if count != args.rows or distinct != args.rows:
        raise SystemExit(f"expected {args.rows:,} jobs, got {count:,}")


if __name__ == "__main__":
    main()
