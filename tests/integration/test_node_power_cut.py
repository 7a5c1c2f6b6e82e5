"""Power cuts of every node of a real cluster: nothing acknowledged is lost.

The nodes run with ``SHOAL_TEST_IO=deferred`` (node/raft/storage.py): every journal and
metadata byte not yet synced stays in the node's own memory, so SIGKILL of a node loses
exactly what a power cut would. A pipelined stream of PUSHes runs; at a random moment
every node is killed at once; the cluster restarts from its data directories. Every
acknowledged job must be there, and the replicas' digests must agree.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import pytest

from shoal.client import AsyncClient, ConnectionOptions
from shoal.cluster.launcher import LocalCluster, free_base_port

from conftest import NODE_COMMAND, replica_views

QUEUE = "power-cut"
LANES = 16
STREAM_S_MAX = 20.0


async def push_until_cut(cluster: LocalCluster, rng: random.Random, acked: list[str]) -> None:
    """Push from LANES lanes; SIGKILL every node after a random delay; return once the lanes stop."""
    options = ConnectionOptions(command_timeout=3.0)
    async with AsyncClient(cluster.addresses, options=options) as client:
        q = client.queue(QUEUE)
        stop = asyncio.Event()
        n = 0

        async def lane(k: int) -> None:
            nonlocal n
            t0 = time.monotonic()
            while not stop.is_set() and time.monotonic() - t0 < STREAM_S_MAX:
                n += 1
                try:
                    acked.append(await q.add(b"job-%d" % n))
                except Exception:
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.05)

        lanes = [asyncio.create_task(lane(k)) for k in range(LANES)]
        await asyncio.sleep(rng.uniform(0.3, 2.0))
        for node_id in cluster.node_ids:  # all at once: the whole cluster loses power
            cluster.signal(node_id, signal.SIGKILL)
        stop.set()
        for node_id in cluster.node_ids:
            cluster.procs[node_id].wait(10)
        await asyncio.wait_for(asyncio.gather(*lanes, return_exceptions=True), 30)


async def missing_jobs(cluster: LocalCluster, ids: list[str]) -> list[str]:
    async with AsyncClient(cluster.addresses) as client:
        q = client.queue(QUEUE)
        missing: list[str] = []
        for start in range(0, len(ids), 200):
            chunk = ids[start:start + 200]
            jobs = await asyncio.gather(*(q.get_job(i) for i in chunk))
            missing += [i for i, job in zip(chunk, jobs) if job is None]
        return missing


def power_cuts(tmp_path: Path, seed: int, cuts: int) -> None:
    rng = random.Random(seed)
    acked: list[str] = []
    with LocalCluster(nodes=3, partitions=2, data_dir=tmp_path / "c", base_port=free_base_port(3, 2),
                      extra_env={"SHOAL_TEST_IO": "deferred"}, node_command=NODE_COMMAND) as cluster:
        for cut in range(cuts):
            before = len(acked)
            asyncio.run(push_until_cut(cluster, rng, acked))
            assert len(acked) > before, f"cut {cut}: nothing was acknowledged before the cut"
            cluster.start()  # every node restarts from what its "disk" kept
            missing = asyncio.run(missing_jobs(cluster, acked))
            assert not missing, f"cut {cut}: {len(missing)} of {len(acked)} acknowledged jobs lost: {missing[:5]}"
        # every replica hashes its state in a child, one after another on a shared machine
        views = replica_views(cluster, QUEUE, timeout_s=120.0)
        assert len(views) == 3
        assert len({v["digest"] for v in views}) == 1, views


# One seed in the test command; the second, and fifteen cuts in a row, under ``-m soak``.
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.soak)])
def test_power_cut_of_every_node_keeps_every_acknowledged_job(tmp_path: Path, seed: int) -> None:
    power_cuts(tmp_path, seed, cuts=2)


@pytest.mark.soak
def test_power_cuts_many_times(tmp_path: Path) -> None:
    power_cuts(tmp_path, 7, cuts=15)
