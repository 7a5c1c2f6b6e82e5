"""Parent/child flows across partitions against real node processes: a flow whose children
sit on three partitions completes through a SIGKILL of the parent partition's leader and of a
child partition's leader, and the parent sees every child's result exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for
from shoal.client import AsyncClient, ConnectionOptions
from shoal.client.exceptions import CommandError

from conftest import http_url, replica_views, secured_cluster
from waiting import eventually, eventually_async

pytestmark = pytest.mark.integration

FAST = ConnectionOptions(command_timeout=20.0, ping_interval=0.3, max_ping_failures=2, connect_timeout=1.0,
                         max_command_timeouts=2)
WAIT_S_MAX = 30.0


def queues_on_distinct_partitions(partitions: int, n: int, prefix: str) -> list[str]:
    """``n`` queue names on ``n`` different partitions (bounded search)."""
    names: dict[int, str] = {}
    for i in range(10_000):
        name = f"{prefix}{i}"
        names.setdefault(partition_for(name, partitions), name)
        if len(names) == n:
            return list(names.values())
    raise AssertionError("not enough partitions")


async def wait_state(client: AsyncClient, job_id: str, state: str, timeout_s: float = WAIT_S_MAX) -> None:
    async def reached() -> bool:
        return bool((await client.call({"cmd": "GetState", "id": job_id}))["state"] == state)

    await eventually_async(reached, f"job {job_id} to be {state}", timeout_s, poll_s=0.1, ignoring=(CommandError,))


async def work_one(client: AsyncClient, queue: str, result: Any) -> str:
    """Pull one job of ``queue`` and ack it with ``result``; its id."""
    q = client.queue(queue)
    job = await q.pull(timeout=10)
    assert job is not None, f"no job in {queue}"
    await q.ack(job, result)
    return job.id


def wait_all_ready(cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    eventually(lambda: all(p.leader for p in cluster.topology().partition_map) and cluster.nodes_ready(),
               "a leader for every partition and every node ready", timeout_s, poll_s=0.1)


def test_flow_across_partitions_completes(fresh_cluster: LocalCluster) -> None:
    """Children on three partitions, each completes; the parent then runs with their results."""
    parent_q, *child_qs = queues_on_distinct_partitions(fresh_cluster.config.partitions, 4, "fl-a")

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            tree = await client.flow({"queue": parent_q, "data": "parent"},
                                     [{"queue": q, "data": i} for i, q in enumerate(child_qs)])
            parent = tree["id"]
            assert [c["queue"] for c in tree["children"]] == child_qs
            assert await client.queue(parent_q).get_state(parent) == "waiting-children"
            done = {await work_one(client, q, 10 * i) for i, q in enumerate(child_qs)}
            assert done == {c["id"] for c in tree["children"]}
            await wait_state(client, parent, "waiting")
            values = await client.get_children_values(parent)
            assert values == {c["id"]: 10 * i for i, c in enumerate(tree["children"])}
            job = await client.queue(parent_q).pull(timeout=10)  # what a worker's handler sees
            assert job is not None and job.id == parent and job.raw["children"] == {"expected": 3, "done": 3}
            assert await job.children_values() == values
            await client.queue(parent_q).ack(job, "ok")
            child = await client.queue(child_qs[0]).get_job(tree["children"][0]["id"])
            assert child is not None and child.parent == parent

    asyncio.run(main())


def test_child_failure_policies(fresh_cluster: LocalCluster) -> None:
    """fail: the parent fails; ignore / remove: the parent proceeds."""
    parent_q, child_q = queues_on_distinct_partitions(fresh_cluster.config.partitions, 2, "fl-b")

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue(child_q)
            tolerant = await client.flow({"queue": parent_q, "data": 1},
                                         [{"queue": child_q, "data": "x", "onFailure": "ignore"},
                                          {"queue": child_q, "data": "y", "onFailure": "remove"}])
            for _ in range(2):
                job = await q.pull(timeout=10)
                assert job is not None
                await q.fail(job, "boom")
            await wait_state(client, tolerant["id"], "waiting")
            report = await client.get_children_report(tolerant["id"])
            assert report["values"] == {} and report["done"] == 2
            assert set(report["ignored"]) | set(report["removed"]) == {c["id"] for c in tolerant["children"]}

            strict = await client.flow({"queue": parent_q, "data": 2}, [{"queue": child_q, "data": "z"}])
            job = await q.pull(timeout=10)
            assert job is not None
            await q.fail(job, "broken")
            await wait_state(client, strict["id"], "failed")

    asyncio.run(main())


def test_flow_survives_leader_sigkills(fresh_cluster: LocalCluster) -> None:
    """SIGKILL the parent partition's leader while children report, then a child partition's
    leader right after its child was acked: every child's result reaches the parent once."""
    partitions = fresh_cluster.config.partitions
    parent_q, *child_qs = queues_on_distinct_partitions(partitions, 4, "fl-k")

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            tree = await client.flow({"queue": parent_q, "data": "parent"},
                                     [{"queue": q, "data": i} for i, q in enumerate(child_qs)])
            parent = tree["id"]
            children = [c["id"] for c in tree["children"]]
            await work_one(client, child_qs[0], 100)

            victim = fresh_cluster.leader_of(partition_for(parent_q, partitions))
            assert victim is not None
            fresh_cluster.kill(victim)  # the parent's partition loses its leader ...
            await work_one(client, child_qs[1], 101)  # ... while a child's report is on its way
            fresh_cluster.start_node(victim)
            await asyncio.to_thread(wait_all_ready, fresh_cluster)

            child_p = partition_for(child_qs[2], partitions)
            victim2 = fresh_cluster.leader_of(child_p)
            assert victim2 is not None
            await work_one(client, child_qs[2], 102)
            fresh_cluster.kill(victim2)  # the child's partition loses its leader with the report in its outbox
            await wait_state(client, parent, "waiting")
            report = await client.get_children_report(parent)
            assert report["values"] == dict(zip(children, [100, 101, 102]))
            assert report["expected"] == report["done"] == 3
            fresh_cluster.start_node(victim2)
            await asyncio.to_thread(wait_all_ready, fresh_cluster)
            assert await work_one(client, parent_q, "ok") == parent

    asyncio.run(main())
    views = replica_views(fresh_cluster, parent_q)
    assert len({v["digest"] for v in views}) == 1, "the parent partition's replicas differ"


