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
        # queue -> id -> its entry, (kind, seq, expires_ms, first_ms) packed into one int
        # (_pack_entry): dedupe expires at its TTL, a debounce entry when its job is due (it
        # cannot match after that)
        self.dedupe: dict[str, dict[str, int]] = {}
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
        entries = self.dedupe.get(q.name)
        spec = options.get("dedupe")
        if spec is not None:
            packed = entries.get(spec["id"]) if entries is not None else None
            if packed is None:
                return None
            kind, seq, expires, first = _unpack_entry(packed)
            if kind != DEDUPE or expires <= now:
                return None
            if spec.get("extend"):
                self._set_entry(q.name, spec["id"], (kind, seq, now + spec["ttlMs"], first))
            if spec.get("replace"):
                peeked = self._peek(seq)
                if peeked is not None and peeked.state in (WAITING, DELAYED):
                    job = self._get(seq)  # a segment's slot becomes a job object to change
                    assert job is not None
                    self._replace_data(job, options["data"])
            return self.wire_id_of_seq(seq)
        spec = options["debounce"]
        packed = entries.get(spec["id"]) if entries is not None else None
        if packed is None:
            return None
        kind, seq, expires, first = _unpack_entry(packed)
        if kind != DEBOUNCE:
            return None
        job = self._peek(seq)
        if job is None or job.state != DELAYED or job.run_at_ms <= now:
            # The burst's job is due already (moved, or due at this instant but not yet
            # promoted by a tick): this add starts a new burst.
            return None
        job = self._get(seq)  # a segment's slot becomes a job object to change
        assert job is not None
        self._replace_data(job, options["data"])
        run_at = now + spec["delayMs"]
        wait = spec.get("maxWaitMs")
        if wait is not None:
            run_at = min(run_at, first + wait)
        if run_at != job.run_at_ms:
            job.run_at_ms = run_at
            heapq.heappush(self.delayed, due_key(run_at, job.seq))  # the old entry goes stale
            self._set_entry(q.name, spec["id"], (kind, seq, run_at, first))
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
        now = self.now_ms
        spec = options.get("dedupe")
        if spec is not None:
            self._set_entry(q.name, spec["id"], (DEDUPE, seq, now + spec["ttlMs"], now))
            return
        self._set_entry(q.name, options["debounce"]["id"], (DEBOUNCE, seq, now + options["delay"], now))

    def _set_entry(self, queue: str, dedupe_id: str, entry: tuple[str, int, int, int]) -> None:
        """Keep ``entry`` (kind, seq, expires_ms, first_ms) for ``dedupe_id`` of ``queue``; its
        expiry goes on the heap (an entry it replaces leaves a stale one there)."""
        entries = self.dedupe.get(queue)
        if entries is None:
            entries = self.dedupe[queue] = {}
        entries[dedupe_id] = _pack_entry(*entry)
        heapq.heappush(self.dedupe_order, (entry[2], queue, dedupe_id))

    def _purge_dedupe(self) -> None:
        """Drop entries past their expiry (stale heap entries are skipped)."""
        order, now, dedupe = self.dedupe_order, self.now_ms, self.dedupe
        while order and order[0][0] <= now:
            expires, queue, dedupe_id = heapq.heappop(order)
            entries = dedupe.get(queue)
            if entries is None:
                continue
            packed = entries.get(dedupe_id)
            if packed is not None and _unpack_entry(packed)[2] == expires:
                del entries[dedupe_id]
                if not entries:
                    del dedupe[queue]

    def dedupe_state(self) -> list[Any]:
        """The entries in canonical order (by queue, then id), for the snapshot."""
        return [[q, i, *_unpack_entry(packed)] for q in sorted(self.dedupe) for i, packed in
                sorted(self.dedupe[q].items())]

    def load_dedupe(self, state: list[Any]) -> None:
        """Restore :meth:`dedupe_state`; the expiry heap is rebuilt from it."""
        for queue, dedupe_id, kind, seq, expires, first in state:
            self._set_entry(queue, dedupe_id, (kind, seq, expires, first))


#: Bits of each of an entry's numbers when packed (seqs and times in ms are far below 2**64).
_BITS = 64
_FIELD_MASK = (1 << _BITS) - 1


def _pack_entry(kind: str, seq: int, expires_ms: int, first_ms: int) -> int:
    """One int for an entry: a Python int of about 48 bytes, where a list of four fields with
    their ints takes about 180."""
    assert 0 <= seq <= _FIELD_MASK and 0 <= expires_ms <= _FIELD_MASK and 0 <= first_ms <= _FIELD_MASK
    return ((((first_ms << _BITS) | expires_ms) << _BITS | seq) << 1) | (kind == DEBOUNCE)


def _unpack_entry(packed: int) -> tuple[str, int, int, int]:
    """``(kind, seq, expires_ms, first_ms)`` of a packed entry."""
    kind = DEBOUNCE if packed & 1 else DEDUPE
    packed >>= 1
    return kind, packed & _FIELD_MASK, (packed >> _BITS) & _FIELD_MASK, packed >> (2 * _BITS)

