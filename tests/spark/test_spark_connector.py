"""The Spark connector against a real 3-node cluster, with a local[2,2] SparkSession and (marker
``spark_cluster``) on a Spark standalone cluster of two workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client
from shoal.cluster.launcher import LocalCluster

from spark_helpers import process_available_then_stop
from waiting import eventually

pytestmark = pytest.mark.spark
SPARK_MASTERS = ("local", "standalone")  # conftest: also on a standalone master with two workers

STREAM_TIMEOUT_S = 120.0


def test_write_then_read_back_exactly_the_rows(spark: Any, seeds: str, cluster: LocalCluster) -> None:
    df = spark.range(0, 3000, numPartitions=3).selectExpr("id", "concat('row-', id) AS name", "id % 5 AS p")
    df.write.format("shoal").option("seeds", seeds).option("queue", "sp-rows").option("priorityColumn", "p") \
        .mode("append").save()
    back = spark.read.format("shoal").option("seeds", seeds).option("queue", "sp-rows") \
        .option("dataFormat", "json").load()
    rows = back.select("data", "state", "priority").collect()
    got = sorted((json.loads(r.data)["id"], json.loads(r.data)["name"], r.priority) for r in rows)
    assert got == [(i, f"row-{i}", i % 5) for i in range(3000)]
    # a waiting job with a priority is listed as prioritized
    assert sorted((json.loads(r.data)["id"], r.state) for r in rows) == [
        (i, "waiting" if i % 5 == 0 else "prioritized") for i in range(3000)]
    waiting = spark.read.format("shoal").option("seeds", seeds).option("queue", "sp-rows") \
        .option("state", "completed").load()
    assert waiting.count() == 0  # the state filter reaches the node


def test_a_retried_task_adds_nothing_twice(spark: Any, seeds: str, cluster: LocalCluster) -> None:
    df = spark.range(0, 2000, numPartitions=2).selectExpr("id")
    # Task 0's first attempt pushes 700 rows, then fails; Spark runs it again.
    df.write.format("shoal").option("seeds", seeds).option("queue", "sp-retry") \
        .option("batchSize", "100").option("testFailFirstAttempt", "0:700").mode("append").save()
    with Client(cluster.addresses) as client:
        assert client.queue("sp-retry").count("waiting") == 2000
    ids = [json.loads(r.data)["id"] for r in spark.read.format("shoal").option("seeds", seeds)
           .option("queue", "sp-retry").option("dataFormat", "json").load().select("data").collect()]
    assert sorted(ids) == list(range(2000))


def _collect_stream(spark: Any, seeds: str, queue: str, checkpoint: Path, sink: list[Any],
                    extra: dict[str, str] | None = None) -> None:
    """Run a stream until it has processed everything available, then stop it."""
    reader = spark.readStream.format("shoal").option("seeds", seeds).option("queue", queue)
    for k, v in (extra or {}).items():
        reader = reader.option(k, v)

    def each(batch: Any, batch_id: int) -> None:
        sink.extend(batch.collect())

    query = reader.load().writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint)).start()
    process_available_then_stop(query, STREAM_TIMEOUT_S)


def test_log_stream_restarts_from_its_checkpoint_exactly_once(spark: Any, seeds: str, cluster: LocalCluster,
                                                              tmp_path: Path) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("sp-log")
        q.create("log")
        q.add_bulk([f"e{i}" for i in range(150)])
        seen: list[Any] = []
        _collect_stream(spark, seeds, "sp-log", tmp_path / "ckpt", seen, {"maxRecordsPerBatch": "60",
                                                                          "dataFormat": "string"})
        assert [r.data for r in seen] == [f"e{i}" for i in range(150)]
        q.add_bulk([f"e{i}" for i in range(150, 220)])
        _collect_stream(spark, seeds, "sp-log", tmp_path / "ckpt", seen, {"dataFormat": "string"})
    assert [r.data for r in seen] == [f"e{i}" for i in range(220)]      # each once, in order
    assert [r.seq for r in seen] == list(range(1, 221))


def test_job_stream_acks_what_it_committed_and_nothing_else(spark: Any, seeds: str, cluster: LocalCluster,
                                                            tmp_path: Path) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("sp-jobs")
        q.add_bulk([{"n": i} for i in range(30)])
        seen: list[Any] = []
        _collect_stream(spark, seeds, "sp-jobs", tmp_path / "ckpt", seen,
                        {"maxJobsPerBatch": "10", "dataFormat": "json"})
        delivered = [r.id for r in seen]
        assert sorted(json.loads(r.data)["n"] for r in seen) == list(range(30))
        assert len(set(delivered)) == 30
        q.add_bulk([{"n": i} for i in range(30, 40)])  # never read by the stream
        eventually(lambda: q.counts()["completed"] >= 20, "the first two batches acked", 10, poll_s=0.2)
        counts = q.counts()
        # Batches 1 and 2 were committed (the engine planned a batch after each): acked.
        # The last batch's jobs stay leased until the query commits it or their lease lapses.
        assert counts["completed"] >= 20 and counts["completed"] + counts["active"] == 30
        assert counts["waiting"] == 10
        completed = {j.id for j in q.get_jobs("completed", limit=100)[0]}
        assert completed <= set(delivered)


def test_tasks_ran_on_both_workers(spark: Any, request: pytest.FixtureRequest) -> None:
    """On the standalone cluster, the tests above ran tasks in both executors, one per worker."""
    if request.node.callspec.params.get("spark") != "standalone":
        pytest.skip("standalone cluster only")
    import urllib.request

    context = spark.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/executors"
    with urllib.request.urlopen(url, timeout=60) as reply:  # a loaded 2-core machine answers slowly
        executors = [e for e in json.load(reply) if e["id"] != "driver"]
    assert len(executors) == 2 and all(e["totalTasks"] > 0 for e in executors), executors
    workers = request.getfixturevalue("standalone").state()["workers"]
    assert [w["coresused"] for w in workers if w["state"] == "ALIVE"] == [1, 1]  # one executor on each
