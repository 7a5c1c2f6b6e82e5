"""The wire protocol against a real 3-node cluster: Hello, v1/v2, routing, bad input."""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from typing import Any

import msgpack
import pytest

from shoal.cluster import limits as L
from shoal.cluster.codec import encode
from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for

from conftest import replica_views
from waiting import eventually
from rawproto import RawConn, Router

pytestmark = pytest.mark.integration


def leader_conn(cluster: LocalCluster, queue: str) -> RawConn:
    router = Router(cluster.addresses)
    router.refresh()
    address = router.leader_address(partition_for(queue, 8))
    assert address
    return RawConn(address)


def test_hello_reports_topology_with_every_leader(cluster: LocalCluster) -> None:
    def hello_with_every_leader() -> Any:
        with RawConn(cluster.addresses[0]) as c:
            h = c.hello
        return h if all(p["leader"] for p in h["topology"]["partitionMap"]) else None

    # a node learns a new leader within a heartbeat; allow for one in flight
    h = eventually(hello_with_every_leader, "a Hello naming every partition's leader", 10, poll_s=0.1)
    assert h["ok"] and h["protocolVersion"] == 2 and "pipelining" in h["capabilities"]
    assert h["nodeId"] == "n1" and h["clusterId"]
    topo = h["topology"]
    assert topo["partitions"] == 8 and len(topo["nodes"]) == 3
    assert all(p["leader"] for p in topo["partitionMap"])
    assert all(len(p["replicas"]) == 3 for p in topo["partitionMap"])


def test_leaders_spread_over_nodes(cluster: LocalCluster) -> None:
    def preferred() -> Any:
        topo = cluster.topology()
        return topo if all(p.leader == p.replicas[0] for p in topo.partition_map) else None

    topo = eventually(preferred, "leadership back on every partition's preferred replica", 20, poll_s=0.5)
    assert {p.leader for p in topo.partition_map} == set(cluster.node_ids)


def test_push_pull_ack_round_trip(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "rt") as c:
        r = c.call({"cmd": "PUSH", "queue": "rt", "data": {"to": "a@example.com"}, "priority": 1})
        assert r["ok"], r
        job_id = r["id"]
        assert job_id.startswith(f"{partition_for('rt', 8)}-")
        r = c.call({"cmd": "PULL", "queue": "rt"})
        assert r["ok"] and r["job"]["id"] == job_id and r["job"]["data"] == {"to": "a@example.com"}
        assert r["token"]
        assert c.call({"cmd": "ACK", "id": job_id, "token": r["token"], "result": {"sent": True}})["ok"]
        assert c.call({"cmd": "GetResult", "id": job_id})["result"] == {"sent": True}
        assert c.call({"cmd": "GetState", "id": job_id})["state"] == "completed"


def test_pull_without_job_and_without_timeout_answers_null(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "empty-q") as c:
        r = c.call({"cmd": "PULL", "queue": "empty-q"})
        assert r == {"ok": True, "job": None, "reqId": r["reqId"]} or (r["ok"] and r["job"] is None)


def test_long_poll_pull_is_woken_by_a_push(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "lp") as puller, leader_conn(cluster, "lp") as pusher:
        # A poll that expired would answer job null: the job in the answer is the push waking it.
        req = puller.send({"cmd": "PULL", "queue": "lp", "timeout": 60_000})
        time.sleep(0.3)  # parked by now, on a machine that is not overloaded
        pushed = pusher.call({"cmd": "PUSH", "queue": "lp", "data": 7})
        r = puller.wait_reply(req, 60)
        assert r["ok"] and r["job"]["id"] == pushed["id"]


def test_long_poll_times_out_with_null(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "lp-timeout") as c:
        t0 = time.monotonic()
        r = c.call({"cmd": "PULLB", "queue": "lp-timeout", "count": 5, "timeout": 300})
        assert r["ok"] and r["jobs"] == []
        assert 0.25 <= time.monotonic() - t0 < 30  # it waited, and then answered (a loaded machine answers later)


