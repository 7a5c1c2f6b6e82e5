"""Group commit: commands for one partition that arrive while a proposal is in
flight ride together in the next Raft entry.

Event-loop side only. Up to ``inflight_max`` entries are in flight at once
(pysyncobj pipelines them); everything else waits in ``_cmds`` and is
proposed as one batch the moment a slot frees. Results fan back out to each
command's callback in order.

Inside a batch, a run of consecutive plain PUSHes to one queue (data and maybe
an idempotency key) travels as one ``_PushMany`` command: one list of data
bytes to pickle and one segment for the engines to store, instead of a dict
and a job object per push on every replica. Each push keeps its own result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode

from .clock import Clock
from .raft import PartitionReplica, fail_reason_error

__all__ = ["GroupCommit", "ReplyCallback"]

#: Receives the engine's reply dict or a CommandError.
ReplyCallback = Callable[[Any], None]


#: Fields a PUSH may carry and still ride in a ``_PushMany`` (``timeout`` and ``_deadline``
#: only matter to the dispatcher, which parks a push refused with QUEUE_FULL).
_PLAIN_PUSH_FIELDS = frozenset({"cmd", "reqId", "queue", "data", "idempotencyKey", "timeout", "_deadline"})


def coalesce_pushes(cmds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int] | None]:
    """Replace each run of 2+ consecutive plain PUSHes to one queue by one ``_PushMany``.

    Returns the commands to replicate and, when anything was merged, how many original
    commands each stands for (0 for a command kept as it was); None when nothing was.
    """
    out: list[dict[str, Any]] = []
    sizes: list[int] = []
    merged = False
    i, n = 0, len(cmds)
    while i < n:
        cmd = cmds[i]
        j = i + 1
        if cmd["cmd"] == "PUSH" and cmd.keys() <= _PLAIN_PUSH_FIELDS:
            queue = cmd["queue"]
            while j < n and cmds[j]["cmd"] == "PUSH" and cmds[j]["queue"] == queue \
                    and cmds[j].keys() <= _PLAIN_PUSH_FIELDS:
                j += 1
        if j - i < 2:
            out.append(cmd)
            sizes.append(0)
            i += 1
            continue
        run = cmds[i:j]
        many: dict[str, Any] = {"cmd": "_PushMany", "queue": queue,
                                "_datas": [d.packed if type(d) is Raw else d for d in [c["data"] for c in run]]}
        keys = [c.get("idempotencyKey") for c in run]
        if any(k is not None for k in keys):
            many["_keys"] = keys
        out.append(many)
        sizes.append(j - i)
        merged = True
        i = j
    return out, (sizes if merged else None)


class _Entry:
    """One proposed entry's callbacks; ``settled`` once answered (by Raft or by abandonment).

    ``sizes`` (from :func:`coalesce_pushes`) maps the replicated commands back to the callbacks.
    """

    __slots__ = ("cbs", "sizes", "settled")

    def __init__(self, cbs: list[ReplyCallback], sizes: list[int] | None) -> None:
        self.cbs = cbs
        self.sizes = sizes
        self.settled = False


class GroupCommit:
    """Batches one partition's writes into Raft entries."""

    def __init__(self, replica: PartitionReplica, loop: asyncio.AbstractEventLoop, clock: Clock, *,
                 inflight_max: int = 3, batch_commands_max: int = 2048) -> None:
        self.replica = replica
        self.loop = loop
        #: Stamps each entry (the engines' ``now_ms``): the node's one clock, never decreasing.
        self.clock = clock
        self.inflight_max = inflight_max
        self.batch_commands_max = batch_commands_max
        self.pending_commands_max = 200_000
        self._cmds: list[dict[str, Any]] = []
        self._cbs: list[ReplyCallback] = []
        self._inflight = 0
        self._entries: set[_Entry] = set()
        self._scheduled = False
        self.proposed_batches = 0
        self.proposed_commands = 0

    @property
    def pending(self) -> int:
        return len(self._cmds)

    def submit(self, cmd: dict[str, Any], callback: ReplyCallback) -> None:
        """Queue ``cmd`` for the next entry; ``callback`` gets its result on the event loop."""
        if len(self._cmds) >= self.pending_commands_max:
            callback(CommandError(ErrorCode.OVERLOADED, "too many commands waiting for this partition"))
            return
        self._cmds.append(cmd)
        self._cbs.append(callback)
        if not self._scheduled and self._inflight < self.inflight_max:
            # Defer to the end of this loop iteration so a burst of frames shares one entry.
            self._scheduled = True
            self.loop.call_soon(self._flush)

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
            # A block of plain pushes (Dispatcher.handle_pushes) arrives as one _PushMany: count its pushes.
            self.proposed_commands += sum(len(c["_datas"]) if c["cmd"] == "_PushMany" else 1 for c in cmds)
            loop = self.loop
            cmds, sizes = coalesce_pushes(cmds)
            entry = _Entry(cbs, sizes)
            self._entries.add(entry)

            def done(results: Any, reason: int, entry: _Entry = entry) -> None:
                # Called inside pysyncobj's apply loop: answer after it finishes this tick.
                loop.call_soon(self._complete, entry, results, reason)

            try:
                self.replica.propose(self.clock.now_ms(), cmds, done)
            except Exception as exc:  # pysyncobj refused synchronously (e.g. destroyed)
                self._complete(entry, None, -1, exc)

    def abandon_inflight(self) -> None:
        """Leadership was lost: answer every proposed, uncommitted entry with ``TIMEOUT``.

        pysyncobj keeps a deposed leader's proposals waiting until its log is overwritten,
        which for an isolated leader means until the partition heals. Whether such an entry
        commits is unknown (the new leader may have it), so the answer is TIMEOUT: clients
        retry with the same idempotency key. Raft's late answer is then ignored.
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
        elif entry.sizes is None:
            for cb, res in zip(cbs, results):
                cb(res)
        else:
            k = 0
            for res, n in zip(results, entry.sizes):
                if n == 0:
                    cbs[k](res)
                    k += 1
                    continue
                # a _PushMany: one result per push, or one error for all (an engine failure)
                each = res["results"] if type(res) is dict else [res] * n
                for cb, r in zip(cbs[k:k + n], each):
                    cb(r)
                k += n
        if self._cmds and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
