"""What a pull takes next: the ready heap of ungrouped jobs, and fair turns between groups.

Ungrouped jobs wait in one heap of ``(-priority, seq)``: a higher priority is pulled first
(bunqueue's order), then the lower seq. An entry whose priority no longer matches its job
(ChangePriority pushed a new one) is stale and skipped like any other.

Groups (a job's ``group``; tarantool's utube sub-queues) take turns, weighted and fair
(self-clocked fair queueing over a virtual clock):

- each group keeps a heap of its waiting jobs by ``(-priority, seq)``: priority orders a
  group's jobs, then age (utube queues have no priorities, so each group is strict FIFO);
- a group with live jobs (waiting, delayed or active) has a virtual finish *tag*; it gets the
  queue's virtual time ``vtime`` as its tag when its first live job arrives, and forgets it
  when its last one ends;
- the pull's group is the eligible group with the least ``(tag, name)``; taking its turn sets
  ``vtime = max(vtime, tag)`` and ``tag = vtime + FAIR_STRIDE // weight``, so a group of weight
  ``w`` (queue option ``groupWeights``) gets ``w`` turns for each turn of a weight-1 group,
  and groups of equal weight alternate (round-robin);
- when one of a group's jobs ends its lease, ``tag = max(tag, vtime)``: a group that waited
  for its running job rejoins at the present, with no credit for the turns it could not take.

Eligible means a waiting job, room under ``groupConcurrency`` and rate budget
(:mod:`._limits`). Only eligible groups sit in the heap of turns ``group_heads`` (``(key,
group)``, one live entry per group: ``group_listed`` maps a listed group to its entry's key):
a group that is full or empty leaves it when its entry surfaces and comes back when a job of it
is released or added; a group out of rate budget is parked until its window frees. A listed
group's tag only grows (a turn, a lease ending, a one-group pull), and its entry keeps the key
it was pushed with, a lower bound of the tag: an entry that surfaces with a key below its
group's tag is pushed down to the tag (one heap operation) before the least tag is taken, so
the heap never holds more than one live entry per group. A pull is therefore O(log groups),
never a scan. The tags and ``vtime`` are replicated state (snapshots hold ``tag - vtime``: only
differences matter); which groups sit in the heap or are parked is not, since a tag changes
only where a command moves a job, never where a heap entry is dropped or parked.

A pull limited to one group (``PULL``/``PULLB`` ``group``, bunqueue's ``groupAffinity``) takes
that group's head while the group may run (the same concurrency and rate checks), and each job
it takes counts as one turn of the group: ``tag = max(tag, vtime) + FAIR_STRIDE // weight``,
the step a turn takes, while ``vtime`` stays where it is, since the group was not chosen by its
tag. Groups whose tags come first keep their turns (nobody is skipped, as a moved round-robin
cursor would skip them), and the group pays for what it took: a group drained by a dedicated
consumer waits, in the turns of the others, until they caught up. ``vtime`` still only moves
to the least listed tag, so every listed tag stays at or after it. A pull limited to jobs
without a group (``ungrouped``) takes from the ready heap alone and moves no tag.

An ungrouped job and the head of the group whose turn it is compete by ``(priority, seq)``:
ungrouped jobs keep the order they have without groups, beside the group turns.
"""

from __future__ import annotations

import heapq

from ._model import SEQ_BITS, SEQ_MASK, Job, Queue, ready_key
from ._segments import SLOT_READY, SLOT_WAITING
from ._store import Store
from ._transitions import ACTIVE, DELAYED, WAITING

__all__ = ["ReadyIndex", "FAIR_STRIDE"]

#: Virtual time one turn costs a group of weight 1 (a group of weight w pays FAIR_STRIDE // w):
#: divisible by every weight up to 16, and within 1.4e-5 of exact for the weights the schema
#: allows (up to 1,000).
FAIR_STRIDE = 72_072_000
#: States in which a job counts toward its group's size (``groupMaxSize``).
_QUEUED = (WAITING, DELAYED)
#: States in which a job keeps its group's tag.
_LIVE = (WAITING, DELAYED, ACTIVE)


