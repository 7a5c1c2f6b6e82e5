"""Flow control and cancellation against real node processes: a rate limit holds across a
SIGKILL of the partition leader, and Cancel reaches a running Worker's handler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for
from shoal.client import AsyncClient, ConnectionOptions, Debounce, Dedupe, InvalidCommand, ShoalError, Worker
from shoal.client.job import Job

from waiting import eventually_async

pytestmark = pytest.mark.integration

FAST = ConnectionOptions(command_timeout=15.0, ping_interval=0.3, max_ping_failures=2, connect_timeout=1.0,
                         max_command_timeouts=2)
RATE_MAX, RATE_MS = 4, 1_000
TTR_S = 3.0


def busiest_window(stamps_ms: list[int], window_ms: int) -> int:
    """The most leases any half-open window ``[t, t + window_ms)`` holds (it suffices to start
    windows at lease times)."""
    stamps_ms = sorted(stamps_ms)
    best, lo = 0, 0
    for hi, t in enumerate(stamps_ms):
        while stamps_ms[lo] <= t - window_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_rate_limit_holds_across_a_leader_sigkill(fresh_cluster: LocalCluster) -> None:
    """No sliding window of durationMs ever leases more than max, computed from the lease
    stamps the engine gave (leaseDeadline - ttr), before, during and after the failover."""
    total = 40

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("fc-rate")
            await q.create(limit=(RATE_MAX, RATE_MS / 1000), ttr=TTR_S)
            await q.add_bulk(range(total))
            victim = fresh_cluster.leader_of(partition_for("fc-rate", fresh_cluster.config.partitions))
            assert victim is not None
            stamps: list[int] = []
            done: set[Any] = set()
            killed = asyncio.Event()
            deadline = time.monotonic() + 90

            async def consumer() -> None:
                while len(done) < total and time.monotonic() < deadline:
                    try:
                        job = await q.pull(1.0, ttr=TTR_S)
                    except ShoalError:
                        await asyncio.sleep(0.1)
                        continue
                    if job is None:
                        continue
                    stamps.append(int(job.raw["leaseDeadline"]) - int(TTR_S * 1000))
                    try:
                        await q.ack(job)
                        done.add(job.data)
                    except ShoalError:
                        # An ack cut by the failover has an unknown outcome: committed (the job
                        # is completed) or not (the lease lapses and the job is leased again).
                        with contextlib.suppress(AssertionError):  # no answer: the lease lapses, the job comes again
                            state = await eventually_async(lambda: q.get_state(job.id), "the new leader's answer", 10,
                                                           poll_s=0.25, ignoring=(ShoalError,))
                            if state == "completed":
                                done.add(job.data)
                    if len(stamps) >= total // 3 and not killed.is_set():
                        killed.set()
                        fresh_cluster.kill(victim)  # SIGKILL by pid, pulls in flight

            await asyncio.wait_for(asyncio.gather(*(consumer() for _ in range(6))), 120)
            print(f"\n{len(stamps)} leases of {total} jobs, busiest {RATE_MS} ms window: "
                  f"{busiest_window(stamps, RATE_MS)} (max {RATE_MAX}), leader {victim} killed")
            assert killed.is_set()
            assert done == set(range(total)), "every job was leased and acked in the end"
            assert busiest_window(stamps, RATE_MS) <= RATE_MAX

    asyncio.run(main())


@pytest.mark.parametrize("watch", [True, False], ids=["event-stream", "next-extend"])
def test_cancel_reaches_a_running_worker(cluster: LocalCluster, watch: bool) -> None:
    """The handler's task is cancelled (CancelledError) soon after Cancel, nothing is acked,
    the job ends ``cancelled`` with who cancelled it; the worker goes on with the next job."""

    async def main() -> None:
        async with AsyncClient(cluster.addresses) as client:
            q = client.queue(f"fc-cancel-{watch}")
            started: asyncio.Queue[str] = asyncio.Queue()
            stopped: dict[str, float] = {}
            finished: list[Any] = []

            async def handler(job: Job) -> Any:
                await started.put(job.id)
                try:
                    await asyncio.sleep(30 if job.data == "long" else 0)
                except asyncio.CancelledError:
                    stopped[job.id] = time.monotonic()
                    raise
                finished.append(job.data)
                return "done"

            lease = 30.0 if watch else 1.5  # without events: the extension every lease / 3 finds out
            async with Worker(client, q.name, handler, lease=lease, poll_timeout=0.5, watch_cancel=watch) as w:
                job_id = await q.add("long")
                running = await asyncio.wait_for(started.get(), 10)
                assert running == job_id
                await asyncio.sleep(0.3)  # the worker's event subscription is in place
                asked = time.monotonic()
                await q.cancel(job_id, by="operator")
                await eventually_async(lambda: job_id in stopped, "the handler cancelled", 5)
                assert stopped[job_id] - asked < 1.0
                await q.add("short")
                await asyncio.wait_for(started.get(), 10)
                await eventually_async(lambda: finished, "the next job finished", 5)
                assert finished == ["short"]
                assert w.cancelled == 1
            assert await q.get_state(job_id) == "cancelled"
            job = await q.get_job(job_id)
            assert job is not None and job.error == "cancelled by operator"
            assert (await q.counts())["cancelled"] == 1

    asyncio.run(main())


def test_dedupe_and_debounce_through_the_client(cluster: LocalCluster) -> None:
    """The node takes the per-job path for adds with dedupe/debounce and answers the existing id."""

    async def main() -> None:
        async with AsyncClient(cluster.addresses) as client:
            q = client.queue("fc-dedupe")
            first = await q.add("a", dedupe=Dedupe("order-1", ttl=30))
            assert await q.add("b", dedupe=Dedupe("order-1", ttl=30, replace=True)) == first
            job = await q.get_job(first)
            assert job is not None and job.data == "b"
            burst = [await q.add(n, debounce=Debounce("reindex", delay=0.3, max_wait=5)) for n in range(5)]
            assert len(set(burst)) == 1
            assert await q.get_state(burst[0]) == "delayed"
            pulled = [await q.pull(2.0) for _ in range(2)]
            assert [j.data for j in pulled if j is not None] == ["b", 4]  # the burst ran once, last data
            with pytest.raises(InvalidCommand):
                await q.add("x", dedupe={"id": "no-ttl"})  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_parked_long_poll_wakes_when_budget_returns(cluster: LocalCluster) -> None:
    """A pull parked on a queue whose window is full gets the next job when the window
    slides (the leader ticks at that instant), not at the end of its timeout."""

    async def main() -> None:
        async with AsyncClient(cluster.addresses) as client:
            q = client.queue("fc-wake")
            await q.create(limit=(1, 1.5))
            await q.add_bulk(["first", "second"])
            first = await q.pull(1.0)
            assert first is not None and first.data == "first"
            leased_at = time.monotonic()
            second = await q.pull(8.0)
            waited = time.monotonic() - leased_at
            assert second is not None and second.data == "second"
            assert 1.0 < waited < 4.0, f"woke after {waited:.2f} s (budget returned after 1.5 s)"
            assert int(second.raw["leaseDeadline"]) - int(first.raw["leaseDeadline"]) >= 1500

    asyncio.run(main())


def test_cancel_sets_the_flag_of_a_plain_function_handler(cluster: LocalCluster) -> None:
    """A handler in the worker's thread pool cannot be interrupted: it sees ``job.cancelled``,
    and whatever it returns is not acked."""

    async def main() -> None:
        async with AsyncClient(cluster.addresses) as client:
            q = client.queue("fc-cancel-sync")
            seen: list[float] = []

            def handler(job: Job) -> str:
                started = time.monotonic()
                while not job.cancelled and time.monotonic() - started < 20:
                    time.sleep(0.02)
                seen.append(time.monotonic())
                return "finished anyway"

            async with Worker(client, q.name, handler, poll_timeout=0.5, watch_cancel=True) as w:
                job_id = await q.add("work")

                async def active() -> bool:
                    return await q.get_state(job_id) == "active"

                await eventually_async(active, "the job running", 10)
                await asyncio.sleep(0.3)
                asked = time.monotonic()
                await q.cancel(job_id)
                await eventually_async(lambda: seen, "the handler to see the flag", 5)
                assert seen[0] - asked < 1.0
                await eventually_async(lambda: w.cancelled == 1, "the worker counting the cancelled job", 5)
                assert w.processed == 0
                closing = time.monotonic()
            # Nothing runs any more: the close does not sit out its grace (30 s) for the
            # cancellation watcher, which waits for events, not for jobs.
            assert time.monotonic() - closing < 10.0
            assert await q.get_state(job_id) == "cancelled"
            assert await q.get_result(job_id) is None

    asyncio.run(main())
