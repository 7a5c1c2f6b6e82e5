"""ReplicaDigests: small partitions hashed inline, large ones in a forked child off the event loop."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from shoal.node.digests import ReplicaDigests
from shoal.node.partition import PartitionView
from shoal.node.state import PartitionEngine

from waiting import eventually_async


class FakeReplica:
    def __init__(self, jobs: int) -> None:
        self.engine = PartitionEngine(0)
        self.application = SimpleNamespace(view=PartitionView(lambda: self.engine))
        self.index = 0
        self.push(jobs)

    def push(self, jobs: int) -> None:
        for k in range(jobs):
            self.engine.apply({"cmd": "PUSH", "queue": "q", "data": k.to_bytes(4, "big")}, 1_000 + k)
        self.index += 1

    def applied_index(self) -> int:
        return self.index


async def until_fresh(digests: ReplicaDigests, p: int, replica: FakeReplica, replicas: dict) -> tuple:
    def fresh() -> tuple | None:
        digest, index = digests.get(p, replica, replicas)
        return (digest, index) if index == replica.applied_index() and digest is not None else None

    return await eventually_async(fresh, "the digest child's answer at the applied index", 20, poll_s=0.01)


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
            await eventually_async(lambda: digests.get(1, large, replicas) == (large.engine.digest(), 2),
                                   "the replaced state hashed", 20, poll_s=0.01)
            assert digests.forks == 3
        finally:
            digests.close()

    asyncio.run(scenario())
