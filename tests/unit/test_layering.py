"""Import layering of the node: every module imports only its own layer or the ones below; and over the
whole package, no import circle and no click outside ``cli/``.

The layers, top to bottom: ``server`` (wiring and lifecycle, the steps a pod runs around it) → the edge (``http/``,
``connection``, the flow service, the guard, the collector, the simulation) → ``view`` (the protocol the edge
reads the node through) → ``dispatch`` (with the small protocols it is handed, ``ports``) →
``partitions`` (group commit, the push path, the output written together, the clock, the node's
identity on disk, the node registry, the moves of replicas, the ``raft/`` replication and the
``partition/`` machine it drives) → ``state``, the engine, which is pure: no I/O, clock or randomness.

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
    ("partitions", frozenset({"raft", "partition", "group_commit", "pushes", "clock", "digests", "identity",
                              "cluster_map", "moves", "log_format", "heap", "payload_checks",
                              "payload_repair", "writes"})),
    ("dispatch", frozenset({"dispatch", "ports", "sessions", "audits", "metrics", "relay", "bunqueue", "locator"})),
    ("view", frozenset({"view"})),
    ("edge", frozenset({"connection", "http", "guard", "collector", "simulation", "flows"})),
    ("server", frozenset({"server", "pod", "__main__", "__init__"})),
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


# --- the seams: pysyncobj stays inside node/raft/, a replica's engine inside node/partition/ ----

#: The packages outside the seams (``bench/`` and ``tests/`` build engines of their own).
SEAM_FOLDERS = ("node", "cluster", "client", "chaos", "cli")
RAFT = NODE / "raft"
PARTITION = NODE / "partition"


def outside_the_seam(seam: Path = RAFT) -> list[Path]:
    """Every Python file of the packages above, except those under ``seam``."""
    return [p for folder in SEAM_FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if not p.is_relative_to(seam)]


def engine_reads(source: str) -> list[str]:
    """Every ``<expr>.engine`` in ``source``, read or written (``ast``: comments and strings do not count)."""
    hits = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute) and node.attr == "engine"]
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in sorted(hits, key=lambda n: (n.lineno, n.col_offset))]


def test_nothing_outside_the_raft_package_imports_pysyncobj() -> None:
    offenders = [f"{path.relative_to(ROOT)} {line}" for path in outside_the_seam()
                 for line, name in imports_in(path.read_text(), "shoal") if name.split(".")[0] == "pysyncobj"]
    assert offenders == []


def test_nothing_outside_the_partition_package_reads_a_replicas_engine() -> None:
    """The edge reads partitions through the machine's view (:class:`~shoal.node.partition.view.PartitionView`)."""
    offenders = [f"{path.relative_to(ROOT)} {hit}" for path in outside_the_seam(PARTITION)
                 for hit in engine_reads(path.read_text())]
    assert offenders == []


def test_the_seam_checks_catch_what_they_look_for() -> None:
    source = ("import os, pysyncobj\ndef f(replica):\n    from pysyncobj.batteries import x\n"
              "    # replica.engine in a comment\n    n = replica.engine.job_count()\n    replica.engine = None\n")
    assert [name for _, name in imports_in(source, "shoal.node") if name.startswith("pysyncobj")] == [
        "pysyncobj", "pysyncobj.batteries"]
    assert engine_reads(source) == ["line 5: replica.engine", "line 6: replica.engine"]


# --- no import cycle between the node's modules -------------------------------------------------


