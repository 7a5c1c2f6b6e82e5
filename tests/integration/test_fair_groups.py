"""Fair turns between groups and group admission on real nodes, through a node that does not
lead the queue, by a connection that does not route (bunqueue's client never says Hello).

One tenant's burst (200 jobs of group A) does not hold back another's (5 jobs of B): pulled
and acked one at a time, B's jobs come among the first pulls. Weights and ``groupMaxSize``
travel the same forwarded way.
"""

from __future__ import annotations

from collections import Counter

import pytest

from shoal.client import Client
from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

from rawproto import RawConn

pytestmark = pytest.mark.integration


def away(cluster: LocalCluster, queue: str) -> str:
    """The address of a node that does not lead ``queue``'s partition."""
    leader = cluster.leader_of(partition_for(queue, cluster.config.partitions))
    return cluster.address_of(next(n for n in cluster.node_ids if n != leader))


def push_all(conn: RawConn, frames: list[dict[str, object]]) -> list[dict[str, object]]:
    """Send ``frames`` pipelined, then wait for every reply."""
    replies = [conn.wait_reply(r) for r in [conn.send(f) for f in frames]]
    assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:3]
    return replies


def test_a_burst_of_one_group_does_not_hold_back_another(cluster: LocalCluster) -> None:
    queue = "fair-burst"
    with RawConn(away(cluster, queue), hello=False) as c:
        push_all(c, [{"cmd": "PUSH", "queue": queue, "data": {"n": i}, "groupId": "tenant-a"} for i in range(200)])
        push_all(c, [{"cmd": "PUSH", "queue": queue, "data": {"n": i}, "groupId": "tenant-b"} for i in range(5)])
        order = []
        for _ in range(12):
            got = c.call({"cmd": "PULL", "queue": queue})
            assert got["ok"] and got["job"] is not None, got
            order.append(got["job"]["groupId"])
            assert c.call({"cmd": "ACK", "id": got["job"]["id"], "token": got["token"]})["ok"]
        assert order.count("tenant-b") == 5, order
        assert order[:10] == ["tenant-a", "tenant-b"] * 5, order


def test_weights_and_max_size_through_a_forwarding_node(cluster: LocalCluster) -> None:
    queue = "fair-weights"
    with RawConn(away(cluster, queue), hello=False) as c:
        created = c.call({"cmd": "CreateQueue", "queue": queue,
                          "options": {"groupConcurrency": 0, "groupWeights": {"heavy": 3}}})
        assert created["ok"], created
        for group in ("heavy", "light"):
            added = c.call({"cmd": "PUSHB", "queue": queue,
                            "jobs": [{"data": i, "groupId": group} for i in range(40)]})
            assert added["ok"], added
        got = c.call({"cmd": "PULLB", "queue": queue, "count": 16})
        assert Counter(j["groupId"] for j in got["jobs"]) == {"heavy": 12, "light": 4}
        assert c.call({"cmd": "ACKB", "ids": [j["id"] for j in got["jobs"]], "tokens": got["tokens"]})["ok"]

        # bunqueue's group: {id: "capped", maxSize: 2} on the wire
        capped = [c.call({"cmd": "PUSH", "queue": queue, "data": i, "groupId": "capped", "groupMaxSize": 2})
                  for i in range(3)]
        assert [r["ok"] for r in capped] == [True, True, False]
        assert capped[2]["code"] == "QUEUE_FULL"
        assert capped[2]["error"] == "Group capped has reached its maximum size of 2"


def test_the_python_client_sets_weights(cluster: LocalCluster) -> None:
    with Client(cluster.addresses) as client:
        queue = client.queue("fair-client")
        queue.create(group_concurrency=0)
        for group in ("x", "y"):
            queue.add_bulk(range(20), group=group)
        queue.update(group_weights={"y": 4})
        jobs = queue.pull_many(10)
        assert Counter(j.group for j in jobs) == {"x": 2, "y": 8}
        queue.ack_many(jobs)
