"""Spark finds ``format("shoal")`` with no register call from any working directory.

The script runs in a fresh interpreter whose working directory is a temporary directory
outside the repository, with no ``PYTHONPATH``: only what the installation put on
``sys.path`` can make the source visible (Spark lists ``pyspark_*`` modules with
``pkgutil.iter_modules``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent('''
    import json, os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    seeds = sys.argv[1]
    spark = (SparkSession.builder.master("local[2]").appName("shoal-discovery")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark.range(0, 500, numPartitions=2).selectExpr("id", "concat('r', id) AS name").write \\
            .format("shoal").option("seeds", seeds).option("queue", "disc").mode("append").save()
        rows = spark.read.format("shoal").option("seeds", seeds).option("queue", "disc") \\
            .option("dataFormat", "json").load().select("data").collect()
        print("IDS", json.dumps(sorted(json.loads(r.data)["id"] for r in rows)))
    finally:
        spark.stop()
''')


def test_found_from_a_directory_outside_the_repository(cluster: LocalCluster, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert REPO not in work.resolve().parents
    script = work / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    done = subprocess.run([sys.executable, str(script), ",".join(cluster.addresses)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ids_line = [line for line in done.stdout.splitlines() if line.startswith("IDS ")]
    assert ids_line, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(ids_line[0][4:]) == list(range(500))


def test_the_spark_entry_module_is_a_real_file_on_sys_path() -> None:
    """What ``iter_modules`` needs, in this interpreter (editable or wheel install alike)."""
    import pkgutil

    outside = [p for p in sys.path if Path(p or ".").resolve() != REPO]  # not via the repository root
    found = [m for m in pkgutil.iter_modules(outside) if m.name == "pyspark_shoal"]
    assert found, "pyspark_shoal is not a file in any sys.path directory: reinstall the package"
