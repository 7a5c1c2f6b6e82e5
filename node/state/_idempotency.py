"""The idempotency window: the keys clients gave their adds, kept IDEMPOTENCY_WINDOW_MS.

Every add the client library sends carries a key, so the window holds one entry per job added
in the last two minutes: at a steady ingest it is the engine's largest structure after the jobs
themselves, and a bulk ingest of millions of jobs holds millions of keys. A key is kept as its
hash in a packed table (``_key_table``, 20 bytes a slot), never as its string. The engine's
``idem`` (a :class:`KeyWindow`) holds:

- ``table``: hash of (queue, key) -> the seq of the job the key added; ``moving``: the table
  it replaced while its live entries move over (``cursor`` the next slot, ``step`` slots an add).
- ``runs``: ``[expires_ms, last_seq, keys]`` per run of keys given with one expiry, oldest
  first: ``last_seq`` is the highest seq a key of the run added.
- ``over``: every key whose seq is at most this is over (the runs a ``_Tick`` dropped).
- ``live``: the keys the runs hold (a key given again counts twice): sizes the table.

Seqs grow with the partition clock, so the runs due at ``now`` hold exactly the keys whose seq
is at most the last of them, and a key found in the table is live when its seq is above that:
dropping a run is raising ``over``, with nothing done per key.

Snapshots hold ``[over, runs]`` and then ``[h, c, seq]`` per live key in seq order
(engine state version 2, ``docs/formats.md``); version 1 held the keys' strings, and is read by
hashing them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from ._key_table import MIN_SLOTS, KeyTable, KeyWindow, key_hash, slots_for
from ._store import Store

__all__ = ["IdempotencyWindow"]

#: Slots of a replaced table a ``_Tick`` moves over (a window that stops taking keys still
#: finishes its move, a few milliseconds a tick).
_TICK_MOVE_SLOTS = 1 << 15


class IdempotencyWindow(Store):
    """The keys of recent adds (see the module docstring)."""

    def _remember_key(self, name: str, key: str, seq: int, expires: int) -> None:
        """Key ``key`` of queue ``name`` added job ``seq``; it is kept until ``expires``."""
        w = self.idem
        # A single add's lookup (_key_seq) hashed its key just before: taken from there.
        last = w.last
        if last[1] is key and last[0] == name:
            h, c = last[2], last[3]
        else:
            h, c = key_hash(name, key)
        w.admit(seq, 1, expires).put(h, c, seq, w.over)

    def _remember_hashes(self, hs: Sequence[int], cs: Sequence[int], seqs: Sequence[int],
                         expires: int) -> None:
        """The keys hashed ``(hs[i], cs[i])`` added jobs ``seqs[i]`` (in seq order); they are kept
        until ``expires``."""
        w = self.idem
        w.admit(seqs[-1], len(seqs), expires).put_many(hs, cs, seqs, w.over)

    def _key_seq(self, name: str, key: str) -> int | None:
        """The seq of the job ``key`` added to queue ``name`` while the key is live, else None."""
        w = self.idem
        if w.table is None:
            return None
        h, c = key_hash(name, key)
        w.last = (name, key, h, c)
        return w.seq_of(h, c, self.now_ms)

    def _hash_seq(self, h: int, c: int) -> int | None:
        """The seq of the job the key hashed ``(h, c)`` added while the key is live, else None."""
        return self.idem.seq_of(h, c, self.now_ms)

    def _purge_idempotency(self) -> None:
        """Drop the keys whose window has passed, and move or shrink the table a step."""
        w = self.idem
        runs = w.runs
        now = self.now_ms
        while runs and runs[0][0] <= now:
            _, last_seq, keys = runs.popleft()
            if last_seq > w.over:
                w.over = last_seq
            w.live -= keys
        table = w.table
        if table is None:
            return
        if not runs:
            w.table = w.moving = None
            w.cursor = 0
        elif w.moving is not None:
            w.move(_TICK_MOVE_SLOTS)
        elif table.size > MIN_SLOTS and 4 * slots_for(w.live) <= table.size:
            w.resize()  # most keys are over: a smaller table

    def idempotency_state(self) -> tuple[list[Any], list[Any]]:
        """The window as snapshots hold it: ``([over, runs], entries)`` (see the module
        docstring). The same keys give the same entries whatever the tables' layout."""
        w = self.idem
        over = w.over
        live: dict[tuple[int, int], int] = {}
        if w.moving is not None:  # the slots not moved yet
            for h, c, seq in w.moving.live(over, w.cursor):
                live[h, c] = seq
        if w.table is not None:
            for h, c, seq in w.table.live(over):
                live[h, c] = seq  # a key given again since: its later job
        entries = [[h, c, seq] for seq, h, c in sorted((seq, h, c) for (h, c), seq in live.items())]
        return [over, [list(run) for run in w.runs]], entries

    def load_idempotency(self, head: list[Any], entries: Iterable[tuple[int, int, int]]) -> None:
        """The window from a version-2 snapshot: ``head`` is ``[over, runs]``, ``entries`` gives
        ``(h, c, seq)`` per live key, read as they stream."""
        w = self.idem = KeyWindow()
        w.over, runs = head
        w.runs = deque([expires, last_seq, keys] for expires, last_seq, keys in runs)
        w.live = sum(run[2] for run in w.runs)
        table = KeyTable(slots_for(w.live, loaded=True)) if w.live else None
        for h, c, seq in entries:
            assert table is not None, "an idempotency entry without a run"
            table.put(h, c, seq, w.over)
        w.table = table

    def load_idempotency_v1(self, order: Iterable[tuple[int, str, str]],
                            entries: Iterable[tuple[str, str, int, int]]) -> None:
        """The window from a version-1 snapshot, which held key strings: ``order`` gives
        ``(expires, queue, key)`` per giving, oldest first, then ``entries`` ``(queue, key, seq,
        expires)`` per live key. A run's last seq is the highest seq of the live keys of its
        expiry (a key given again lists under a later expiry, so it never counts for its earlier
        run)."""
        w = self.idem = KeyWindow()
        for expires, _, _ in order:
            w.add_run(-1, 1, expires)
        table = KeyTable(slots_for(w.live, loaded=True)) if w.live else None
        highest: dict[int, int] = {}  # expires -> the highest live seq
        for name, key, seq, expires in entries:
            assert table is not None, "an idempotency entry without a giving"
            h, c = key_hash(name, key)
            table.put(h, c, seq, -1)
            if seq > highest.get(expires, -1):
                highest[expires] = seq
        for run in w.runs:
            run[1] = highest.get(run[0], -1)
        w.table = table
