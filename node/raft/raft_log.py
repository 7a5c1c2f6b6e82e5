"""The Raft core's view of its log: entries on storage, entries not yet handed to storage, the snapshot base.

The core never writes storage. New entries (a leader's proposals, a follower's
appends) go to the *unstable* tail first and leave it through
:class:`~.core.Ready`: the replica appends them to its journal and tells the
core with :meth:`RaftLog.stable_to`. A conflict found by the log-matching rule
(Raft §5.3) may cut entries that are already on storage: the cut is recorded in
:attr:`RaftLog.truncate_from` until the replica has made it durable.

Entries at or below the snapshot base (``snap_index``) may be gone from storage;
the base's own term stays known (it is the snapshot's), which is all the
log-matching check of the next entry needs.
"""

from __future__ import annotations

from typing import Protocol

from .messages import Entry

__all__ = ["LogStorage", "MemoryStorage", "RaftLog", "READ_SLICE", "ENTRIES_PER_READ_MAX"]

#: Entries read from storage at a time when a message's bytes are bounded.
READ_SLICE = 64
#: Most entries one bounded read returns.
ENTRIES_PER_READ_MAX = 1024


class LogStorage(Protocol):
    """What the core reads of the entries on storage (the journal implements it)."""

    @property
    def first_index(self) -> int:
        """Index of the first entry held (``last_index + 1`` when empty)."""

    @property
    def last_index(self) -> int:
        """Index of the last entry held."""

    def term_at(self, index: int) -> int | None:
        """Term of the entry at ``index``; None if not held."""

    def entries(self, start: int, stop: int) -> list[Entry]:
        """Entries ``start`` to ``stop - 1`` (all held)."""


class MemoryStorage:
    """A :class:`LogStorage` in memory, with the writes a replica would make (scripts and simulations)."""

    def __init__(self, first_index: int = 1) -> None:
        self._first = first_index
        self._entries: list[Entry] = []

    @property
    def first_index(self) -> int:
        return self._first

    @property
    def last_index(self) -> int:
        return self._first + len(self._entries) - 1

    def term_at(self, index: int) -> int | None:
        k = index - self._first
        return self._entries[k][2] if 0 <= k < len(self._entries) else None

    def entries(self, start: int, stop: int) -> list[Entry]:
        return self._entries[start - self._first:stop - self._first]

    def append(self, entries: list[Entry]) -> None:
        for entry in entries:
            if not self._entries:
                self._first = entry[1]
            elif entry[1] != self.last_index + 1:
                raise ValueError(f"entry {entry[1]} does not follow {self.last_index}")
            self._entries.append(entry)

    def delete_from(self, index: int) -> None:
        del self._entries[max(0, index - self._first):]

    def delete_to(self, index: int) -> None:
        """Forget entries below ``index``."""
        drop = min(max(0, index - self._first), len(self._entries))
        del self._entries[:drop]
        self._first = max(self._first, index)

    def clear(self, next_index: int) -> None:
        self._entries = []
        self._first = next_index


