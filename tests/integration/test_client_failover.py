"""Client failover against real node processes: SIGKILL of a leader during a pipelined push
stream, SIGSTOP (half-open links) and dead-link detection. Each test gets its own cluster."""

from __future__ import annotations

import asyncio
import time

import pytest

from shoal.cluster.launcher import LocalCluster
from shoal.cluster.partitioning import partition_for
from shoal.client import AsyncClient, ConnectionLost, ConnectionOptions, ShoalError

pytestmark = pytest.mark.integration

FAST = ConnectionOptions(command_timeout=15.0, ping_interval=0.3, max_ping_failures=2, connect_timeout=1.0,
                         max_command_timeouts=2)


def test_sigkill_of_the_leader_during_a_pipelined_push_stream(fresh_cluster: LocalCluster) -> None:
    """Every acknowledged push is pulled afterwards, exactly once (idempotency keys stop
    retried pushes from enqueueing twice)."""

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("cf-kill")
            victim = fresh_cluster.leader_of(partition_for("cf-kill", fresh_cluster.config.partitions))
            assert victim is not None
            acked: dict[int, str] = {}
            failed: list[int] = []
            errors: list[str] = []
            lanes, per_lane = 16, 150
            started = asyncio.Event()

            async def lane(k: int) -> None:
                for j in range(per_lane):
                    n = k * per_lane + j
                    try:
                        acked[n] = await q.add(n)
                    except ShoalError as exc:
                        failed.append(n)
                        errors.append(f"{type(exc).__name__}: {exc}")
                    if len(acked) > lanes * per_lane // 3:
                        started.set()

            async def killer() -> None:
                await started.wait()
                fresh_cluster.kill(victim)   # SIGKILL by pid, pushes in flight

            await asyncio.wait_for(asyncio.gather(killer(), *(lane(k) for k in range(lanes))), 120)
            print(f"\n{len(acked)} pushes acknowledged, {len(failed)} raised, leader {victim} killed mid-stream"
                  + "".join(f"\n  {e}" for e in sorted(set(errors))[:5]))
            assert len(acked) >= lanes * per_lane * 0.9, "pushes fail over within the command timeout"
            assert len(set(acked.values())) == len(acked)
            pulled: list[tuple[str, int]] = []
            for _ in range(200):
                jobs = await q.pull_many(500, timeout=1.0)
                if not jobs:
                    break
                await q.ack_many(jobs)
                pulled += [(j.id, j.data) for j in jobs]
            data = [d for _, d in pulled]
            assert len(data) == len(set(data)), "no push was enqueued twice"
            assert {i for i, _ in pulled} >= set(acked.values()), "no acknowledged push was lost"
            assert set(data) <= set(range(lanes * per_lane))

    asyncio.run(main())


def test_sigstop_of_the_leader_is_detected_and_commands_move_on(fresh_cluster: LocalCluster) -> None:
    """A paused leader keeps its sockets open: pings find the dead link, in-flight work is
    rejected with ConnectionLost at once, and a retry-safe push lands on the new leader."""

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("cf-stop")
            await q.add("before")
            await q.ack(await q.pull(timeout=1.0))                  # the queue exists and is empty
            victim = fresh_cluster.leader_of(partition_for("cf-stop", fresh_cluster.config.partitions))
            assert victim is not None
            parked = asyncio.ensure_future(q.pull(timeout=30.0))   # a long poll parked on the leader
            await asyncio.sleep(0.3)
            assert not parked.done()
            fresh_cluster.pause(victim)
            try:
                t0 = time.monotonic()
                with pytest.raises(ConnectionLost):
                    await parked
                detected = time.monotonic() - t0
                print(f"\nhalf-open link detected after {detected:.2f}s")
                assert detected < 5.0, "ping failures reject in-flight work long before its 30 s wait"
                t0 = time.monotonic()
                job_id = await q.add("during")          # retried on the new leader
                print(f"push after SIGSTOP of the leader took {time.monotonic() - t0:.2f}s")
                assert await q.get_state(job_id) == "waiting"
                new_leader = client.topology.partition_map[
                    partition_for("cf-stop", fresh_cluster.config.partitions)].leader
                assert new_leader != victim
            finally:
                fresh_cluster.resume(victim)

    asyncio.run(main())


def test_reads_survive_a_node_restart(fresh_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, options=FAST) as client:
            q = client.queue("cf-restart")
            ids = await q.add_bulk(list(range(50)))
            victim = fresh_cluster.leader_of(partition_for("cf-restart", fresh_cluster.config.partitions))
            assert victim is not None
            fresh_cluster.kill(victim)
            assert (await q.counts())["waiting"] == 50      # a read: retried until a new leader answers
            fresh_cluster.restart(victim)
            for job_id in ids[:5]:
                assert await q.get_state(job_id) == "waiting"

    asyncio.run(main())
