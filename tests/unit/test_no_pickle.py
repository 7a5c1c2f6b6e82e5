"""Nothing a file or a peer can reach is unpickled: no module of the node, cluster or client imports pickle.

Checked on the syntax tree of every module, so an import inside a function, a
``from pickle import loads`` and ``__import__("pickle")`` count as well as a top-level
``import pickle``. Release a0861d3's pickled log entries are read by walking their opcodes
(:func:`shoal.node.partition.log_format.read_legacy_batch`), which ``pickletools`` does without
running anything; ``pickletools`` is therefore allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("node", "cluster", "client")
#: Modules that load pickles, or load through pickle.
REFUSED = frozenset({"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve", "joblib", "copyreg"})
pytestmark = pytest.mark.timeout(60)


def _refused(name: str | None) -> bool:
    return name is not None and name.split(".")[0] in REFUSED


def pickle_imports(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every import of a refused module in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str | None] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in ("__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [f"{filename}:{node.lineno}: {name}" for name in names if _refused(name)]
    return found


def test_no_module_of_the_node_cluster_or_client_imports_pickle() -> None:
    files = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50  # the packages were found
    found = [hit for path in files for hit in pickle_imports(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("source", [
    "import pickle", "import os, pickle as p", "from pickle import loads", "import _pickle",
    "def f():\n    import cloudpickle", "__import__('pickle')", "importlib.import_module('dill')",
    "from shelve import open",
])
def test_every_form_of_import_is_caught(source: str) -> None:
    assert len(pickle_imports(source, "x.py")) == 1


@pytest.mark.parametrize("source", ["import pickletools", "from . import pickle", "x = 'import pickle'",
                                    "import msgpack"])
def test_what_is_not_an_import_of_pickle_passes(source: str) -> None:
    assert pickle_imports(source, "x.py") == []