def test_not_leader_carries_a_leader_hint(cluster: LocalCluster) -> None:
    topo = cluster.topology()
    p = partition_for("hint", 8)
    leader = topo.partition_map[p].leader
    follower = next(n for n in cluster.node_ids if n != leader)
    with RawConn(cluster.address_of(follower)) as c:
        r = c.call({"cmd": "PUSH", "queue": "hint", "data": 1})
        assert not r["ok"] and r["code"] == "NOT_LEADER"
        assert r["leader"]["nodeId"] == leader
        assert f"{r['leader']['host']}:{r['leader']['port']}" == cluster.address_of(leader)


def test_v2_pipelining_answers_out_of_order_and_v1_in_order(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "pipe-idle") as v2:
        # A parked long poll first (nothing is ever pushed to pipe-idle), then quick commands:
        # their replies overtake it.
        slow = v2.send({"cmd": "PULL", "queue": "pipe-idle", "timeout": 800})
        fast = [v2.send({"cmd": "Ping"}) for _ in range(20)]
        order = [v2.read_frame()["reqId"] for _ in range(21)]
        assert order.index(slow) == 20 and sorted(order[:20]) == fast
    address = leader_conn(cluster, "pipe").address
    with RawConn(address, hello=False) as v1:
        ids = [v1.send({"cmd": "PUSH", "queue": "pipe", "data": i}) for i in range(50)]
        got = [v1.read_frame()["reqId"] for _ in ids]
        assert got == ids


def test_a_burst_of_plain_pushes_gets_the_right_reply_each(cluster: LocalCluster) -> None:
    """Plain PUSHes that arrive together are answered as a block: each still gets its own
    reply (errors, duplicates), and jobs keep the order their frames came in."""
    frames = {i: {"cmd": "PUSH", "queue": "burst", "data": i, "reqId": i} for i in range(1, 12)}
    frames[4]["data"] = b"x" * (L.data_bytes_max + 1)        # refused alone, the rest go on
    frames[6]["idempotencyKey"] = frames[7]["idempotencyKey"] = "k6"  # 7 is 6 again
    frames[8]["priority"] = 1                                 # job options: the one-by-one path
    frames[9]["queue"] = "bad name!"
    frames[11]["reqId"] = "eleven"                           # a string reqId comes back as sent
    with leader_conn(cluster, "burst") as c:
        c.send_raw(b"".join(encode(f) for f in frames.values()))
        replies = {i: c.wait_reply(f["reqId"]) for i, f in frames.items()}
        assert set(replies[1]) == {"ok", "reqId", "id"} and replies[11]["reqId"] == "eleven"
        assert replies[4]["code"] == "INVALID" and "data" in replies[4]["error"]
        assert replies[9]["code"] == "INVALID" and "queue" in replies[9]["error"]
        assert replies[7]["ok"] and replies[7]["duplicate"] and replies[7]["id"] == replies[6]["id"]
        new = [1, 2, 3, 5, 6, 8, 10, 11]
        assert all(replies[i]["ok"] and not replies[i].get("duplicate") for i in new)
        seqs = [int(replies[i]["id"].split("-")[1]) for i in new]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        got = c.call({"cmd": "PULLB", "queue": "burst", "count": 20})
        assert [j["data"] for j in got["jobs"]] == [8, 1, 2, 3, 5, 6, 10, 11]  # priority 1 comes first