class RaftLog:
    """Storage, unstable tail and snapshot base as one log (see the module docstring)."""

    __slots__ = ("storage", "snap_index", "snap_term", "unstable", "truncate_from", "reset_to")

    def __init__(self, storage: LogStorage, snap_index: int = 0, snap_term: int = 0) -> None:
        self.storage = storage
        self.snap_index = snap_index
        self.snap_term = snap_term
        #: Entries not yet on storage, consecutive, following the stable part.
        self.unstable: list[Entry] = []
        #: Storage entries at and after this index are no longer in the log (cut not yet durable).
        self.truncate_from: int | None = None
        #: A snapshot was installed: storage must be emptied and restart after this index.
        self.reset_to: int | None = None

    # --- reads ----------------------------------------------------------------------------------

    def _stable_last(self) -> int:
        """Last index of the part of storage still in the log."""
        if self.reset_to is not None:
            return self.snap_index
        storage = self.storage
        # An empty storage holds nothing past the snapshot, whatever index it would take next
        # (the journal, emptied after an install, still names the end of the log it dropped).
        last = storage.last_index if storage.first_index <= storage.last_index else 0
        if self.truncate_from is not None:
            last = min(last, self.truncate_from - 1)
        return max(last, self.snap_index)

    @property
    def last_index(self) -> int:
        unstable = self.unstable
        return unstable[-1][1] if unstable else self._stable_last()

    @property
    def last_term(self) -> int:
        unstable = self.unstable
        if unstable:
            return unstable[-1][2]
        term = self.term(self._stable_last())
        return term if term is not None else 0

    @property
    def first_index(self) -> int:
        """The first index whose entry the log can still hand out (after the snapshot base at the latest)."""
        if self.reset_to is not None:
            return self.snap_index + 1
        first = self.storage.first_index
        return first if first <= self.snap_index + 1 else self.snap_index + 1

    def term(self, index: int) -> int | None:
        """Term of entry ``index``; None when the log does not know it (compacted or beyond the end)."""
        unstable = self.unstable
        if unstable and index >= unstable[0][1]:
            k = index - unstable[0][1]
            return unstable[k][2] if k < len(unstable) else None
        if index == self.snap_index:
            return self.snap_term
        if index > self._stable_last() or self.reset_to is not None:
            return None
        if index == 0:
            return 0
        return self.storage.term_at(index)

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def entries(self, start: int, stop: int, bytes_max: int | None = None) -> list[Entry]:
        """Entries ``start`` .. ``stop - 1``; with ``bytes_max``, only as many as fit in that many
        payload bytes (at least one) and at most :data:`ENTRIES_PER_READ_MAX` of them.

        Storage is read in slices of :data:`READ_SLICE` entries, so a follower far behind costs
        one bounded read per message, not a read of everything it lacks. The caller checks
        ``start >= first_index``.
        """
        stop = min(stop, self.last_index + 1)
        if bytes_max is not None:
            stop = min(stop, start + ENTRIES_PER_READ_MAX)
        if start >= stop:
            return []
        unstable = self.unstable
        u0 = unstable[0][1] if unstable else stop
        out: list[Entry] = []
        total = 0
        at = start
        while at < min(stop, u0):
            upto = min(stop, u0, at + READ_SLICE) if bytes_max is not None else min(stop, u0)
            chunk = self.storage.entries(at, upto)
            if bytes_max is not None:
                for entry in chunk:
                    total += len(entry[0])
                    if total > bytes_max and out:
                        return out
                    out.append(entry)
            else:
                out.extend(chunk)
            if len(chunk) < upto - at:
                return out
            at = upto
        if stop > u0:
            tail = unstable[max(0, start - u0):stop - u0]
            if bytes_max is None:
                return out + tail
            for entry in tail:
                total += len(entry[0])
                if total > bytes_max and out:
                    return out
                out.append(entry)
        return out

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: a candidate's log is at least as up to date as this one."""
        my_term = self.last_term
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index)

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The last ``(index, term)`` at or below ``index`` whose term is at most ``term``."""
        while index > self.snap_index:
            t = self.term(index)
            if t is None or t <= term:
                return index, t or 0
            index -= 1
        return index, self.snap_term if index == self.snap_index else 0

    # --- writes (to the unstable part) ---------------------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        """Append entries following :attr:`last_index`."""
        if entries:
            assert entries[0][1] == self.last_index + 1 and entries[-1][1] == entries[0][1] + len(entries) - 1, \
                f"entries {entries[0][1]}..{entries[-1][1]} do not follow {self.last_index}"
            self.unstable.extend(entries)

    def truncate_and_append(self, entries: list[Entry]) -> None:
        """Append ``entries``, first cutting every entry from ``entries[0]``'s index on (a §5.3 conflict)."""
        first = entries[0][1]
        assert first <= self.last_index + 1 and entries[-1][1] == first + len(entries) - 1, \
            f"entries {first}..{entries[-1][1]} leave a gap after {self.last_index}"
        unstable = self.unstable
        if unstable and first >= unstable[0][1]:
            del unstable[first - unstable[0][1]:]
        else:
            unstable.clear()
            stable_last = self._stable_last()
            if first <= stable_last:
                self.truncate_from = first if self.truncate_from is None else min(self.truncate_from, first)
        unstable.extend(entries)

    def restore(self, index: int, term: int) -> None:
        """A snapshot at ``(index, term)`` replaces the whole log."""
        self.snap_index, self.snap_term = index, term
        self.unstable = []
        self.truncate_from = None
        self.reset_to = index

    # --- handing entries to storage --------------------------------------------------------------

    def stable_to(self, index: int) -> None:
        """Entries up to ``index`` are on storage (and any recorded cut or reset is done)."""
        self.truncate_from = None
        self.reset_to = None
        unstable = self.unstable
        if unstable and index >= unstable[0][1]:
            del unstable[:index - unstable[0][1] + 1]

    def compacted(self, index: int, term: int) -> None:
        """A durable snapshot now covers entries up to ``index``."""
        if index > self.snap_index:
            self.snap_index, self.snap_term = index, term
