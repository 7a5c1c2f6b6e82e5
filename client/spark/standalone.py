"""A Spark standalone cluster on loopback, from the pyspark installation's own scripts.

    with StandaloneSpark(workers=2, work_dir=tmp) as cluster:
        spark = cluster.session("my-app")

One master and ``workers`` workers, each a ``spark-class`` JVM (``org.apache.spark.deploy.master.Master``,
``...worker.Worker``) in the foreground, so this object owns their PIDs and stops exactly
those processes (terminate, then kill after a grace period), also when start-up fails.
Ports are picked free on 127.0.0.1 (none of Spark's defaults, so several clusters can
share a machine). For tests, benchmarks and examples: executors in separate JVMs and
Python workers in separate processes, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["StandaloneSpark", "spark_home"]

_START_TIMEOUT_S = 120.0
_STOP_GRACE_S = 10.0
_POLL_S = 0.25


def spark_home() -> Path:
    """The directory of the installed pyspark (it ships ``bin/spark-class`` and the jars)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StandaloneSpark:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1."""

    def __init__(self, work_dir: Path, *, workers: int = 2, cores: int = 1, memory: str = "768m") -> None:
        self.work_dir = Path(work_dir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = _free_port()
        self.ui_port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``."""
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(self.work_dir),
                   PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
        return env

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop())
        self._logs.append(log)
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        self.procs.append(subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, cwd=self.work_dir))

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, their cores in use, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as reply:
            return dict(json.load(reply))

    def _wait(self, what: str, ready: Any) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:  # bounded by the start-up timeout
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"Spark {what}: a process exited with {proc.returncode} "
                                       f"(logs in {self.work_dir})")
            try:
                if ready():
                    return
            except (OSError, ValueError):
                # not listening yet, or a page that is not yet the JSON status: a master's web UI
                # can answer /json/ with an HTML page for a moment while it starts
                pass
            time.sleep(_POLL_S)
        raise TimeoutError(f"Spark {what} not ready within {_START_TIMEOUT_S:.0f}s (logs in {self.work_dir})")

    def start(self) -> "StandaloneSpark":
        """Start the master, then the workers; return once every worker is ALIVE at the master."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(self.port), "--webui-port", str(self.ui_port)])
            self._wait("master", lambda: self.state() is not None)
            for i in range(self.workers):
                work = self.work_dir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                            "--cores", str(self.cores), "--memory", self.memory,
                                            "--webui-port", str(_free_port()), "--work-dir", str(work),
                                            self.master_url])
            self._wait("workers", lambda: sum(w.get("state") == "ALIVE" for w in self.state().get("workers", []))
                       >= self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def session(self, app_name: str, **conf: str) -> Any:
        """A SparkSession on this cluster: one executor per worker (``cores`` each), driver on loopback,
        Python workers running this interpreter."""
        from pyspark.sql import SparkSession

        os.environ["PYSPARK_PYTHON"] = sys.executable
        builder = (SparkSession.builder.master(self.master_url).appName(app_name)
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.executor.cores", str(self.cores)).config("spark.executor.memory", "512m")
                   .config("spark.cores.max", str(self.cores * self.workers))
                   .config("spark.ui.port", str(_free_port())).config("spark.sql.shuffle.partitions", "2"))
        for key, value in conf.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    def stop(self) -> None:
        """Stop the workers, then the master: by PID, terminate then kill after a grace period."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(_STOP_GRACE_S)
        self.procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> "StandaloneSpark":
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
