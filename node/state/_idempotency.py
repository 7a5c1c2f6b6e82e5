"""The idempotency window: the keys clients gave their adds, kept IDEMPOTENCY_WINDOW_MS.

Every add the client library sends carries a key, so the window holds one entry per job added
in the last two minutes: at a steady ingest it is the engine's largest structure after the jobs
themselves. It is kept small:

- ``idempotency``: queue name -> key -> the seq of the job the key added. The key is the
  string the command brought; the seq is the job's own int where the job holds one.
- ``idempotency_runs``: the keys in the order they were given, as runs
  ``[expires_ms, queue, keys, last_seq]`` of one queue and one expiry (the adds of one
  entry), oldest first; ``last_seq`` is the highest seq a key of the run added.

Seqs grow with the partition clock, so the runs due at ``now`` hold exactly the keys whose seq
is at most the last of them, and a key found in the map is live when its seq is above that.
A key given again once its entry is due but before a ``_Tick`` dropped it (a new job) is in two
runs: only the run that holds its seq (the later one) drops it.

Snapshots hold it as ``(expires, [queue, key])`` per key given, oldest first, then
``(queue, key, job id, expires)`` per live key (``docs/formats.md``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from shoal.cluster.jobid import format_job_id

from ._store import Store

__all__ = ["IdempotencyWindow"]


class IdempotencyWindow(Store):
    """The keys of recent adds (see the module docstring)."""

    def _remember_key(self, name: str, key: str, seq: int, expires: int) -> None:
        """Key ``key`` of queue ``name`` added job ``seq``; it is kept until ``expires``."""
        keys_of = self.idempotency.get(name)
        if keys_of is None:
            keys_of = self.idempotency[name] = {}
        keys_of[key] = seq
        runs = self.idempotency_runs
        if runs:
            run = runs[-1]
            if run[0] == expires and run[1] == name:
                run[2].append(key)
                run[3] = seq
                return
        runs.append([expires, name, [key], seq])

    def _key_seq(self, name: str, key: str) -> int | None:
        """The seq of the job ``key`` added to queue ``name`` while the key is live, else None."""
        keys_of = self.idempotency.get(name)
        if keys_of is None:
            return None
        seq = keys_of.get(key)
        if seq is None:
            return None
        runs = self.idempotency_runs
        if runs and runs[0][0] <= self.now_ms and seq <= self._due_through():
            return None  # due, not dropped yet
        return seq

    def _due_through(self) -> int:
        """The highest seq a key of the runs due now added (-1: none)."""
        now = self.now_ms
        through = -1
        for expires, _, _, last_seq in self.idempotency_runs:
            if expires > now:
                break
            if last_seq > through:
                through = last_seq
        return through

    def _purge_idempotency(self) -> None:
        """Drop the keys whose window has passed."""
        runs = self.idempotency_runs
        now = self.now_ms
        window = self.idempotency
        while runs and runs[0][0] <= now:
            _, name, keys, last_seq = runs.popleft()
            keys_of = window.get(name)
            if keys_of is None:
                continue
            for key in keys:
                seq = keys_of.get(key)
                if seq is not None and seq <= last_seq:
                    del keys_of[key]
            if not keys_of:
                del window[name]

    def idempotency_state(self) -> tuple[list[Any], list[Any]]:
        """The window as snapshots hold it: ``(order, entries)`` (see the module docstring)."""
        order: list[Any] = []
        entries: list[Any] = []
        partition = self.partition
        window = self.idempotency
        for expires, name, keys, last_seq in self.idempotency_runs:
            keys_of = window.get(name, {})
            for key in keys:
                order.append((expires, [name, key]))
                seq = keys_of.get(key)
                if seq is not None and seq <= last_seq:
                    entries.append((name, key, format_job_id(partition, seq), expires))
        return order, entries

    def load_idempotency(self, order: Iterable[tuple[int, str, str]],
                         entries: Iterable[tuple[str, str, int, int]]) -> None:
        """The window from a snapshot, read as it streams: ``order`` gives ``(expires, queue,
        key)`` per giving, oldest first, then ``entries`` ``(queue, key, seq, expires)`` per live
        key.

        Nothing per key is held beyond what the window keeps: the runs are built as the order
        comes, and a run's last seq is the highest seq of the live keys of its queue and expiry
        (a key given again lists under a later expiry, so it never counts for its earlier run).
        """
        runs: deque[list[Any]] = deque()
        for expires, name, key in order:
            if runs:
                run = runs[-1]
                if run[0] == expires and run[1] == name:
                    run[2].append(key)
                    continue
            runs.append([expires, name, [key], -1])
        window: dict[str, dict[str, int]] = {}
        highest: dict[tuple[str, int], int] = {}  # (queue, expires) -> the highest live seq
        for name, key, seq, expires in entries:
            keys_of = window.get(name)
            if keys_of is None:
                keys_of = window[name] = {}
            keys_of[key] = seq
            if seq > highest.get((name, expires), -1):
                highest[name, expires] = seq
        for run in runs:
            run[3] = highest.get((run[1], run[0]), -1)
        self.idempotency = window
        self.idempotency_runs = runs
