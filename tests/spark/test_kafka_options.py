"""Kafka-source options of the shoal source, against a real 3-node cluster and a local[2,2] session."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (SHOAL_NO_SPARK=1 or no Java)")
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from shoal.client import Client  # noqa: E402
from shoal.client.spark._cluster import connected, resolve_layout  # noqa: E402
from shoal.client.spark._convert import log_schema  # noqa: E402
from shoal.client.spark._options import OptionError, parse_read, parse_stream  # noqa: E402
from shoal.client.spark._stream import ShoalLogStreamReader, share_limit  # noqa: E402
from shoal.cluster.launcher import LocalCluster  # noqa: E402

from spark_helpers import process_available_then_stop

pytestmark = pytest.mark.spark

STREAM_TIMEOUT_S = 120.0


def _log(cluster: LocalCluster, queue: str, records: list[str]) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue(queue)
        q.create("log")
        q.add_bulk(records)


def _stream(spark: Any, seeds: str, checkpoint: Path, options: dict[str, str], *, available_now: bool = False) \
        -> list[list[Any]]:
    """Run a stream over everything available; the rows of each micro-batch."""
    reader = spark.readStream.format("shoal").option("seeds", seeds)
    for k, v in options.items():
        reader = reader.option(k, v)
    batches: list[list[Any]] = []

    def each(batch: Any, batch_id: int) -> None:
        rows = batch.collect()
        if rows:
            batches.append(rows)

    writer = reader.load().writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
    if available_now:
        query = writer.trigger(availableNow=True).start()
        try:
            assert query.awaitTermination(STREAM_TIMEOUT_S), "an availableNow query must stop by itself"
        finally:
            query.stop()
        return batches
    query = writer.start()
    process_available_then_stop(query, STREAM_TIMEOUT_S)
    return batches


def test_ending_offsets_bound_a_batch_read_of_a_log_exactly(spark: Any, seeds: str, cluster: LocalCluster) -> None:
    _log(cluster, "ko-bounded", [f"r{i}" for i in range(1, 101)])
    rows = spark.read.format("shoal").option("seeds", seeds).option("queue", "ko-bounded") \
        .option("dataFormat", "string").option("startingOffsets", json.dumps({"ko-bounded": {"0": 11}})) \
        .option("endingOffsets", json.dumps({"ko-bounded": {"0": 51}})).load().collect()
    assert sorted(r.seq for r in rows) == list(range(11, 51))           # [11, 51): exclusive end, as Kafka's
    assert sorted(r.data for r in rows) == sorted(f"r{i}" for i in range(11, 51))
    earliest = spark.read.format("shoal").option("seeds", seeds).option("queue", "ko-bounded") \
        .option("endingOffsets", json.dumps({"ko-bounded": {"0": -1}})).load().count()
    assert earliest == 100


def test_max_offsets_per_trigger_bounds_each_micro_batch(spark: Any, seeds: str, cluster: LocalCluster,
                                                         tmp_path: Path) -> None:
    _log(cluster, "ko-capped", [f"c{i}" for i in range(250)])
    batches = _stream(spark, seeds, tmp_path / "ckpt", {"queue": "ko-capped", "maxOffsetsPerTrigger": "60",
                                                        "dataFormat": "string"})
    assert all(len(b) <= 60 for b in batches) and len(batches) >= 5
    assert [r.data for b in batches for r in b] == [f"c{i}" for i in range(250)]


def test_available_now_drains_and_stops(spark: Any, seeds: str, cluster: LocalCluster, tmp_path: Path) -> None:
    _log(cluster, "ko-now", [f"n{i}" for i in range(130)])
    batches = _stream(spark, seeds, tmp_path / "ckpt", {"queue": "ko-now", "maxOffsetsPerTrigger": "50",
                                                        "dataFormat": "string"}, available_now=True)
    assert [len(b) for b in batches] == [50, 50, 30]  # the limit holds under AvailableNow too
    assert [r.data for b in batches for r in b] == [f"n{i}" for i in range(130)]
    with Client(cluster.addresses) as client:
        q = client.queue("jobs-now")
        q.add_bulk([{"n": i} for i in range(45)])
    jobs = _stream(spark, seeds, tmp_path / "ckpt-jobs", {"queue": "jobs-now", "maxOffsetsPerTrigger": "20",
                                                          "dataFormat": "json"}, available_now=True)
    assert sorted(json.loads(r.data)["n"] for b in jobs for r in b) == list(range(45))


def test_two_queues_in_one_query_with_the_queue_as_a_column(spark: Any, seeds: str, cluster: LocalCluster,
                                                            tmp_path: Path) -> None:
    _log(cluster, "ko-a", [f"a{i}" for i in range(40)])
    _log(cluster, "ko-b", [f"b{i}" for i in range(25)])
    batches = _stream(spark, seeds, tmp_path / "ckpt", {"queues": "ko-a,ko-b", "dataFormat": "string"})
    rows = [r for b in batches for r in b]
    assert [r.data for r in rows if r.queue == "ko-a"] == [f"a{i}" for i in range(40)]
    assert [r.data for r in rows if r.queue == "ko-b"] == [f"b{i}" for i in range(25)]
    with Client(cluster.addresses) as client:
        client.queue("kj-x").add_bulk([{"q": "x", "n": i} for i in range(30)])
        client.queue("kj-y").add_bulk([{"q": "y", "n": i} for i in range(20)])
    jobs = spark.read.format("shoal").option("seeds", seeds).option("queuePattern", "kj-.*") \
        .option("dataFormat", "json").load().collect()
    assert sorted((r.queue, json.loads(r.data)["n"]) for r in jobs) == \
        sorted([("kj-x", i) for i in range(30)] + [("kj-y", i) for i in range(20)])


def test_fail_on_data_loss(spark: Any, seeds: str, cluster: LocalCluster) -> None:
    _log(cluster, "ko-lost", [f"l{i}" for i in range(1, 61)])
    with Client(cluster.addresses) as client:
        client.call({"cmd": "Truncate", "queue": "ko-lost", "beforeSeq": 21})

    def read(**extra: str) -> Any:
        reader = spark.read.format("shoal").option("seeds", seeds).option("queue", "ko-lost")
        for k, v in extra.items():
            reader = reader.option(k, v)
        return reader.load()

    assert read().count() == 40  # earliest is the first record still there: nothing is lost
    from_checkpoint = json.dumps({"ko-lost": {"0": 5}})  # a position older than the truncation
    with pytest.raises(Exception, match="truncated before it was read"):
        read(startingOffsets=from_checkpoint).count()
    assert read(startingOffsets=from_checkpoint, failOnDataLoss="false").count() == 40


def test_min_offsets_per_trigger_waits_for_rows_or_the_delay(cluster: LocalCluster, seeds: str) -> None:
    _log(cluster, "ko-min", [f"m{i}" for i in range(30)])
    options = parse_stream({"seeds": seeds, "queue": "ko-min", "minOffsetsPerTrigger": "50",
                            "maxTriggerDelay": "1s"}, "log")
    with connected(options.connect) as client:
        layout = resolve_layout(client, options.connect)
    reader = ShoalLogStreamReader(options, layout, log_schema())
    start = reader.initialOffset()
    assert start == {"ko-min": {"0": 1}}
    assert reader.latestOffset(start, ReadMaxRows(10_000)) == start    # 30 < 50 rows: wait
    assert reader.latestOffset(start, ReadAllAvailable()) == {"ko-min": {"0": 31}}
    reader.admission.started()
    time.sleep(1.2)                                                     # maxTriggerDelay passed
    assert reader.latestOffset(start, ReadMaxRows(10_000)) == {"ko-min": {"0": 31}}


def test_share_limit_is_fair_and_never_over() -> None:
    assert share_limit({"a": 5, "b": 100, "c": 100}, 60) == {"a": 5, "b": 27, "c": 28}
    assert share_limit({"a": 5, "b": 3}, 60) == {"a": 5, "b": 3}
    assert sum(share_limit({i: 7 for i in range(13)}, 50).values()) == 50


def test_old_option_names_work_with_a_warning_and_bad_ones_fail() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = parse_stream({"seeds": "h:1", "queue": "q", "maxRecordsPerBatch": "7",
                                "startingOffsets": '{"0": 3}'}, "log")
    assert options.max_per_batch == 7 and options.starting == {None: {"0": 3}}
    assert sum(issubclass(w.category, FutureWarning) for w in caught) == 2
    with pytest.raises(OptionError, match="maxTriggerDelay"):
        parse_stream({"seeds": "h:1", "queue": "q", "maxTriggerDelay": "5m"}, "log")
    with pytest.raises(OptionError, match="exactly one"):
        parse_read({"seeds": "h:1", "queue": "q", "queues": "a,b"}, "log")
    with pytest.raises(OptionError, match="endingOffsets"):
        parse_read({"seeds": "h:1", "queue": "q", "endingOffsets": "earliest"}, "log")
    with pytest.raises(OptionError, match="one queue"):
        from shoal.client.spark._options import parse_write
        parse_write({"seeds": "h:1", "queues": "a,b"}, "w")
    from shoal.client.spark._read import resolve_offsets
    with pytest.raises(OptionError, match="does not cover: b"):
        resolve_offsets({"b": {"0": 3}}, (("a", None),), {"a": {"0": 9}}, "earliest")
    assert resolve_offsets({"a": {"1": -1}}, (("a", 2),), {"a": {"0": 9, "1": 4}}, "earliest",
                           {"a": {"0": 5, "1": 2}}) == {"a": {"0": 5, "1": 4}}