def module_name(path: Path) -> str:
    """The dotted name of the node module at ``path`` (a package's ``__init__`` is the package)."""
    parts = ("shoal", "node", *path.relative_to(NODE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(source: str, package: str, modules: set[str]) -> set[str]:
    """The node modules ``source`` imports, anywhere in it (``TYPE_CHECKING`` and function bodies
    included): ``from x import y`` counts as importing ``x.y`` when that is a module."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            subs = {f"{name}.{alias.name}" for alias in node.names} & modules
            out.update(subs or {name})
    return out & modules


def import_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph, as the modules along it; None if there is none."""
    done: set[str] = set()

    def visit(module: str, trail: tuple[str, ...]) -> list[str] | None:
        if module in trail:
            return [*trail[trail.index(module):], module]
        if module in done:
            return None
        for target in sorted(edges.get(module, ())):
            found = visit(target, (*trail, module))
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(edges):
        found = visit(module, ())
        if found:
            return found
    return None


def test_the_modules_of_the_node_import_each_other_in_no_cycle() -> None:
    """Module by module, counting imports under ``TYPE_CHECKING``: a type-only cycle still
    means neither module can be understood, or moved, without the other."""
    paths = sorted(NODE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    edges: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges[name] = module_imports(path.read_text(), package, modules) - {name}
    assert import_cycle(edges) is None


def test_the_cycle_check_sees_type_checking_imports_and_submodules() -> None:
    modules = {"shoal.node.http", "shoal.node.http.api", "shoal.node.http.dashboard"}
    api = "from .dashboard import add\n"
    dashboard = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import api\n"
    assert module_imports(api, "shoal.node.http", modules) == {"shoal.node.http.dashboard"}
    assert module_imports(dashboard, "shoal.node.http", modules) == {"shoal.node.http.api"}
    edges = {"shoal.node.http.api": {"shoal.node.http.dashboard"}, "shoal.node.http.dashboard": {"shoal.node.http.api"}}
    assert import_cycle(edges) == ["shoal.node.http.api", "shoal.node.http.dashboard", "shoal.node.http.api"]
    assert import_cycle({"a": {"b"}, "b": {"c"}}) is None


# --- the whole package: no import cycle, and click only in the CLI -------------------------------------

#: The folders of the package (``shoal.<folder>``), as ``pyproject.toml`` maps them.
PACKAGE_FOLDERS = ("cluster", "node", "client", "chaos", "cli")


def package_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package's ``__init__`` is the package)."""
    out = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = ("shoal", *path.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def package_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in it (functions and ``TYPE_CHECKING`` included)."""
    modules = package_modules()
    names = set(modules)
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges[name] = module_imports(path.read_text(), package, names)
    return edges


def import_circles(edges: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Every circle of the graph: its strongly connected components of more than one module, and the
    modules that import themselves; each as its modules (sorted) and one cycle through the first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(edges.get(module, ())):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1 or module in edges.get(module, ()):
                components.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            connect(module)
    out = []
    for component in sorted(components):
        inside = {m: edges.get(m, set()) & set(component) for m in component}
        out.append((component, import_cycle(inside) or [component[0], component[0]]))
    return out


def test_the_package_has_no_import_circle() -> None:
    """Over every module of the package, counting imports inside functions and under ``TYPE_CHECKING``:
    a circle, even a type-only one, means neither module can be read, tested or moved without the other."""
    circles = import_circles(package_graph())
    assert circles == [], "import circles:\n" + "\n".join(
        f"{', '.join(modules)}: {' -> '.join(cycle)}" for modules, cycle in circles)


def test_the_circle_check_finds_every_circle_and_self_import() -> None:
    edges = {"a": {"b"}, "b": {"c", "a"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"g"}, "g": {"f"}}
    assert import_circles(edges) == [(["a", "b", "c"], ["a", "b", "a"]), (["e"], ["e", "e"]),
                                     (["f", "g"], ["f", "g", "f"])]
    assert import_circles({"a": {"b"}, "b": set()}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .queue import AsyncQueue\n"
    assert module_imports(source, "shoal.client", {"shoal.client.queue"}) == {"shoal.client.queue"}


def test_the_package_graph_sees_the_cli_and_its_libraries() -> None:
    edges = package_graph()
    assert {"shoal.cluster.launcher", "shoal.cluster.operator"} <= edges["shoal.cli.cluster"]
    assert "shoal.cli.node" in edges["shoal.node.__main__"]
    assert "shoal.cluster.commands" not in edges["shoal.cluster.flow"]


def click_imports(source: str) -> list[str]:
    """The imports of click in ``source`` (a submodule of it too), as ``line N``."""
    return [f"line {line}" for line, name in imports_in(source, "shoal") if name.split(".")[0] == "click"]


def test_only_the_cli_imports_click() -> None:
    """Commands live in ``cli/``; every other package is library code the commands call."""
    offenders = [f"{path.relative_to(ROOT)} {hit}" for name, path in package_modules().items()
                 if not name.startswith("shoal.cli.") and name != "shoal.cli"
                 for hit in click_imports(path.read_text())]
    assert offenders == []


def test_the_click_check_catches_click() -> None:
    assert click_imports("import click\ndef f():\n    from click.testing import CliRunner\n") == ["line 1", "line 3"]
    assert click_imports("import clickhouse\n") == []
