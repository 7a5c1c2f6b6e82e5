"""More of the HTTP API against real node processes (aiohttp's client): strict fields, 404s,
redirects of every kind of request, /work refills and releases, /ws pipelining and auth,
metrics, and the OpenAPI description against the routes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import msgpack
import pytest
import yaml

from conftest import follower_url, http_url, leader_of, leader_url, run, secured_cluster
from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

pytestmark = pytest.mark.integration
TOKEN = "api-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT_S = 10.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with secured_cluster(tmp_path_factory, "http-api", TOKEN) as cl:
        yield cl


async def sse_events(stream: aiohttp.ClientResponse, n: int, kind: str = "job") -> list[Any]:
    """Read the next ``n`` SSE messages of type ``kind`` (bounded by WAIT_S)."""
    out: list[Any] = []
    event = None

    async def read() -> None:
        nonlocal event
        while len(out) < n:
            line = (await stream.content.readline()).decode()
            if not line:
                raise AssertionError("stream ended")
            if line.startswith("event: "):
                event = line[7:].strip()
            elif line.startswith("data: ") and event == kind:
                out.append(json.loads(line[6:]))
            elif line == "\n":
                event = None

    await asyncio.wait_for(read(), WAIT_S)
    return out


async def push(s: aiohttp.ClientSession, base: str, queue: str, data: Any, **fields: Any) -> str:
    async with s.post(f"{base}/queues/{queue}/jobs", json={"data": data, **fields}) as r:
        body = await r.json()
        assert r.status == 200, body
        return body["id"]


# --- the OpenAPI description ------------------------------------------------------------------


def test_openapi_describes_every_route(secured: LocalCluster) -> None:
    from shoal.node.http import build_app

    stub = SimpleNamespace(config=SimpleNamespace(tokens=(), frame_bytes_max=1 << 20))
    app = build_app(stub)  # type: ignore[arg-type]  # routes only: no node is needed for that
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}

    async def main() -> dict[str, Any]:
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.get(http_url(secured, "n2") + "/openapi.yaml") as r:
                assert r.status == 200 and r.content_type == "application/yaml"
                return yaml.safe_load(await r.text())

    doc = run(main())
    described = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops if m != "parameters"}
    assert described == routes
    try:
        from openapi_spec_validator import validate
    except ImportError:
        return
    validate(doc)


# --- strict fields, 404s, JSON errors ---------------------------------------------------------


def test_fields_are_checked_not_ignored(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "a-strict")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            job = await push(s, base, "a-strict", {"x": 1})
            async with s.get(base + "/queues/a-strict/jobs") as r:
                token = (await r.json())["token"]
            # A misspelt token must not turn into an unfenced ack.
            async with s.post(f"{base}/jobs/{job}/ack", json={"tokne": token}) as r:
                body = await r.json()
                assert r.status == 400 and body["code"] == "INVALID" and "tokne" in body["error"]
            async with s.post(f"{base}/jobs/{job}/fail", json={"token": token, "why": "x"}) as r:
                assert r.status == 400 and "why" in (await r.json())["error"]
            async with s.post(f"{base}/jobs/{job}/ack", data=b"[1", headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400 and (await r.json())["code"] == "INVALID"
            async with s.post(base + "/queues/a-strict/jobs", json={"priority": 1}) as r:
                assert r.status == 400 and "data" in (await r.json())["error"]
            async with s.post(base + "/queues/a-strict/jobs", json={"data": 1, "delay": -5}) as r:
                assert r.status == 400 and "delay" in (await r.json())["error"]
            for query in ({"timeout": "soon"}, {"count": "-1"}, {"timeout": str(10**12)}):
                async with s.get(base + "/queues/a-strict/jobs", params=query) as r:
                    assert r.status == 400 and (await r.json())["code"] == "INVALID", query
            async with s.post(f"{base}/jobs/{job}/ack", json={"token": token, "result": [1, "two"]}) as r:
                assert r.status == 200
            async with s.get(f"{base}/jobs/{job}") as r:
                assert (await r.json())["job"]["result"] == [1, "two"]
    run(main())


def test_unknown_things_are_404_and_bad_ids_400(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "a-404")
        seq_free = f"{partition_for('a-404', secured.config.partitions)}-999999"
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.get(f"{base}/jobs/{seq_free}") as r:
                assert r.status == 404 and (await r.json())["code"] == "NOT_FOUND"
            async with s.get(f"{base}/jobs/not-an-id") as r:   # a custom id no job has
                assert r.status == 404
            async with s.get(f"{base}/jobs/{'x' * 300}") as r:
                assert r.status == 400 and (await r.json())["code"] == "INVALID"
            async with s.get(f"{base}/jobs/99-1") as r:   # a partition the cluster does not have
                assert r.status == 404
            async with s.get(f"{base}/no/such/path") as r:
                assert r.status == 404 and (await r.json())["code"] == "NOT_FOUND"
            async with s.put(f"{base}/jobs/{seq_free}") as r:  # DELETE is the dashboard's delete
                assert r.status == 405 and (await r.json())["ok"] is False
    run(main())


def test_queue_full_is_429_with_retry_after(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "a-full")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.ws_connect(base + "/ws") as ws:
                await ws.send_str(json.dumps({"cmd": "CreateQueue", "queue": "a-full", "type": "limfifottl",
                                              "options": {"capacity": 1, "discard": "reject"}}))
                assert json.loads((await ws.receive(timeout=WAIT_S)).data)["ok"]
            await push(s, base, "a-full", 1)
            async with s.post(base + "/queues/a-full/jobs", json={"data": 2}) as r:
                assert r.status == 429 and (await r.json())["code"] == "QUEUE_FULL"
                assert r.headers["Retry-After"] == "1"
    run(main())


# --- a follower forwards every kind of request to the leader ------------------------------------


def test_a_follower_forwards_rest_requests_with_their_auth(secured: LocalCluster) -> None:
    async def main() -> None:
        queue = "a-follow"
        follower = follower_url(secured, queue)
        leader_id = leader_of(secured, queue)
        async with aiohttp.ClientSession(headers=AUTH) as s:
            job = await push(s, follower, queue, {"via": "follower"})
            async with s.get(follower + f"/jobs/{job}") as r:
                assert r.status == 200 and r.headers["X-Shoal-Leader"] == leader_id
                assert (await r.json())["job"]["data"] == {"via": "follower"}
            async with s.get(follower + f"/queues/{queue}/jobs", params={"timeout": "2000"}) as r:
                pulled = await r.json()
            assert pulled["job"]["id"] == job
            async with s.post(follower + f"/jobs/{job}/ack", json={"token": "stale"}) as r:
                assert r.status == 409 and (await r.json())["code"] == "LEASE_MISMATCH"   # the leader's status
            async with s.post(follower + f"/jobs/{job}/ack", json={"token": pulled["token"]}) as r:
                assert r.status == 200
            async with s.post(follower + f"/jobs/{job}/ack", data=b"{", headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400   # refused by the follower itself: the body is not JSON
            # A REST command goes to the leader over the node-to-node link, which never forwards a
            # forwarded command again: a request some node relayed over HTTP is answered all the same.
            async with s.get(follower + f"/jobs/{job}", headers={"X-Shoal-Forwarded-By": "n9"}) as r:
                assert r.status == 200 and r.headers["X-Shoal-Leader"] == leader_id
        async with aiohttp.ClientSession() as s:   # the follower checks the token before forwarding
            async with s.get(follower + f"/jobs/{job}", headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 403
    run(main())


def test_a_follower_relays_events_and_work_streams(secured: LocalCluster) -> None:
    async def main() -> None:
        queue = "a-follow-stream"
        follower, leader = follower_url(secured, queue), leader_url(secured, queue)
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.get(follower + "/events", params={"queue": queue}) as events:
                assert events.status == 200 and events.headers["X-Shoal-Leader"] == leader_of(secured, queue)
                await events.content.readline()
                job = await push(s, leader, queue, 1, ttr=120_000)
                [ev] = await sse_events(events, 1)
                assert ev["id"] == job and ev["state"] == "waiting"
            async with s.get(follower + f"/queues/{queue}/work", params={"max": "2"}) as stream:
                [got] = await sse_events(stream, 1)
                assert got["job"]["id"] == job
            # Closing the relayed stream closed the leader's: the lease is back before its ttr.
            async with s.get(leader + f"/queues/{queue}/jobs", params={"timeout": "5000"}) as r:
                assert (await r.json())["job"]["id"] == job
    run(main())


def test_a_rest_pull_abandoned_by_its_client_takes_nothing(secured: LocalCluster) -> None:
    async def main() -> None:
        queue = "a-abandon"
        base = leader_url(secured, queue)
        async with aiohttp.ClientSession(headers=AUTH) as s:
            poll = asyncio.ensure_future(s.get(base + f"/queues/{queue}/jobs", params={"timeout": "5000"}))
            await asyncio.sleep(0.3)
            poll.cancel()   # the client goes away while its long poll is parked on the leader
            await asyncio.gather(poll, return_exceptions=True)
            await asyncio.sleep(0.2)
            job = await push(s, base, queue, "for-someone-present")
            async with s.get(base + f"/queues/{queue}/jobs", params={"timeout": "2000"}) as r:
                assert (await r.json())["job"]["id"] == job
    run(main())


# --- /work ------------------------------------------------------------------------------------


def test_work_leases_go_back_at_once_and_are_pullable_before_their_ttr(secured: LocalCluster) -> None:
    async def main() -> None:
        queue = "a-work-release"
        base = leader_url(secured, queue)
        async with aiohttp.ClientSession(headers=AUTH) as s:
            ids = {await push(s, base, queue, i, ttr=120_000) for i in range(2)}
            async with s.get(base + "/work", params={"queue": queue, "max": "5"}) as stream:
                got = await sse_events(stream, 2)
            assert {g["job"]["id"] for g in got} == ids
            assert all(g["job"]["state"] == "active" for g in got)
            started = time.monotonic()
            async with s.get(base + f"/queues/{queue}/jobs", params={"count": "5", "timeout": "60000"}) as r:
                pulled = await r.json()
            # Disconnect released both leases; the long poll got them long before a 120 s ttr.
            assert {j["id"] for j in pulled["jobs"]} == ids and time.monotonic() - started < 60
    run(main())


def test_work_refills_after_an_ack_on_another_interface_and_after_a_lapsed_lease(secured: LocalCluster) -> None:
    async def main() -> None:
        queue = "a-work-refill"
        base = leader_url(secured, queue)
        async with aiohttp.ClientSession(headers=AUTH) as s:
            for i in range(3):
                await push(s, base, queue, i)
            async with s.get(base + f"/queues/{queue}/work", params={"max": "1", "ttr": "1500"}) as stream:
                [first] = await sse_events(stream, 1)
                async with s.ws_connect(base + "/ws") as ws:   # ack over the WebSocket, not REST
                    await ws.send_str(json.dumps({"cmd": "ACK", "id": first["job"]["id"],
                                                  "token": first["token"]}))
                    assert json.loads((await ws.receive(timeout=WAIT_S)).data)["ok"]
                [second] = await sse_events(stream, 1)
                assert second["job"]["id"] != first["job"]["id"]
                # Not acked: its 1.5 s lease lapses, and the stream leases again (the same job or
                # the next one) instead of waiting for an ack that never comes.
                [third] = await sse_events(stream, 1)
                assert third["token"] != second["token"]
    run(main())


def test_work_refuses_bad_parameters(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "a-work-bad")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            for path in ("/work", "/work?queue=a-work-bad&max=0", "/work?queue=a-work-bad&max=x",
                         "/queues/a-work-bad/work?ttr=-1", "/work?queue=bad%20name"):
                async with s.get(base + path, allow_redirects=False) as r:
                    assert r.status == 400 and (await r.json())["code"] == "INVALID", path
    run(main())


# --- /ws --------------------------------------------------------------------------------------


def test_ws_auth_pipelining_batches_and_msgpack(secured: LocalCluster) -> None:
    async def main() -> None:
        queue = "a-ws"
        base = leader_url(secured, queue)
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await s.ws_connect(base + "/ws", headers={"Authorization": "Bearer wrong"})
            assert refused.value.status == 403
            async with s.ws_connect(base + "/ws") as ws:   # no header: authenticate in-band
                async def call(frame: dict[str, Any]) -> dict[str, Any]:
                    await ws.send_str(json.dumps(frame))
                    return json.loads((await ws.receive(timeout=WAIT_S)).data)

                assert (await call({"cmd": "Count", "queue": queue}))["code"] == "AUTH_REQUIRED"
                assert (await call({"cmd": "Auth", "token": "nope"}))["code"] == "AUTH_FAILED"
                assert (await call({"cmd": "Auth", "token": TOKEN}))["ok"]
                assert (await call({"cmd": "Hello", "protocolVersion": 2}))["protocolVersion"] == 2
                # v2: a parked long poll does not hold up the commands behind it.
                await ws.send_str(json.dumps({"cmd": "PULL", "queue": queue, "timeout": 5000, "reqId": "poll"}))
                await ws.send_str(json.dumps({"cmd": "PUSHB", "queue": queue, "reqId": "batch",
                                              "jobs": [{"data": {"n": 1}}, {"data": [2], "priority": -5}]}))
                replies: dict[str, dict[str, Any]] = {}
                order = []
                while len(replies) < 2:
                    reply = json.loads((await ws.receive(timeout=WAIT_S)).data)
                    replies[reply["reqId"]] = reply
                    order.append(reply["reqId"])
                assert order == ["batch", "poll"]
                assert replies["poll"]["job"]["data"] == {"n": 1}
                # Binary frames: MessagePack in, MessagePack out.
                await ws.send_bytes(msgpack.packb({"cmd": "PULL", "queue": queue, "reqId": 9}))
                reply = msgpack.unpackb((await ws.receive(timeout=WAIT_S)).data)
                assert reply["reqId"] == 9 and reply["job"]["data"] == [2]
                await ws.send_bytes(b"\xc1")
                assert msgpack.unpackb((await ws.receive(timeout=WAIT_S)).data)["code"] == "PROTOCOL_ERROR"
    run(main())


# --- health and metrics -----------------------------------------------------------------------


def test_health_and_metrics_carry_the_issue_figures(secured: LocalCluster) -> None:
    async def main() -> str:
        queue = "a-metrics"
        base = leader_url(secured, queue)
        async with aiohttp.ClientSession(headers=AUTH) as s:
            job = await push(s, base, queue, 1)
            async with s.get(base + f"/queues/{queue}/jobs") as r:
                token = (await r.json())["token"]
            async with s.post(f"{base}/jobs/{job}/ack", json={"token": token}):
                pass
            await push(s, base, queue, 2)
            async with s.get(base + "/health") as r:
                health = await r.json()
            assert health["status"] == "ok" and health["memory"]["rssBytes"] > 0
            assert health["jobsHeld"] >= 2 and health["leading"]
            async with s.get(base + "/prometheus") as r:
                return await r.text()
    text = run(main())
    from prometheus_client.parser import text_string_to_metric_families

    values = {(m.name, tuple(sorted(m.labels.items()))): m.value
              for family in text_string_to_metric_families(text) for m in family.samples}
    names = {name for name, _ in values}
    assert values[("shoal_queue_jobs", (("queue", "a-metrics"), ("state", "waiting")))] == 1
    assert values[("shoal_queue_jobs", (("queue", "a-metrics"), ("state", "completed")))] == 1
    assert values[("shoal_queue_events_total", (("kind", "enqueued"), ("queue", "a-metrics")))] == 2
    assert values[("shoal_queue_events_total", (("kind", "completed"), ("queue", "a-metrics")))] == 1
    assert any(n == "shoal_command_latency_seconds_bucket" and dict(labels)["cmd"] == "PUSH" for n, labels in values)
    assert any(n == "shoal_http_command_latency_seconds_count" and dict(labels)["cmd"] == "ACK" and v >= 1
               for (n, labels), v in values.items())
    for name in ("shoal_raft_term", "shoal_raft_commit_index", "shoal_partition_is_leader", "shoal_partition_leader",
                 "shoal_connections", "shoal_inflight_commands", "shoal_http_streams", "shoal_http_requests_total",
                 "shoal_http_request_latency_seconds_bucket", "shoal_http_forwarded_total", "shoal_sessions"):
        assert name in names, name