class ReadyIndex(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    # --- waiting jobs ----------------------------------------------------------------------

    def _enqueue_ready(self, q: Queue, job: Job) -> None:
        if job.group is None:
            heapq.heappush(q.ready, ready_key(job.priority, job.seq))
        else:
            self._enqueue_group(q, job.group, ready_key(job.priority, job.seq))

    def _enqueue_group(self, q: Queue, group: str, key: int) -> None:
        """A waiting job of ``group`` (a job object or a segment's slot), its ready key ``key``."""
        fifo = q.group_fifo.get(group)
        if fifo is None:
            fifo = q.group_fifo[group] = []
        heapq.heappush(fifo, key)
        if group not in q.group_listed:
            self._list_group(q, group)

    def _group_head(self, q: Queue, group: str) -> tuple[int, int] | None:
        """``(-priority, seq)`` of ``group``'s next waiting job, cleaning stale heap tops. A
        segment's slot is looked at where it is, not made a job object."""
        fifo = q.group_fifo.get(group)
        jobs, segments = self.jobs, self.segments
        while fifo:
            key = fifo[0]
            prio, seq = key >> SEQ_BITS, key & SEQ_MASK
            job = jobs.get(seq)
            if job is not None:
                if job.state == WAITING and job.group == group and -job.priority == prio:
                    return prio, seq
            elif segments:
                seg = segments.find(seq)
                if seg is not None and seg.groups is not None:
                    i = seq - seg.first
                    if seg.states[i] == SLOT_READY and seg.groups[i] == group and -seg.priority(i) == prio:
                        return prio, seq
            heapq.heappop(fifo)
        q.group_fifo.pop(group, None)
        return None

    # --- the turns between groups ----------------------------------------------------------

    def _list_group(self, q: Queue, group: str) -> None:
        """Put ``group`` among the groups taking turns if it may run now (a job of it waits, it
        has room under ``groupConcurrency``, it is not parked) and is not there yet."""
        if group in q.group_listed or not _group_free(q, group):
            return
        lim = q.limiter
        if lim is not None and group in lim.parked_groups:
            return  # back when its budget is (``_unpark``)
        tag = q.group_tags.get(group)
        if tag is None or self._group_head(q, group) is None:
            return
        q.group_listed[group] = tag
        heapq.heappush(q.group_heads, (tag, group))

    def _group_turn(self, q: Queue) -> tuple[int, int, str] | None:
        """``(-priority, seq, group)`` of the head of the group whose turn it is, if any; groups
        found empty, full or out of budget leave the turns on the way."""
        lim = q.limiter
        if lim is not None and lim.parked and lim.parked[0][0] <= self.now_ms:
            for group in lim.unpark(self.now_ms):
                self._list_group(q, group)
        heads, listed, tags = q.group_heads, q.group_listed, q.group_tags
        while heads:
            key, group = heads[0]
            if listed.get(group) != key:
                heapq.heappop(heads)  # stale: the group left the turns (and maybe came back)
                continue
            tag = tags[group]
            if tag != key:
                # The tag grew while the group was listed: the entry moves down to it.
                assert tag > key, f"group {group!r}: tag {tag} below its turn entry {key}"
                listed[group] = tag
                heapq.heapreplace(heads, (tag, group))
                continue
            head = self._group_head(q, group)
            if head is not None and _group_free(q, group):
                if lim is None or lim.group_open(group, self.now_ms):
                    return head[0], head[1], group
                heapq.heappop(heads)
                del listed[group]
                lim.park(group)
                continue
            heapq.heappop(heads)
            del listed[group]  # listed again when a job of it is added or released
        return None

    def _take_turn(self, q: Queue, group: str) -> None:
        """``group`` takes its turn: the virtual clock moves to its tag, the tag one stride on."""
        tags = q.group_tags
        vtime = tags[group]
        if vtime < q.group_vtime:
            vtime = q.group_vtime
        q.group_vtime = vtime
        tags[group] = vtime + _stride(q, group)

    def _charge_turn(self, q: Queue, group: str) -> None:
        """A one-group pull took a job of ``group``: the group's tag steps on as a turn's would,
        from no earlier than the present; the virtual clock stays (see the module docstring)."""
        tags = q.group_tags
        tag = tags[group]
        if tag < q.group_vtime:
            tag = q.group_vtime
        tags[group] = tag + _stride(q, group)

    # --- a group's jobs coming and going ---------------------------------------------------

    def _group_moved(self, q: Queue, group: str, prev: str, state: str) -> None:
        """Keep ``group``'s size (waiting and delayed jobs) and tag as one of its jobs moves
        from ``prev`` to ``state`` (``new`` and ``removed`` at the ends of a job's life)."""
        if state in _QUEUED:
            if prev not in _QUEUED:
                sizes = q.group_sizes
                sizes[group] = sizes.get(group, 0) + 1
                if group not in q.group_tags:
                    q.group_tags[group] = q.group_vtime
            return
        if prev in _QUEUED:
            sizes = q.group_sizes
            n = sizes[group] - 1
            if n:
                sizes[group] = n
            else:
                del sizes[group]
        if state != ACTIVE and group not in q.group_sizes and group not in q.group_active:
            self._forget_group(q, group)

    @staticmethod
    def _forget_group(q: Queue, group: str) -> None:
        """``group`` has no live job left: it forgets its tag (it comes back at the present)."""
        q.group_tags.pop(group, None)
        q.group_listed.pop(group, None)

    def _release_group(self, q: Queue, job: Job) -> None:
        """An active job of a group ends its lease: one more of the group may run, and the group
        rejoins the turns no earlier than the present."""
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
        tag = q.group_tags.get(group)
        if tag is not None and tag < q.group_vtime:
            q.group_tags[group] = q.group_vtime  # a listed group's entry follows when it surfaces
        self._list_group(q, group)

    # --- what a pull takes -----------------------------------------------------------------

    def _ungrouped_head(self, q: Queue) -> tuple[int, int] | None:
        """``(-priority, seq)`` of ``q``'s next waiting job without a group, cleaning stale heap tops."""
        ready = q.ready
        while ready:
            key = ready[0]
            seq = key & SEQ_MASK
            job = self.jobs.get(seq)
            if job is None and self.segments:
                seg = self.segments.find(seq)
                if seg is not None and seq != seg.low:
                    i = seq - seg.first
                    if seg.states[i] != SLOT_WAITING and not self._cursor_entry(ready, key, seg, i):
                        continue  # a stale entry popped, or a cursor moved on to its next slot
                job = self._materialize(seq, waiting_only=True)
            if (job is not None and job.state == WAITING and job.group is None and job.queue == q.name
                    and -job.priority == key >> SEQ_BITS):
                return key >> SEQ_BITS, seq
            heapq.heappop(ready)
        return None

    def _peek_ready(self, q: Queue) -> tuple[int, int, str | None] | None:
        """The next pullable (-priority, seq, group) of ``q``, cleaning stale heap tops."""
        top = self._ungrouped_head(q)
        best: tuple[int, int, str | None] | None = (top[0], top[1], None) if top is not None else None
        if q.group_heads or (q.limiter is not None and q.limiter.parked):
            turn = self._group_turn(q)
            if turn is not None and (best is None or turn[:2] < best[:2]):
                best = turn
        return best

    def _pop_ready(self, q: Queue) -> Job | None:
        top = self._peek_ready(q)
        if top is None:
            return None
        group = top[2]
        if group is None:
            heapq.heappop(q.ready)
            return self.jobs[top[1]]
        job = self._get(top[1])  # a slot becomes a job object as it is taken
        heapq.heappop(q.group_fifo[group])
        self._take_turn(q, group)
        conc = q.group_conc
        if conc != 1 and (not conc or q.group_active.get(group, 0) + 1 < conc) \
                and self._group_head(q, group) is not None:
            # The lease about to be made leaves the group room for another job: it stays
            # listed, at its new tag (one heap operation instead of a pop and a push).
            q.group_listed[group] = tag = q.group_tags[group]
            heapq.heapreplace(q.group_heads, (tag, group))
        else:
            heapq.heappop(q.group_heads)
            del q.group_listed[group]  # listed again when a job of it ends its lease
        return job

    # --- pulls limited to one group, or to jobs without one ---------------------------------

    def _group_ready(self, q: Queue, group: str) -> int | None:
        """The seq of ``group``'s next waiting job if the group may run it now (room under
        ``groupConcurrency``, rate budget), else None. A group found out of budget is parked, so
        the leader ticks when its window frees (a parked long poll of the group then wakes)."""
        head = self._group_head(q, group)
        if head is None or not _group_free(q, group):
            return None
        lim = q.limiter
        if lim is not None and not lim.group_open(group, self.now_ms):
            lim.park(group)  # its listed entry, if any, leaves the turns when it surfaces
            return None
        return head[1]

    def _pop_group(self, q: Queue, group: str) -> None:
        """Take ``group``'s head (what :meth:`_group_ready` returned) out of its heap; it counts
        as one turn of the group (see the module docstring)."""
        heapq.heappop(q.group_fifo[group])
        self._charge_turn(q, group)


def _stride(q: Queue, group: str) -> int:
    """The virtual time one turn costs ``group``: FAIR_STRIDE divided by its weight."""
    weights = q.opts.get("groupWeights")
    weight = weights.get(group) if weights else None
    return FAIR_STRIDE // weight if weight else FAIR_STRIDE


def _group_free(q: Queue, group: str) -> bool:
    """True when ``group`` runs fewer jobs than its queue's ``groupConcurrency`` allows."""
    conc = q.group_conc
    if conc == 1:
        return group not in q.group_active
    return not conc or q.group_active.get(group, 0) < conc

