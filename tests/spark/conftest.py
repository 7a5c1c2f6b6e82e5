"""One 3-node cluster per test session and one SparkSession per test module (all stopped at the end).

``local[2,2]``: two cores, and a failed task is tried twice (the retry test needs that). A module
that sets ``SPARK_MASTERS = ("local", "standalone")`` also runs on a Spark standalone cluster:
a master and two one-core workers on loopback, started from pyspark's own ``spark-class`` and
stopped by PID (marker ``spark_cluster``, excluded from the default run).
Spark's Python workers run this interpreter (``PYSPARK_PYTHON``), where the connector is
installed; Spark finds it through the ``pyspark_shoal`` module, with no register call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path_factory.mktemp("spark-cluster"),
                      base_port=free_base_port(3, 4)) as cl:
        cl.wait_balanced()
        yield cl


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spark" in metafunc.fixturenames:
        masters = getattr(metafunc.module, "SPARK_MASTERS", ("local",))
        metafunc.parametrize("spark", [pytest.param(m, marks=pytest.mark.spark_cluster) if m == "standalone" else m
                                       for m in masters], indirect=True, scope="module")


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from shoal.client.spark.standalone import StandaloneSpark

    with StandaloneSpark(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    if getattr(request, "param", "local") == "standalone":
        session = request.getfixturevalue("standalone").session(
            "shoal-tests", **{"spark.sql.warehouse.dir": str(warehouse), "spark.task.maxFailures": "2"})
    else:
        session = (SparkSession.builder.master("local[2,2]").appName("shoal-tests")
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                   .config("spark.sql.warehouse.dir", str(warehouse)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture()
def seeds(cluster: LocalCluster) -> str:
    return ",".join(cluster.addresses)
