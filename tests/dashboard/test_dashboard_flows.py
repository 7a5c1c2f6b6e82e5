"""A flow in the dashboard's job drawer: the parent lists its children's results and errors,
and a child links back to its parent (real browser, real 3-node cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client
from shoal.cluster.launcher import LocalCluster

from dashboard_helpers import base_url, browser, cluster, page, shots  # noqa: F401  (fixtures)
from waiting import eventually

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_job_drawer_shows_a_flow(cluster: LocalCluster, page: Any, shots: Path) -> None:
    with Client(cluster.addresses) as client:
        tree = client.flow({"queue": "render", "data": {"movie": 7}},
                           [{"queue": "frames", "data": {"part": 1}},
                            {"queue": "audio", "data": {"track": 1}, "onFailure": "ignore"}])
        parent, (frame, audio) = tree["id"], [c["id"] for c in tree["children"]]
        job = client.queue("frames").pull(timeout=5)
        assert job is not None
        client.queue("frames").ack(job, {"frames": 240})
        job = client.queue("audio").pull(timeout=5)
        assert job is not None
        client.queue("audio").fail(job, "codec missing")
        eventually(lambda: client.queue("render").get_state(parent) == "waiting", "the parent waiting", 15)
    page.goto(base_url(cluster) + f"/#/queue/render?state=waiting&job={parent}")
    page.wait_for_selector("#drawer-panel [data-flow-job]")
    text = page.locator("#drawer-panel").inner_text()
    assert "2 of 2" in text and frame in text and audio in text
    assert "240" in text and "codec missing" in text
    page.screenshot(path=str(shots / "flow-parent.png"))
    page.click(f'#drawer-panel [data-flow-job="{frame}"]')  # a child opens, naming its parent
    page.wait_for_selector(f'#drawer-panel[data-job="{frame}"] [data-flow-job="{parent}"]')
