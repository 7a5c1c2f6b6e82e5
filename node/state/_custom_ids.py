"""A queue's index of custom ids: the seq of the job that holds each one.

Up to :data:`SMALL_MAX` ids it is a dict from the id to the seq, the fastest index Python has.
Past that, the ``str`` and the dict slot it keeps per id (about 90 bytes, where the job holds
its id in 22) would dominate what a waiting job costs, so the entries move into packed tables
that keep no string: each entry is 32 bits of the id's ``hash()`` and the seq, 12 bytes a slot,
and a lookup confirms a candidate by asking the engine for that job's custom id (``key_of``),
so a matching hash never stands in for a matching id. Each operation on the tables runs in
Python, a few times the cost of the dict's (``bench/ab_engine.py``). Tables left with fewer than
a quarter of :data:`SMALL_MAX` entries become a dict again.

The entries are spread over :data:`SHARDS` open-addressing tables by the hash's low bits; the
next 32 bits are the entry's check and, masked to the table's size, where its probe starts
(linear probing), so a table can be rebuilt from its checks alone. Each table grows on its own:
once three quarters of its slots are taken it is rebuilt, half full, for its live entries (about
20 bytes an entry on average; a probe that finds nothing reads about 8 slots on average when the
table is fullest), and growing one copies a 256th of the index, not all of it, within one add.
A removed entry leaves a tombstone (seq 0) that probes pass over and inserts reuse.

``hash()`` of a ``str`` differs between processes; nothing replicated depends on it: where an
entry lies changes how long a probe is, never what a lookup answers or which entries are kept,
and :meth:`CustomIds.as_dict` lists the entries in seq order. An entry whose job is no longer
held (the engine discards each as its job goes) answers nothing and is not listed.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from operator import itemgetter

__all__ = ["CustomIds", "SHARDS", "SMALL_MAX"]

#: An index of up to this many ids is a plain dict (fast, and small in absolute terms); past
#: it, its entries move into the tables, which become a dict again below a quarter of it.
SMALL_MAX = 16_384
#: Tables an index spreads its entries over (a power of two).
SHARDS = 256
_SHARD_BITS = SHARDS.bit_length() - 1
_MIN_SLOTS = 8


class _Table:
    __slots__ = ("checks", "seqs", "mask", "used")

    def __init__(self, slots: int) -> None:
        self.checks = array("I", [0]) * slots  # 0: an empty slot
        self.seqs = array("q", [0]) * slots    # 0 beside a check: a removed entry (a tombstone)
        self.mask = slots - 1
        self.used = 0                          # slots holding an entry or a tombstone


def _slots_for(live: int) -> int:
    """A table size that holds ``live`` entries at most half full."""
    slots = _MIN_SLOTS
    while slots < live * 2:
        slots *= 2
    return slots


class CustomIds:
    """Custom id -> seq, confirmed through ``key_of(seq)`` (the custom id of job ``seq``, or None
    when no job ``seq`` is held); see the module docstring."""

    __slots__ = ("_key_of", "_small", "_tables", "_live", "_small_max")

    def __init__(self, key_of: Callable[[int], str | None], small_max: int = SMALL_MAX) -> None:
        """``small_max``: the most ids the index keeps as a dict (tables from one more on, a dict
        again below a quarter of it)."""
        self._key_of = key_of
        self._small_max = small_max
        self._small: dict[str, int] | None = {}
        self._tables: list[_Table | None] = []
        self._live = 0  # entries in the tables

    def __len__(self) -> int:
        return len(self._small) if self._small is not None else self._live

    def get(self, key: str, default: int | None = None) -> int | None:
        """The seq of the job whose custom id is ``key``, else ``default``."""
        if self._small is not None:
            return self._small.get(key, default)
        shard, check = _place(key)
        table = self._tables[shard]
        if table is None:
            return default
        checks, seqs, mask = table.checks, table.seqs, table.mask
        i = check & mask
        while True:
            c = checks[i]
            if c == check:
                seq = seqs[i]
                if seq and self._key_of(seq) == key:
                    return seq
            elif not c:
                return default
            i = (i + 1) & mask

    def __getitem__(self, key: str) -> int:
        seq = self.get(key)
        if seq is None:
            raise KeyError(key)
        return seq

    def __setitem__(self, key: str, seq: int) -> None:
        """Job ``seq`` holds ``key`` (in place of a job that held it, if one still does)."""
        assert seq > 0
        small = self._small
        if small is not None:
            small[key] = seq
            if len(small) > self._small_max:
                self._pack()
            return
        shard, check = _place(key)
        table = self._tables[shard]
        if table is None:
            table = self._tables[shard] = _Table(_MIN_SLOTS)
        checks, seqs, mask, key_of = table.checks, table.seqs, table.mask, self._key_of
        i = check & mask
        free = -1
        while True:
            c = checks[i]
            if not c:
                break
            if c == check and seqs[i] and key_of(seqs[i]) == key:
                seqs[i] = seq
                return
            if free < 0 and not seqs[i]:
                free = i
            i = (i + 1) & mask
        if free >= 0:
            i = free
        else:
            table.used += 1
        checks[i] = check
        seqs[i] = seq
        self._live += 1
        if table.used * 4 > (mask + 1) * 3:
            self._rebuild(shard)

    def discard(self, key: str, seq: int) -> None:
        """Forget that job ``seq`` holds ``key`` (nothing if the index says another job does)."""
        small = self._small
        if small is not None:
            if small.get(key) == seq:
                del small[key]
            return
        shard, check = _place(key)
        table = self._tables[shard]
        if table is None:
            return
        checks, seqs, mask = table.checks, table.seqs, table.mask
        i = check & mask
        while True:
            c = checks[i]
            if not c:
                return
            if c == check and seqs[i] == seq:
                seqs[i] = 0
                self._live -= 1
                if self._live < self._small_max // 4:
                    self._small, self._tables, self._live = self.as_dict(), [], 0
                return
            i = (i + 1) & mask

    def load(self, entries: Iterable[tuple[str, int]]) -> None:
        """Add ``(key, seq)`` entries of distinct keys none of which the index holds (a restore,
        before the jobs are: nothing is confirmed)."""
        for key, seq in entries:
            if self._small is not None:
                self._small[key] = seq
                if len(self._small) > self._small_max:
                    self._pack()
                continue
            self._put_new(key, seq)

    def as_dict(self) -> dict[str, int]:
        """``{custom id: seq}`` of every entry whose job is held, in seq order."""
        if self._small is not None:
            return dict(sorted(self._small.items(), key=itemgetter(1)))
        seqs = sorted(s for table in self._tables if table is not None for s in table.seqs if s)
        key_of = self._key_of
        out = {}
        for seq in seqs:
            key = key_of(seq)
            if key is not None:
                out[key] = seq
        return out

    def _pack(self) -> None:
        """Move the entries from the dict into the tables (see the module docstring)."""
        small = self._small
        assert small is not None
        self._small, self._tables = None, [None] * SHARDS
        for key, seq in small.items():
            self._put_new(key, seq)

    def _put_new(self, key: str, seq: int) -> None:
        """Add an entry for ``key``, which no entry of the tables holds."""
        shard, check = _place(key)
        table = self._tables[shard]
        if table is None:
            table = self._tables[shard] = _Table(_MIN_SLOTS)
        _put(table, check, seq)
        self._live += 1
        if table.used * 4 > (table.mask + 1) * 3:
            self._rebuild(shard)

    def _rebuild(self, shard: int) -> None:
        """Move shard ``shard``'s live entries into a table sized for them (tombstones dropped)."""
        old = self._tables[shard]
        assert old is not None
        live = [(c, s) for c, s in zip(old.checks, old.seqs) if s]
        table = self._tables[shard] = _Table(_slots_for(len(live)))
        for check, seq in live:
            _put(table, check, seq)


def _place(key: str) -> tuple[int, int]:
    """The shard of ``key``'s entry and its check (never 0, which marks an empty slot)."""
    h = hash(key)
    return h & (SHARDS - 1), (h >> _SHARD_BITS) & 0xFFFFFFFF or 1


def _put(table: _Table, check: int, seq: int) -> None:
    """Place an entry the table does not hold in the first free slot of its probe."""
    checks, mask = table.checks, table.mask
    i = check & mask
    while checks[i]:
        i = (i + 1) & mask
    checks[i] = check
    table.seqs[i] = seq
    table.used += 1
