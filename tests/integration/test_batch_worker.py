"""``BatchWorker`` against real node processes: batches of size/min_size/timeout, a job failed alone,
a raising handler, Retry, a sync thread handler, cancellation, long batches, close."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.client import AsyncClient, Batch, BatchOptions, BatchWorker, Client, ConnectionOptions, Retry

from waiting import eventually, eventually_async

pytestmark = pytest.mark.integration

FAST = ConnectionOptions(command_timeout=10.0, ping_interval=0.5, max_ping_failures=2, connect_timeout=1.0,
                         max_command_timeouts=2)


def test_hundred_jobs_in_batches_with_one_failed_alone(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            q = client.queue("bw-hundred")
            ids = await q.add_bulk(list(range(100)), attempts=2, backoff=0.05)
            batches: list[list[tuple[int, int]]] = []

            async def handler(batch: Batch) -> list[int]:
                batches.append([(job.data, job.attempts) for job in batch])
                for job in batch:
                    if job.data == 42:
                        batch.fail(job, "bad input 42")  # alone: the rest of its batch completes
                return [job.data * 10 for job in batch]

            options = BatchOptions(size=10, min_size=4, timeout=0.3)
            async with BatchWorker(client, "bw-hundred", handler, batch=options, concurrency=2, lease=5.0,
                                   poll_timeout=0.2) as worker:
                await eventually_async(lambda: worker.processed == 99 and worker.failed == 2,
                                       "99 jobs acked and job 42 failed on both attempts", 30)
            assert all(1 <= len(b) <= 10 for b in batches)
            assert len(batches[0]) == 10  # the 100 jobs were there: the first pull filled a batch
            assert sum(attempt == 1 for b in batches for _, attempt in b) == 100
            assert sorted(data for b in batches for data, _ in b) == sorted(list(range(100)) + [42])
            assert [a for b in batches for data, a in b if data == 42] == [1, 2]  # retried, then dead
            counts = await q.counts()
            assert (counts["completed"], counts["failed"], counts["active"], counts["waiting"]) == (99, 1, 0, 0)
            assert await q.get_result(ids[7]) == 70
            [dead] = await q.dlq()
            assert dead.id == ids[42] and dead.error == "bad input 42"
            assert worker.held == 0 and worker.batches == len(batches)

    asyncio.run(main())


def test_min_size_holds_a_batch_and_timeout_runs_what_came(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            waited: list[list[int]] = []
            timed: list[tuple[int, float]] = []
            t_added: list[float] = []

            async def hold(batch: Batch) -> None:
                waited.append([job.data for job in batch])

            async def on_time(batch: Batch) -> None:
                timed.append((len(batch), time.monotonic() - t_added[0]))

            holding = BatchWorker(client, "bw-min", hold, batch=BatchOptions(size=10, min_size=4), poll_timeout=0.2)
            timing = BatchWorker(client, "bw-timeout", on_time, batch=BatchOptions(size=10, min_size=4, timeout=0.3),
                                 poll_timeout=0.2)
            async with holding, timing:
                await client.queue("bw-min").add_bulk([1, 2])
                await eventually_async(lambda: holding.held == 2, "the two jobs collected", 10)
                t_added.append(time.monotonic())
                await client.queue("bw-timeout").add_bulk([1, 2, 3])
                await client.queue("bw-min").add_bulk([3, 4])
                await eventually_async(lambda: waited and timed, "both batches run", 10)
            assert waited == [[1, 2, 3, 4]]  # not [1, 2] and then [3, 4]
            [(size, after_s)] = timed
            assert size == 3 and after_s >= 0.3  # fewer than min_size, once the timeout passed
            for name in ("bw-min", "bw-timeout"):
                assert (await client.queue(name).counts())["active"] == 0

    asyncio.run(main())


def test_a_raising_handler_fails_every_job_of_its_batch(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            q = client.queue("bw-raise")
            await q.add_bulk(list(range(6)), attempts=2, backoff=0.05)
            seen: list[tuple[int, int]] = []

            async def handler(batch: Batch) -> None:
                seen.extend((job.data, job.attempts) for job in batch)
                if any(job.attempts == 1 for job in batch):
                    raise ConnectionError("warehouse down")

            async with BatchWorker(client, "bw-raise", handler, batch=BatchOptions(size=6, min_size=6, timeout=5),
                                   poll_timeout=0.2) as worker:
                await eventually_async(lambda: worker.processed == 6, "every job acked on its second attempt", 20)
            assert sorted(seen) == sorted([(i, 1) for i in range(6)] + [(i, 2) for i in range(6)])
            assert worker.failed == 6 and (await q.counts())["completed"] == 6

    asyncio.run(main())


def test_sync_worker_with_a_thread_handler_retry_and_results(cluster: LocalCluster) -> None:
    with Client(cluster.addresses, options=FAST) as client:
        q = client.queue("bw-sync")
        ids = q.add_bulk(list(range(12)))
        calls: list[int] = []

        def handler(batch: Batch) -> list[int]:  # runs in a thread: blocking calls are fine
            calls.append(len(batch))
            batch[0].set_progress(50)
            if len(calls) == 1:
                raise Retry(0.05)  # every job of the batch goes back, none failed
            return [job.data + 100 for job in batch]

        with BatchWorker(client, "bw-sync", handler, batch=BatchOptions(size=5), poll_timeout=0.2) as worker:
            eventually(lambda: worker.processed == 12, "every job acked", 20)
        assert worker.retried == calls[0] and worker.failed == 0 and max(calls) <= 5
        assert [q.get_result(job_id) for job_id in ids] == list(range(100, 112))
        assert q.counts()["completed"] == 12


def test_a_job_cancelled_while_its_batch_runs_is_not_acked(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            q = client.queue("bw-cancel")
            ids = await q.add_bulk(["a", "b", "c"])
            started, go = asyncio.Event(), asyncio.Event()

            async def handler(batch: Batch) -> None:
                started.set()
                await go.wait()

            async with BatchWorker(client, "bw-cancel", handler, batch=BatchOptions(size=3, min_size=3, timeout=5),
                                   poll_timeout=0.2) as worker:
                async with asyncio.timeout(10):
                    await started.wait()
                await q.cancel(ids[1], by="test")
                go.set()
                await eventually_async(lambda: worker.processed == 2, "the two others acked", 10)
            assert worker.cancelled == 1
            assert [await q.get_state(i) for i in ids] == ["completed", "cancelled", "completed"]

    asyncio.run(main())


def test_a_long_batch_keeps_its_leases_and_group_affinity(cluster: LocalCluster) -> None:
    """Batches outlast the lease: the heartbeat extends the running jobs and the held ones of the
    other group, so no job is leased twice."""
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            q = client.queue("bw-long")
            await q.create(group_concurrency=0)  # the default, 1, leases one job of a group at a time
            await q.add_bulk(["a1", "a2"], group="a")
            await q.add_bulk(["b1", "b2"], group="b")
            batches: list[list[tuple[Any, int]]] = []

            async def handler(batch: Batch) -> None:
                batches.append([(job.data, job.attempts) for job in batch])
                await asyncio.sleep(1.2)  # twice the lease

            options = BatchOptions(size=4, min_size=2, group_affinity=True)
            async with BatchWorker(client, "bw-long", handler, batch=options, lease=0.6, poll_timeout=0.2) as worker:
                await eventually_async(lambda: worker.processed == 4, "every job acked", 20)
            assert sorted(map(sorted, batches)) == [[("a1", 1), ("a2", 1)], [("b1", 1), ("b2", 1)]]

    asyncio.run(main())


def test_close_releases_the_jobs_collected_for_a_batch(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses, options=FAST) as client:
            q = client.queue("bw-close")
            await q.add_bulk([1, 2])

            async def handler(batch: Batch) -> None:
                raise AssertionError("no batch of 5 can form")

            worker = BatchWorker(client, "bw-close", handler, batch=BatchOptions(size=10, min_size=5), lease=30.0,
                                 poll_timeout=0.2)
            worker.start()
            await eventually_async(lambda: worker.held == 2, "the two jobs collected", 10)
            assert (await q.counts())["active"] == 2
            await worker.close(1.0)
            counts = await q.counts()  # back at once, not after the 30 s lease
            assert (counts["waiting"], counts["active"], worker.batches) == (2, 0, 0)

    asyncio.run(main())
