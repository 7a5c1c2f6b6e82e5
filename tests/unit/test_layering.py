"""Import layering of the node: every module imports only its own layer or the ones below.

The layers, top to bottom: ``server`` (wiring and lifecycle, the commands) → the edge (``http/``,
``connection``, the flow service, the guard, the collector, the simulation) → ``view`` (the protocol the edge
reads the node through) → ``dispatch`` (with the small protocols it is handed, ``ports``) →
``partitions`` (group commit, the push path, the clock, the node's identity on disk, the node
registry, the moves of replicas and the ``raft/`` seam) → ``state``, the engine, which is pure: no I/O, clock or randomness.

Checked from the source (``ast``), so an import inside a function or under
``TYPE_CHECKING`` counts as much as one at the top, and a module is refused before
anything runs it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "node"
STATE = NODE / "state"
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


#: The node's layers, lowest first: each maps the ``shoal.node`` units (a module, or a
#: package counted as one) to the layer they are in.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("state", frozenset({"state"})),
    ("partitions", frozenset({"raft", "group_commit", "pushes", "clock", "digests", "identity", "cluster_map",
                              "moves"})),
    ("dispatch", frozenset({"dispatch", "ports", "sessions", "metrics"})),
    ("view", frozenset({"view"})),
    ("edge", frozenset({"connection", "http", "guard", "collector", "simulation", "flows"})),
    ("server", frozenset({"server", "cli", "pod", "__main__", "__init__"})),
)
RANK = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}
LAYER_NAMES = [name for name, _ in LAYERS]


def unit_of(module: str) -> str | None:
    """The unit of ``shoal.node`` that ``module`` belongs to (None: outside the node)."""
    if module == "shoal.node":
        return "__init__"
    if not module.startswith("shoal.node."):
        return None
    return module.split(".")[2]


def node_modules() -> list[tuple[Path, str]]:
    """Every Python module of the node, with its package's dotted name."""
    out = []
    for path in sorted(NODE.rglob("*.py")):
        rel = path.relative_to(NODE).parent.parts
        out.append((path, ".".join(("shoal", "node", *rel))))
    return out


def unit_of_path(path: Path) -> str:
    """The unit of the node module at ``path``: its package under ``node/``, or its own name."""
    rel = path.relative_to(NODE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def upward_imports(source: str, unit: str, package: str) -> list[str]:
    """The imports in ``source`` (of a module of ``unit``) that reach a layer above its own."""
    own = RANK[unit]
    out = []
    for line, name in sorted(imports_in(source, package)):
        target = unit_of(name)
        if target is not None and target != unit and RANK.get(target, len(LAYERS)) > own:
            out.append(f"line {line}: {name} ({LAYER_NAMES[RANK[unit]]} imports "
                       f"{LAYER_NAMES[RANK[target]] if target in RANK else 'an unplaced module'})")
    return out


@pytest.mark.parametrize("path,package", node_modules(),
                         ids=lambda v: str(v.relative_to(NODE)) if isinstance(v, Path) else "")
def test_no_node_module_imports_a_layer_above_it(path: Path, package: str) -> None:
    assert upward_imports(path.read_text(), unit_of_path(path), package) == []


def test_every_node_module_has_a_layer() -> None:
    units = {unit_of_path(p) for p, _ in node_modules()}
    assert units - set(RANK) == set(), "place the new module in LAYERS"


def test_the_units_of_the_node_import_each_other_in_no_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for path, package in node_modules():
        unit = unit_of_path(path)
        for _, name in imports_in(path.read_text(), package):
            target = unit_of(name)
            if target is not None and target != unit:
                edges.setdefault(unit, set()).add(target)
    done: set[str] = set()

    def visit(unit: str, trail: tuple[str, ...]) -> None:
        assert unit not in trail, f"import cycle: {' -> '.join(trail + (unit,))}"
        if unit in done:
            return
        for target in sorted(edges.get(unit, ())):
            visit(target, trail + (unit,))
        done.add(unit)

    for unit in sorted(edges):
        visit(unit, ())


def test_the_layer_check_catches_an_upward_import() -> None:
    source = ("from typing import TYPE_CHECKING\nfrom .ports import Clock\nfrom .raft import replica\n"
              "if TYPE_CHECKING:\n    from .connection import ClientConnection\n"
              "def f():\n    from ..server import Node\n")
    assert upward_imports(source, "dispatch", "shoal.node") == [
        "line 5: shoal.node.connection (dispatch imports edge)"]
    assert upward_imports(source, "http", "shoal.node.http") == ["line 7: shoal.node.server (edge imports server)"]
    assert upward_imports("from ..group_commit import x\n", "raft", "shoal.node.raft") == []  # same layer
    assert upward_imports("from ..nowhere import x\n", "raft", "shoal.node.raft") == [
        "line 1: shoal.node.nowhere (partitions imports an unplaced module)"]
