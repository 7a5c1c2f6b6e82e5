"""Group commit: commands for one partition that arrive while a proposal is in
flight ride together in the next Raft entry.

Event-loop side only. Up to ``inflight_max`` entries are in flight at once
(the Raft core pipelines them); everything else waits in ``_cmds`` and is
proposed as one batch the moment a slot frees. Results fan back out to each
command's callback in order.

The commands of an entry are the batch in its replicated form, which
:mod:`~.pushes` decides (a run of plain PUSHes as one ``PushRun``, and so on);
each submitted command still gets its own result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from shoal.cluster.errors import CommandError, ErrorCode

from ..clock import Clock
from .pushes import Command, SessionPull, commands_in, fan_out, replicated_form
from ..raft import BatchResult, PartitionReplica, fail_reason_error

__all__ = ["GroupCommit", "ReplyCallback"]

#: Receives the engine's reply dict or a CommandError.
ReplyCallback = Callable[[Any], None]
#: Replicates one entry: ``(now_ms, commands, done(results, fail_reason), early(results) or None)``.
Propose = Callable[[int, list[Any], Callable[[BatchResult | None, int], None], Callable[[BatchResult], None] | None],
                   None]


class _Entry:
    """One proposed entry's callbacks; ``settled`` once answered (by Raft or by abandonment).

    ``sizes`` (from :func:`~.pushes.replicated_form`) maps the replicated commands back to the
    callbacks; ``takes`` pairs each take's result index with its callback's.
    """

    __slots__ = ("cbs", "sizes", "takes", "settled")

    def __init__(self, cbs: list[ReplyCallback], sizes: list[int] | None, takes: list[tuple[int, int]]) -> None:
        self.cbs = cbs
        self.sizes = sizes
        self.takes = takes
        self.settled = False


def _takes(cmds: list[Command], sizes: list[int] | None) -> list[tuple[int, int]]:
    """(result index, callback index) of each command of ``cmds`` that takes jobs for a session
    (a PULL or PULLB whose leases go back when the connection's session ends; a detached one's
    outlive it)."""
    out: list[tuple[int, int]] = []
    k = 0
    for i, cmd in enumerate(cmds):
        if type(cmd) is SessionPull and cmd.session is not None:
            out.append((i, k))
        k += 1 if sizes is None or sizes[i] == 0 else sizes[i]
    return out


def _answered_early(_: Any) -> None:
    """Stands in for a callback answered before the entry's sync."""