def test_a_burst_of_plain_bulk_adds_gets_the_right_reply_each(cluster: LocalCluster) -> None:
    """PUSHBs whose jobs carry only data (and maybe a key) are checked as a whole: each gets the
    reply the general path gives it (refusals name what is wrong), and keyed jobs dedupe."""
    def bulk(req_id: Any, *datas: Any, keys: list[str] | None = None, queue: str = "bulk") -> dict[str, Any]:
        jobs = [{"data": d} if keys is None else {"data": d, "idempotencyKey": k} for d, k in zip(datas, keys or datas)]
        return {"cmd": "PUSHB", "queue": queue, "jobs": jobs, "reqId": req_id}

    frames = [bulk(1, 1, 2), bulk(2, 3, 4, keys=["a", "b"]), bulk(3, 5, b"x" * (L.data_bytes_max + 1)),
              bulk(4, 6, queue="bad name!"), bulk(5, 7, keys=[""]), bulk("\x00six", 8), bulk(7, 3, 9, keys=["a", "c"]),
              {**bulk(8, 10), "jobs": [{"data": 10, "priority": 2}]}]  # a job option: the general path
    with leader_conn(cluster, "bulk") as c:
        c.send_raw(b"".join(encode(f) for f in frames))
        replies = {f["reqId"]: c.wait_reply(f["reqId"]) for f in frames if f["reqId"] != "\x00six"}
        replies["\x00six"] = c.wait_reply("six")  # the NUL is taken off the refusal's reqId
        assert replies[1]["ok"] and len(replies[1]["ids"]) == 2
        assert replies[3]["code"] == "INVALID" and "data" in replies[3]["error"]
        assert replies[4]["code"] == "INVALID" and "queue" in replies[4]["error"]
        assert replies[5]["code"] == "INVALID" and "idempotencyKey" in replies[5]["error"]
        assert replies["\x00six"]["code"] == "INVALID" and "reqId" in replies["\x00six"]["error"]
        assert replies[7]["ok"] and replies[7]["ids"][0] == replies[2]["ids"][0]  # key "a" again
        got = c.call({"cmd": "PULLB", "queue": "bulk", "count": 20})
        assert [j["data"] for j in got["jobs"]] == [10, 1, 2, 3, 4, 9]  # priority 2 first, then in order


def test_v1_and_v2_connections_side_by_side(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "mixed") as v2:
        with RawConn(v2.address, hello=False) as v1:
            a = v1.call({"cmd": "PUSH", "queue": "mixed", "data": "from v1"})
            b = v2.call({"cmd": "PUSH", "queue": "mixed", "data": "from v2"})
            assert a["ok"] and b["ok"]
            got = v2.call({"cmd": "PULLB", "queue": "mixed", "count": 10})
            assert sorted(j["data"] for j in got["jobs"]) == ["from v1", "from v2"]


