"""What a pull takes next: the ready heap of ungrouped jobs and the per-group heaps of utube queues.

A higher priority is pulled first (bunqueue's order), then the lower seq: heap entries are
``(-priority, seq)``. An entry whose priority no longer matches its job (ChangePriority
pushed a new one) is stale and skipped like any other.
"""

from __future__ import annotations

import heapq

from ._model import Job, Queue
from ._store import Store
from ._transitions import WAITING

__all__ = ["ReadyIndex"]


class ReadyIndex(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _enqueue_ready(self, q: Queue, job: Job) -> None:
        if job.group is None:
            heapq.heappush(q.ready, (-job.priority, job.seq))
            return
        group = job.group
        fifo = q.group_fifo.setdefault(group, [])
        heapq.heappush(fifo, job.seq)
        if fifo[0] == job.seq and (group not in q.group_active if q.group_conc == 1 else _group_free(q, group)):
            heapq.heappush(q.group_heads, (-self.jobs[fifo[0]].priority, fifo[0], group))

    def _refresh_group_head(self, q: Queue, group: str) -> None:
        """A waiting group job left the queue some other way than a pull: expose the next head."""
        if _group_free(q, group):
            head = self._group_head(q, group)
            if head is not None:
                heapq.heappush(q.group_heads, (-self.jobs[head].priority, head, group))

    def _group_head(self, q: Queue, group: str) -> int | None:
        fifo = q.group_fifo.get(group)
        while fifo:
            job = self.jobs.get(fifo[0])
            if job is not None and job.state == WAITING and job.group == group:
                return fifo[0]
            heapq.heappop(fifo)
        q.group_fifo.pop(group, None)
        return None

    def _peek_ready(self, q: Queue) -> tuple[int, int, str | None] | None:
        """The next pullable (priority, seq, group) of ``q``, cleaning stale heap tops."""
        ready = q.ready
        while ready:
            prio, seq = ready[0]
            job = self.jobs.get(seq)
            if job is None and self.segments:
                job = self._materialize(seq, waiting_only=True)
            if (job is not None and job.state == WAITING and job.group is None and job.queue == q.name
                    and -job.priority == prio):
                break
            heapq.heappop(ready)
        heads = q.group_heads
        lim = q.limiter
        if lim is not None and lim.parked and lim.parked[0][0] <= self.now_ms:
            for group in lim.unpark(self.now_ms):
                self._refresh_group_head(q, group)
        while heads:
            prio_g, seq_g, group = heads[0]
            if _group_free(q, group) and self._group_head(q, group) == seq_g:
                if lim is None or lim.group_open(group, self.now_ms):
                    break
                heapq.heappop(heads)
                lim.park(group)  # its head comes back when the group's budget does
                continue
            heapq.heappop(heads)
            if _group_free(q, group):
                head = self._group_head(q, group)
                if head is not None:
                    heapq.heappush(heads, (-self.jobs[head].priority, head, group))
        best: tuple[int, int, str | None] | None = None
        if ready:
            best = (ready[0][0], ready[0][1], None)
        if heads and (best is None or heads[0][:2] < best[:2]):
            best = heads[0]
        return best

    def _pop_ready(self, q: Queue) -> Job | None:
        top = self._peek_ready(q)
        if top is None:
            return None
        if top[2] is None:
            heapq.heappop(q.ready)
        else:
            heapq.heappop(q.group_heads)
            heapq.heappop(q.group_fifo[top[2]])
        return self.jobs[top[1]]

    def _release_group(self, q: Queue, job: Job) -> None:
        """An active job of a group ends its lease: one more of the group may run."""
        group = job.group
        if group is None:
            return
        n = q.group_active.get(group, 0)
        if not n:
            return
        if n == 1:
            del q.group_active[group]
        else:
            q.group_active[group] = n - 1
        if n == q.group_conc:  # the group was full, so no head of it is in the heap
            head = self._group_head(q, group)
            if head is not None:
                heapq.heappush(q.group_heads, (-self.jobs[head].priority, head, group))


def _group_free(q: Queue, group: str) -> bool:
    """True when ``group`` runs fewer jobs than its queue's ``groupConcurrency`` allows."""
    conc = q.group_conc
    if conc == 1:
        return group not in q.group_active
    return not conc or q.group_active.get(group, 0) < conc
