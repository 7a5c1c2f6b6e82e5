"""The dashboard in a real browser against a real 3-node cluster."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client
from shoal.cluster.admin_client import AdminClient
from shoal.cluster.launcher import LocalCluster, free_base_port

from dashboard_helpers import PHONE, base_url, browser, cluster, page, shots  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def api(cluster: LocalCluster, path: str, method: str = "GET", body: Any = None, token: str | None = None,
        node: int = 1) -> tuple[int, dict[str, Any]]:
    """The HTTP API as a separate client sees it (another node than the page's, on purpose)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base_url(cluster, node) + path, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_overview_shows_nodes_leaders_and_live_counts(cluster: LocalCluster, page: Any, shots: Path) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("emails")
        q.add_bulk([{"to": f"user{i}@example.com"} for i in range(30)])
        client.queue("thumbnails").add_bulk([{"img": i} for i in range(12)])
    page.goto(base_url(cluster) + "/")
    page.wait_for_selector("#nodes .node")
    # the three nodes, all ready
    for node_id in cluster.node_ids:
        card = page.locator(f'.node[data-node="{node_id}"]')
        card.wait_for()
        assert "ready" in card.inner_text()
    # every partition's leader, as the cluster itself reports it
    for p in range(cluster.config.partitions):
        leader = cluster.leader_of(p)
        assert leader is not None
        cell = page.locator(f'tr[data-partition="{p}"] .leader-cell')
        page.wait_for_function("([p, l]) => document.querySelector(`tr[data-partition=\"${p}\"] .leader-cell`)"
                               "?.textContent.includes(l)", arg=[p, leader])
        assert leader in cell.inner_text()
    waiting = page.locator('tr[data-queue="emails"] td.c-waiting')
    page.wait_for_function("() => document.querySelector('tr[data-queue=\"emails\"] td.c-waiting')?.textContent === '30'")
    page.screenshot(path=str(shots / "overview-dark.png"), full_page=True)
    # pushes by a separate client show up on screen within 2 s, without a reload
    with Client(cluster.addresses) as client:
        client.queue("emails").add_bulk([{"to": f"late{i}@example.com"} for i in range(25)])
    pushed_at = time.monotonic()
    page.wait_for_function("() => document.querySelector('tr[data-queue=\"emails\"] td.c-waiting')?.textContent === '55'",
                           timeout=2_000)
    assert time.monotonic() - pushed_at < 2.0
    assert waiting.inner_text() == "55"
    page.screenshot(path=str(shots / "overview-live.png"), full_page=True)
    page.click("#theme")  # light theme
    page.screenshot(path=str(shots / "overview-light.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(400)  # the page redraws its charts for the new width
    page.screenshot(path=str(shots / "overview-phone.png"), full_page=True)


def test_overview_moves_panel_shows_what_cluster_status_shows(tmp_path: Path, page: Any, shots: Path) -> None:
    """A node registered while rebalance_auto is off: every partition that would move to it lists
    a move pending a rebalance, on the page as in the admin API (which `shoal cluster status` prints)."""
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "c", base_port=free_base_port(5, 4)) as cl:
        cl.wait_balanced()
        admin = AdminClient(base_url(cl, 1))
        admin.settings(rebalanceAuto=False)
        first = cl.config.nodes[0]
        admin.add_node("n4", first.host, first.port + 6, first.port + 7, first.raft_port + 3)  # never started
        moves = admin.wait(lambda s: len(s.moves) > 0 and all(m["state"] == "pending rebalance" for m in s.moves),
                           30).moves
        page.goto(base_url(cl) + "/")
        page.wait_for_function("(n) => document.querySelectorAll('#moves tr[data-move]').length === n",
                               arg=len(moves))
        rows = page.locator("#moves tr[data-move]")
        for k, move in enumerate(moves):
            text = rows.nth(k).inner_text()
            assert f"p{move['partition']}" in text and "pending rebalance" in text and "n4" in text
        assert "rebalance by hand" in page.locator("#moves header").inner_text()
        card = page.locator('.node[data-node="n4"]')
        card.wait_for()
        assert "unreachable" in card.inner_text()
        page.screenshot(path=str(shots / "overview-moves.png"), full_page=True)


def test_queue_page_job_detail_and_actions(cluster: LocalCluster, page: Any, shots: Path) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("orders")
        ids = q.add_bulk([{"order": i, "items": [{"sku": f"A-{i}", "qty": i % 3 + 1}], "total": 9.5 * i}
                          for i in range(1, 8)], attempts=1)
        special = q.add({"order": 99, "note": "gift <b>wrap</b>"}, custom_id="order-99", tag="vip")
        # two jobs fail for good: into the DLQ
        for _ in range(2):
            job = q.pull(timeout=2)
            assert job is not None
            q.fail(job, "card declined")
    page.goto(base_url(cluster) + "/#/queue/orders")
    page.wait_for_selector("table.jobs tbody tr")
    assert page.locator("#q-states a[data-state=waiting] .tab-count").inner_text() == "6"
    # search by custom id, then open the job: its data as JSON (escaped, not markup)
    page.fill("#q-search input[name=q]", "order-99")
    page.press("#q-search input[name=q]", "Enter")
    page.wait_for_selector(f'tr[data-job="{special}"]')
    page.click(f'tr[data-job="{special}"] td.data')
    page.wait_for_selector("#job-data")
    data_text = page.locator("#job-data").inner_text()
    assert json.loads(data_text) == {"order": 99, "note": "gift <b>wrap</b>"}
    assert "vip" in page.locator("#drawer-panel").inner_text()
    page.screenshot(path=str(shots / "job-detail.png"))
    page.keyboard.press("Escape")
    # search by tag
    page.fill("#q-search input[name=q]", "vip")
    page.press("#q-search input[name=q]", "Enter")
    page.wait_for_selector(f'tr[data-job="{special}"]')
    # the DLQ: retry one job from it, through the page
    page.goto(base_url(cluster) + "/#/queue/orders?state=failed")
    page.wait_for_function("() => document.querySelectorAll('table.jobs tbody tr .s-failed').length === 2")
    assert page.locator("table.jobs tbody tr").count() == 2
    page.screenshot(path=str(shots / "queue-dlq.png"), full_page=True)
    failed_id = page.locator("table.jobs tbody tr").first.get_attribute("data-job")
    page.locator(f'tr[data-job="{failed_id}"] [data-jact=retry]').click()
    page.wait_for_selector(f'tr[data-job="{failed_id}"]', state="detached")
    status, body = api(cluster, f"/jobs/{failed_id}")
    assert status == 200 and body["job"]["state"] == "waiting"
    # pause and resume the queue
    page.once("dialog", lambda d: d.accept())
    page.click("[data-qact=pause]")
    page.wait_for_selector("#q-paused")
    assert api(cluster, "/queues/orders")[1]["metrics"]["paused"] is True
    page.screenshot(path=str(shots / "queue-paused.png"), full_page=True)
    page.click("[data-qact=resume]")
    page.wait_for_selector("[data-qact=pause]")
    assert api(cluster, "/queues/orders")[1]["metrics"]["paused"] is False
    # retry-all of the DLQ
    page.goto(base_url(cluster) + "/#/queue/orders?state=failed")
    page.wait_for_selector("table.jobs tbody tr")
    page.once("dialog", lambda d: d.accept())
    page.click("[data-qact='dlq/retry']")
    page.wait_for_selector("table.jobs", state="detached")
    counts = api(cluster, "/queues/orders")[1]["metrics"]["counts"]
    assert counts["failed"] == 0 and counts["waiting"] == 8
    page.goto(base_url(cluster) + "/#/queue/orders?state=waiting")
    page.wait_for_selector("table.jobs tbody tr")
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(400)  # the page redraws its charts for the new width
    page.screenshot(path=str(shots / "queue-phone.png"), full_page=True)


def _all_jobs(cluster: LocalCluster, queue: str, state: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    for offset in range(0, 100_000, 200):  # bounded: at most 500 pages
        status, body = api(cluster, f"/queues/{queue}/list?state={state}&offset={offset}&limit=200")
        assert status == 200, body
        jobs += body["jobs"]
        if len(body["jobs"]) < 200:
            return jobs
    raise AssertionError("more pages than any test pushes")


def test_simulation_drains_500_jobs_with_hangs_and_loses_none(cluster: LocalCluster, page: Any, shots: Path) -> None:
    page.goto(base_url(cluster) + "/#/simulation")
    form = page.locator("#sim-form")
    for name, value in {"queue": "sim500", "jobs": "500", "workers": "16", "workMs": "5", "failRate": "0.04",
                        "hangRate": "0.1", "ttrMs": "1000", "attempts": "3"}.items():
        form.locator(f"input[name={name}]").fill(value)
    page.click("#sim-start")
    page.wait_for_function("() => document.querySelector('#sim-phase')?.textContent === 'draining'")
    page.wait_for_function("() => document.querySelector('.worker.hung') !== null", timeout=30_000)
    page.screenshot(path=str(shots / "simulation-running.png"), full_page=True)
    page.wait_for_function("() => document.querySelector('#sim-phase')?.textContent === 'finished'", timeout=120_000)
    page.wait_for_timeout(1_200)  # one more overview tick, so the screenshot shows the final counts
    page.screenshot(path=str(shots / "simulation-finished.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(1_200)
    page.screenshot(path=str(shots / "simulation-phone.png"), full_page=True)
    status, sim = api(cluster, "/simulation", node=0)
    assert status == 200
    counters = sim["simulation"]["counters"]
    assert counters["pushed"] == 500
    assert counters["hung"] > 0
    # checked through the API, not the page: every job completed or in the DLQ, none lost
    status, info = api(cluster, "/queues/sim500")
    counts, totals = info["metrics"]["counts"], info["metrics"]["totals"]
    assert counts["waiting"] == counts["delayed"] == counts["active"] == 0, counts
    assert counts["completed"] + counts["failed"] == 500, counts
    assert totals["reclaimed"] > 0, totals  # hung jobs came back when their lease lapsed
    done = _all_jobs(cluster, "sim500", "completed")
    dead = _all_jobs(cluster, "sim500", "failed")
    numbers = sorted(j["data"]["n"] for j in done + dead)
    assert numbers == list(range(1, 501))
    assert all(j["error"] for j in dead)
    # a reclaimed job finished on another worker: its log names two deliveries
    reclaimed = [j for j in done if j["attempts"] > 1]
    assert reclaimed
    status, detail = api(cluster, f"/jobs/{reclaimed[0]['id']}/detail")
    assert len(detail["logs"]) >= 2, detail["logs"]


def test_job_detail_shows_the_trace_a_job_was_added_in(cluster: LocalCluster, page: Any) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    status, traced = api(cluster, "/queues/traced/jobs", "POST",
                         {"data": {"n": 1}, "traceContext": {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}})
    assert status == 200, traced
    status, plain = api(cluster, "/queues/traced/jobs", "POST", {"data": {"n": 2}})
    assert status == 200, plain
    page.goto(base_url(cluster) + f"/#/queue/traced?job={traced['id']}")
    page.wait_for_selector("#job-trace")
    assert page.locator("#job-trace").inner_text() == trace_id
    page.goto(base_url(cluster) + f"/#/queue/traced?job={plain['id']}")
    page.wait_for_selector(f'#drawer-panel[data-job="{plain["id"]}"] #job-data')
    assert page.locator("#job-trace").count() == 0
