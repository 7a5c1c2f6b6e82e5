"""Raft's log-matching rule on the follower side (Raft paper §5.3, Figure 2), as a pure function.

A follower receiving AppendEntries(prevLogIndex, prevLogTerm, entries, leaderCommit):

1. rejects it unless its log holds an entry at ``prevLogIndex`` whose term is
   ``prevLogTerm`` (an entry at or below the commit index, or compacted into a
   snapshot, is committed and so matches every current leader's log);
2. walks the entries: one it already holds with the same term is skipped; the
   first one whose term differs from the entry it holds is the conflict — the
   follower deletes that entry and everything after it — and the remaining
   entries are appended;
3. never deletes anything when nothing conflicts, so a stale, duplicated or
   reordered AppendEntries (all of whose entries it already holds) leaves the
   log as it was, including entries past the message's last one;
4. never deletes at or below its commit index (a conflict there means a broken
   leader or a damaged log: the message is refused, nothing changes);
5. advances its commit index to ``min(leaderCommit, index of the last entry the
   message vouches for)`` — never past what the message proved matching, never
   backwards.

The function only decides; the caller applies :class:`Accept` (delete, then
append, then set the commit index) or answers a :class:`Reject`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Accept", "LogView", "Reject", "match_append_entries"]


class LogView(Protocol):
    """What the rule needs to know of the follower's log."""

    @property
    def first_index(self) -> int:
        """Index of the first entry held (entries below are in a snapshot)."""

    @property
    def last_index(self) -> int:
        """Index of the last entry held."""

    def term_at(self, index: int) -> int | None:
        """Term of the entry at ``index``; ``None`` if not held."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer failure; the leader should retry from ``next_index``."""

    next_index: int
    reason: str


@dataclass(frozen=True, slots=True)
class Accept:
    """Delete entries from ``delete_from`` (``None``: delete nothing), then append ``append``."""

    delete_from: int | None
    append: Sequence[Any]
    match_index: int
    commit_index: int


def match_append_entries(
    log: LogView,
    commit_index: int,
    prev_log_index: int,
    prev_log_term: int,
    entries: Sequence[Any],
    leader_commit: int,
) -> Accept | Reject:
    """Decide what a follower does with one AppendEntries (see the module docstring).

    ``entries`` are pysyncobj-style ``(command, index, term)`` tuples and must
    carry the indexes ``prev_log_index + 1, prev_log_index + 2, …``.
    """
    for k, entry in enumerate(entries):
        if entry[1] != prev_log_index + 1 + k:
            return Reject(commit_index + 1, f"entry {k} has index {entry[1]}, expected {prev_log_index + 1 + k}")
    last_index = log.last_index
    if prev_log_index > last_index:
        return Reject(last_index + 1, f"no entry at prevLogIndex {prev_log_index} (log ends at {last_index})")
    if prev_log_index > commit_index and prev_log_index >= log.first_index:
        term = log.term_at(prev_log_index)
        if term != prev_log_term:
            return Reject(prev_log_index, f"term {term} at prevLogIndex {prev_log_index}, leader has {prev_log_term}")
    elif prev_log_index >= log.first_index and prev_log_index > 0:
        term = log.term_at(prev_log_index)
        if term is not None and term != prev_log_term:
            return Reject(commit_index + 1, f"committed entry {prev_log_index} has term {term}, leader says {prev_log_term}")

    delete_from: int | None = None
    append: Sequence[Any] = ()
    for k, entry in enumerate(entries):
        index, term = entry[1], entry[2]
        if index > last_index:
            append = entries[k:]
            break
        if index < log.first_index:
            continue  # compacted into a snapshot: committed, so it matches
        held = log.term_at(index)
        if held == term:
            continue
        if index <= commit_index:
            return Reject(commit_index + 1, f"entry {index} conflicts at or below the commit index {commit_index}")
        delete_from = index
        append = entries[k:]
        break
    match_index = prev_log_index + len(entries)
    new_commit = max(commit_index, min(leader_commit, match_index))
    return Accept(delete_from, append, match_index, new_commit)
