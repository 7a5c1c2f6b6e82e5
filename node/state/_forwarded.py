"""Idempotency keys a forwarding node gives the adds it forwards (``shoal.node.relay``).

A node that forwards a client's PUSH (or PUSHB job) with neither key nor custom id keys it,
so that sending it again to a new leader (when the first froze) never adds it twice. Such adds
come at the rate of a cluster's whole ingest through non-leaders, so the engine keeps their keys
for much less than clients' keys:

- A first send carries ``FORWARDED_KEY_PREFIX`` and is never looked up: if a first copy is
  committed at all, it is applied before any copy sent again (an entry of an older term never
  follows one of a newer term in the log, and a leader appends in order), so it cannot repeat one.
  Its key is recorded with those of the same command, one record per command:
  ``(expires_ms, seqs, keys)``, where ``seqs`` is the first job's seq (``keys[i]`` made job
  ``seqs + i``) or one seq per key, and ``keys`` often the command's own list.
- A copy sent again carries ``FORWARDED_AGAIN_PREFIX``; it is looked up under the first form
  in an index of the records, built when the first such copy comes and extended as records are
  added after it (a cache: what it answers is what a scan of the records would). A new job it
  makes is recorded under the first form too.

Records are replicated state (snapshot, digest) and live FORWARDED_KEY_WINDOW_MS, longer than
a forwarding node sends an add again; a ``_Tick`` drops the expired ones (up to
FORWARDED_PURGE_LATE_MS late).
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any

from shoal.cluster.jobid import format_job_id

from ._model import FORWARDED_AGAIN_PREFIX, FORWARDED_KEY_PREFIX, FORWARDED_KEY_WINDOW_MS
from ._store import Store
from ._payloads import PayloadSpace

__all__ = ["ForwardedKeys", "FORWARDED_FORMS", "FORWARDED_PURGE_LATE_MS", "first_form", "first_sends_only"]

#: Both forms of a forwarding node's keys (for ``str.startswith``).
FORWARDED_FORMS = (FORWARDED_KEY_PREFIX, FORWARDED_AGAIN_PREFIX)
_PREFIX_CHARS = len(FORWARDED_KEY_PREFIX)
#: How late past its time a record may be dropped (``next_due_ms``): records expire at the rate
#: adds came, and a ``_Tick`` for each would be a Raft entry every few milliseconds.
FORWARDED_PURGE_LATE_MS = 1_000
assert len(FORWARDED_AGAIN_PREFIX) == _PREFIX_CHARS


def first_form(key: str) -> str:
    """The key of a first send, for either form."""
    return key if key.startswith(FORWARDED_KEY_PREFIX) else FORWARDED_KEY_PREFIX + key[_PREFIX_CHARS:]


def first_sends_only(keys: list[str | None]) -> bool:
    """Are all of ``keys`` first sends of a forwarding node (no lookup needed)?"""
    for key in keys:
        if key is None or not key.startswith(FORWARDED_KEY_PREFIX):
            return False
    return True


class ForwardedKeys(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see this module's docstring)."""

    def __init__(self, partition: int, space: PayloadSpace | None = None) -> None:
        super().__init__(partition, space)
        self.forwarded: deque[tuple[int, Any, list[str]]] = deque()
        # The lookup cache: first-form key -> seq, over records numbered below _forwarded_indexed
        # (records are numbered from 0 as added; _forwarded_popped of them were dropped).
        self._forwarded_index: dict[str, int] | None = None
        self._forwarded_indexed = 0
        self._forwarded_popped = 0

    def _note_forwarded(self, seqs: int | list[int], keys: list[str]) -> None:
        """Record the keys of the jobs one command made (first form): ``seqs`` as in the module doc."""
        self.forwarded.append((self.now_ms + FORWARDED_KEY_WINDOW_MS, seqs, keys))

    def _forwarded_duplicate(self, key: str) -> str | None:
        """Shoal's id of the job an earlier copy of the add keyed ``key`` made, or None (a first
        send never repeats one)."""
        if key.startswith(FORWARDED_KEY_PREFIX):
            return None
        index = self._forwarded_index
        if index is None:
            index = self._forwarded_index = {}
            self._forwarded_indexed = self._forwarded_popped
        new = self._forwarded_popped + len(self.forwarded) - self._forwarded_indexed
        if new:
            for _, seqs, keys in islice(reversed(self.forwarded), new):
                if type(seqs) is int:
                    index.update(zip(keys, range(seqs, seqs + len(keys))))
                else:
                    index.update(zip(keys, seqs))
            self._forwarded_indexed += new
        seq = index.get(first_form(key))
        return None if seq is None else format_job_id(self.partition, seq)

    def _purge_forwarded(self) -> None:
        """Drop the records past their time (from ``_Tick``)."""
        records, now = self.forwarded, self.now_ms
        index = self._forwarded_index
        while records and records[0][0] <= now:
            _, _, keys = records.popleft()
            if index is not None and self._forwarded_popped < self._forwarded_indexed:
                for key in keys:
                    index.pop(key, None)
            self._forwarded_popped += 1
        if self._forwarded_indexed < self._forwarded_popped:
            self._forwarded_indexed = self._forwarded_popped
        if index is not None and not records:
            self._forwarded_index = None  # nothing left to find: free the cache

    def forwarded_state(self) -> list[Any]:
        """The records, oldest first, for the snapshot."""
        return [[expires, seqs, keys] for expires, seqs, keys in self.forwarded]

    def load_forwarded(self, state: list[Any]) -> None:
        """Restore :meth:`forwarded_state`."""
        self.forwarded = deque((expires, seqs, keys) for expires, seqs, keys in state)
