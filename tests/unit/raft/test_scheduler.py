"""The node-wide Raft timer: slots, earlier bookings win, one timer for many groups."""

from __future__ import annotations

import asyncio

from shoal.node.raft.scheduler import TickScheduler


class Group:
    def __init__(self, log: list[str], name: str) -> None:
        self.timer_slot: int | None = None
        self.log, self.name = log, name

    def on_timer(self) -> None:
        self.log.append(self.name)


def test_groups_due_in_one_slot_tick_together_and_earlier_bookings_stand() -> None:
    async def scenario() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        sched = TickScheduler(loop, slot_s=0.01)
        log: list[str] = []
        a, b, c = Group(log, "a"), Group(log, "b"), Group(log, "c")
        sched.call_later(0.05, a)
        sched.call_later(0.05, b)
        sched.call_later(0.01, c)
        sched.call_later(0.5, c)    # a later booking does not replace the earlier one
        sched.call_later(0.02, a)   # an earlier one does
        await asyncio.sleep(0.2)
        fired = sched.fired
        sched.close()
        return log, fired

    log, fired = asyncio.run(scenario())
    assert log == ["c", "a", "b"] and fired == 3


def test_cancelled_group_does_not_tick() -> None:
    async def scenario() -> list[str]:
        sched = TickScheduler(asyncio.get_running_loop(), slot_s=0.01)
        log: list[str] = []
        g = Group(log, "g")
        sched.call_later(0.01, g)
        sched.cancel(g)
        await asyncio.sleep(0.05)
        sched.close()
        return log

    assert asyncio.run(scenario()) == []