def test_http_flow_and_children(fresh_cluster: LocalCluster) -> None:
    """POST /flows and GET /jobs/{id}/children; bad trees get INVALID naming the field."""
    import aiohttp


    parent_q, child_q = queues_on_distinct_partitions(fresh_cluster.config.partitions, 2, "fl-h")
    base = http_url(fresh_cluster, fresh_cluster.node_ids[0])

    async def main() -> None:
        async with aiohttp.ClientSession() as s, AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            body = {"parent": {"queue": parent_q, "data": {"p": 1}},
                    "children": [{"queue": child_q, "data": {"c": 1}}], "idempotencyKey": "h1"}
            async with s.post(base + "/flows", json=body) as r:
                assert r.status == 200
                ids = (await r.json())["ids"]
            async with s.post(base + "/flows", json=body) as r:  # re-sent: the same jobs
                assert (await r.json())["ids"] == ids
            await work_one(client, child_q, {"sum": 3})
            await wait_state(client, ids[0], "waiting")
            async with s.get(f"{base}/jobs/{ids[0]}/children") as r:
                assert r.status == 200
                assert (await r.json())["values"] == {ids[1]: {"sum": 3}}
            bad = {"parent": {"queue": parent_q, "data": 1}, "children": [{"queue": child_q, "data": 1,
                                                                           "onFailure": "explode"}]}
            async with s.post(base + "/flows", json=bad) as r:
                reply = await r.json()
                assert r.status == 400 and reply["code"] == "INVALID"
                assert reply["error"].startswith("children[0].onFailure")

    asyncio.run(main())


def test_forged_peer_request_is_refused(fresh_cluster: LocalCluster) -> None:
    """The flow commands nodes send each other come only over the node-to-node link, whose peers
    proved the cluster secret: from a client's connection they are unknown commands."""
    from rawproto import RawConn

    node = fresh_cluster.node_ids[0]
    with RawConn(fresh_cluster.address_of(node)) as c:
        for frame in ({"cmd": "_ChildDone", "partition": 0, "_reports": [["0-1", "1-1", False, None, None, "fail"]]},
                      {"cmd": "_FlowPush", "queue": "q", "_items": []},
                      {"cmd": "_FlowPeer", "_body": b"\x80", "_proof": b"0" * 32}):
            assert c.call(frame)["code"] == "UNKNOWN_COMMAND"
        assert c.call({"cmd": "Ping"})["ok"]


def test_flow_on_a_cluster_with_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Flows across partitions led by different nodes work with client tokens switched on: the nodes'
    own flow commands travel over the node-to-node link, which tokens do not gate."""

    with secured_cluster(tmp_path_factory, "flow-auth", "flow-token") as cl:
        parent_q, *child_qs = queues_on_distinct_partitions(cl.config.partitions, 4, "fl-t")

        async def main() -> None:
            async with AsyncClient(cl.addresses, token="flow-token", options=FAST) as client:
                tree = await client.flow({"queue": parent_q, "data": 0},
                                         [{"queue": q, "data": i} for i, q in enumerate(child_qs)])
                for i, q in enumerate(child_qs):
                    await work_one(client, q, i)
                await wait_state(client, tree["id"], "waiting")
                assert await client.get_children_values(tree["id"]) == {
                    c["id"]: i for i, c in enumerate(tree["children"])}

        asyncio.run(main())
