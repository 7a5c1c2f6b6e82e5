"""A job's moves between states (through the transition table), its removal, and history trimming."""

from __future__ import annotations

import heapq
from itertools import islice

from ._model import Job, Queue, due_key
from ._segments import SLOT_COMPLETED, SLOT_GONE, Segment
from ._store import Store
from ._transitions import ACTIVE, CANCELLED, COMPLETED, DELAYED, REMOVED, WAITING, check_transition

__all__ = ["Moves"]


class Moves(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _set_state(self, q: Queue, job: Job, state: str) -> None:
        prev = job.state
        check_transition(prev, state)
        q.counts[prev] -= 1
        q.counts[state] += 1
        if prev == WAITING:
            self._drop_prio(q, job.priority)
        if state == WAITING:
            q.prio_counts[job.priority] = q.prio_counts.get(job.priority, 0) + 1
        job.state = state
        group = job.group
        if group is not None:
            self._group_moved(q, group, prev, state)  # type: ignore[attr-defined]  # ReadyIndex
        events = self._events
        if events is not None:
            events.append((q.name, job.seq, state, prev))

    def _end_lease(self, q: Queue, job: Job) -> None:
        if job.session is not None:
            self.sessions.let_go(job.session, job.seq)
        job.token = None
        job.session = None
        job.lease_deadline_ms = 0
        self._release_group(q, job)

    def _to_waiting(self, q: Queue, job: Job, delay_ms: int = 0) -> None:
        prev = job.state
        if prev == ACTIVE:
            self._end_lease(q, job)
        if job.ttl_deadline_ms and prev != WAITING and prev != DELAYED:
            # The TTL heap's entry was dropped if the deadline passed while the job was not
            # waiting: a new one keeps the TTL in force, as a restored engine's index does.
            heapq.heappush(self.ttls, (job.ttl_deadline_ms, job.seq))
        if delay_ms > 0:
            job.run_at_ms = self.now_ms + delay_ms
            self._set_state(q, job, DELAYED)
            self.delayed.push(due_key(job.run_at_ms, job.seq))
        else:
            job.run_at_ms = self.now_ms
            self._set_state(q, job, WAITING)
            self._enqueue_ready(q, job)

    def _finish(self, q: Queue, job: Job, state: str) -> None:
        if job.state == ACTIVE:
            self._end_lease(q, job)
        job.finished_ms = self.now_ms
        self._set_state(q, job, state)
        if state == COMPLETED:
            q.history.append(job.seq)
            q.totals["completed"] += 1
            if len(q.history) > q.opts["historyMax"]:
                self._trim_history(q)  # the age limit is enforced by _Tick
        else:
            q.dlq[job.seq] = None
            q.totals["failed"] += 1
        if self.flow_children:
            self._flow_child_done(job, state != COMPLETED)
        meta = job.meta
        if meta is not None and meta.get("removeOnFail" if state != COMPLETED else "removeOnComplete") \
                and job.seq in self.jobs:
            self._remove(q, job)  # the job asked not to be kept once it ended

    def _complete(self, q: Queue, job: Job, trim: bool = True) -> None:
        """``_finish(q, job, COMPLETED)`` for an active job (the ack path), without the general checks.

        ``trim`` False: the caller trims the history once its batch is done.
        """
        check_transition(job.state, COMPLETED)
        self._end_lease(q, job)
        job.finished_ms = self.now_ms
        job.state = COMPLETED
        counts = q.counts
        counts[ACTIVE] -= 1
        counts[COMPLETED] += 1
        events = self._events
        if events is not None:
            events.append((q.name, job.seq, COMPLETED, ACTIVE))
        group = job.group
        if group is not None and group not in q.group_sizes and group not in q.group_active:
            self._forget_group(q, group)  # type: ignore[attr-defined]  # ReadyIndex: its last live job ended
        q.history.append(job.seq)
        q.totals["completed"] += 1
        if self.flow_children:
            self._flow_child_done(job, False)
        if job.meta is not None and job.meta.get("removeOnComplete"):
            self._remove(q, job)  # the job asked not to be kept once it ended
        if trim and len(q.history) > q.opts["historyMax"]:
            self._trim_history(q)

    def _remove(self, q: Queue, job: Job) -> None:
        """Delete a job for good (cancel, drain, clean, TTL, purge)."""
        check_transition(job.state, REMOVED)
        if job.state == ACTIVE:
            self._end_lease(q, job)
        if job.state == WAITING:
            self._drop_prio(q, job.priority)
        q.counts[job.state] -= 1
        q.dlq.pop(job.seq, None)
        if job.custom_id is not None:
            q.custom_ids.discard(job.custom_id, job.seq)
        if self.flow_children or self.flow_parents:
            self._flow_forget(job)
        del self.jobs[job.seq]
        self._let_go(job.data)
        if job.group is not None and job.state in (WAITING, DELAYED, ACTIVE):
            self._group_moved(q, job.group, job.state, REMOVED)  # type: ignore[attr-defined]  # ReadyIndex
        events = self._events
        if events is not None:
            events.append((q.name, job.seq, "removed", job.state))

    @staticmethod
    def _drop_prio(q: Queue, priority: int, n: int = 1) -> None:
        """``n`` waiting jobs of ``priority`` fewer."""
        left = q.prio_counts.get(priority, 0) - n
        if left:
            q.prio_counts[priority] = left
        else:
            q.prio_counts.pop(priority, None)

    def _trim_history(self, q: Queue) -> None:
        limit = q.opts["historyMax"]
        oldest_ms = self.now_ms - q.opts["historyAgeMs"]
        history, all_jobs, segments = q.history, self.jobs, self.segments
        seg: Segment | None = None  # the segment the previous completed job was held in
        while history:
            seq = history[0]
            job = all_jobs.get(seq)
            if job is None:
                # A completed segment job: let its slot go without making it an object first.
                if seg is None or not 0 <= seq - seg.first < len(seg.states):
                    seg = segments.find(seq)
                i = seq - seg.first if seg is not None else 0
                if seg is None or seg.states[i] != SLOT_COMPLETED:
                    history.popleft()
                    continue
                over = len(history) - limit
                if over > 1 and self._trim_run(q, seg, seq, over):
                    continue
                if over > 0 or seg.finished[i] < oldest_ms:
                    self._let_go_completed(q, seg, i, 1)
                    continue
                break
            if job.state != COMPLETED and job.state != CANCELLED:
                history.popleft()
                continue
            if len(history) > limit or job.finished_ms < oldest_ms:
                history.popleft()
                self._remove(q, job)
                continue
            break

    def _trim_run(self, q: Queue, seg: Segment, first: int, n: int) -> bool:
        """Let the ``n`` oldest history entries go at once if they are ``seg``'s completed slots
        ``first .. first+n-1`` (the usual case: acked in runs); False, changing nothing, if not."""
        i = first - seg.first
        end = i + n
        history = q.history
        if end > len(seg.states) or seg.states.count(SLOT_COMPLETED, i, end) != n or history[n - 1] != first + n - 1:
            return False
        if list(islice(history, n)) != list(range(first, first + n)):
            return False
        self._let_go_completed(q, seg, i, n)
        return True

    def _let_go_completed(self, q: Queue, seg: Segment, i: int, n: int) -> None:
        """Remove completed slots ``i .. i+n-1`` of ``seg``, the ``n`` oldest entries of the history."""
        check_transition(COMPLETED, REMOVED)  # the callers found the slots completed
        end = i + n
        seg.release(i, end)
        seg.states[i:end] = bytes([SLOT_GONE]) * n
        self.segments.gone(seg, n)
        q.counts[COMPLETED] -= n
        popleft = q.history.popleft
        for _ in range(n):
            popleft()
        events = self._events
        if events is not None:
            name, first = q.name, seg.first
            events.extend([(name, first + j, "removed", COMPLETED) for j in range(i, end)])
