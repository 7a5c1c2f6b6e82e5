"""Rebuilding a partition's replica whose payload files failed a read.

A replica's payload files hold nothing its snapshot and journal do not (both checksummed), so a
block that fails its checksum, or a file cut short, is repaired by rebuilding the replica's state
as a restart of the node would: the replica is closed and opened again from its snapshot and
journal. A snapshot that carries the data writes every file afresh; one that refers to the
payload files (hard links of the same files) shares their damage, so it is moved aside first and
the replica opens empty, brought back by its leader as a replica whose snapshot was damaged is
(a lone replica keeps it: the files are all there is). Should the snapshot or journal be damaged
too, opening does what it does at a start (``repair_damaged``): the replica starts empty and its
leader brings it back by log or snapshot.

A leader first hands leadership to a caught-up follower, so the partition takes writes again as
soon as the new leader is elected; a lone replica is rebuilt at once and its partition answers
again once its state is back. A replica loading a snapshot is rebuilt once the load ends; one
rebuilt less than :data:`REBUILD_INTERVAL_S` ago waits out the rest of that time, so a disk that
keeps failing cannot keep a replica rebuilding.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from .raft import PartitionReplica

__all__ = ["PayloadRepair", "REBUILD_INTERVAL_S", "TRANSFER_WAIT_S"]

log = logging.getLogger(__name__)

#: Least time between two rebuilds of one replica.
REBUILD_INTERVAL_S = 60.0
#: How long a leader waits for a follower to take over before it rebuilds anyway.
TRANSFER_WAIT_S = 3.0
#: How often a repair waiting for a transfer or a load looks again.
POLL_S = 0.05


class PayloadRepair:
    """Rebuilds replicas whose payload files failed (see the module docstring).

    ``replica_of(p)``: the replica hosted for partition ``p``, or None; ``rebuild(p)``: close it
    and open it again from its files (the node's)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, replica_of: Callable[[int], PartitionReplica | None],
                 rebuild: Callable[[int], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.loop = loop
        self._replica_of = replica_of
        self._rebuild = rebuild
        self._clock = clock
        self._pid = os.getpid()
        self._pending: dict[int, asyncio.Task[None]] = {}
        self._rebuilt_at: dict[int, float] = {}
        self._closed = False
        self.rebuilds = 0

    def damaged(self, p: int, exc: OSError) -> None:
        """A read of partition ``p``'s payload files failed (from any thread of the node; in a
        forked snapshot child nothing happens: the parent hears of it as the snapshot's failure)."""
        if os.getpid() != self._pid or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._start, p, str(exc))

    def close(self) -> None:
        """The node stops: repairs not yet done are dropped (a restart rebuilds every file)."""
        self._closed = True
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()

    def _start(self, p: int, why: str) -> None:
        if self._closed or p in self._pending or self._replica_of(p) is None:
            return
        self._pending[p] = self.loop.create_task(self._repair(p, why))

    async def _repair(self, p: int, why: str) -> None:
        try:
            wait = self._rebuilt_at.get(p, -REBUILD_INTERVAL_S) + REBUILD_INTERVAL_S - self._clock()
            log.error("partition %d: %s; the replica is rebuilt from its snapshot and journal%s", p, why,
                      f" in {wait:.0f} s" if wait > 0 else "")
            if wait > 0:
                await asyncio.sleep(wait)
            replica = await self._ready(p)
            if replica is None:
                return
            if replica.is_leader() and replica.transfer_leadership():
                deadline = self._clock() + TRANSFER_WAIT_S
                while replica.is_leader() and self._clock() < deadline:
                    await asyncio.sleep(POLL_S)
            if self._replica_of(p) is not replica:
                return  # closed meanwhile (removed from its group, or the node stopping)
            self._rebuilt_at[p] = self._clock()
            self.rebuilds += 1
            try:
                self._rebuild(p)
            except Exception:  # the node runs on without the partition until it restarts
                log.exception("partition %d: the replica could not be reopened", p)
                return
            log.info("partition %d: replica reopened from its snapshot and journal", p)
        finally:
            self._pending.pop(p, None)

    async def _ready(self, p: int) -> PartitionReplica | None:
        """The replica once it loads no snapshot (a load writes a new engine's files), or None if
        it is gone."""
        while True:
            replica = self._replica_of(p)
            if replica is None or not replica.status()["loading"]:
                return replica
            await asyncio.sleep(POLL_S)
