"""A partition's dedupe and debounce entries, by the hash of (queue, id): no string kept.

An entry names the job an add made (its seq), its kind (dedupe or debounce), when it expires
and when the add that made it happened. It lives in packed arrays, 36 bytes a slot: the first
64 bits of ``key_hash(queue, id)`` (0 marks an empty slot), its next 32 bits, which must match
too, the seq with the kind in its low bit, the expiry and the first add's time. The slots are
spread over :data:`SHARDS` open-addressing tables by the hash's low bits; the rest of it, modulo
the table's size, is where its probe starts (linear probing). A table is rebuilt for its live
entries, half full, once three quarters of its slots are taken, so it stays between half and
three quarters full (48 to 72 bytes an entry) and growing it copies a 256th of the entries.

An entry at or past its expiry is *over*: a lookup does not answer it, :meth:`DedupeTable.entries`
leaves it out, and an insert whose probe passes it may take its slot. So nothing replicated
depends on when an over entry's slot is freed, nor on where an entry lies. :meth:`DedupeTable.sweep`
(each ``_Tick``, at most every :data:`SWEEP_EVERY_MS`) looks at one table and rebuilds it once a
third of its entries are over (drops it when all are), so a burst's entries give their memory
back within about a minute of expiring.

With 96 bits of BLAKE2b (``_key_table.key_hash``), the chance that two of ten million entries
held at once match falsely (an add answered as a duplicate of another id's) is about 6e-16.
"""

from __future__ import annotations

from array import array
from operator import itemgetter

__all__ = ["DedupeTable", "SHARDS", "SWEEP_EVERY_MS", "Entry"]

#: Tables the entries spread over (a power of two), by the hash's low bits.
SHARDS = 256
_SHARD_BITS = SHARDS.bit_length() - 1
_SHARD_MASK = SHARDS - 1
_MIN_SLOTS = 8
#: Engine time between two sweeps (each scans one table): ticks come every 20 ms while jobs are
#: due, and a table of ten million entries' 256th is tens of thousands of slots.
SWEEP_EVERY_MS = 250

#: ``(h, c, debounce, seq, expires_ms, first_ms)``: an entry as :meth:`DedupeTable.entries` lists it.
Entry = tuple[int, int, bool, int, int, int]


class _Table:
    __slots__ = ("hashes", "checks", "seqs", "expires", "firsts", "used")

    def __init__(self, slots: int) -> None:
        self.hashes = array("Q", [0]) * slots   # 0: an empty slot
        self.checks = array("I", [0]) * slots
        self.seqs = array("q", [0]) * slots     # seq << 1 | 1 for a debounce entry
        self.expires = array("q", [0]) * slots
        self.firsts = array("q", [0]) * slots
        self.used = 0                           # slots holding an entry, live or over

    def live(self, now: int) -> list[tuple[int, int, int, int, int]]:
        """``(h, c, packed seq, expires, first)`` of the entries not over at ``now``."""
        return [(h, c, s, e, f) for h, c, s, e, f in zip(self.hashes, self.checks, self.seqs, self.expires, self.firsts)
                if h and e > now]


class DedupeTable:
    """The entries of a partition's dedupe and debounce ids; see the module docstring."""

    __slots__ = ("_tables", "_sweep_at", "_swept_ms", "_sweep_every_ms")

    def __init__(self, sweep_every_ms: int = SWEEP_EVERY_MS) -> None:
        self._tables: list[_Table | None] = [None] * SHARDS
        self._sweep_at = 0
        self._sweep_every_ms = sweep_every_ms
        self._swept_ms = -sweep_every_ms

    def get(self, h: int, c: int, now: int) -> tuple[bool, int, int, int] | None:
        """``(debounce, seq, expires_ms, first_ms)`` of the entry hashed ``(h, c)``, unless it is
        over at ``now`` or absent (None)."""
        table = self._tables[h & _SHARD_MASK]
        if table is None:
            return None
        hashes = table.hashes
        size = len(hashes)
        i = (h >> _SHARD_BITS) % size
        while True:
            v = hashes[i]
            if v == h and table.checks[i] == c:
                expires = table.expires[i]
                if expires <= now:
                    return None
                packed = table.seqs[i]
                return bool(packed & 1), packed >> 1, expires, table.firsts[i]
            if not v:
                return None
            i += 1
            if i == size:
                i = 0

    def put(self, h: int, c: int, debounce: bool, seq: int, expires: int, first: int, now: int) -> None:
        """Keep the entry hashed ``(h, c)`` (in place of the one it had, live or over)."""
        assert h and 0 <= seq and 0 <= first, (h, seq, first)
        shard = h & _SHARD_MASK
        table = self._tables[shard]
        if table is None:
            table = self._tables[shard] = _Table(_MIN_SLOTS)
        hashes, checks, over = table.hashes, table.checks, table.expires
        size = len(hashes)
        i = (h >> _SHARD_BITS) % size
        free = -1
        while True:
            v = hashes[i]
            if not v:
                break
            if v == h and checks[i] == c:
                free = i
                break
            if free < 0 and over[i] <= now:
                free = i
            i += 1
            if i == size:
                i = 0
        if free >= 0:
            i = free
        else:
            table.used += 1
        hashes[i] = h
        checks[i] = c
        table.seqs[i] = seq << 1 | debounce
        over[i] = expires
        table.firsts[i] = first
        if table.used * 4 > size * 3:
            self._rebuild(shard, now)

    def sweep(self, now: int) -> None:
        """Look at the next table (unless one was looked at within the sweep interval): rebuilt
        once a third of its entries are over at ``now``, dropped when all are."""
        if now - self._swept_ms < self._sweep_every_ms:
            return
        self._swept_ms = now
        shard = self._sweep_at
        self._sweep_at = (shard + 1) & _SHARD_MASK
        table = self._tables[shard]
        if table is not None:
            live = sum(1 for h, e in zip(table.hashes, table.expires) if h and e > now)
            if live * 3 <= table.used * 2:
                self._rebuild(shard, now)

    def entries(self, now: int) -> list[Entry]:
        """Every entry not over at ``now``, by hash: the same list on every replica holding the
        same entries, however their tables lie."""
        out: list[Entry] = []
        for table in self._tables:
            if table is not None:
                out.extend((h, c, bool(s & 1), s >> 1, e, f) for h, c, s, e, f in table.live(now))
        out.sort(key=_by_hash)
        return out

    def slots(self) -> int:
        """Slots of every table (36 bytes each): what the entries cost."""
        return sum(len(t.hashes) for t in self._tables if t is not None)

    def _rebuild(self, shard: int, now: int) -> None:
        """Table ``shard`` anew for its live entries, half full (none: no table)."""
        old = self._tables[shard]
        assert old is not None
        live = old.live(now)
        if not live:
            self._tables[shard] = None
            return
        size = max(_MIN_SLOTS, len(live) * 2)
        table = self._tables[shard] = _Table(size)
        hashes, checks, seqs, over, firsts = table.hashes, table.checks, table.seqs, table.expires, table.firsts
        for h, c, packed, expires, first in live:  # each absent: to the empty slot ending its probe
            i = (h >> _SHARD_BITS) % size
            while hashes[i]:
                i += 1
                if i == size:
                    i = 0
            hashes[i] = h
            checks[i] = c
            seqs[i] = packed
            over[i] = expires
            firsts[i] = first
        table.used = len(live)


_by_hash = itemgetter(0, 1)
