"""A lone partition replica for tests: one member, no peers, on a real event loop and disk.

It leads once it campaigned; its application is the test's (the queue engine's
``PartitionMachine``, or an application of the test's own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from shoal.node.raft import RaftNetwork, TickScheduler
from shoal.node.raft.application import Application
from shoal.node.raft.replica import PartitionReplica
from shoal.node.raft.storage import NodeStorage
from waiting import eventually_async

WAIT_S_MAX = 20.0


class LoneReplica:
    """A started one-member group over ``application``, ready to take proposals."""

    def __init__(self, data_dir: str, application: Application, storage: NodeStorage | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.network = RaftNetwork(self.loop, "a", "test", b"k", ("127.0.0.1", 0), {}, set())
        self.scheduler = TickScheduler(self.loop)
        self.replica = PartitionReplica(0, self.network, [], application=application, data_dir=data_dir,
                                        loop=self.loop, scheduler=self.scheduler, preferred=True, storage=storage)
        self.replica.start()
        self.run_until(lambda: self.replica.read_ready() and not self.replica.status()["loading"], "the lone leader")

    def run_until(self, done: Callable[[], Any], what: str = "the condition") -> None:
        """Run the loop until ``done()`` is true (bounded)."""
        self.loop.run_until_complete(eventually_async(done, what, WAIT_S_MAX, poll_s=0.005))

    def close(self) -> None:
        self.replica.close()
        self.scheduler.close()
        self.network.close()
        self.loop.close()