def test_bad_input_gets_errors_and_the_connection_keeps_working(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "bad") as c:
        assert c.call({"cmd": "NOPE"})["code"] == "UNKNOWN_COMMAND"
        r = c.call({"cmd": "PUSH", "queue": "bad name!", "data": 1})
        assert r["code"] == "INVALID" and "queue" in r["error"]
        r = c.call({"cmd": "PUSH", "queue": "bad", "data": 1, "priority": 10**7})
        assert r["code"] == "INVALID" and "priority" in r["error"]
        r = c.call({"cmd": "PUSH", "queue": "bad"})
        assert r["code"] == "INVALID" and "data" in r["error"]
        r = c.call({"cmd": "ACK", "id": "x" * 300})
        assert r["code"] == "INVALID" and "id" in r["error"]
        r = c.call({"cmd": "ACK", "id": "not-an-id"})  # a custom id no job has
        assert r["code"] == "NOT_FOUND"
        assert c.call({"cmd": "_Tick"})["code"] == "UNKNOWN_COMMAND"
        # Undecodable body and a non-map body: error frames, connection stays up.
        c.send_raw(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
        assert c.read_frame()["code"] == "PROTOCOL_ERROR"
        body = msgpack.packb([1, 2, 3])
        c.send_raw(struct.pack(">I", len(body)) + body)
        assert c.read_frame()["code"] == "PROTOCOL_ERROR"
        body = msgpack.packb({"reqId": 99, "queue": "x"})
        c.send_raw(struct.pack(">I", len(body)) + body)
        f = c.read_frame()
        assert f["code"] == "PROTOCOL_ERROR" and f["reqId"] == 99
        assert c.call({"cmd": "PUSH", "queue": "bad", "data": "still fine"})["ok"]


def test_oversized_length_header_closes_only_that_connection(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "big") as victim, leader_conn(cluster, "big") as bystander:
        victim.send_raw(struct.pack(">I", 200 * 1024 * 1024))
        f = victim.read_frame()
        assert not f["ok"] and f["code"] == "FRAME_TOO_LARGE"
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            victim.read_frame(timeout_s=3)
        assert bystander.call({"cmd": "PUSH", "queue": "big", "data": 1})["ok"]


def test_job_data_is_opaque_bytes_end_to_end(cluster: LocalCluster) -> None:
    payload = {"nested": [1, 2.5, None, {"k": b"\x00\xff"}], "s": "é"}
    with leader_conn(cluster, "opaque") as c:
        job_id = c.call({"cmd": "PUSH", "queue": "opaque", "data": payload})["id"]
        assert c.call({"cmd": "GetJob", "id": job_id})["job"]["data"] == payload


def test_events_are_pushed_to_subscribers(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "ev") as c:
        assert c.call({"cmd": "Subscribe", "queue": "ev"})["ok"]
        job_id = c.call({"cmd": "PUSH", "queue": "ev", "data": 1})["id"]

        def event_seen() -> bool:
            with contextlib.suppress(TimeoutError):
                f = c.read_frame(timeout_s=0.5)
                if "event" in f:
                    c.events.append(f)
            return any(e.get("id") == job_id for e in c.events)

        eventually(event_seen, "the pushed job's event", 5, poll_s=0.0)
        assert any(e.get("id") == job_id and e.get("queue") == "ev" for e in c.events)


def test_session_leases_are_released_when_the_connection_closes(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "sess") as keeper:
        job_id = keeper.call({"cmd": "PUSH", "queue": "sess", "data": 1, "ttr": 60_000})["id"]
        with leader_conn(cluster, "sess") as worker:
            r = worker.call({"cmd": "PULL", "queue": "sess"})
            assert r["job"]["id"] == job_id
        eventually(lambda: keeper.call({"cmd": "GetState", "id": job_id})["state"] == "waiting",
                   "the closed session's job waiting again", 5)


def test_stats_local_digests_agree_across_replicas(cluster: LocalCluster) -> None:
    with leader_conn(cluster, "digest") as c:
        for i in range(50):
            c.call({"cmd": "PUSH", "queue": "digest", "data": i})
    views = replica_views(cluster, "digest")
    assert len({v["appliedIndex"] for v in views}) == 1
    assert len({v["digest"] for v in views}) == 1


def test_raft_entries_larger_than_a_socket_read_replicate_whole(cluster: LocalCluster) -> None:
    # A Raft link reads at most 1 MiB per recv() and stops at a short read: a 10 MB entry
    # arrives over many socket events and must still be parsed as one message on each follower.
    blobs = [bytes([i]) * 500_000 for i in range(20)]
    with leader_conn(cluster, "huge") as c:
        r = c.call({"cmd": "PUSHB", "queue": "huge", "jobs": [{"data": b} for b in blobs]}, timeout_s=30)
        assert r["ok"] and len(r["ids"]) == 20
        assert c.call({"cmd": "PUSH", "queue": "huge", "data": b"z" * 3_000_000}, timeout_s=30)["ok"]
        views = replica_views(cluster, "huge", 30)
        assert len({v["appliedIndex"] for v in views}) == 1 and len({v["digest"] for v in views}) == 1
        got = c.call({"cmd": "PULLB", "queue": "huge", "count": 21}, timeout_s=30)["jobs"]
        assert [j["data"] for j in got] == blobs + [b"z" * 3_000_000]


def test_concurrent_connections_all_get_answers(cluster: LocalCluster) -> None:
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            with leader_conn(cluster, "conc") as c:
                for i in range(50):
                    assert c.call({"cmd": "PUSH", "queue": "conc", "data": [k, i]})["ok"]
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    with leader_conn(cluster, "conc") as c:
        assert c.call({"cmd": "Count", "queue": "conc"})["count"] == 400


def test_pullb_reply_stays_within_the_frame_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A PULLB never leases more jobs than its reply can carry; the rest stay waiting."""
    import os

    from shoal.cluster.launcher import free_base_port

    node_command = os.environ.get("SHOAL_TEST_NODE_COMMAND", "").split() or None  # as conftest's fixtures

    frame_max = 64 * 1024
    with LocalCluster(nodes=3, partitions=2, data_dir=tmp_path / "c", base_port=free_base_port(3, 2),
                      node_command=node_command, extra_env={"SHOAL_FRAME_BYTES_MAX": str(frame_max)}) as cl:
        cl.wait_balanced()
        router = Router(cl.addresses)
        try:
            router.refresh()
            address = router.leader_address(partition_for("fat", 2))
            assert address
            with RawConn(address) as c:
                blob = b"x" * 10_000
                for _ in range(4):  # 5 × 10 kB per frame: under the 64 kB limit
                    assert c.call({"cmd": "PUSHB", "queue": "fat", "jobs": [{"data": blob}] * 5})["ok"]
                seen: list[str] = []
                for _ in range(20):  # bounded: 20 jobs, each reply carries at least one
                    r = c.call({"cmd": "PULLB", "queue": "fat", "count": 20})
                    assert r["ok"], r
                    if not r["jobs"]:
                        break
                    assert len(r["jobs"]) < 20                 # cut at the frame limit...
                    assert all(j["data"] == blob for j in r["jobs"])
                    seen += [j["id"] for j in r["jobs"]]
                    assert c.call({"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]],
                                   "tokens": r["tokens"]})["ok"]
                assert len(set(seen)) == 20                     # ...and nothing was left leased
                for state in ("waiting", "active"):
                    assert c.call({"cmd": "Count", "queue": "fat", "state": state})["count"] == 0
        finally:
            router.close()


def test_a_detached_lease_outlives_its_connection(cluster: LocalCluster) -> None:
    """PULLB {detach: true}: closing the connection does not release the lease; its token acks it."""
    with leader_conn(cluster, "detached") as c:
        assert c.call({"cmd": "PUSHB", "queue": "detached", "jobs": [{"data": 1}, {"data": 2}]})["ok"]
        kept = c.call({"cmd": "PULLB", "queue": "detached", "count": 1, "detach": True, "ttr": 60_000})
        bound = c.call({"cmd": "PULLB", "queue": "detached", "count": 1, "ttr": 60_000})
        assert kept["ok"] and bound["ok"] and kept["jobs"] and bound["jobs"]
        assert c.call({"cmd": "PULL", "queue": "x", "detach": "yes"})["code"] == "INVALID"
    with leader_conn(cluster, "detached") as c:
        # the session (grace 0) ends with the connection, and its release is applied
        eventually(lambda: c.call({"cmd": "Count", "queue": "detached", "state": "waiting"})["count"] == 1,
                   "the session's lease to be released")
        assert c.call({"cmd": "Count", "queue": "detached", "state": "active"})["count"] == 1
        assert c.call({"cmd": "Count", "queue": "detached", "state": "waiting"})["count"] == 1
        job = kept["jobs"][0]
        assert c.call({"cmd": "ACK", "id": job["id"], "token": kept["tokens"][0]})["ok"]


def test_a_heartbeat_right_after_a_pull_is_answered_and_one_asking_more_renews(cluster: LocalCluster) -> None:
    """bunqueue's worker heartbeats each batch it pulls: those leases are fresh, so the leader
    answers from its state (the deadline stays); a heartbeat asking for a longer lease renews."""
    with leader_conn(cluster, "hb") as c:
        c.call({"cmd": "PUSHB", "queue": "hb", "jobs": [{"data": i} for i in range(3)]})
        got = c.call({"cmd": "PULLB", "queue": "hb", "count": 3})
        ids, tokens = [j["id"] for j in got["jobs"]], got["tokens"]
        leased = [j["leaseDeadline"] for j in got["jobs"]]
        fresh = c.call({"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens})
        assert fresh["ok"] and fresh["count"] == 3 and fresh["data"] == {"ok": True, "count": 3}
        wrong = c.call({"cmd": "JobHeartbeatB", "ids": ids, "tokens": ["0.999999", *tokens[1:]]})
        assert wrong["ok"] and wrong["count"] == 2, "a job leased to another token is skipped"
        longer = c.call({"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens, "ttr": 600_000})
        assert longer["count"] == 3
        after = [c.call({"cmd": "GetJob", "id": i})["job"]["leaseDeadline"] for i in ids]
        assert all(a >= lease + 500_000 for a, lease in zip(after, leased)), (leased, after)
