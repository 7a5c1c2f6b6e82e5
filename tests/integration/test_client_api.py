"""The client's API against real node processes (3 nodes, 8 partitions, one cluster per module)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.client import (AsyncClient, AsyncQueue, AsyncTube, Client, ConnectionOptions, InvalidState, Job,
                          NotFound, Queue, Retry, ShoalError, Tube, Worker)

from waiting import eventually, eventually_async

pytestmark = pytest.mark.integration

OPTS = ConnectionOptions(command_timeout=10.0, ping_interval=1.0, max_ping_failures=3, connect_timeout=2.0)


def test_async_round_trip_add_pull_ack_fail(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=OPTS) as client:
            q = client.queue("ca-round")
            later = await q.add({"n": "later"}, delay=0.3)
            low = await q.add({"n": "low"}, priority=1)
            high = await q.add({"n": "high"}, priority=5, attempts=2, backoff=0.1)  # higher runs first
            assert await q.get_state(later) == "delayed"
            job = await q.pull(timeout=1.0)
            assert isinstance(job, Job) and job.id == high and job.data == {"n": "high"} and job.attempts == 1
            assert job.token is not None
            assert await q.fail(job, "smtp timeout") == "delayed"      # 1 of 2 attempts: retried after backoff
            again = await q.pull(timeout=2.0)
            assert again is not None and again.id in (high, low, later)
            while again is not None and again.id != high:               # take the others first
                await q.ack(again, result={"ok": again.id})
                again = await q.pull(timeout=2.0)
            assert again is not None and again.attempts == 2
            assert await q.fail(again, "smtp timeout") == "failed"      # out of attempts: dead-lettered
            dead = await q.dlq()
            assert [j.id for j in dead] == [high] and "smtp timeout" in (dead[0].error or "")
            assert await q.get_result(low) == {"ok": low}

            async def none_delayed() -> bool:
                return (await q.counts())["delayed"] == 0

            await eventually_async(none_delayed, "the delayed job promoted", 10, poll_s=0.1)
            left = await q.pull(timeout=1.0)
            if left is not None:
                await q.ack(left)
            assert await q.counts() == {"waiting": 0, "delayed": 0, "active": 0, "completed": 2, "failed": 1, "waiting-children": 0,
                                         "cancelled": 0}
            assert await q.retry_dlq() == 1 and await q.purge_dlq() == 0
            await q.obliterate()
    asyncio.run(main())


def test_add_bulk_10000_lands_every_job_once(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=OPTS) as client:
        q = client.queue("ca-bulk")
        t0 = time.perf_counter()
        ids = q.add_bulk([{"n": i} for i in range(10_000)])
        took = time.perf_counter() - t0
        print(f"\nadd_bulk: 10,000 jobs in {took:.2f}s ({10_000 / took:,.0f} jobs/s)")
        assert len(ids) == 10_000 and len(set(ids)) == 10_000
        assert q.counts()["waiting"] == 10_000
        assert q.get_job(ids[1234]).data == {"n": 1234}   # ids come back in input order
        assert q.drain() == 10_000
        q.obliterate()


def test_pipelined_pushes_and_pulls(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=OPTS) as client:
            q = client.queue("ca-pipe")
            n, window = 3_000, 200
            t0 = time.perf_counter()
            sem = asyncio.Semaphore(window)

            async def one(i: int) -> str:
                async with sem:
                    return await q.add(i)
            ids = await asyncio.gather(*(one(i) for i in range(n)))
            took = time.perf_counter() - t0
            print(f"\npipelined add: {n} in {took:.2f}s ({n / took:,.0f} ops/s, {window} in flight)")
            assert len(set(ids)) == n
            got: list[str] = []
            for _ in range(50):
                jobs = await q.pull_many(500, timeout=0.5)
                if not jobs:
                    break
                assert await q.ack_many(jobs) == len(jobs)
                got += [j.id for j in jobs]
            assert sorted(got) == sorted(ids)
            await q.obliterate()
    asyncio.run(main())


def test_queue_control_queries_cron_logs_and_events(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=OPTS) as client:
            q = client.queue("ca-ctl")
            events: list[dict] = []

            async def watch() -> None:
                async for ev in q.events():
                    events.append(ev)

            watcher = asyncio.ensure_future(watch())
            await asyncio.sleep(0.3)
            a = await q.add("a", custom_id="order-1")
            assert await q.add("a again", custom_id="order-1") == a   # customId dedupes
            assert (await q.get_job_by_custom_id("order-1")).id == a
            await q.pause()
            assert await q.is_paused()
            assert await q.pull() is None
            await q.resume()
            job = await q.pull(timeout=1.0)
            assert job is not None and job.id == a
            await job.set_progress(40, "reading")
            await job.add_log("step 1")
            assert await q.get_progress(a) == 40
            assert [entry.get("message") for entry in await q.logs(a)][-1] == "step 1"
            await q.ack(job, "done")
            assert await q.clean(0.0, "completed") == 1
            with pytest.raises(NotFound):
                await q.get_state(a)
            b = await q.add("b")
            with pytest.raises((InvalidState, ShoalError)):
                await q.ack(b)                              # not leased
            assert await q.drain() == 1
            next_run = await q.cron("ca-tick", {"tick": 1}, every=60.0)
            assert next_run > time.time()
            assert any(c.get("name") == "ca-tick" for c in await client.cron_list())
            assert await client.cron_delete("ca-tick")
            assert "ca-ctl" in await client.list_queues()
            assert (await client.ping())["pong"]
            try:
                await eventually_async(lambda: any(e.get("id") == a and e.get("state") == "completed" for e in events),
                                       "the completed event of the job", 10, poll_s=0.1)
            finally:
                watcher.cancel()
            assert any(e.get("id") == a and e.get("state") == "completed" for e in events), events[:5]
            await q.obliterate()
    asyncio.run(main())


def test_tube_api(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=OPTS) as client:
        tube = client.tube("ca-crawl")
        assert isinstance(tube, Tube)
        assert tube.create("utubettl", ttr=5)
        a = tube.put({"url": 1}, utube="site-a")
        b = tube.put({"url": 2}, utube="site-a", pri=0)
        c = tube.put({"url": 3}, utube="site-b", delay=30)
        assert (a.state, c.state) == ("waiting", "delayed")
        t1 = tube.take(timeout=1.0)
        assert t1 is not None and t1.id == a.id
        assert tube.take() is None                       # site-a busy, site-b's task delayed
        assert tube.touch(t1, 10) > time.time() + 5
        assert tube.release(t1) == "waiting"
        t1 = tube.take(timeout=1.0)
        tube.bury(t1)
        assert tube.peek(a.id).state == "failed"
        t2 = tube.take(timeout=1.0)
        assert t2 is not None and t2.id == b.id
        tube.ack(t2)
        assert tube.kick(5) == 1
        t3 = tube.take(timeout=1.0)
        assert t3 is not None and t3.id == a.id
        assert tube.release_all() == 1
        stats = tube.statistics()
        assert stats["tasks"]["ready"] == 1 and stats["tasks"]["delayed"] == 1 and stats["calls"]["Bury"] == 1
        tube.delete(c.id)
        assert tube.peek(c.id) is None
        assert tube.truncate() == 2                      # a (ready) and b (done)
        tube.drop()


def test_worker_on_a_sync_client_with_a_blocking_handler_and_graceful_close(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=OPTS) as client:
        q = client.queue("ca-sync-work")
        ids = q.add_bulk(list(range(60)))
        slow = q.add("slow", priority=1)
        seen: list[object] = []
        threads: set[str] = set()
        release = threading.Event()

        def handler(job: Job) -> object:
            threads.add(threading.current_thread().name)
            if job.data == "slow":
                job.set_progress(10)                # a blocking call from the handler's thread
                release.wait(5)                     # still running when the worker closes
                return "late"
            if job.data == 3 and job.attempts == 1:
                raise Retry(0.05)
            if job.data == 5:
                raise RuntimeError("boom")
            time.sleep(0.01)                        # blocking is fine: handlers run in threads
            seen.append(job.data)
            return job.data * 2

        worker = Worker(client, "ca-sync-work", handler, concurrency=4, lease=2.0, poll_timeout=0.2)
        with worker:
            eventually(lambda: len(seen) >= 59, "every job but the failing one handled", 30)
            assert q.get_progress(slow) == 10
            worker.close(grace=0.3)                 # the slow job does not finish: released
            release.set()
        assert sorted(seen) == [i for i in range(60) if i != 5]
        assert q.get_result(ids[7]) == 14
        assert "boom" in (q.get_job(ids[5]).error or "")
        assert q.get_state(slow) == "waiting"
        assert len(threads) > 1 and worker.processed == 59 and worker.retried == 1
        q.obliterate()


def test_async_worker_extends_leases_of_slow_handlers(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=OPTS) as client:
            q = client.queue("ca-slow")
            await q.add_bulk(["slow"] * 4)
            runs = 0

            async def handler(job: Job) -> str:
                nonlocal runs
                runs += 1
                await asyncio.sleep(1.5)   # 3 leases long: extended every lease/3
                return "ok"

            async with Worker(client, "ca-slow", handler, concurrency=4, lease=0.5, poll_timeout=0.2) as worker:
                await eventually_async(lambda: worker.processed >= 4, "the four slow jobs processed", 15)
            assert runs == 4 and worker.processed == 4, "no job ran twice: every lease was extended"
            assert (await q.counts())["completed"] == 4
            await q.obliterate()
    asyncio.run(main())


def test_sync_client_mirrors_async_client(cluster: LocalCluster) -> None:
    def public_coroutines(cls: type) -> set[str]:
        return {n for n, f in vars(cls).items() if not n.startswith("_") and
                (inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f))}

    assert public_coroutines(AsyncQueue) <= set(dir(Queue))
    assert public_coroutines(AsyncTube) <= set(dir(Tube))
    assert public_coroutines(AsyncClient) <= set(dir(Client))
    assert inspect.signature(Queue.add) == inspect.signature(AsyncQueue.add)
    with Client(cluster.addresses, options=OPTS) as client:
        q = client.queue("ca-mirror")
        job_id = q.add({"to": "a@example.com"}, priority=1, delay=0.0)
        assert job_id.split("-")[0].isdigit()
        job = q.pull(timeout=1.0)
        q.ack(job, result={"sent": True})
        assert q.get_result(job_id) == {"sent": True}
        assert q.counts() == {"waiting": 0, "delayed": 0, "active": 0, "completed": 1, "failed": 0, "waiting-children": 0, "cancelled": 0}
        assert client.topology is not None and len(client.topology.nodes) == 3
        q.obliterate()


def test_sharded_queue_spreads_and_pulls_from_every_shard(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=OPTS) as client:
        q = client.queue("ca-sharded", shards=4)
        q.create(shards=4)
        ids = q.add_bulk(list(range(40)))
        assert len({i.split("-")[0] for i in ids}) > 1     # the shards live on several partitions
        g = [q.add(f"g{i}", group="user-7") for i in range(5)]
        assert len({q.get_job(i).queue for i in g}) == 1   # one group stays on one shard (FIFO)
        got = []
        for _ in range(100):
            job = q.pull(timeout=0.5)
            if job is None:
                break
            q.ack(job)
            got.append(job.id)
        assert sorted(got) == sorted(ids + g)
        assert q.counts()["completed"] == 45
        q.obliterate()
