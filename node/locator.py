"""Which partition holds a custom job id: the node's bounded map of the ids it has seen."""

from __future__ import annotations

import itertools

__all__ = ["JobLocator", "LOCATED_MAX"]

#: Custom job ids a node remembers the partition of.
LOCATED_MAX = 200_000


class JobLocator:
    """Which partition holds a custom job id (bunqueue's ``jobId``, a flow's client-made ids).

    Shoal's own ids name their partition; a custom id is its queue's. The node learns them
    from the adds and pulls it serves or forwards, and asks every partition (``Locate``)
    for one it has not seen. Bounded: the oldest half is forgotten when full.
    """

    def __init__(self, size_max: int = LOCATED_MAX) -> None:
        self._known: dict[str, int] = {}
        self._size_max = size_max

    def get(self, job_id: str) -> int | None:
        """The partition ``job_id`` was last seen in, or None."""
        return self._known.get(job_id)

    def learn(self, job_id: str, p: int) -> None:
        """``job_id`` lives in partition ``p``."""
        known = self._known
        if len(known) >= self._size_max and job_id not in known:
            for old in list(itertools.islice(known, self._size_max // 2)):
                del known[old]
        known[job_id] = p

    def forget(self, job_id: str) -> None:
        """``job_id`` is gone (removed, or its add was refused)."""
        self._known.pop(job_id, None)
