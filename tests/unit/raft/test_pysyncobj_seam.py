"""The seam to pysyncobj: one package imports it, one module reaches its private names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from shoal.node.raft import _pysyncobj as seam

ROOT = Path(__file__).resolve().parents[3]


def test_every_private_name_still_exists(tmp_path: Path) -> None:
    assert seam.missing_private_names() == [], "pysyncobj renamed a private name Shoal relies on"
    conf = seam.SyncObjConf(autoTick=False, journalFile=str(tmp_path / "j"), fullDumpFile=str(tmp_path / "d"))
    obj = seam.HookedSyncObj(seam.Node("a"), [], conf=conf, transport=seam.Transport(None, None, None))
    try:
        assert seam.missing_private_names(obj) == [], "pysyncobj renamed a private attribute Shoal relies on"
        internals = seam.RaftInternals(obj)
        assert internals.state == seam.FOLLOWER and internals.commit_index >= 0
        assert internals.get_entries(1, 1)
    finally:
        obj.destroy()


def test_installed_version_is_the_checked_one_and_pinned() -> None:
    assert seam.VERSION == seam.CHECKED_VERSION
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("pysyncobj"))
    upper = re.search(r"<\s*([\d.]+)", pin)
    assert upper is not None, "pysyncobj needs an upper bound: _pysyncobj.py reaches its private names"
    assert tuple(map(int, seam.CHECKED_VERSION.split("."))) < tuple(map(int, upper.group(1).split(".")))


def test_only_the_raft_package_imports_pysyncobj() -> None:
    offenders = []
    for folder in ("node", "cluster", "client", "chaos", "cli", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.is_relative_to(ROOT / "node" / "raft"):
                continue
            if re.search(r"^\s*(from|import)\s+pysyncobj", path.read_text(), re.M):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_private_names_are_reached_in_one_module() -> None:
    offenders = []
    for path in (ROOT / "node").rglob("*.py"):
        if path.name == "_pysyncobj.py":
            continue
        if re.search(r"_SyncObj__|\._onTick\b|\._isLeader\b|\._getLeader\b|_checkCommandsToApply", path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_importing_pysyncobj_leaves_socket_alone() -> None:
    import socket
    assert socket.inet_ntop(socket.AF_INET, b"\x7f\x00\x00\x01") == "127.0.0.1"
