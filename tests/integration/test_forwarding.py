"""Any node serves any command of a client that does not route for itself (``shoal.node.relay``).

A raw connection without ``Hello`` (as bunqueue's client connects) to a node that does not
lead the queue's partition: its commands are forwarded over the Raft link's side channel,
its pipelined replies come back matched by reqId, frames without a reqId are answered in
the order they came, long polls and leases work through it, and a leader that hands over
(graceful stop) is followed without the client seeing an error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.cluster.codec import encode
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

from nodehttp import metric
from rawproto import RawConn
from waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture()
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "c", base_port=free_base_port(3, 4)) as cl:
        cl.wait_balanced()
        yield cl


def away(cluster: LocalCluster, queue: str) -> str:
    """The address of a node that does not lead ``queue``'s partition."""
    leader = cluster.leader_of(partition_for(queue, cluster.config.partitions))
    return cluster.address_of(next(n for n in cluster.node_ids if n != leader))


def test_a_connection_without_hello_is_served_through_a_follower(cluster3: LocalCluster) -> None:
    queue = "fw-basic"
    with RawConn(away(cluster3, queue), hello=False) as c:
        ids = [c.send({"cmd": "PUSH", "queue": queue, "name": "n", "data": i}) for i in range(200)]
        replies = [c.wait_reply(r) for r in ids]
        assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:3]
        assert len({r["id"] for r in replies}) == 200
        # frames without a reqId: run together, answered in the order they came
        c.send_raw(b"".join(encode({"cmd": "PUSH", "queue": queue, "data": f"plain {i}"}) for i in range(20)))
        ordered = [c.read_frame() for _ in range(20)]
        seqs = [int(r["id"].split("-")[1]) for r in ordered]
        assert seqs == sorted(seqs) and all("reqId" not in r for r in ordered)
        counts = c.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
        assert counts["waiting"] == 220
        got = c.call({"cmd": "PULLB", "queue": queue, "count": 5, "owner": "w1", "lockTtl": 30_000})
        assert len(got["jobs"]) == 5 and got["jobs"][0]["name"] == "n"
        acked = c.call({"cmd": "ACKB", "ids": [j["id"] for j in got["jobs"]], "tokens": got["tokens"]})
        assert acked["ok"], acked
        job = c.call({"cmd": "GetJob", "id": got["jobs"][0]["id"]})["job"]
        assert job["state"] == "completed" and job["name"] == "n"
    # what crossed the node-to-node link, as each node's metrics count it
    leader = cluster3.leader_of(partition_for(queue, cluster3.config.partitions))
    entry = next(n for n in cluster3.node_ids if n != leader)
    assert metric(cluster3, entry, "shoal_relay_forwarded_total") >= 224  # 220 adds, a pull, an ack, two reads
    assert metric(cluster3, leader, "shoal_relay_served_total") >= 224
    assert metric(cluster3, entry, 'shoal_relay_in_flight{side="forwarding"}') == 0
    assert metric(cluster3, entry, "shoal_peer_frames_sent_total") > 0
    assert metric(cluster3, entry, "shoal_peer_bytes_sent_total") > 0


def test_a_long_poll_parks_at_the_leader_and_a_custom_id_is_found(cluster3: LocalCluster) -> None:
    queue = "fw-poll"
    with RawConn(away(cluster3, queue), hello=False) as c, RawConn(cluster3.addresses[0], hello=False) as p:
        poll = c.send({"cmd": "PULL", "queue": queue, "timeout": 10_000})
        time.sleep(0.3)  # the poll is parked (nothing to take yet); whatever the wait, it must be answered
        added = p.call({"cmd": "PUSH", "queue": queue, "data": "wake", "jobId": "order-9"})
        assert added["id"] == "order-9"
        got = c.wait_reply(poll, timeout_s=15)
        assert got["job"]["id"] == "order-9" and got["job"]["data"] == "wake"
        assert c.call({"cmd": "ACK", "id": "order-9", "token": got["token"]})["ok"]
        # a node that has not seen the custom id finds its partition
        for address in cluster3.addresses:
            with RawConn(address, hello=False) as other:
                assert other.call({"cmd": "GetState", "id": "order-9"})["state"] == "completed"
        assert c.call({"cmd": "GetJob", "id": "no-such-id"})["job"] is None


