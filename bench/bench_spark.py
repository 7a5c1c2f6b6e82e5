"""Ingest benchmark: Spark (local[2]) through the connector vs one Python process with the client.

    python bench/bench_spark.py [--rows 200000]

Both write the same number of ~40-byte rows into fresh queues of one local 3-node
cluster (RF 3, 8 partitions), in the same run. Every loop is bounded by the row count.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from shoal.client import Client
    from shoal.cluster.launcher import LocalCluster, free_base_port

    n = args.rows
    with tempfile.TemporaryDirectory() as tmp:
        with LocalCluster(nodes=3, partitions=8, data_dir=tmp, base_port=free_base_port(3, 8)) as cluster:
            cluster.wait_balanced()
            seeds = ",".join(cluster.addresses)
            with Client(cluster.addresses) as client:
                q = client.queue("bench-client")
                rows = [{"id": i, "user": f"user-{i % 1000}", "amount": i * 0.5} for i in range(n)]
                t0 = time.perf_counter()
                q.add_bulk(rows, batch_size=2000)
                client_s = time.perf_counter() - t0
                assert q.count("waiting") == n
            print(f"plain client, one process:   {n / client_s:10,.0f} rows/s ({n:,} rows in {client_s:.1f} s)")
            spark = SparkSession.builder.master(args.master).appName("shoal-bench") \
                .config("spark.ui.enabled", "false").getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            try:
                df = spark.range(0, n, numPartitions=4).selectExpr(
                    "id", "concat('user-', id % 1000) AS user", "id * 0.5 AS amount").cache()
                df.count()  # generate the rows before the clock starts
                t0 = time.perf_counter()
                df.write.format("shoal").option("seeds", seeds).option("queue", "bench-spark") \
                    .mode("append").save()
                spark_s = time.perf_counter() - t0
            finally:
                spark.stop()
            with Client(cluster.addresses) as client:
                assert client.queue("bench-spark").count("waiting") == n
            print(f"Spark {args.master} connector: {n / spark_s:10,.0f} rows/s ({n:,} rows in {spark_s:.1f} s)")


if __name__ == "__main__":
    main()
