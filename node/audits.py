"""Session audits: a partition leader releases the leases of sessions no live node holds.

Leases belong to the pulling session, and a session's end is noticed by the node holding the
client's connection. That knowledge lives in memory only: after a leader restarts, or
leadership moves to another node, the engine (recovered from the log) may hold leases of
sessions that no node will ever report ended. An audit finds them.

Every :data:`AUDIT_INTERVAL_S` the node collects, over the partitions it leads, the sessions
holding leases that its own session table does not account for (see
:meth:`~.sessions.SessionTable.accounts`; a REST pull's session, which keeps its leases to
their ttr, is never a candidate). Those held by a client connection of this node are
accounted for at once. For the others one round asks every other live node, in one relay
message ``["w", aid, sessions, False]`` each, which of them it holds; a node answers
``["w", aid, held, True]`` and watches the sessions it holds, telling the leader (``["x",
session]``) when their last client connection is gone. Once every node answered, or after
:data:`AUDIT_ANSWER_TIMEOUT_S`, :meth:`SessionAudit.finish` decides:

- a session some node holds is *adopted*: the leader treats it as forwarded by that node;
- a session no node holds is released with the replicated ``_ReleaseSession`` once complete
  rounds have found it held by no node for the session grace (``session_grace_ms``);
- when a node did not answer (no link, no answer in time), the round releases nothing: the
  sessions it may hold are kept until a later, complete round.

Bounded: one round at a time per node, at most :data:`AUDIT_SESSIONS_MAX` sessions asked
per round (one message per other node), at most :data:`SCAN_SESSIONS_MAX` engine sessions
looked at per partition and round. :class:`SessionAudit` holds the decisions and no I/O
(time is an argument); the relay (:mod:`.relay`) sends and receives its messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SessionAudit", "AuditRound", "Verdict", "AUDIT_INTERVAL_S", "AUDIT_ANSWER_TIMEOUT_S",
           "AUDIT_SESSIONS_MAX", "SCAN_SESSIONS_MAX"]

#: How often a node looks for sessions it does not account for in the partitions it leads.
AUDIT_INTERVAL_S = 1.0
#: How long a round waits for every node's answer.
AUDIT_ANSWER_TIMEOUT_S = 2.0
#: Sessions one round asks about (the rest wait for later rounds).
AUDIT_SESSIONS_MAX = 1024
#: Engine sessions looked at per partition and round.
SCAN_SESSIONS_MAX = 65_536


@dataclass(slots=True)
class AuditRound:
    """One round's question and the answers so far."""

    aid: int
    started_ms: int
    #: The nodes asked (every other live node).
    asked: frozenset[str]
    #: The sessions asked about, each with the partitions where it holds unaccounted leases.
    partitions: dict[str, tuple[int, ...]]
    answered: set[str] = field(default_factory=set)
    #: Session -> the first node that said it holds it.
    held: dict[str, str] = field(default_factory=dict)

    @property
    def sessions(self) -> list[str]:
        return list(self.partitions)

    @property
    def complete(self) -> bool:
        return self.answered >= self.asked


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a finished round decided."""

    #: (partition, session, node): ``node`` holds ``session``; the leader of ``partition`` adopts it.
    adopt: tuple[tuple[int, str, str], ...]
    #: (partition, session): no node holds ``session`` (for the grace): release its leases on ``partition``.
    release: tuple[tuple[int, str], ...]
    #: Sessions no node holds, still within their grace.
    waiting: int
    #: The nodes that did not answer (nothing was released then).
    silent: tuple[str, ...]


class SessionAudit:
    """The decisions of the session audits of one node (pure: no I/O, time is an argument)."""

    def __init__(self, grace_ms: int, sessions_max: int = AUDIT_SESSIONS_MAX) -> None:
        self.grace_ms = grace_ms
        self.sessions_max = sessions_max
        self.round: AuditRound | None = None
        self._aids = 0
        #: Session -> when a complete round first found no node holding it.
        self._unheld_since: dict[str, int] = {}

    def begin(self, now_ms: int, candidates: Mapping[int, Iterable[str]], nodes: Iterable[str]) -> AuditRound | None:
        """Start a round over ``candidates`` (partition -> sessions holding leases there that the
        leader does not account for), asking ``nodes``; None when a round is under way or there
        is nothing to ask."""
        if self.round is not None:
            return None
        partitions: dict[str, list[int]] = {}
        for p, sessions in sorted(candidates.items()):
            for session in sessions:
                ps = partitions.get(session)
                if ps is None:
                    if len(partitions) >= self.sessions_max:
                        continue
                    ps = partitions[session] = []
                ps.append(p)
        if not partitions:
            self._unheld_since.clear()
            return None
        self._aids += 1
        self.round = AuditRound(self._aids, now_ms, frozenset(nodes),
                                {s: tuple(ps) for s, ps in partitions.items()})
        return self.round

    def answer(self, node: str, aid: Any, held: Any) -> bool:
        """``node``'s answer to round ``aid``: the sessions it holds. Ignored unless it answers
        the round under way, from a node asked, with a list of sessions. True when every node
        asked has answered."""
        rnd = self.round
        if rnd is None or aid != rnd.aid or node not in rnd.asked or node in rnd.answered:
            return False
        if type(held) is not list:
            return False
        rnd.answered.add(node)
        for session in held:
            if type(session) is str and session in rnd.partitions:
                rnd.held.setdefault(session, node)
        return rnd.complete

    def due(self, now_ms: int, timeout_ms: int) -> bool:
        """Is the round under way complete, or past its time for answers?"""
        rnd = self.round
        return rnd is not None and (rnd.complete or now_ms - rnd.started_ms >= timeout_ms)

    def finish(self, now_ms: int) -> Verdict:
        """End the round under way and say what to do."""
        rnd = self.round
        assert rnd is not None, "finish() without a round"
        self.round = None
        adopt = [(p, s, node) for s, node in rnd.held.items() for p in rnd.partitions[s]]
        complete = rnd.complete
        since = self._unheld_since
        kept: dict[str, int] = {}
        release: list[tuple[int, str]] = []
        waiting = 0
        for session, ps in rnd.partitions.items():
            if session in rnd.held:
                continue
            first = since.get(session)
            if complete and first is None:
                first = now_ms
            if first is None:
                continue  # a node did not answer: not known to be held by no one yet
            if complete and now_ms - first >= self.grace_ms:
                release.extend((p, session) for p in ps)
            else:
                kept[session] = first
                waiting += 1
        self._unheld_since = kept  # only this round's sessions: bounded by sessions_max
        return Verdict(tuple(adopt), tuple(release), waiting, tuple(sorted(rnd.asked - rnd.answered)))
