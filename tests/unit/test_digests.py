"""ReplicaDigests: small partitions hashed inline, large ones in a forked child off the event loop."""

from __future__ import annotations

import asyncio
import time

from shoal.node.digests import ReplicaDigests
from shoal.node.raft.view import PartitionView
from shoal.node.state import PartitionEngine


class FakeReplica:
    def __init__(self, jobs: int) -> None:
        self.engine = PartitionEngine(0)
        self.view = PartitionView(lambda: self.engine)
        self.index = 0
        self.push(jobs)

    def push(self, jobs: int) -> None:
        for k in range(jobs):
            self.engine.apply({"cmd": "PUSH", "queue": "q", "data": k.to_bytes(4, "big")}, 1_000 + k)
        self.index += 1

    def applied_index(self) -> int:
        return self.index


async def until_fresh(digests: ReplicaDigests, p: int, replica: FakeReplica, replicas: dict) -> tuple:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        digest, index = digests.get(p, replica, replicas)
        if index == replica.applied_index() and digest is not None:
            return digest, index
        await asyncio.sleep(0.01)
    raise AssertionError("digest child did not answer")


def test_small_inline_large_in_a_child_with_the_index_it_is_of() -> None:
    async def scenario() -> None:
        digests = ReplicaDigests(asyncio.get_running_loop(), inline_jobs_max=20)
        small, large = FakeReplica(5), FakeReplica(50)
        replicas = {0: small, 1: large}
        try:
            assert digests.get(0, small, replicas) == (small.engine.digest(), 1)  # inline, no child
            assert digests.forks == 0
            assert digests.get(1, large, replicas) == (None, 0)  # started; nothing known yet
            assert digests.forks == 1
            assert await until_fresh(digests, 1, large, replicas) == (large.engine.digest(), 1)

            large.push(3)  # the state moves on: the old digest is reported with its own index
            digest, index = digests.get(1, large, replicas)
            assert index == 1 and digest is not None and digest != large.engine.digest()
            assert await until_fresh(digests, 1, large, replicas) == (large.engine.digest(), 2)
            assert digests.forks == 2

            # A snapshot installed: a new state object, even at the same applied index, is hashed anew.
            large.engine = PartitionEngine.restore(large.engine.snapshot())
            large.engine.apply({"cmd": "PUSH", "queue": "q", "data": b"x"}, 9_000)
            deadline = time.monotonic() + 20
            while digests.get(1, large, replicas) != (large.engine.digest(), 2):
                assert time.monotonic() < deadline, "the replaced state was never hashed"
                await asyncio.sleep(0.01)
            assert digests.forks == 3
        finally:
            digests.close()

    asyncio.run(scenario())
