"""Per-node connection pools: round-robin, preferring connected sockets; shared and reference-counted.

Every client on the same event loop with the same address, token, session and
options shares one pool per node; the last client to
let go closes it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ._connection import Connection
from .options import ConnectionOptions

__all__ = ["Pool", "acquire", "release", "SHARED_POOLS"]

Listener = Callable[[dict[str, Any]], None]


class Pool:
    """``options.pool_size`` connections to one node."""

    def __init__(self, address: str, options: ConnectionOptions, token: str | None, session: str | None) -> None:
        self.address = address
        self.listeners: list[Listener] = []
        self.connections = [Connection(address, options, token=token, session=session, on_event=self._dispatch)
                            for _ in range(options.pool_size)]
        self._turn = itertools.count()
        self.refs = 0

    def __repr__(self) -> str:
        up = sum(c.connected for c in self.connections)
        return f"<Pool {self.address} {up}/{len(self.connections)} connected refs={self.refs}>"

    def _dispatch(self, frame: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            listener(frame)

    @property
    def connected(self) -> bool:
        return any(c.connected for c in self.connections)

    def pick(self) -> Connection:
        """The next connection in turn that is connected, or the next one in turn if none is."""
        n = len(self.connections)
        start = next(self._turn)
        for i in range(n):
            conn = self.connections[(start + i) % n]
            if conn.connected:
                return conn
        return self.connections[start % n]

    async def close(self) -> None:
        for conn in self.connections:
            await conn.close()


#: (loop id, address, token, session, options) → pool.
SHARED_POOLS: dict[tuple[Any, ...], Pool] = {}


def _key(address: str, options: ConnectionOptions, token: str | None, session: str | None) -> tuple[Any, ...]:
    return (id(asyncio.get_running_loop()), address, token, session, options)


def acquire(address: str, options: ConnectionOptions, token: str | None, session: str | None,
            listener: Listener) -> tuple[Pool, tuple[Any, ...]]:
    """The shared pool for these settings (created on first use), with one more reference."""
    key = _key(address, options, token, session)
    pool = SHARED_POOLS.get(key)
    if pool is None:
        pool = SHARED_POOLS[key] = Pool(address, options, token, session)
    pool.refs += 1
    pool.listeners.append(listener)
    return pool, key


async def release(key: tuple[Any, ...], listener: Listener) -> None:
    """Drop one reference; the last one closes the pool."""
    pool = SHARED_POOLS.get(key)
    if pool is None:
        return
    pool.refs -= 1
    if listener in pool.listeners:
        pool.listeners.remove(listener)
    if pool.refs <= 0:
        del SHARED_POOLS[key]
        await pool.close()
