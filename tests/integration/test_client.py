"""The client against real node processes: API round trips, failover, dead links."""

from __future__ import annotations

import asyncio
import time

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for
from shoal.client import (AsyncClient, Client, ConnectionLost, ConnectionOptions, LeaseMismatch, Retry,
                          Worker)

from waiting import eventually_async

pytestmark = pytest.mark.integration

FAST = ConnectionOptions(command_timeout=10.0, ping_interval=0.5, max_ping_failures=2, connect_timeout=1.0,
                         max_command_timeouts=2)


def test_sync_client_round_trip(cluster: LocalCluster) -> None:
    with Client(cluster.addresses[:1], options=FAST) as client:
        q = client.queue("c-emails")
        job_id = q.add({"to": "a@example.com"}, priority=1)  # higher value first
        ids = q.add_bulk([{"n": i} for i in range(1000)])
        assert len(set(ids)) == 1000
        job = q.pull(timeout=1.0)
        assert job is not None and job.id == job_id and job.data == {"to": "a@example.com"} and job.attempts == 1
        q.ack(job, result={"sent": True})
        assert q.get_result(job_id) == {"sent": True}
        other = q.pull()
        assert q.fail(other, "smtp timeout") == "failed"
        assert [j.id for j in q.dlq()] == [other.id]
        assert q.counts() == {"waiting": 999, "delayed": 0, "active": 0, "completed": 1, "failed": 1, "waiting-children": 0, "cancelled": 0}
        assert "c-emails" in client.list_queues()


def test_stale_token_is_refused_through_the_client(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=FAST) as client:
        q = client.queue("c-fence")
        q.add("x", ttr=0.2)
        first = q.pull()
        second = q.pull(timeout=20.0)  # waits for the lease to lapse and the leader's tick to reclaim it
        assert second is not None and second.id == first.id and second.token != first.token
        with pytest.raises(LeaseMismatch):
            q.ack(first)
        q.ack(second)


def test_tube_api(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=FAST) as client:
        tube = client.tube("c-crawl")
        assert tube.create("utubettl", ttr=5)
        a = tube.put({"url": 1}, utube="site-a")
        tube.put({"url": 2}, utube="site-a")
        tube.put({"url": 3}, utube="site-b")
        taken = [tube.take(), tube.take()]
        assert sorted(t.data["url"] for t in taken) == [1, 3]
        assert tube.take() is None           # site-a is busy
        tube.bury(taken[0])
        assert tube.kick(5) == 1
        assert tube.peek(a.id) is not None
        stats = tube.statistics()
        assert stats["tasks"]["total"] == 3 and stats["calls"]["Bury"] == 1
        assert tube.release_all() == 1
        tube.drop()


def test_v1_sequential_mode(cluster: LocalCluster) -> None:
    opts = ConnectionOptions(pipelining=False, command_timeout=5.0)
    with Client(cluster.addresses, options=opts) as client:
        q = client.queue("c-v1")
        ids = [q.add(i) for i in range(20)]
        assert [q.pull().id for _ in range(20)] == ids


