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


class FrozenLoop:
    """A loop whose clock stands still while a callback runs (as a simulated loop's does)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.timers: list[tuple[float, object]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, fn: object) -> "FrozenLoop":
        self.timers.append((when, fn))
        return self

    def cancel(self) -> None:
        """The timer handle's cancel (this loop is its own handle)."""


def test_a_group_rebooking_before_its_deadline_waits_for_the_next_slot() -> None:
    # The timer fires at the slot's start, which rounds a hair below the deadline the group
    # booked; its tick finds nothing due yet and books the same deadline again. That booking
    # goes to the next slot instead of spinning in this one until the clock moves.
    loop = FrozenLoop(1002.4)
    sched = TickScheduler(loop, slot_s=0.01)  # type: ignore[arg-type]
    deadline = 1002.4000000000001
    ticks: list[float] = []

    class Rebooking(Group):
        def on_timer(self) -> None:
            ticks.append(loop.time())
            assert len(ticks) < 10, "the scheduler spins on a group whose deadline has not come"
            sched.call_later(max(0.0, deadline - loop.time()), self)

    group = Rebooking([], "g")
    sched.call_later(0.0, group)
    sched._fire()  # noqa: SLF001 (the loop's timer callback)
    assert ticks == [1002.4]
    assert group.timer_slot == 100241
