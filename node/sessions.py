"""Sessions own leases; a session ends when its last connection has been gone
for ``grace_ms`` without an ``Identify`` bringing it back.

The node only decides *when* a session ended; releasing its leases is a
replicated ``_ReleaseSession`` command on each partition it pulled from.

A partition leader also accounts for sessions it learns of in an audit
(:mod:`.audits`): a session another node holds is *watched* there, and that
node tells the leader (relay message ``x``) when the session's last client
connection is gone. A REST pull's session is minted with
:data:`KEPT_SESSION_PREFIX`: its leases are kept to their ttr by design, so no
audit releases them.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable

__all__ = ["SessionTable", "SESSION_CHARS_MAX", "KEPT_SESSION_PREFIX", "WATCHED_MAX"]

log = logging.getLogger(__name__)

SESSION_CHARS_MAX = 128
#: Sessions whose id begins with this keep their leases to their ttr (a REST pull hands its
#: lease to a client that acks on a later request); an audit never releases them.
KEPT_SESSION_PREFIX = "kept."
#: Sessions held here that partition leaders elsewhere watch (:meth:`SessionTable.watch`).
WATCHED_MAX = 100_000


class SessionTable:
    """Tracks which connections and partitions belong to each session."""

    def __init__(self, node_id: str, loop: asyncio.AbstractEventLoop, grace_ms: int,
                 release: Callable[[str, set[int]], None],
                 gone: Callable[[str, set[str]], None] | None = None) -> None:
        """``release(session, partitions)`` releases an ended session's leases; ``gone(session,
        peers)`` tells the watching ``peers`` that ``session`` has no client connection here any more."""
        self.loop = loop
        self.grace_ms = grace_ms
        self._release = release
        self.gone = gone
        self._conns: dict[str, set[int]] = {}
        self._partitions: dict[str, set[int]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._watchers: dict[str, set[str]] = {}

    def new_session_id(self, kept: bool = False) -> str:
        """128 random bits: a session owns leases, so its id must not be guessable (``Identify``
        takes a session over by id). ``kept``: a session whose leases live to their ttr."""
        token = secrets.token_hex(16)
        return KEPT_SESSION_PREFIX + token if kept else token

    def attach(self, session: str, conn_id: int) -> None:
        """A connection now belongs to ``session`` (new, or taken back within its grace)."""
        timer = self._timers.pop(session, None)
        if timer is not None:
            timer.cancel()
        self._conns.setdefault(session, set()).add(conn_id)

    def detach(self, session: str, conn_id: int) -> None:
        """A connection of ``session`` closed; end the session after the grace if it was the last."""
        if not self._drop_conn(session, conn_id) or session not in self._partitions:
            return
        if self.grace_ms <= 0:
            self._end(session)
        else:
            self._timers[session] = self.loop.call_later(self.grace_ms / 1000, self._end, session)

    def used_partition(self, session: str, partition: int) -> None:
        """``session`` took a lease on ``partition`` through this node (or an audit found it held)."""
        self._partitions.setdefault(session, set()).add(partition)

    def forget(self, session: str, conn_id: int) -> None:
        """Drop ``conn_id`` without ending the session: its leases live until their ttr (REST pulls)."""
        if self._drop_conn(session, conn_id):
            self._partitions.pop(session, None)

    def end_now(self, session: str, conn_id: int) -> None:
        """Detach ``conn_id`` and end ``session`` at once, ignoring the grace (push-mode streams)."""
        self._drop_conn(session, conn_id)
        self._end(session)

    def _drop_conn(self, session: str, conn_id: int) -> bool:
        """Take ``conn_id`` out of ``session``; True when it was the session's last connection here."""
        conns = self._conns.get(session)
        if conns is None:
            return False
        conns.discard(conn_id)
        self._unwatch_if_gone(session, conns)
        if conns:
            return False
        del self._conns[session]
        return True

    def release(self, session: str, partitions: set[int]) -> None:
        """Release ``session``'s leases on ``partitions`` now (an audit found no node holding it)."""
        self._release(session, partitions)

    def _end(self, session: str) -> None:
        self._timers.pop(session, None)
        if session in self._conns:
            return
        partitions = self._partitions.pop(session, set())
        if partitions:
            self._release(session, partitions)

    # --- what audits ask ----------------------------------------------------------------------------

    def held_here(self, session: str) -> bool:
        """Does a client connection of this node belong to ``session``? (A peer's forwarded
        session, attached with a negative id, does not count: that peer answers for it.)"""
        return any(conn_id > 0 for conn_id in self._conns.get(session, ()))

    def accounts(self, session: str, partition: int) -> bool:
        """Will this node release ``session``'s leases on ``partition`` when the session ends?"""
        return partition in self._partitions.get(session, ())

    def watch(self, session: str, peer: str) -> bool:
        """``peer`` (a partition leader) wants to hear when ``session``, held here, has no client
        connection here any more. False when the table of watched sessions is full."""
        peers = self._watchers.get(session)
        if peers is None:
            if len(self._watchers) >= WATCHED_MAX:
                log.warning("%d sessions are watched already; session %s is not", WATCHED_MAX, session)
                return False
            peers = self._watchers[session] = set()
        peers.add(peer)
        return True

    def unwatch_peer(self, peer: str) -> None:
        """The link to ``peer`` is gone: it has detached what it watched (``Relay.peer_lost``)."""
        for session in [s for s, peers in self._watchers.items() if peer in peers]:
            peers = self._watchers[session]
            peers.discard(peer)
            if not peers:
                del self._watchers[session]

    def _unwatch_if_gone(self, session: str, conns: set[int]) -> None:
        if session in self._watchers and not any(conn_id > 0 for conn_id in conns):
            peers = self._watchers.pop(session)
            if self.gone is not None:
                self.gone(session, peers)

    @property
    def active(self) -> int:
        return len(self._conns)
