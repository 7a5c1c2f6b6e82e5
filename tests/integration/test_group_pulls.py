"""Pulls limited to one group on real nodes: bunqueue's ``groupAffinity`` pulls through a node
that does not lead the queue, long polls that wait for one group, and the Python client's
``group=`` pulls and group-affine :class:`~shoal.client.BatchWorker`.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import pytest

from shoal.client import AsyncClient, Batch, BatchOptions, BatchWorker, Client
from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

from conftest import http_url, replica_views
from rawproto import RawConn
from waiting import eventually_async

pytestmark = pytest.mark.integration


def away(cluster: LocalCluster, queue: str) -> str:
    """The address of a node that does not lead ``queue``'s partition."""
    leader = cluster.leader_of(partition_for(queue, cluster.config.partitions))
    return cluster.address_of(next(n for n in cluster.node_ids if n != leader))


def test_bunqueues_group_pulls_through_a_forwarding_node(cluster: LocalCluster) -> None:
    queue = "gp-affinity"
    with RawConn(away(cluster, queue), hello=False) as c:  # bunqueue's client: no Hello, no routing
        assert c.call({"cmd": "CreateQueue", "queue": queue, "options": {"groupConcurrency": 0}})["ok"]
        jobs = [{"data": {"i": i}, "groupId": g} for i in range(4) for g in ("a", "b", "c")]
        jobs += [{"data": {"i": i}} for i in range(3)]
        assert c.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})["ok"]

        got = c.call({"cmd": "PULLB", "queue": queue, "count": 10, "group": {"affinity": "b"}, "owner": "w1"})
        assert got["ok"] and [j["groupId"] for j in got["jobs"]] == ["b"] * 4, got
        assert [j["data"]["i"] for j in got["jobs"]] == [0, 1, 2, 3]
        one = c.call({"cmd": "PULL", "queue": queue, "group": {"affinity": "c"}})
        assert one["ok"] and one["job"]["groupId"] == "c", one
        plain = c.call({"cmd": "PULLB", "queue": queue, "count": 10, "group": {"affinity": None}})
        assert plain["ok"] and len(plain["jobs"]) == 3 and all(j.get("groupId") is None for j in plain["jobs"]), plain

        refused = c.call({"cmd": "PULLB", "queue": queue, "count": 2, "group": {"concurrency": 2}})
        assert not refused["ok"] and refused["code"] == "INVALID" and refused["error"].startswith("group.concurrency")
        rest = c.call({"cmd": "PULLB", "queue": queue, "count": 20})
        assert Counter(j.get("groupId") for j in rest["jobs"]) == {"a": 4, "c": 3}, rest


def rest_pull(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_rest_pull_takes_one_groups_jobs(cluster: LocalCluster) -> None:
    queue = "gp-rest"
    with Client(cluster.addresses) as client:
        q = client.queue(queue)
        q.create(group_concurrency=0)
        q.add_bulk(["a1", "a2"], group="a")
        q.add_bulk(["b1"], group="b")
        q.add("plain")
    base = f"{http_url(cluster, cluster.node_ids[0])}/queues/{queue}/jobs"
    status, got = rest_pull(f"{base}?count=10&group=b")
    assert status == 200 and [j["data"] for j in got["jobs"]] == ["b1"], got
    status, got = rest_pull(f"{base}?count=10&ungrouped=true")
    assert status == 200 and [j["data"] for j in got["jobs"]] == ["plain"], got
    status, got = rest_pull(f"{base}?group=a")
    assert status == 200 and got["job"]["data"] == "a1", got
    status, got = rest_pull(f"{base}?ungrouped=no")
    assert status == 400 and got["code"] == "INVALID", got
    status, got = rest_pull(f"{base}?group=a&ungrouped=true")
    assert status == 400 and got["code"] == "INVALID", got


def test_a_long_poll_for_one_group_waits_for_that_group_only(cluster: LocalCluster) -> None:
    """A parked poll for group g is not woken (nor resubmitted) by jobs of other groups, which
    a parked poll of the whole queue takes meanwhile; a job of g answers it at once.

    One connection to the queue's leader: the node reads its frames in order, so both polls
    are parked before the adds that follow them arrive."""
    queue = "gp-long-poll"
    leader = cluster.address_of(cluster.leader_of(partition_for(queue, cluster.config.partitions)))
    with RawConn(leader) as c:
        assert c.call({"cmd": "CreateQueue", "queue": queue, "options": {"groupConcurrency": 0}})["ok"]
        for_g = c.send({"cmd": "PULL", "queue": queue, "group": "g", "timeout": 10_000})
        anyone = c.send({"cmd": "PULL", "queue": queue, "timeout": 10_000})
        assert c.call({"cmd": "PUSH", "queue": queue, "data": "h1", "group": "h"})["ok"]
        got = c.wait_reply(anyone, 5.0)
        assert got["ok"] and got["job"]["data"] == "h1", got
        assert c.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": f"h{i}", "group": "h"}
                                                               for i in range(2, 22)]})["ok"]
        for i in range(20):  # each add its own applied entry: twenty wake rounds
            assert c.call({"cmd": "PUSH", "queue": queue, "data": f"x{i}", "group": "x"})["ok"]
        metrics = c.call({"cmd": "Metrics", "queue": queue})["metrics"]
        assert metrics["calls"].get("PULL", 0) == 1, metrics  # the group poll was never resubmitted
        assert metrics["counts"]["waiting"] == 40
        started = time.monotonic()
        assert c.call({"cmd": "PUSH", "queue": queue, "data": "g1", "group": "g"})["ok"]
        got = c.wait_reply(for_g, 5.0)
        assert got["ok"] and got["job"]["data"] == "g1" and got["job"]["group"] == "g", got
        assert time.monotonic() - started < 2.0


