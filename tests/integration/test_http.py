"""The HTTP API against real node processes, with aiohttp's client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import pytest

from conftest import NODE_COMMAND, follower_url, http_url, leader_url, run, secured_cluster
from waiting import eventually_async
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

pytestmark = pytest.mark.integration
TOKEN = "http-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with secured_cluster(tmp_path_factory, "http", TOKEN) as cl:
        yield cl


def test_health_endpoints_and_auth(secured: LocalCluster) -> None:
    async def main() -> None:
        base = http_url(secured, "n1")
        async with aiohttp.ClientSession() as s:
            for path in ("/healthz", "/ready"):      # open without a token
                async with s.get(base + path) as r:
                    assert r.status == 200, path
            for node_id in secured.node_ids:         # wait_balanced promises every node is ready
                async with s.get(http_url(secured, node_id) + "/ready") as r:
                    assert r.status == 200, (node_id, await r.json())
            async with s.get(base + "/health") as r:
                assert r.status == 401 and (await r.json())["code"] == "AUTH_REQUIRED"
            async with s.get(base + "/health", headers={"Authorization": "Bearer nope"}) as r:
                assert r.status == 403 and (await r.json())["code"] == "AUTH_FAILED"
            async with s.get(base + "/health", headers=AUTH) as r:
                body = await r.json()
                assert r.status == 200 and body["nodeId"] == "n1" and body["memory"]["maxRssBytes"] > 0
            async with s.get(base + "/prometheus", headers=AUTH) as r:
                text = await r.text()
                assert "shoal_raft_term" in text and "shoal_queue_jobs" in text
            async with s.get(base + "/stats", headers=AUTH) as r:
                assert set((await r.json())["replicas"]) == {"0", "1", "2", "3"}
            async with s.get(base + "/openapi.json", headers=AUTH) as r:
                assert "/queues/{queue}/jobs" in (await r.json())["paths"]
    run(main())


def test_ready_stays_ready_on_every_node_while_writes_flow(secured: LocalCluster) -> None:
    """Followers apply a few entries at a time: that normal lag must not read as catching up."""
    async def main() -> None:
        base = leader_url(secured, "h-ready")
        urls = [http_url(secured, n) for n in secured.node_ids]
        not_ready: list[dict[str, object]] = []
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async def writes() -> None:
                for i in range(300):
                    async with s.post(base + "/queues/h-ready/jobs", json={"data": i}) as r:
                        assert r.status in (200, 201), await r.text()

            async def probes() -> None:
                for _ in range(60):
                    for url in urls:
                        async with s.get(url + "/ready") as r:
                            if r.status != 200:
                                not_ready.append(await r.json())
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(asyncio.gather(writes(), probes()), 60)
        assert not not_ready, not_ready[:3]
    run(main())


def test_rest_add_pull_get_ack_fail(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "h-rest")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.post(base + "/queues/h-rest/jobs", json={"data": {"n": 1}, "priority": -2}) as r:
                job_id = (await r.json())["id"]
            async with s.post(base + "/queues/h-rest/jobs", json={"data": [2], "attempts": 1}) as r:
                second = (await r.json())["id"]
            async with s.get(base + "/queues/h-rest/jobs", params={"timeout": "1000"}) as r:
                pulled = await r.json()
            assert pulled["job"]["id"] == second and pulled["job"]["data"] == [2]   # priority 0 before -2
            async with s.post(base + f"/jobs/{second}/fail", json={"token": pulled["token"], "error": "boom"}) as r:
                assert (await r.json())["state"] == "failed"
            async with s.get(base + "/queues/h-rest/jobs") as r:
                pulled = await r.json()
            async with s.post(base + f"/jobs/{job_id}/ack", json={"token": "stale"}) as r:
                assert r.status == 409 and (await r.json())["code"] == "LEASE_MISMATCH"
            async with s.post(base + f"/jobs/{job_id}/ack", json={"token": pulled["token"], "result": {"ok": 1}}) as r:
                assert r.status == 200
            async with s.get(base + f"/jobs/{job_id}") as r:
                job = (await r.json())["job"]
                assert job["state"] == "completed" and job["result"] == {"ok": 1}
            async with s.get(base + "/jobs/99-1") as r:
                assert r.status in (200, 404, 503)
    run(main())


def test_bad_requests_get_400_with_the_code(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "h-bad")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.post(base + "/queues/h-bad/jobs", data=b"{not json",
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400 and (await r.json())["code"] == "INVALID"
            async with s.post(base + "/queues/h-bad/jobs", json={"data": 1, "priority": "high"}) as r:
                body = await r.json()
                assert r.status == 400 and body["code"] == "INVALID" and "priority" in body["error"]
            async with s.post(base + "/queues/bad%20name/jobs", json={"data": 1}) as r:
                assert r.status == 400
            async with s.post(base + "/queues/h-bad/jobs", json=[1, 2]) as r:
                assert r.status == 400
    run(main())


def test_a_follower_forwards_to_the_leader(secured: LocalCluster) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(headers=AUTH) as s:
            url = follower_url(secured, "h-redirect") + "/queues/h-redirect/jobs"
            async with s.post(url, json={"data": 1}, allow_redirects=False) as r:
                assert r.status == 200 and (await r.json())["id"]
                leader = secured.leader_of(partition_for("h-redirect", secured.config.partitions))
                assert r.headers["X-Shoal-Leader"] == leader
    run(main())


def test_sse_events_of_push_pull_ack(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "h-events")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.get(base + "/events", params={"queue": "h-events"}) as stream:
                await stream.content.readline()
                async with s.post(base + "/queues/h-events/jobs", json={"data": 1}) as r:
                    job_id = (await r.json())["id"]
                async with s.get(base + "/queues/h-events/jobs") as r:
                    token = (await r.json())["token"]
                async with s.post(base + f"/jobs/{job_id}/ack", json={"token": token}):
                    pass
                states = []
                async def read() -> None:
                    while len(states) < 3:
                        line = (await stream.content.readline()).decode()
                        if line.startswith("data: "):
                            ev = json.loads(line[6:])
                            if ev["id"] == job_id:
                                states.append(ev["state"])
                await asyncio.wait_for(read(), 10)
                assert states == ["waiting", "active", "completed"]
    run(main())


def test_work_stream_leases_and_releases_on_disconnect(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "h-work")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            for i in range(3):
                async with s.post(base + "/queues/h-work/jobs", json={"data": i, "ttr": 60_000}):
                    pass
            got: list[dict] = []
            async with s.get(base + "/queues/h-work/work", params={"max": "2"}) as stream:
                async def read(n: int) -> None:
                    while len(got) < n:
                        line = (await stream.content.readline()).decode()
                        if line.startswith("data: "):
                            got.append(json.loads(line[6:]))
                await asyncio.wait_for(read(2), 10)
                async with s.post(base + f"/jobs/{got[0]['job']['id']}/ack", json={"token": got[0]["token"]}) as r:
                    assert r.status == 200
                await asyncio.wait_for(read(3), 10)   # a replacement is leased after the ack
            # The stream is gone: its two leases are back in the queue long before their 60 s ttr.

            async def leases_back() -> dict | None:
                async with s.get(base + "/stats") as r:
                    counts = (await r.json())["queues"]["h-work"]["counts"]
                return counts if counts["active"] == 0 else None

            counts = await eventually_async(leases_back, "the stream's leases back in the queue", 5, poll_s=0.1)
            assert counts == {"waiting": 2, "delayed": 0, "active": 0, "completed": 1, "failed": 0, "waiting-children": 0, "cancelled": 0}
    run(main())


def test_websocket_carries_protocol_commands(secured: LocalCluster) -> None:
    async def main() -> None:
        base = leader_url(secured, "h-ws")
        async with aiohttp.ClientSession(headers=AUTH) as s:
            async with s.ws_connect(base + "/ws") as ws:
                await ws.send_str(json.dumps({"cmd": "PUSH", "queue": "h-ws", "data": {"a": 1}, "reqId": 7}))
                reply = json.loads((await ws.receive()).data)
                assert reply["ok"] and reply["reqId"] == 7
                await ws.send_str(json.dumps({"cmd": "PULL", "queue": "h-ws", "reqId": 8}))
                reply = json.loads((await ws.receive()).data)
                assert reply["job"]["data"] == {"a": 1}
                await ws.send_str("not json")
                assert json.loads((await ws.receive()).data)["code"] == "PROTOCOL_ERROR"
    run(main())


def test_ready_is_false_while_a_partition_has_no_leader(tmp_path) -> None:  # noqa: ANN001
    async def main(cluster: LocalCluster) -> None:
        base = http_url(cluster, "n1")
        async with aiohttp.ClientSession() as s:

            async def ready_status(wanted: int) -> bool:
                async with s.get(base + "/ready") as r:
                    return r.status == wanted

            # ready once n1 knows every leader and has applied what is committed
            await eventually_async(lambda: ready_status(200), "/ready 200 on n1", 20, poll_s=0.1)
            cluster.kill("n2")
            cluster.kill("n3")   # no majority left: n1's partitions lose their leaders
            await eventually_async(lambda: ready_status(503), "/ready 503 on n1 without a majority", 15, poll_s=0.1)

    with LocalCluster(nodes=3, partitions=2, data_dir=tmp_path / "c", base_port=free_base_port(3, 2),
                      node_command=NODE_COMMAND) as cluster:
        run(main(cluster))
