"""bunqueue's own clients, installed once per machine into a cache outside the repository, and
real Shoal clusters to point them at: its JavaScript client (npm ``bunqueue``, run by Bun from
npm ``bun``) and its Python SDK (PyPI ``bunqueue-client``, imported as ``bunqueue``).

The versions are pinned: the compatibility they show is with these. Without ``npm`` (or
``pip``) the tests of that client skip and say why; where they are present (developers'
machines, CI) they run.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port

BUN_VERSION = "1.4.5"
BUNQUEUE_VERSION = "2.9.5"
BUNQUEUE_SDK_VERSION = "0.1.5"
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


def _cache_base() -> Path:
    return Path(os.environ.get("SHOAL_COMPAT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shoal", "compat"))


def _cache_root() -> Path:
    return _cache_base() / f"bunqueue-{BUNQUEUE_VERSION}-bun-{BUN_VERSION}"


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


def _sdk_installed(root: Path) -> bool:
    return (root / f"bunqueue_client-{BUNQUEUE_SDK_VERSION}.dist-info").is_dir() and \
        (root / "bunqueue" / "__init__.py").is_file()


@pytest.fixture(scope="session")
def bunqueue_sdk() -> object:
    """bunqueue's Python SDK (the ``bunqueue`` module), installed from PyPI on first use into the
    cache beside the JavaScript client (``pip install --target``; its one dependency,
    ``msgpack``, is Shoal's own) and imported from there."""
    pip = [sys.executable, "-m", "pip"]
    root = _cache_base() / f"bunqueue-client-{BUNQUEUE_SDK_VERSION}-py"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time on this machine
        if not _sdk_installed(root):
            if subprocess.run([*pip, "--version"], capture_output=True, check=False).returncode != 0:
                pytest.skip("pip is not available: bunqueue's Python SDK (PyPI bunqueue-client) cannot be installed")
            shutil.rmtree(root, ignore_errors=True)
            cmd = [*pip, "install", "--no-deps", "--disable-pip-version-check", "--quiet", "--target", str(root),
                   f"bunqueue-client=={BUNQUEUE_SDK_VERSION}"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
            assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
            assert _sdk_installed(root), f"bunqueue-client {BUNQUEUE_SDK_VERSION} did not install in {root}"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("bunqueue")


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
