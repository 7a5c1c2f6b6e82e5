"""The HTTP endpoints the dashboard uses, against a real 3-node cluster: the merged overview and
its stream, queue history and rates, listing and search, job detail, every action (sent to a
follower, forwarded to the leader, checked through the binary protocol), the worker
simulation, and read-only mode with tokens."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import follower_url, http_url, leader_of
from waiting import eventually
from shoal.client import Client
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.node.http.dashboard import PEER_ACTION_TIMEOUT_S

pytestmark = pytest.mark.integration
WAIT_S = 15.0
#: How long a call waits for its answer: longer than a node waits for a peer it relays an
#: action to, so a slow peer on a busy machine is answered for rather than timed out here.
CALL_TIMEOUT_S = PEER_ACTION_TIMEOUT_S + 30


def call(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=CALL_TIMEOUT_S) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_cluster_overview_merges_every_node(cluster: LocalCluster) -> None:
    with Client(cluster.addresses) as client:
        client.queue("ov-a").add_bulk([{"i": i} for i in range(40)])
    for node in cluster.node_ids:
        status, o = call(http_url(cluster, node) + "/cluster")
        assert status == 200 and o["servedBy"] == node and o["readOnly"] is False
        assert sorted(n["nodeId"] for n in o["nodes"]) == sorted(cluster.node_ids)
        assert all(n["reachable"] and n["ready"] and n["uptimeS"] > 0 and n["rssBytes"] > 0 for n in o["nodes"])
        assert [p["id"] for p in o["partitions"]] == list(range(cluster.config.partitions))
        for p in o["partitions"]:
            assert p["leader"] == cluster.leader_of(p["id"])
            assert sorted(p["members"]) == sorted(p["replicas"])
            assert all(m["lag"] >= 0 for m in p["members"].values())
    leader = leader_of(cluster, "ov-a")

    def from_leader() -> Any:
        # a follower's sample may show the queue first; its leader's replaces it once taken
        q = call(http_url(cluster, "n1") + "/cluster")[1]["queues"].get("ov-a")
        return q if q and q["reportedBy"] == leader and q["counts"]["waiting"] == 40 else None

    q = eventually(from_leader, "ov-a's 40 jobs in the overview, as its leader samples them", WAIT_S, poll_s=0.2)
    assert set(q["rates"]) == {"enqueued", "completed", "failed"}
    assert set(q["history"]) >= {"t", "waiting", "completedRate"}
    # the node's own part
    status, me = call(http_url(cluster, "n2") + "/node")
    assert status == 200 and me["nodeId"] == "n2" and len(me["replicas"]) == cluster.config.partitions


def test_rates_and_history_follow_the_queue(cluster: LocalCluster) -> None:
    url = follower_url(cluster, "ov-rates") + "/queues/ov-rates"
    with Client(cluster.addresses) as client:
        q = client.queue("ov-rates")
        q.add({"i": -1})
        # The sampler must know the queue before the counted work: rates are differences of samples.
        eventually(lambda: len(call(url)[1].get("history", {}).get("t", ())) >= 1, "the queue's first sample",
                   WAIT_S, poll_s=0.2)
        q.add_bulk([{"i": i} for i in range(30)])
        for job in q.pull_many(31, timeout=2):
            q.ack(job)

    def rated() -> Any:
        status, body = call(url)
        assert status == 200, body
        h = body["history"]
        # The history keeps ten minutes of once-a-second samples; the current rates only the last
        # five seconds, which a busy machine may let pass before the first look.
        seen = any(r > 0 for r in h["completedRate"]) and any(r > 0 for r in h["enqueuedRate"])
        return body if seen and len(h["t"]) >= 2 else None

    body = eventually(rated, "a completed rate in the queue's history", WAIT_S, poll_s=0.2)
    assert body["metrics"]["counts"]["completed"] == 31
    h = body["history"]
    assert len(h["t"]) == len(h["waiting"]) == len(h["completedRate"]) and h["t"] == sorted(h["t"])
    assert sum(h["completedRate"]) > 0 and sum(h["enqueuedRate"]) > 0
    assert set(body["rates"]) == {"enqueued", "completed", "failed"}


def test_list_search_and_detail(cluster: LocalCluster) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("ov-list")
        plain = q.add_bulk([{"i": i} for i in range(25)])
        tagged = [q.add({"t": i}, tag="blue") for i in range(3)]
        special = q.add({"s": 1}, custom_id="the-one", tag="red")
        job = q.pull(timeout=2)
        assert job is not None and job.id == plain[0]
        q.log(job, "step 1 done")
        q.progress(job, 40, "resizing")
        # (inside the client's block: its session holds the lease the detail shows)
        base = follower_url(cluster, "ov-list")
        status, page = call(base + "/queues/ov-list/list?state=waiting&offset=10&limit=5")
        assert status == 200 and page["total"] == 28 and [j["id"] for j in page["jobs"]] == plain[11:16]
        status, page = call(base + "/queues/ov-list/list?tag=blue")
        assert page["total"] == 3 and [j["id"] for j in page["jobs"]] == tagged
        assert call(base + "/queues/ov-list/list?limit=201")[0] == 400
        assert call(base + "/queues/ov-list/list?state=nope")[0] == 400
        assert call(base + "/queues/bad%20name!/list")[0] == 400
        for text, how in ((special, "id"), ("the-one", "customId"), ("red", "tag")):
            status, found = call(base + f"/queues/ov-list/search?q={text}")
            assert status == 200 and [j["id"] for j in found["jobs"]] == [special], (text, found)
            assert how in found["jobs"][0]["matched"]  # a custom id is the job's id too
        assert call(base + "/queues/ov-list/search?q=nothing-here")[1]["jobs"] == []
        assert call(base + "/queues/ov-list/search")[0] == 400
        status, d = call(base + f"/jobs/{plain[0]}/detail")
        assert status == 200 and d["job"]["state"] == "active" and d["job"]["data"] == {"i": 0}
        assert [entry["message"] for entry in d["logs"]] == ["step 1 done"]
        assert d["progressMessage"] == "resizing" and d["job"]["progress"] == 40
        states = [e["state"] for e in d["timeline"]]
        assert states[0] == "created" and "lease ends" in states
        assert call(base + "/jobs/0-999999/detail")[0] == 404


def test_timeline_records_state_changes_while_the_job_is_looked_at(cluster: LocalCluster) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("ov-timeline")
        job_id = q.add({"x": 1}, attempts=2, backoff=0.05)
        status, d = call(http_url(cluster, "n1") + f"/jobs/{job_id}/detail")  # opening it starts recording
        assert status == 200 and [e["state"] for e in d["timeline"]] == ["created"]
        job = q.pull(timeout=2)
        assert job is not None
        q.fail(job, "first try failed")
        job = q.pull(timeout=3)
        assert job is not None
        q.ack(job, {"ok": True})
    status, d = call(http_url(cluster, "n2") + f"/jobs/{job_id}/detail")
    seen = [e["state"] for e in d["timeline"] if e["source"] == "leader"]
    assert seen[0] == "active" and seen[-1] == "completed" and seen.count("active") == 2, d["timeline"]
    assert d["timeline"][-1]["state"] == "completed" and d["job"]["result"] == {"ok": True}


def test_actions_run_on_the_leader_and_replicate(cluster: LocalCluster) -> None:
    queue = "ov-actions"
    base = follower_url(cluster, queue)  # every action forwarded by a follower
    with Client(cluster.addresses) as client:
        q = client.queue(queue)
        ids = q.add_bulk([{"i": i} for i in range(6)])
        delayed = q.add({"d": 1}, delay=600)
        failed = []
        for _ in range(3):
            job = q.pull(timeout=2)
            assert job is not None
            q.fail(job, "boom")
            failed.append(job.id)
        active = q.pull(timeout=2)
        assert active is not None
        assert call(base + f"/jobs/{failed[0]}/retry", "POST")[0] == 200
        assert q.get_state(failed[0]) == "waiting"
        assert call(base + f"/jobs/{delayed}/promote", "POST")[0] == 200
        assert q.get_state(delayed) == "waiting"
        assert call(base + f"/jobs/{active.id}/release", "POST")[0] == 200
        assert q.get_state(active.id) == "waiting"
        status, body = call(base + f"/jobs/{ids[5]}/promote", "POST")
        assert (status, body["code"]) == (409, "INVALID_STATE")
        job = q.pull(timeout=2)
        assert job is not None
        assert call(base + f"/jobs/{job.id}", "DELETE")[0] == 200  # an active job is cancelled (Cancel)
        assert q.get_state(job.id) == "cancelled"
        job = q.pull(timeout=2)
        assert job is not None
        assert call(base + f"/jobs/{job.id}/cancel", "POST")[0] == 200  # the dashboard's cancel: to the DLQ
        assert q.get_job(job.id).error == "cancelled from the dashboard"  # type: ignore[union-attr]
        assert call(base + f"/jobs/{ids[5]}", "DELETE")[0] == 200
        assert q.get_job(ids[5]) is None
        assert call(base + "/jobs/0-999999/retry", "POST")[0] == 404
        assert call(base + f"/queues/{queue}/pause", "POST")[0] == 200
        assert q.is_paused() is True
        assert call(base + f"/queues/{queue}/resume", "POST")[0] == 200
        assert q.is_paused() is False
        dlq = q.counts()["failed"]
        assert dlq == 3  # two failed + one cancelled
        status, body = call(base + f"/queues/{queue}/dlq/retry", "POST")
        assert (status, body["count"]) == (200, 3) and q.counts()["failed"] == 0
        job = q.pull(timeout=2)
        assert job is not None
        q.fail(job, "again")
        status, body = call(base + f"/queues/{queue}/dlq/purge", "POST")
        assert (status, body["count"]) == (200, 1) and q.get_job(job.id) is None
        job = q.pull(timeout=2)
        assert job is not None
        q.ack(job)
        status, body = call(base + f"/queues/{queue}/clean", "POST", {"state": "completed", "grace": 0})
        assert (status, body["count"]) == (200, 1)
        assert call(base + f"/queues/{queue}/clean", "POST", {"nope": 1})[0] == 400
        status, body = call(base + f"/queues/{queue}/drain", "POST")
        assert status == 200 and body["count"] == 3
        assert q.counts() == {"waiting": 0, "delayed": 0, "active": 0, "completed": 0, "failed": 0, "waiting-children": 0, "cancelled": 1}


def test_simulation_validates_runs_and_stops(cluster: LocalCluster) -> None:
    base = http_url(cluster, "n3")
    for bad in ({"jobs": 0}, {"workers": 1000}, {"hangRate": 2}, {"failRate": 0.6, "hangRate": 0.6},
                {"queue": "bad name"}, {"what": 1}, {"ttrMs": "x"}):
        status, body = call(base + "/simulation", "POST", bad)
        assert (status, body["code"]) == (400, "INVALID"), bad
    assert call(base + "/simulation")[1]["simulation"] is None
    status, body = call(base + "/simulation", "POST", {"queue": "ov-sim", "jobs": 2000, "workers": 4, "workMs": 20,
                                                     "hangRate": 0, "failRate": 0})
    assert status == 200 and body["simulation"]["running"]
    status, body = call(base + "/simulation", "POST", {"queue": "ov-sim"})
    assert (status, body["code"]) == (409, "INVALID_STATE")
    eventually(lambda: call(base + "/simulation")[1]["simulation"]["counters"].get("completed", 0) >= 20,
               "the simulated workers completing jobs", WAIT_S, poll_s=0.2)
    status, body = call(http_url(cluster, "n1") + "/simulation?node=n3", "DELETE")  # relayed to n3
    assert status == 200 and not body["simulation"]["running"] and body["simulation"]["phase"] == "stopped"
    assert call(http_url(cluster, "n1") + "/simulation?node=n9", "DELETE")[0] == 400
    assert call(http_url(cluster, "n1") + "/simulation", "DELETE")[0] == 404  # n1 runs none
    with Client(cluster.addresses) as client:
        counts = client.queue("ov-sim").counts()
    # the stopped workers' client closed: no job is left leased to it
    assert counts["active"] == 0 and counts["completed"] >= 20
    assert sum(counts.values()) == 2000
    sim = call(http_url(cluster, "n1") + "/cluster")[1]["simulations"]
    assert [s["nodeId"] for s in sim] == ["n3"]


def test_overview_shows_a_dead_node_and_the_new_leaders(fresh_cluster: LocalCluster) -> None:
    cl = fresh_cluster
    victim = cl.leader_of(0)
    assert victim is not None
    survivor = next(n for n in cl.node_ids if n != victim)
    cl.kill(victim)

    def moved() -> Any:
        status, o = call(http_url(cl, survivor) + "/cluster")
        assert status == 200
        nodes = {n["nodeId"]: n for n in o["nodes"]}
        leaders = {p["id"]: p["leader"] for p in o["partitions"]}
        if nodes[victim]["reachable"] or victim in leaders.values() or None in leaders.values():
            return None
        # Leadership may still move (the balancer hands partitions back): the overview must agree
        # with the nodes' own view read in the same look, so compare within the wait.
        if any(leader != cl.leader_of(p) for p, leader in leaders.items()):
            return None
        return o

    o = eventually(moved, "the overview to show the killed node unreachable and every partition led elsewhere, "
                          "as the nodes themselves say", timeout_s=30.0, poll_s=0.2)
    assert {n["nodeId"] for n in o["nodes"] if n["reachable"]} == set(cl.node_ids) - {victim}


@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=1, partitions=2, data_dir=tmp_path_factory.mktemp("dash-ro"),
                      base_port=free_base_port(1, 2), tokens=("ro-token",),
                      extra_env={"SHOAL_DASHBOARD_READ_ONLY": "true"}) as cl:
        cl.wait_balanced()
        yield cl


def test_read_only_and_tokens(read_only: LocalCluster) -> None:
    base = http_url(read_only, "n1")
    with urllib.request.urlopen(base + "/", timeout=10) as resp:  # the page shell needs no token
        page = resp.read().decode()
        assert resp.status == 200 and "login-form" in page and "/dashboard/app.js" in page
        assert "'self'" in resp.headers["Content-Security-Policy"]
    for name in ("app.js", "style.css", "icon.svg"):
        with urllib.request.urlopen(f"{base}/dashboard/{name}", timeout=10) as resp:
            assert resp.status == 200
    assert call(base + "/dashboard/secrets.txt")[0] == 401  # only the listed files are open
    assert call(base + "/dashboard/secrets.txt", token="ro-token")[0] == 404
    assert call(base + "/cluster")[1]["code"] == "AUTH_REQUIRED"
    assert call(base + "/node", token="wrong")[1]["code"] == "AUTH_FAILED"
    status, o = call(base + "/cluster", token="ro-token")
    assert status == 200 and o["readOnly"] is True
    with Client(read_only.addresses, token="ro-token") as client:
        job_id = client.queue("ro").add({"x": 1})
    for path, method in (("/queues/ro/pause", "POST"), ("/queues/ro/drain", "POST"), ("/queues/ro/clean", "POST"),
                         ("/queues/ro/dlq/retry", "POST"), ("/queues/ro/dlq/purge", "POST"),
                         (f"/jobs/{job_id}/cancel", "POST"), (f"/jobs/{job_id}", "DELETE"),
                         ("/simulation", "POST"), ("/simulation", "DELETE")):
        status, body = call(base + path, method, token="ro-token")
        assert (status, body["code"]) == (403, "READ_ONLY"), path
    assert call(base + f"/jobs/{job_id}/detail", token="ro-token")[1]["job"]["state"] == "waiting"