def test_the_python_clients_group_pulls(cluster: LocalCluster) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("gp-client")
        q.create(group_concurrency=2)
        q.add_bulk(range(5), group="a")
        q.add_bulk(range(5), group="b")
        q.add_bulk(["plain"])
        got = q.pull_many(10, group="a")
        assert [j.data for j in got] == [0, 1]  # group a's concurrency: 2 at a time
        assert q.pull_many(10, group="a") == []
        assert [j.data for j in q.pull_many(10, ungrouped=True)] == ["plain"]
        job = q.pull(group="b")
        assert job is not None and job.group == "b"
        with pytest.raises(ValueError):
            q.pull(group="a", ungrouped=True)


def test_the_python_clients_group_pulls_on_a_sharded_queue(cluster: LocalCluster) -> None:
    with Client(cluster.addresses) as client:
        q = client.queue("gp-sharded", shards=4)
        q.create(shards=4, group_concurrency=0)
        for g in ("a", "b", "c", "d", "e"):
            q.add_bulk([f"{g}{i}" for i in range(3)], group=g)
        for g in ("a", "b", "c", "d", "e"):
            assert [j.data for j in q.pull_many(10, group=g)] == [f"{g}0", f"{g}1", f"{g}2"]


def test_a_group_affine_batch_worker_holds_one_groups_jobs(cluster: LocalCluster) -> None:
    """Every batch is five jobs of one group, and while it runs the worker holds no other
    group's job (its pulls after a batch's first job are limited to that job's group)."""
    async def main() -> None:
        async with AsyncClient(cluster.addresses) as client:
            q = client.queue("gp-batches")
            await q.create(group_concurrency=0)
            for g in ("a", "b", "c"):
                await q.add_bulk([f"{g}{i}" for i in range(10)], group=g)
            batches: list[list[Any]] = []
            held: list[int] = []

            async def handler(batch: Batch) -> None:
                batches.append([job.data for job in batch])
                held.append(worker.held)

            options = BatchOptions(size=5, min_size=5, timeout=5.0, group_affinity=True)
            worker = BatchWorker(client, "gp-batches", handler, batch=options, poll_timeout=0.5)
            async with worker:
                await eventually_async(lambda: worker.processed == 30, "every job acked", 30)
            assert sorted(job for batch in batches for job in batch) == sorted(f"{g}{i}" for g in "abc" for i in range(10))
            assert all(len(b) == 5 and len({job[0] for job in b}) == 1 for b in batches), batches
            assert held == [5] * 6  # the batch's jobs, none of another group
            # The groups take turns batch by batch: each group's first batch before any second one.
            assert sorted(b[0][0] for b in batches[:3]) == ["a", "b", "c"], batches

    asyncio.run(main())


def test_every_replica_agrees_after_group_pulls(cluster: LocalCluster) -> None:
    queue = "gp-replicas"
    with Client(cluster.addresses) as client:
        q = client.queue(queue)
        q.create(group_concurrency=0, group_weights={"a": 2})
        for g in ("a", "b", None):
            q.add_bulk(range(6), **({"group": g} if g else {}))
        for only in ({"group": "b"}, {}, {"ungrouped": True}, {"group": "a"}):
            for job in q.pull_many(2, **only):
                q.ack(job)
    views = replica_views(cluster, queue)  # the replicas' digests, once they applied the same entries
    assert len({v["digest"] for v in views}) == 1, views
