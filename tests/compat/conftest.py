"""bunqueue's own client (npm ``bunqueue``, run by Bun from npm ``bun``), installed once per
machine into a cache outside the repository, and real Shoal clusters to point it at.

The versions are pinned: the compatibility they show is with these. Without ``npm`` the
tests skip and say why; where ``npm`` is present (developers' machines, CI) they run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port

BUN_VERSION = "1.4.5"
BUNQUEUE_VERSION = "2.9.5"
INSTALL_TIMEOUT_S = 600
SCRIPTS = Path(__file__).parent / "scripts"
NODE_COMMAND = os.environ.get("SHOAL_TEST_NODE_COMMAND", "").split() or None


@dataclass(frozen=True)
class BunqueueClient:
    """Where the pinned client lives, and how to run a script written with it."""

    root: Path

    @property
    def bun(self) -> Path:
        return self.root / "node_modules" / ".bin" / "bun"

    def run(self, script: str, env: dict[str, str], workdir: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run ``scripts/<script>`` under Bun with the client importable, its output captured."""
        workdir.mkdir(parents=True, exist_ok=True)
        for source in SCRIPTS.glob("*.ts"):
            shutil.copy(source, workdir / source.name)
        link = workdir / "node_modules"
        if not link.exists():
            link.symlink_to(self.root / "node_modules")
        return subprocess.run([str(self.bun), script], cwd=workdir, env={**os.environ, **env}, text=True,
                              capture_output=True, timeout=timeout_s, check=False)


def _cache_root() -> Path:
    base = os.environ.get("SHOAL_COMPAT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shoal", "compat")
    return Path(base) / f"bunqueue-{BUNQUEUE_VERSION}-bun-{BUN_VERSION}"


def _installed(root: Path) -> bool:
    try:
        meta = json.loads((root / "node_modules" / "bunqueue" / "package.json").read_text())
        out = subprocess.run([str(root / "node_modules" / ".bin" / "bun"), "--version"], capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False
    return meta.get("version") == BUNQUEUE_VERSION and out.stdout.strip() == BUN_VERSION


@pytest.fixture(scope="session")
def bunqueue_client() -> BunqueueClient:
    """The pinned bunqueue client and Bun, installed from the npm registry on first use."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not on PATH: bunqueue's client (npm bunqueue and bun) cannot be installed here")
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time on this machine
        if not _installed(root):
            (root / "package.json").write_text(json.dumps({"name": "shoal-compat", "private": True}))
            cmd = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(root),
                   f"bun@{BUN_VERSION}", f"bunqueue@{BUNQUEUE_VERSION}"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
            assert done.returncode == 0, f"npm install failed:\n{done.stdout}\n{done.stderr}"
            assert _installed(root), f"bun {BUN_VERSION} / bunqueue {BUNQUEUE_VERSION} did not install in {root}"
    return BunqueueClient(root)


@contextlib.contextmanager
def _cluster(tmp: Path, nodes: int) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=nodes, partitions=8, data_dir=tmp, base_port=free_base_port(nodes, 8),
                      node_command=NODE_COMMAND) as cl:
        if nodes > 1:
            cl.wait_balanced()
        yield cl


@pytest.fixture(scope="module", params=[1, 3], ids=["1-node", "3-node"])
def shoal_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real 1-node or 3-node Shoal cluster (8 partitions) for one test module."""
    with _cluster(tmp_path_factory.mktemp(f"compat{request.param}"), request.param) as cl:
        yield cl
