"""Import layering: the engine (``node/state``) is pure and imports nothing above it.

Checked from the source (``ast``), so an import inside a function counts as much as one at
the top, and a module is refused before anything runs it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "node" / "state"
#: What the engine may not use: I/O, clocks, randomness, threads, and the layers above it.
FORBIDDEN_MODULES = frozenset({"asyncio", "socket", "time", "random", "uuid", "threading", "os", "selectors",
                               "ssl", "subprocess", "pysyncobj", "aiohttp", "uvloop"})
FORBIDDEN_PREFIXES = ("shoal.node.", "shoal.client", "shoal.chaos", "shoal.cli")
ALLOWED_PREFIXES = ("shoal.node.state",)


def imports_in(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``source`` of a module in ``package``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def violations(source: str, package: str) -> list[str]:
    """The imports of ``source`` that the engine's layer may not make."""
    return [f"line {line}: {name}" for line, name in imports_in(source, package)
            if name.split(".")[0] in FORBIDDEN_MODULES
            or (name.startswith(FORBIDDEN_PREFIXES) and not name.startswith(ALLOWED_PREFIXES))]


@pytest.mark.parametrize("path", sorted(STATE.glob("*.py")), ids=lambda p: p.name)
def test_the_engine_imports_nothing_above_it(path: Path) -> None:
    assert violations(path.read_text(), "shoal.node.state") == []


def test_the_check_catches_bad_imports() -> None:
    source = ("import time\nfrom ..raft import replica\nfrom ._model import Job\nfrom shoal.cluster.codec import Raw\n"
              "\ndef f():\n    import asyncio\n")
    assert [name for _, name in imports_in(source, "shoal.node.state")] == [
        "time", "shoal.node.raft", "shoal.node.state._model", "shoal.cluster.codec", "asyncio"]
    assert violations(source, "shoal.node.state") == ["line 1: time", "line 2: shoal.node.raft", "line 7: asyncio"]
