"""Cancelling a running job: ``Cancel`` on an active job ends it ``cancelled``.

The job keeps its last lease token, so the holder's next Touch, ACK, FAIL or other
command with that token answers ``CANCELLED`` (not the ``LEASE_MISMATCH`` of a lapsed
lease): the worker learns to stop, and acks nothing. ``error`` records who cancelled.
A cancelled job is kept and trimmed like a completed one (``historyMax``, ``historyAgeMs``).
"""

from __future__ import annotations

from ._model import Job, Queue
from ._moves import Moves
from ._transitions import CANCELLED

__all__ = ["CancelOps"]


class CancelOps(Moves):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def _cancel_active(self, q: Queue, job: Job, by: str | None) -> None:
        token = job.token
        self._finish_cancelled(q, job)
        job.token = token  # kept: the holder's token now answers CANCELLED
        job.error = f"cancelled by {by}" if by else "cancelled"

    def _finish_cancelled(self, q: Queue, job: Job) -> None:
        self._end_lease(q, job)
        job.finished_ms = self.now_ms
        self._set_state(q, job, CANCELLED)
        q.history.append(job.seq)
        if len(q.history) > q.opts["historyMax"]:
            self._trim_history(q)