class GroupCommit:
    """Batches one partition's writes into Raft entries."""

    def __init__(self, replica: PartitionReplica, loop: asyncio.AbstractEventLoop, clock: Clock, *,
                 propose: Propose, inflight_max: int = 3, batch_commands_max: int = 2048,
                 after_answers: Callable[[], None] | None = None,
                 before_output: Callable[[Callable[[], None]], None] | None = None,
                 early_answers: Callable[[], None] | None = None) -> None:
        self.replica = replica
        #: Replicates an entry: its partition's :meth:`~.partition.Partition.propose` (the write
        #: policies, then the replica).
        self.propose = propose
        #: Writes the answers handed out ahead of an entry's sync (takes, on a lone replica);
        #: None: every answer waits for the entry to commit.
        self.early_answers = early_answers
        #: Hands the node a call proposing this iteration's batch before the iteration's output
        #: is written (``PendingWrites.propose_first``).
        self.before_output = before_output
        #: Called once an entry's answers are handed out (the node writes them at once).
        self.after_answers = after_answers
        self.loop = loop
        #: Stamps each entry (the engines' ``now_ms``): the node's one clock, never decreasing.
        self.clock = clock
        self.inflight_max = inflight_max
        self.batch_commands_max = batch_commands_max
        self.pending_commands_max = 200_000
        self._cmds: list[Command] = []
        self._cbs: list[ReplyCallback] = []
        self._inflight = 0
        self._entries: set[_Entry] = set()
        self._scheduled = False
        self.proposed_batches = 0
        self.proposed_commands = 0

    @property
    def pending(self) -> int:
        return len(self._cmds)

    def submit(self, cmd: Command, callback: ReplyCallback) -> None:
        """Queue ``cmd`` for the next entry; ``callback`` gets its result on the event loop."""
        if len(self._cmds) >= self.pending_commands_max:
            callback(CommandError(ErrorCode.OVERLOADED, "too many commands waiting for this partition"))
            return
        self._cmds.append(cmd)
        self._cbs.append(callback)
        if not self._scheduled and self._inflight < self.inflight_max:
            # Defer to the end of this loop iteration so a burst of frames shares one entry.
            self._scheduled = True
            self.loop.call_soon(self._flush_due)
            if self.before_output is not None and self.replica.commits_alone():
                # its answers can leave with the replies to the frames read with these
                self.before_output(self._flush_due)

    def _flush_due(self) -> None:
        if self._scheduled:  # not yet flushed by the writes (propose_first)
            self._flush()

    def fail_all(self, error: CommandError) -> None:
        """Reject everything not yet proposed (leadership lost, shutdown)."""
        cbs, self._cmds, self._cbs = self._cbs, [], []
        for cb in cbs:
            cb(error)

    def _flush(self) -> None:
        self._scheduled = False
        while self._cmds and self._inflight < self.inflight_max:
            if not self.replica.is_leader():
                leader = self.replica.leader_id()
                self.fail_all(CommandError(ErrorCode.NOT_LEADER if leader else ErrorCode.NO_LEADER,
                                           "this node no longer leads the partition; retry"))
                return
            n = self.batch_commands_max
            cmds, self._cmds = self._cmds[:n], self._cmds[n:]
            cbs, self._cbs = self._cbs[:n], self._cbs[n:]
            self._inflight += 1
            self.proposed_batches += 1
            self.proposed_commands += sum(map(commands_in, cmds))
            cmds, sizes = replicated_form(cmds, self.replica.partition)
            # only a lone replica answers takes ahead of the sync (PartitionReplica._apply_ahead)
            answers_early = self.early_answers is not None and self.replica.commits_alone()
            entry = _Entry(cbs, sizes, _takes(cmds, sizes) if answers_early else [])
            self._entries.add(entry)

            def done(results: Any, reason: int, entry: _Entry = entry) -> None:
                # The replica calls this once the applies it ran are over: the answers leave now,
                # before the loop polls again or publishes the entry's events.
                self._complete(entry, results, reason)

            def early(results: Any, entry: _Entry = entry) -> None:
                self._answer_takes(entry, results)

            try:
                self.propose(self.clock.now_ms(), cmds, done, early if entry.takes else None)
            except Exception as exc:  # the replica refused synchronously (e.g. closed)
                self._complete(entry, None, -1, exc)

    def abandon_inflight(self) -> None:
        """Leadership was lost: answer every proposed, uncommitted entry with ``TIMEOUT``.

        Whether a deposed leader's appended entry commits is unknown (the new leader may have
        it), so the answer is TIMEOUT: clients retry with the same idempotency key. A late
        answer from the replica is then ignored.
        """
        entries, self._entries = self._entries, set()
        err = CommandError(ErrorCode.TIMEOUT, "leadership was lost before the write committed; "
                                              "its outcome is unknown (retry with the same idempotency key)")
        for entry in entries:
            if not entry.settled:
                entry.settled = True
                self._inflight -= 1
                for cb in entry.cbs:
                    cb(err)

    def _answer_takes(self, entry: _Entry, results: Any) -> None:
        """A lone replica applied the entry and is about to sync it: its takes are answered now,
        so their consumers work on the jobs while the disk syncs. Everything else the entry
        answers waits for the sync (:meth:`_complete`)."""
        if entry.settled or self.early_answers is None:
            return
        cbs = entry.cbs
        for i, k in entry.takes:
            cb, cbs[k] = cbs[k], _answered_early
            cb(results[i])
        self.early_answers()

    def _complete(self, entry: _Entry, results: Any, reason: int, exc: Exception | None = None) -> None:
        if entry.settled:
            return  # already answered by abandon_inflight
        entry.settled = True
        self._entries.discard(entry)
        self._inflight -= 1
        cbs = entry.cbs
        if results is None or reason != 0:
            err = (CommandError(ErrorCode.SHUTTING_DOWN, f"replication unavailable: {exc}") if exc
                   else fail_reason_error(reason))
            for cb in cbs:
                cb(err)
        else:
            fan_out(cbs, results, entry.sizes)
        if self.after_answers is not None:
            self.after_answers()
        if self._cmds and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
