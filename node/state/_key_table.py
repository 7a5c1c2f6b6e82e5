"""A packed hash table from a key's 96-bit hash to a job's seq, for the idempotency window.

A key kept as a string in a dict would cost its string, a dict slot and the seq's int. Here a
key is three packed array slots: the first 64 bits of its hash (0 marks an empty
slot), 32 more bits that must match too, and the seq: 20 bytes a slot, with the table kept
between 30 % and 60 % full. Collisions are resolved by linear probing.

Entries are never deleted one by one: the window drops keys by seq (every key whose seq is at
most a watermark is over), so a slot holding such a seq is free to take a new key (a probe
passes over it, an insert may reuse it). A table that fills up is replaced by one sized for the
live keys, and the old one's live entries move over a few slots per insert (``KeyWindow.move``),
so no single add pays for copying the table.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["KeyTable", "KeyWindow", "MIN_SLOTS", "key_hash", "slots_for"]

#: The smallest table: 20 KiB.
MIN_SLOTS = 1024
_blake2b = hashlib.blake2b
_split = struct.Struct("<QI").unpack


def key_hash(queue: str, key: str) -> tuple[int, int]:
    """The hash of ``key`` given to an add of ``queue``: 64 bits (never 0) and 32 more.

    BLAKE2b, not ``hash()``: replicas of several processes and releases must agree, and ``hash``
    of a str is salted per process. With 96 bits, the chance that any two of ten million keys
    held at once match falsely (an add answered with another key's job) is about 6e-16.
    """
    h, c = _split(_blake2b(f"{len(queue)}:{queue}{key}".encode(), digest_size=12).digest())
    return h or 1, c


class KeyTable:
    """Open addressing over packed arrays; see the module docstring."""

    __slots__ = ("hashes", "checks", "seqs", "mask", "used")

    def __init__(self, slots: int) -> None:
        """An empty table of ``slots`` slots (a power of two)."""
        self.hashes = array("Q", (0,)) * slots
        self.checks = array("I", (0,)) * slots
        self.seqs = array("q", (0,)) * slots
        self.mask = slots - 1
        self.used = 0  # slots holding an entry, live or over

    @property
    def size(self) -> int:
        return self.mask + 1

    def get(self, h: int, c: int) -> int | None:
        """The seq stored for hash ``(h, c)``, live or over, or None."""
        hashes, mask = self.hashes, self.mask
        i = h & mask
        while True:
            v = hashes[i]
            if v == h and self.checks[i] == c:
                return self.seqs[i]
            if not v:
                return None
            i = (i + 1) & mask

    def put(self, h: int, c: int, seq: int, over: int, replace: bool = True) -> None:
        """Store ``seq`` for hash ``(h, c)``: in its slot if the table holds it (unless not
        ``replace``), else in the first slot of its probe whose seq is at most ``over`` (an entry
        that is over), else in the empty slot that ends the probe."""
        hashes, checks, seqs, mask = self.hashes, self.checks, self.seqs, self.mask
        i = h & mask
        free = -1
        while True:
            v = hashes[i]
            if not v:
                break
            if v == h and checks[i] == c:
                if replace:
                    seqs[i] = seq
                return
            if free < 0 and seqs[i] <= over:
                free = i
            i = (i + 1) & mask
        if free >= 0:
            i = free
        else:
            self.used += 1
        hashes[i] = h
        checks[i] = c
        seqs[i] = seq

    def put_many(self, hs: Sequence[int], cs: Sequence[int], seqs: Sequence[int], over: int) -> None:
        """:meth:`put` of each ``(hs[i], cs[i], seqs[i])``."""
        put = self.put
        for h, c, seq in zip(hs, cs, seqs):
            put(h, c, seq, over)

    def room(self, n: int) -> bool:
        """Whether ``n`` more entries keep the table at most 60 % full."""
        return (self.used + n) * 5 <= (self.mask + 1) * 3

    def live(self, over: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, int]]:
        """``(h, c, seq)`` of the entries in slots ``start:stop`` whose seq is above ``over``."""
        hashes, checks, seqs = self.hashes, self.checks, self.seqs
        for i in range(start, self.mask + 1 if stop is None else stop):
            if hashes[i] and seqs[i] > over:
                yield hashes[i], checks[i], seqs[i]


def slots_for(keys: int, loaded: bool = False) -> int:
    """The table size that holds ``keys`` keys at most 35 % full (a full table's live keys fill
    one of twice its size 30 % full), or at most 60 % (``loaded``: a restore, which must not hold
    more than the table that wrote the snapshot)."""
    slots = MIN_SLOTS
    while slots * (60 if loaded else 35) < keys * 100:
        slots *= 2
    return slots


class KeyWindow:
    """The idempotency window's fields (``_idempotency``'s docstring), one attribute of the
    engine, with the steps that work on them alone."""

    __slots__ = ("table", "moving", "cursor", "step", "over", "live", "runs", "last")

    def __init__(self) -> None:
        self.table: KeyTable | None = None
        self.moving: KeyTable | None = None
        self.cursor = 0
        self.step = 0
        self.over = -1
        self.live = 0
        self.runs: deque[list[int]] = deque()
        self.last: tuple[Any, ...] = (None, None, 0, 0)  # the key hashed last (never state)

    def resize(self) -> KeyTable:
        """A new table sized for the live keys; the old one's entries move over bit by bit."""
        if self.moving is not None:
            self.move(self.moving.size)  # the step below keeps this from happening
        old = self.table
        table = self.table = KeyTable(slots_for(self.live))
        if old is not None and old.used:
            self.moving = old
            self.cursor = 0
            # Done within a sixteenth of the new table's slots in adds (8 slots an add when it
            # doubles): the two tables are held together briefly, and the new one stays under
            # 60 % full meanwhile.
            self.step = -(-old.size * 16 // table.size)
        return table

    def move(self, slots: int) -> None:
        """Move the live entries of the next ``slots`` slots of the replaced table."""
        old = self.moving
        assert old is not None and self.table is not None
        start = self.cursor
        stop = min(start + slots, old.size)
        put, over = self.table.put, self.over
        for h, c, seq in old.live(over, start, stop):
            put(h, c, seq, over, False)  # a key given again since is in the new table already
        if stop == old.size:
            self.moving = None
            self.cursor = 0
        else:
            self.cursor = stop

    def seq_of(self, h: int, c: int, now: int) -> int | None:
        """The seq of the job the key hashed ``(h, c)`` added while the key is live, else None."""
        table = self.table
        if table is None:
            return None
        seq = table.get(h, c)
        if seq is None and self.moving is not None:
            seq = self.moving.get(h, c)
        if seq is None or seq <= self.over:
            return None
        runs = self.runs
        if runs and runs[0][0] <= now and seq <= self.due_through(now):
            return None  # due, not dropped yet
        return seq

    def due_through(self, now: int) -> int:
        """The highest seq a key of the runs due at ``now`` added (-1: none)."""
        through = -1
        for expires, last_seq, _ in self.runs:
            if expires > now:
                break
            if last_seq > through:
                through = last_seq
        return through

    def admit(self, last_seq: int, n: int, expires: int) -> KeyTable:
        """The table to put ``n`` keys more in (given with ``expires``, the last of them adding
        job ``last_seq``), counted in the runs: a new one if they would take the present one
        past 60 % full, else the present one after a step of the move its predecessor's keys
        make."""
        self.add_run(last_seq, n, expires)
        table = self.table
        if table is None or not table.room(n):
            return self.resize()
        if self.moving is not None:
            self.move(self.step * n)
        return table

    def add_run(self, last_seq: int, n: int, expires: int) -> None:
        """``n`` keys more, given with ``expires``, the last of them adding job ``last_seq``."""
        runs = self.runs
        run = runs[-1] if runs else None
        if run is not None and run[0] == expires:
            if last_seq > run[1]:
                run[1] = last_seq
            run[2] += n
        else:
            runs.append([expires, last_seq, n])
        self.live += n
