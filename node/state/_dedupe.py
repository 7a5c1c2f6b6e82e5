"""Deduplication and debounce of adds (PUSH and PUSHB items with ``dedupe`` or ``debounce``).

``dedupe: {id, ttlMs, extend?, replace?}`` (BullMQ's meaning): while an add with the same
``id`` on the same queue happened less than ``ttlMs`` ago, a new add is not added and
answers the existing job's id with ``deduped: true``; ``extend`` restarts the TTL with each
such add, ``replace`` swaps the existing job's data for the new one while it is still
waiting or delayed.

``debounce: {id, delayMs, maxWaitMs?}``: a burst of adds runs once. The first add makes a
delayed job due in ``delayMs``; each later add while it is still delayed replaces its data
and moves it to ``delayMs`` after that add, but never later than ``maxWaitMs`` after the
first. Once the job is due (waiting, running or done) the next add starts a new burst.

Entries are replicated state (snapshot and digest); an expiry heap lets ``_Tick`` drop the
ones that can no longer match, so their number stays bounded by the adds of a window.
"""

from __future__ import annotations

import heapq
from typing import Any

from shoal.cluster.errors import CommandError, ErrorCode

from ._model import Queue, due_key
from ._push import SLOT_PUSH_FIELDS
from ._store import Store
from ._transitions import DELAYED, WAITING
from ._payloads import PayloadSpace

__all__ = ["DedupeOps", "DEDUPE", "DEBOUNCE"]

DEDUPE = "d"
DEBOUNCE = "b"


class DedupeOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    def __init__(self, partition: int, space: PayloadSpace | None = None) -> None:
        super().__init__(partition, space)
        # (queue, id) -> [kind, seq, expires_ms, first_ms]: dedupe expires at its TTL, a
        # debounce entry when its job is due (it cannot match after that)
        self.dedupe: dict[tuple[str, str], list[Any]] = {}
        self.dedupe_order: list[tuple[int, str, str]] = []  # (expires_ms, queue, id), a heap

    def _check_dedupe(self, q: Queue, options: dict[str, Any]) -> None:
        """Refuse what cannot be honoured, before anything changes."""
        if options.get("dedupe") is not None and options.get("debounce") is not None:
            raise CommandError(ErrorCode.INVALID, "debounce: give dedupe or debounce, not both")
        debounce = options.get("debounce")
        if debounce is not None:
            if not q.preset["delay"] or q.type == "log":
                raise CommandError(ErrorCode.INVALID, f"debounce: queue {q.name!r} ({q.type}) has no delayed jobs")
            if options.get("delay"):
                raise CommandError(ErrorCode.INVALID, "delay: a debounced add is delayed by debounce.delayMs")
            wait = debounce.get("maxWaitMs")
            if wait is not None and wait < debounce["delayMs"]:
                raise CommandError(ErrorCode.INVALID, "debounce.maxWaitMs: must be at least delayMs")

    def _deduped(self, q: Queue, options: dict[str, Any]) -> str | None:
        """An add that an entry absorbs: apply its effect on the existing job, return that job's id.

        None: the add makes a new job (``_note_dedupe`` records it afterwards).
        """
        now = self.now_ms
        spec = options.get("dedupe")
        if spec is not None:
            entry = self.dedupe.get((q.name, spec["id"]))
            if entry is None or entry[0] != DEDUPE or entry[2] <= now:
                return None
            if spec.get("extend"):
                self._set_expiry(q.name, spec["id"], entry, now + spec["ttlMs"])
            if spec.get("replace"):
                peeked = self._peek(entry[1])
                if peeked is not None and peeked.state in (WAITING, DELAYED):
                    job = self._get(entry[1])  # a segment's slot becomes a job object to change
                    assert job is not None
                    self._replace_data(job, options["data"])
            return self.wire_id_of_seq(entry[1])
        spec = options["debounce"]
        entry = self.dedupe.get((q.name, spec["id"]))
        if entry is None or entry[0] != DEBOUNCE:
            return None
        job = self._peek(entry[1])
        if job is None or job.state != DELAYED or job.run_at_ms <= now:
            # The burst's job is due already (moved, or due at this instant but not yet
            # promoted by a tick): this add starts a new burst.
            return None
        job = self._get(entry[1])  # a segment's slot becomes a job object to change
        assert job is not None
        self._replace_data(job, options["data"])
        run_at = now + spec["delayMs"]
        wait = spec.get("maxWaitMs")
        if wait is not None:
            run_at = min(run_at, entry[3] + wait)
        if run_at != job.run_at_ms:
            job.run_at_ms = run_at
            heapq.heappush(self.delayed, due_key(run_at, job.seq))  # the old entry goes stale
            self._set_expiry(q.name, spec["id"], entry, run_at)
        return self._wire_id(job)

    def _push_deduped(self, q: Queue, options: dict[str, Any]) -> dict[str, Any]:
        """PUSH with ``dedupe`` or ``debounce`` (its idempotency key already checked)."""
        self._check_dedupe(q, options)
        existing = self._deduped(q, options)
        if existing is not None:
            self._count(q, "PUSH")
            return {"id": existing, "deduped": True}
        if options.get("debounce") is not None:
            options = self._debounce_delay(options)
        self._check_push(q, options)  # type: ignore[attr-defined]  # PushOps
        self._count(q, "PUSH")
        return {"id": self._add_deduped(q, options)}

    def _add_deduped(self, q: Queue, options: dict[str, Any]) -> str:
        """Add the job of an add with ``dedupe`` or ``debounce`` that no entry absorbed (checked,
        its debounce delay set) and record its entry; return its wire id. Its fields otherwise
        those of a single add, it waits as a segment's slot (``_add_slot_like``)."""
        rest = {k: v for k, v in options.items() if k != "dedupe" and k != "debounce"}
        if rest.keys() <= SLOT_PUSH_FIELDS and not (q.preset["ttl"] and q.opts["ttl"]):
            wire = self._add_slot_like(q, rest)  # type: ignore[attr-defined]  # PushOps
            seq = self.seq
        else:
            job = self._new_job(q, options["data"], options)  # type: ignore[attr-defined]  # PushOps
            seq, wire = job.seq, self._wire_id(job)
        self._note_dedupe(q, options, seq)
        return wire

    def _debounce_delay(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options of the job a debounced add makes: delayed by ``delayMs``."""
        spec = options["debounce"]
        delay = spec["delayMs"]
        wait = spec.get("maxWaitMs")
        if wait is not None:
            delay = min(delay, wait)
        return {**options, "delay": delay}

    def _note_dedupe(self, q: Queue, options: dict[str, Any], seq: int) -> None:
        """Record the entry of job ``seq``, made by an add with ``dedupe`` or ``debounce``
        (delayed by ``options["delay"]``, for a debounce)."""
        spec = options.get("dedupe")
        if spec is not None:
            entry = [DEDUPE, seq, 0, self.now_ms]
            self.dedupe[(q.name, spec["id"])] = entry
            self._set_expiry(q.name, spec["id"], entry, self.now_ms + spec["ttlMs"])
            return
        spec = options["debounce"]
        entry = [DEBOUNCE, seq, 0, self.now_ms]
        self.dedupe[(q.name, spec["id"])] = entry
        self._set_expiry(q.name, spec["id"], entry, self.now_ms + options["delay"])

    def _set_expiry(self, queue: str, dedupe_id: str, entry: list[Any], expires_ms: int) -> None:
        entry[2] = expires_ms
        heapq.heappush(self.dedupe_order, (expires_ms, queue, dedupe_id))

    def _purge_dedupe(self) -> None:
        """Drop entries past their expiry (stale heap entries are skipped)."""
        order, now = self.dedupe_order, self.now_ms
        while order and order[0][0] <= now:
            expires, queue, dedupe_id = heapq.heappop(order)
            entry = self.dedupe.get((queue, dedupe_id))
            if entry is not None and entry[2] == expires:
                del self.dedupe[(queue, dedupe_id)]

    def dedupe_state(self) -> list[Any]:
        """The entries in canonical order, for the snapshot."""
        return [[q, i, *e] for (q, i), e in sorted(self.dedupe.items())]

    def load_dedupe(self, state: list[Any]) -> None:
        """Restore :meth:`dedupe_state`; the expiry heap is rebuilt from it."""
        for queue, dedupe_id, kind, seq, expires, first in state:
            self.dedupe[(queue, dedupe_id)] = [kind, seq, expires, first]
            heapq.heappush(self.dedupe_order, (expires, queue, dedupe_id))

