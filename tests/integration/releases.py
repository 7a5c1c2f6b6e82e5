"""Earlier releases' code, run as node processes beside this release's (upgrade tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def release_tree(root: Path, commit: str) -> Path:
    """The code of ``commit`` as the package ``shoal`` under ``root`` (for PYTHONPATH); the test
    is skipped when the commit is not in this repository (a shallow clone)."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True, timeout=30).returncode != 0:
        pytest.skip(f"commit {commit} is not in this repository")
    (root / "shoal").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, timeout=60, check=True)
    subprocess.run(["tar", "-x", "-C", str(root / "shoal")], input=archive.stdout, timeout=60, check=True)
    return root
