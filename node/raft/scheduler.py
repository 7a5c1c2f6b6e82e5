"""One timer for every Raft group of a node.

A node may host a thousand groups; a timer per group firing every 20 ms would
spend a core doing nothing. Each group instead books its next tick here (when
its heartbeat, election deadline or pending work is due) and one loop timer
runs the groups whose slot came. Slots are :data:`SLOT_S` wide, so the groups
due in one slot tick together and their messages to a peer leave in one write.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from typing import Protocol

__all__ = ["TickScheduler", "Ticking", "SLOT_S", "CampaignBudget"]

log = logging.getLogger(__name__)

#: Width of a timer slot: ticks are at most this late, and groups due within one slot tick together.
SLOT_S = 0.01
#: Elections a node's groups may start per second, and at once.
CAMPAIGNS_PER_S = 30.0
CAMPAIGN_BURST = 30
_EARLY_S = 0.002


class CampaignBudget:
    """How many elections the node's groups may start: a token bucket.

    A campaign and every vote for it write the Raft meta file (about a millisecond each
    here, on the event loop). A thousand groups campaigning at once (start-up, or every
    follower of a stalled node) would stall the loop for seconds, delay heartbeats and
    set off more elections; spreading the campaigns keeps the loop responsive.
    """

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._at: float | None = None
        self.deferred = 0

    def admit(self, now: float) -> bool:
        """Take a token at ``now`` (monotonic seconds); False: campaign later."""
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.deferred += 1
        return False


class Ticking(Protocol):
    """A group the scheduler can tick; ``timer_slot`` belongs to the scheduler."""

    timer_slot: int | None

    def on_timer(self) -> None: ...


class TickScheduler:
    """Books ticks in slots and runs each slot's groups from one loop timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slot_s: float = SLOT_S,
                 campaigns: CampaignBudget | None = None) -> None:
        self.loop = loop
        self.slot_s = slot_s
        #: Shared by the node's groups: see :class:`CampaignBudget`.
        self.campaigns = campaigns or CampaignBudget(CAMPAIGNS_PER_S, CAMPAIGN_BURST)
        self._slots: dict[int, list[Ticking]] = {}
        self._heap: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot: int | None = None
        #: The slot :meth:`_fire` is running (None outside it).
        self._firing: int | None = None
        self.fired = 0

    def call_later(self, delay_s: float, item: Ticking) -> None:
        """Tick ``item`` in ``delay_s`` (rounded up to a slot); an earlier booking stands."""
        slot = math.ceil((self.loop.time() + delay_s) / self.slot_s)
        if self._firing is not None and slot <= self._firing:
            # Booked by a tick of the slot running now: the loop's clock has not reached the
            # deadline yet (the timer fired a hair early, or the slot's start rounds below it),
            # so ticking it again in this slot would spin until it does.
            slot = self._firing + 1
        current = item.timer_slot
        if current is not None and current <= slot:
            return
        item.timer_slot = slot  # an entry in a later slot is skipped when that slot comes
        items = self._slots.get(slot)
        if items is None:
            self._slots[slot] = [item]
            heapq.heappush(self._heap, slot)
        else:
            items.append(item)
        if self._timer_slot is None or slot < self._timer_slot:
            self._arm(slot)

    def cancel(self, item: Ticking) -> None:
        item.timer_slot = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_slot = None
        self._slots.clear()
        self._heap.clear()

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        self._timer = self.loop.call_at(slot * self.slot_s, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_slot = None
        # The loop's timers have millisecond resolution: a timer may fire a hair early.
        now_slot = math.floor((self.loop.time() + _EARLY_S) / self.slot_s)
        heap = self._heap
        self._firing = now_slot
        try:
            while heap and heap[0] <= now_slot:
                slot = heapq.heappop(heap)
                for item in self._slots.pop(slot, ()):
                    if item.timer_slot == slot:
                        item.timer_slot = None
                        self.fired += 1
                        try:
                            item.on_timer()
                        except Exception:  # one group's bug must not stop every other group's timer
                            log.exception("raft timer callback failed")
        finally:
            self._firing = None
        if heap:
            self._arm(heap[0])
