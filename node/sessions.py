"""Sessions own leases; a session ends when its last connection has been gone
for ``grace_ms`` without an ``Identify`` bringing it back.

The node only decides *when* a session ended; releasing its leases is a
replicated ``_ReleaseSession`` command on each partition it pulled from.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable

__all__ = ["SessionTable"]

SESSION_CHARS_MAX = 128


class SessionTable:
    """Tracks which connections and partitions belong to each session."""

    def __init__(self, node_id: str, loop: asyncio.AbstractEventLoop, grace_ms: int,
                 release: Callable[[str, set[int]], None]) -> None:
        self.loop = loop
        self.grace_ms = grace_ms
        self._release = release
        self._conns: dict[str, set[int]] = {}
        self._partitions: dict[str, set[int]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def new_session_id(self) -> str:
        """128 random bits: a session owns leases, so its id must not be guessable (``Identify``
        takes a session over by id)."""
        return secrets.token_hex(16)

    def attach(self, session: str, conn_id: int) -> None:
        """A connection now belongs to ``session`` (new, or taken back within its grace)."""
        timer = self._timers.pop(session, None)
        if timer is not None:
            timer.cancel()
        self._conns.setdefault(session, set()).add(conn_id)

    def detach(self, session: str, conn_id: int) -> None:
        """A connection of ``session`` closed; end the session after the grace if it was the last."""
        conns = self._conns.get(session)
        if conns is None:
            return
        conns.discard(conn_id)
        if conns:
            return
        del self._conns[session]
        if session not in self._partitions:
            return
        if self.grace_ms <= 0:
            self._end(session)
        else:
            self._timers[session] = self.loop.call_later(self.grace_ms / 1000, self._end, session)

    def used_partition(self, session: str, partition: int) -> None:
        """``session`` took a lease on ``partition`` through this node."""
        self._partitions.setdefault(session, set()).add(partition)

    def forget(self, session: str, conn_id: int) -> None:
        """Drop ``conn_id`` without ending the session: its leases live until their ttr (REST pulls)."""
        conns = self._conns.get(session)
        if conns is not None:
            conns.discard(conn_id)
            if not conns:
                del self._conns[session]
                self._partitions.pop(session, None)

    def end_now(self, session: str, conn_id: int) -> None:
        """Detach ``conn_id`` and end ``session`` at once, ignoring the grace (push-mode streams)."""
        conns = self._conns.get(session)
        if conns is not None:
            conns.discard(conn_id)
            if not conns:
                del self._conns[session]
        self._end(session)

    def _end(self, session: str) -> None:
        self._timers.pop(session, None)
        if session in self._conns:
            return
        partitions = self._partitions.pop(session, set())
        if partitions:
            self._release(session, partitions)

    @property
    def active(self) -> int:
        return len(self._conns)
