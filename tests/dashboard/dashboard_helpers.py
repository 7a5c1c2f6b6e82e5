"""What the dashboard's browser tests share: Chromium's settings, fixtures, the node's URL.

Headless Debian Chromium driven by Playwright, against real 3-node clusters on loopback
(stopped by pid afterwards). A test module that imports this is skipped when Chromium or
Playwright is missing; ``scripts/test`` installs both where it can. (A module, not a
conftest.py: the integration tests import their own ``conftest`` by that name.)"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port

CHROMIUM = os.environ.get("SHOAL_CHROMIUM", "/usr/bin/chromium")
#: Playwright's own browser download cannot reach the internet here: the system Chromium, offline.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                               args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=DESKTOP, color_scheme="dark")
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 3-node, 4-partition cluster shared by one test module."""
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path_factory.mktemp("dash"),
                      base_port=free_base_port(3, 4)) as cl:
        cl.wait_balanced()
        yield cl


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    """Where a test saves its screenshots."""
    out = tmp_path / "screenshots"
    out.mkdir()
    return out


def base_url(cluster: LocalCluster, node: int = 0) -> str:
    n = cluster.config.nodes[node]
    return f"http://{n.host}:{n.http_port}"