def test_async_worker_processes_extends_and_closes(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            q = client.queue("c-work")
            await q.add_bulk(list(range(300)))
            await q.add("slow")
            seen: list[object] = []

            async def handler(job):  # noqa: ANN001
                if job.data == "slow":
                    await asyncio.sleep(1.5)  # longer than the lease: the worker extends it
                elif job.data == 7 and job.attempts == 1:
                    raise Retry(0.1)
                elif job.data == 9:
                    raise ValueError("bad input")
                seen.append(job.data)
                return job.data

            worker = Worker(client, "c-work", handler, concurrency=8, lease=0.6, poll_timeout=0.2)
            worker.start()
            await eventually_async(lambda: len(seen) >= 300, "every job handled", 30)
            await worker.close(5)
            assert sorted(x for x in seen if x != "slow") == [i for i in range(300) if i != 9]
            assert "slow" in seen and seen.count("slow") == 1
            counts = await q.counts()
            assert counts["completed"] == 300 and counts["failed"] == 1 and counts["active"] == 0

    asyncio.run(main())


def test_failover_during_pushes_loses_and_duplicates_nothing(fresh_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("c-failover")
            p = partition_for("c-failover", fresh_cluster.config.partitions)
            victim = fresh_cluster.leader_of(p)
            acked: list[str] = []
            t_fault = t_back = None
            for i in range(400):
                if i == 200:
                    fresh_cluster.kill(victim)
                    t_fault = time.monotonic()
                acked.append(await q.add(i))
                if t_fault and t_back is None:
                    t_back = time.monotonic() - t_fault
            print(f"\nclient writes back {t_back:.2f}s after the leader SIGKILL")
            assert len(set(acked)) == 400
            got = []
            for _ in range(100):
                jobs = await q.pull_many(200, timeout=0.5)
                if not jobs:
                    break
                await q.ack_many(jobs)
                got += [j.id for j in jobs]
            assert sorted(got) == sorted(acked), "every acknowledged push is pulled exactly once"

    asyncio.run(main())


def test_dead_link_is_detected_and_commands_move_to_the_new_leader(fresh_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("c-halfopen")
            await q.add("before")
            p = partition_for("c-halfopen", fresh_cluster.config.partitions)
            victim = fresh_cluster.leader_of(p)
            fresh_cluster.pause(victim)   # half-open: TCP stays up, nothing answers
            try:
                t0 = time.monotonic()
                job_id = await q.add("during")
                print(f"\nwrite after SIGSTOP of the leader took {time.monotonic() - t0:.2f}s")
                assert (await q.get_state(job_id)) == "waiting"
            finally:
                fresh_cluster.resume(victim)

    asyncio.run(main())


def test_connection_lost_rejects_in_flight_commands_at_once(fresh_cluster: LocalCluster) -> None:
    async def main() -> None:
        opts = ConnectionOptions(command_timeout=120.0, ping_interval=0.3, max_ping_failures=2, connect_timeout=1.0)
        async with AsyncClient(fresh_cluster.addresses[:1], options=opts) as client:
            conn = client._pool(fresh_cluster.addresses[0]).pick()
            await conn.ensure_connected()
            fresh_cluster.pause("n1")
            try:
                t0 = time.monotonic()
                with pytest.raises(ConnectionLost):
                    await conn.call({"cmd": "PULL", "queue": "c-idle", "timeout": 100_000}, 120.0)
                assert time.monotonic() - t0 < 60, "ping failures must reject in-flight work long before its timeout"
            finally:
                fresh_cluster.resume("n1")

    asyncio.run(main())


def test_clients_on_one_loop_share_reference_counted_pools(cluster: LocalCluster) -> None:
    async def main() -> None:
        from shoal.client._async import _SHARED_POOLS
        before = len(_SHARED_POOLS)
        a = await AsyncClient(cluster.addresses, options=FAST).connect()
        b = await AsyncClient(cluster.addresses, options=FAST).connect()
        address = cluster.addresses[0]
        assert a._pool(address) is b._pool(address) and a._pool(address).refs == 2
        await a.close()
        assert (await b.queue("c-shared").add(1))          # b still works on the shared pool
        await b.close()
        assert len(_SHARED_POOLS) == before

    asyncio.run(main())


def test_consecutive_command_timeouts_force_a_reconnect(fresh_cluster: LocalCluster) -> None:
    async def main() -> None:
        opts = ConnectionOptions(command_timeout=0.3, ping_interval=0, max_command_timeouts=2, connect_timeout=1.0)
        async with AsyncClient(fresh_cluster.addresses[:1], options=opts) as client:
            conn = client._pool(fresh_cluster.addresses[0]).pick()
            await conn.ensure_connected()
            fresh_cluster.pause("n1")
            try:
                from shoal.client import CommandTimeout
                for _ in range(2):
                    with pytest.raises(CommandTimeout):
                        await conn.call({"cmd": "Ping"}, 0.3)
                assert conn.state.value == "RECONNECTING", "two timeouts in a row declare the link dead"
            finally:
                fresh_cluster.resume("n1")
            await conn.ensure_connected()
            assert (await conn.call({"cmd": "Ping"}, 2.0))["pong"]

    asyncio.run(main())


def test_a_topology_event_updates_routing_at_once(fresh_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("c-topo")
            await q.add(1)
            p = partition_for("c-topo", fresh_cluster.config.partitions)
            old = client.topology.partition_map[p].leader
            fresh_cluster.stop_node(old)  # graceful: hands leadership over, others announce it
            # no command sent: only pushed events can change it
            await eventually_async(lambda: client.topology.partition_map[p].leader not in (old, None),
                                   "the client's topology naming the new leader", 10)

    asyncio.run(main())
