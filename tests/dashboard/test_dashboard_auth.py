"""The dashboard on a cluster with client tokens and ``dashboard_read_only``: a login form
until a valid token, then no action anywhere (and the API refuses them)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client
from shoal.cluster.launcher import LocalCluster, free_base_port

from dashboard_helpers import base_url, browser, page, shots  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TOKEN = "dash-s3cret-token"


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path_factory.mktemp("dash-auth"),
                      base_port=free_base_port(3, 4), tokens=(TOKEN,),
                      extra_env={"SHOAL_DASHBOARD_READ_ONLY": "1"}) as cl:
        cl.wait_balanced()
        with Client(cl.addresses, token=TOKEN) as client:
            q = client.queue("invoices")
            q.add_bulk([{"invoice": i} for i in range(5)])
            job = q.pull(timeout=2)
            assert job is not None
            q.fail(job, "pdf renderer crashed")
        yield cl


def call(cluster: LocalCluster, path: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(base_url(cluster) + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if resp.headers.get_content_type() == "application/json" else raw
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_only_the_login_form_until_a_valid_token(locked: LocalCluster, page: Any, shots: Path) -> None:
    # the API gives nothing away without the token; the page shell is served (it holds no data)
    assert call(locked, "/cluster")[0] == 401
    assert call(locked, "/cluster", token="wrong")[0] == 403
    assert call(locked, "/queues/invoices/list")[0] == 401
    assert call(locked, "/")[0] == 200
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(base_url(locked) + "/")
    page.wait_for_selector("#login-form", state="visible")
    page.wait_for_timeout(500)
    assert page.locator("#topbar").is_hidden() and page.locator("#view").is_hidden()
    text = page.locator("body").inner_text()
    assert "invoices" not in text and "n2" not in text
    page.screenshot(path=str(shots / "login.png"))
    page.fill("#token", "not-the-token")
    page.click("#login-form button[type=submit]")
    page.wait_for_function("() => document.querySelector('#login-error').textContent.includes('not valid')")
    assert page.locator("#view").is_hidden()
    page.screenshot(path=str(shots / "login-refused.png"))
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#nodes .node")
    assert page.locator("#login").is_hidden()
    page.wait_for_selector('tr[data-queue="invoices"]')
    assert {u.split("/", 3)[2] for u in requests} == {base_url(locked).split("/", 3)[2]}  # nothing from elsewhere
    page.screenshot(path=str(shots / "after-login.png"), full_page=True)
    page.click("#logout")
    page.wait_for_selector("#login-form", state="visible")
    assert page.locator("#view").is_hidden()


def test_read_only_hides_every_action_and_the_api_refuses_them(locked: LocalCluster, page: Any,
                                                                shots: Path) -> None:
    for path, method in (("/queues/invoices/pause", "POST"), ("/queues/invoices/dlq/purge", "POST"),
                         ("/jobs/0-1/retry", "POST"), ("/jobs/0-1", "DELETE"), ("/simulation", "POST")):
        status, body = call(locked, path, method, token=TOKEN)
        assert (status, body["code"]) == (403, "READ_ONLY"), (path, body)
    assert call(locked, "/queues/invoices", token=TOKEN)[1]["metrics"]["paused"] is False
    page.goto(base_url(locked) + "/")
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#ro-badge", state="visible")
    page.goto(base_url(locked) + "/#/queue/invoices?state=failed")
    page.wait_for_selector("table.jobs tbody tr")
    page.click("table.jobs tbody tr td.data")
    page.wait_for_selector("#job-data")
    assert page.locator("[data-qact]:visible, [data-jact]:visible").count() == 0
    page.screenshot(path=str(shots / "read-only-queue.png"), full_page=True)
    page.keyboard.press("Escape")
    page.goto(base_url(locked) + "/#/simulation")
    page.wait_for_selector("#sim-live")
    assert page.locator("#sim-form").is_hidden()
