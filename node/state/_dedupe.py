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

Entries are replicated state (snapshot and digest), kept by the hash of (queue, id) in packed
tables (``_dedupe_table``, 36 bytes a slot): an entry past its expiry can no longer match and is
left out of the snapshot, and ``_Tick``'s sweeps give its slot back.
"""

from __future__ import annotations

from typing import Any

from shoal.cluster.errors import CommandError, ErrorCode

from ._dedupe_table import DedupeTable
from ._key_table import key_hash
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
        # hash of (queue, id) -> (kind, seq, expires_ms, first_ms): dedupe expires at its TTL, a
        # debounce entry when its job is due (it cannot match after that)
        self.dedupe = DedupeTable()
        self._dedupe_hashed: tuple[str, str, int, int] = ("", "", 0, 0)  # the id hashed last (never state)

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
            h, c = self._dedupe_hash(q.name, spec["id"])
            entry = self.dedupe.get(h, c, now)
            if entry is None:
                return None
            debounce, seq, _expires, first = entry
            if debounce:
                return None
            if spec.get("extend"):
                self.dedupe.put(h, c, False, seq, now + spec["ttlMs"], first, now)
            if spec.get("replace"):
                peeked = self._peek(seq)
                if peeked is not None and peeked.state in (WAITING, DELAYED):
                    job = self._get(seq)  # a segment's slot becomes a job object to change
                    assert job is not None
                    self._replace_data(job, options["data"])
            return self.wire_id_of_seq(seq)
        spec = options["debounce"]
        h, c = self._dedupe_hash(q.name, spec["id"])
        entry = self.dedupe.get(h, c, now)  # over once its job is due
        if entry is None:
            return None
        debounce, seq, _expires, first = entry
        if not debounce:
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
            self.delayed.push(due_key(run_at, job.seq))  # the old entry goes stale
            self.dedupe.put(h, c, True, seq, run_at, first, now)
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
            h, c = self._dedupe_hash(q.name, spec["id"])
            self.dedupe.put(h, c, False, seq, now + spec["ttlMs"], now, now)
            return
        h, c = self._dedupe_hash(q.name, options["debounce"]["id"])
        self.dedupe.put(h, c, True, seq, now + options["delay"], now, now)

    def _dedupe_hash(self, queue: str, dedupe_id: str) -> tuple[int, int]:
        """``key_hash(queue, dedupe_id)``; an add's lookup and its new entry hash the id once."""
        last = self._dedupe_hashed
        if last[1] == dedupe_id and last[0] == queue:
            return last[2], last[3]
        h, c = key_hash(queue, dedupe_id)
        self._dedupe_hashed = (queue, dedupe_id, h, c)
        return h, c

    def _purge_dedupe(self) -> None:
        """Give back the slots of entries past their expiry, a table at a time."""
        self.dedupe.sweep(self.now_ms)

    def dedupe_state(self) -> list[list[Any]]:
        """The live entries in canonical order (by hash), for the snapshot: ``[h, c, kind, seq,
        expires_ms, first_ms]`` each."""
        return [[h, c, DEBOUNCE if debounce else DEDUPE, seq, expires, first]
                for h, c, debounce, seq, expires, first in self.dedupe.entries(self.now_ms)]

    def load_dedupe(self, state: list[Any], hashed: bool = True) -> None:
        """Restore :meth:`dedupe_state`, or (``hashed`` false) the entries of an engine state of
        version 1 or 2, ``[queue, id, kind, seq, expires_ms, first_ms]`` each, hashed as they
        load."""
        now = self.now_ms
        for key, second, kind, seq, expires, first in state:
            h, c = (key, second) if hashed else key_hash(key, second)
            self.dedupe.put(h, c, kind == DEBOUNCE, seq, expires, first, now)