def test_a_leader_that_hands_over_is_followed(cluster3: LocalCluster) -> None:
    queue = "fw-failover"
    p = partition_for(queue, cluster3.config.partitions)
    leader = cluster3.leader_of(p)
    entry = next(n for n in cluster3.node_ids if n != leader)
    with RawConn(cluster3.address_of(entry), hello=False) as c:
        first = [c.send({"cmd": "PUSH", "queue": queue, "data": i, "idempotencyKey": f"k{i}"}) for i in range(50)]
        assert all(c.wait_reply(r)["ok"] for r in first)
        cluster3.stop_node(leader)  # graceful: leadership moves; commands meet NOT_LEADER and go again
        later = [c.send({"cmd": "PUSH", "queue": queue, "data": i, "idempotencyKey": f"k{i}"})
                 for i in range(50, 100)]
        replies = [c.wait_reply(r, timeout_s=40) for r in later]
        assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:3]

        def answered() -> dict | None:
            counts = c.call({"cmd": "GetJobCounts", "queue": queue}, timeout_s=20)
            return counts if counts.get("ok") else None

        counts = eventually(answered, "the queue's counts from the new leader", 20, poll_s=0.1)
        assert counts["counts"]["waiting"] == 100


def test_a_bulk_add_through_a_follower_is_sent_on_as_received_and_checked_at_the_leader(
        cluster3: LocalCluster) -> None:
    queue = "fw-bulk"
    with RawConn(away(cluster3, queue), hello=False) as c:
        jobs = [{"data": {"name": "from-envelope", "n": 0}},  # bunqueue's envelope: the name is in the data
                {"name": "named", "data": 1}, {"data": 2, "jobId": "bulk-c1"}, {"data": 3, "idempotencyKey": "bk"}]
        added = c.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
        assert added["ok"], added
        ids = added["ids"]
        assert len(set(ids)) == 4 and ids[2] == "bulk-c1"
        # The leader read it in bunqueue's dialect, and keeps the client's own key.
        job = c.call({"cmd": "GetJob", "id": ids[0]})["job"]
        assert job["name"] == "from-envelope" and job["data"] == {"n": 0}
        assert c.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 3, "idempotencyKey": "bk"}]})["ids"] == [ids[3]]
        # The leader checks the frame: one bad job refuses the whole add, answered to its reqId.
        bad = c.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 1}, {"data": 2, "priority": "high"}]})
        assert bad["ok"] is False and bad["code"] == "INVALID" and "jobs[1]" in bad["error"]
        # A client's own field named where the node keeps a frame's bytes is just an unknown field.
        odd = c.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 1}], "\x00received": b"PUSHB"})
        assert odd["ok"] is False and odd["code"] == "INVALID" and "unknown field" in odd["error"]
        # A large frame (the decoder's path for frames of map data over 512 bytes).
        big = c.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"name": "b", "data": {"n": i}} for i in range(1_000)]})
        assert big["ok"] and len(set(big["ids"])) == 1_000
        assert c.call({"cmd": "GetJobCounts", "queue": queue})["counts"]["waiting"] == 1_004
    # A node that has not seen the custom id finds its partition.
    with RawConn(cluster3.addresses[0], hello=False) as other:
        assert other.call({"cmd": "GetState", "id": "bulk-c1"})["state"] == "waiting"


def test_every_command_through_a_follower_is_sent_on_as_received_and_checked_at_the_leader(
        cluster3: LocalCluster) -> None:
    """Not a bulk add alone: a single add with options, pulls, acks and reads go on to the leader
    as the client sent them; the leader's checks answer a bad one, a single add gets the
    forwarding node's key (one job for a frame the node may have to send twice), and a custom
    id is still found."""
    queue = "fw-any"
    with RawConn(away(cluster3, queue), hello=False) as c:
        one = c.call({"cmd": "PUSH", "queue": queue, "data": {"name": "enveloped", "k": 1}, "priority": 5})
        custom = c.call({"cmd": "PUSH", "queue": queue, "data": 2, "jobId": "any-c1", "delay": 60_000})
        assert one["ok"] and custom["ok"] and custom["id"] == "any-c1", (one, custom)
        job = c.call({"cmd": "GetJob", "id": one["id"]})["job"]
        assert job["name"] == "enveloped" and job["priority"] == 5 and job["data"] == {"k": 1}
        bad = c.call({"cmd": "PULLB", "queue": queue, "count": 1, "colour": "blue"})
        assert bad["ok"] is False and bad["code"] == "INVALID" and "colour" in bad["error"], bad
        bad = c.call({"cmd": "ACK", "id": one["id"], "token": "t", "nonsense": 1})
        assert bad["ok"] is False and bad["code"] == "INVALID" and "nonsense" in bad["error"], bad
        got = c.call({"cmd": "PULLB", "queue": queue, "count": 5, "owner": "w1", "lockTtl": 30_000})
        assert [j["id"] for j in got["jobs"]] == [one["id"]], got
        assert c.call({"cmd": "ACK", "id": one["id"], "token": got["tokens"][0]})["ok"]
        counts = c.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
        assert counts["completed"] == 1 and counts["delayed"] == 1, counts
    with RawConn(cluster3.addresses[0], hello=False) as other:
        assert other.call({"cmd": "GetState", "id": "any-c1"})["state"] == "delayed"
