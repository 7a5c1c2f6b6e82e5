"""``AsyncClient``: partition-aware, pipelined, self-healing.

Routing: the topology from ``Hello`` says which node leads each partition; a
command goes to the leader of its queue's partition, or of the partition in
its job id. ``NOT_LEADER``/``NO_LEADER`` (never applied) refresh the topology
and retry within the command timeout; ``ConnectionLost``/``TIMEOUT`` (outcome
unknown) are retried only for commands that are safe to repeat. Pushes carry
an idempotency key made by the client, so a retried push never enqueues twice.
A topology event pushed by a node updates routing at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from shoal.cluster.commands import COMMANDS
from shoal.cluster.jobid import partition_of_job
from shoal.cluster.partitioning import partition_for
from shoal.cluster.topology import Topology

from ._connection import Connection
from .exceptions import AuthError, ClientClosed, CommandError, CommandTimeout, ConnectionLost, NotLeader, ShoalError
from .options import ConnectionOptions

__all__ = ["AsyncClient", "ms"]

_NOT_APPLIED = {"NOT_LEADER", "NO_LEADER", "OVERLOADED", "SHUTTING_DOWN"}
_UNKNOWN_OUTCOME = {"TIMEOUT"}
_RETRY_PAUSE_S = 0.05


def ms(seconds: float | None) -> int | None:
    """Python seconds → wire milliseconds."""
    return None if seconds is None else int(round(seconds * 1000))


#: One session per process by default: clients in a process share pools and leases.
PROCESS_SESSION = f"c-{uuid.uuid4().hex[:16]}"


class _Pool:
    """Connections to one node: round-robin, preferring connected sockets.

    Pools are shared, reference-counted, by every client on the same event loop with
    the same address, token, session and options (seed 001's shared pools).
    """

    def __init__(self, address: str, options: ConnectionOptions, token: str | None, session: str) -> None:
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.connections = [Connection(address, options, token=token, session=session, on_event=self._dispatch)
                            for _ in range(options.pool_size)]
        self._next = itertools.count()
        self.refs = 0

    def _dispatch(self, frame: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            listener(frame)

    def pick(self) -> Connection:
        n = len(self.connections)
        start = next(self._next)
        for i in range(n):
            conn = self.connections[(start + i) % n]
            if conn.connected:
                return conn
        return self.connections[start % n]

    async def close(self) -> None:
        for conn in self.connections:
            await conn.close()


_SHARED_POOLS: dict[tuple[Any, ...], _Pool] = {}


def _acquire_pool(address: str, client: "AsyncClient") -> _Pool:
    key = (id(asyncio.get_running_loop()), address, client.token, client.session, client.options)
    pool = _SHARED_POOLS.get(key)
    if pool is None:
        pool = _SHARED_POOLS[key] = _Pool(address, client.options, client.token, client.session)
    pool.refs += 1
    pool.listeners.append(client._on_event)
    client._pool_keys[address] = key
    return pool


async def _release_pool(key: tuple[Any, ...], client: "AsyncClient") -> None:
    pool = _SHARED_POOLS.get(key)
    if pool is None:
        return
    pool.refs -= 1
    if client._on_event in pool.listeners:
        pool.listeners.remove(client._on_event)
    if pool.refs <= 0:
        del _SHARED_POOLS[key]
        await pool.close()


class AsyncClient:
    """The asyncio client. Use ``async with AsyncClient(["host:port"]) as client: ...``."""

    def __init__(self, seeds: list[str] | str, token: str | None = None,
                 options: ConnectionOptions | None = None, *, session: str | None = None) -> None:
        self.seeds = [seeds] if isinstance(seeds, str) else list(seeds)
        if not self.seeds:
            raise ValueError("give at least one seed address host:port")
        self.token = token
        self.options = options or ConnectionOptions()
        #: Leases belong to this session; reconnecting connections identify with it again.
        self.session = session or PROCESS_SESSION
        self.topology: Topology | None = None
        self._pools: dict[str, _Pool] = {}
        self._pool_keys: dict[str, tuple[Any, ...]] = {}
        self._key_prefix = uuid.uuid4().hex[:12]
        self._keys = itertools.count(1)
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._refresh_task: asyncio.Task[None] | None = None
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------------

    async def connect(self) -> "AsyncClient":
        """Learn the topology from the first seed that answers."""
        await self.refresh_topology()
        if self.options.topology_refresh > 0:
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_loop())
        return self

    async def close(self) -> None:
        self._closed = True
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        for address in list(self._pools):
            await _release_pool(self._pool_keys.pop(address), self)
        self._pools.clear()

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- topology -------------------------------------------------------------------------------

    def _pool(self, address: str) -> _Pool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = _acquire_pool(address, self)
        return pool

    async def refresh_topology(self) -> Topology:
        """Ask the known nodes (then the seeds) for their view; keep the freshest per partition."""
        addresses = list(dict.fromkeys(
            ([f"{n.host}:{n.port}" for n in self.topology.nodes.values()] if self.topology else []) + self.seeds))
        errors = []
        auth_error: AuthError | None = None
        merged = None
        for address in addresses:
            try:
                conn = self._pool(address).pick()
                await conn.ensure_connected()
                reply = await conn.call({"cmd": "Hello", "protocolVersion": 2}, self.options.connect_timeout)
            except AuthError as exc:
                auth_error = exc
                errors.append(f"{address}: {exc}")
                continue
            except (ShoalError, OSError) as exc:
                errors.append(f"{address}: {exc}")
                continue
            topo = Topology.from_wire(reply["topology"])
            merged = topo if merged is None else merged.merge(topo)
            if all(p.leader for p in merged.partition_map):
                break
        if merged is None:
            if auth_error is not None:
                raise auth_error  # a wrong token is not a network problem: say so
            raise ConnectionLost("no node answered: " + "; ".join(errors))
        self.topology = merged if self.topology is None else self.topology.merge(merged)
        return self.topology

    async def _refresh_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.options.topology_refresh)
            try:
                await self.refresh_topology()
            except ShoalError:
                pass

    def _on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("event") == "topology":
            topo = Topology.from_wire(frame["topology"])
            self.topology = topo if self.topology is None else self.topology.merge(topo)
            return
        for listener in list(self._listeners):
            listener(frame)

    # --- routing and retries --------------------------------------------------------------------

    def partition_of(self, frame: dict[str, Any]) -> int | None:
        """The partition a frame routes to (``None`` for node-level commands)."""
        assert self.topology is not None
        spec = COMMANDS.get(frame["cmd"])
        routing = spec.routing if spec else "node"
        if routing == "queue":
            return partition_for(frame["queue"], self.topology.partitions)
        if routing == "id":
            return partition_of_job(frame["id"] if "id" in frame else frame["ids"][0])
        if routing == "partition":
            return frame.get("partition")
        return None

    def new_idempotency_key(self) -> str:
        return f"{self._key_prefix}-{next(self._keys)}"

    async def call(self, frame: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Send one command to the right node; retry leader changes within the command timeout."""
        if self._closed:
            raise ClientClosed("the client is closed")
        if self.topology is None:
            await self.connect()
        extra = (frame.get("timeout") or 0) / 1000 if frame["cmd"] in ("PULL", "PULLB", "PUSH") else 0
        budget = (timeout or self.options.command_timeout) + extra
        deadline = time.monotonic() + budget
        spec = COMMANDS.get(frame["cmd"])
        safe = bool(spec and (spec.read_only or spec.retry_safe))
        last: Exception | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if isinstance(last, CommandError):
                    raise NotLeader(f"{frame['cmd']}: no leader answered within {budget:.1f}s ({last})",
                                    last.code, last.reply) from last
                raise CommandTimeout(f"{frame['cmd']}: no reply within {budget:.1f}s ({last})") from last
            address = self._address_for(frame)
            if address is None:
                last = NotLeader("no known leader", "NO_LEADER")
                await self._pause_and_refresh()
                continue
            try:
                return await self._pool(address).pick().call(frame, remaining)
            except CommandError as exc:
                if exc.code in _NOT_APPLIED or (exc.code in _UNKNOWN_OUTCOME and safe):
                    last = exc
                    self._apply_hint(frame, exc)
                    await self._pause_and_refresh()
                    continue
                raise
            except (ConnectionLost, CommandTimeout) as exc:
                if not safe:
                    raise
                last = exc
                await self._pause_and_refresh()

    def _address_for(self, frame: dict[str, Any]) -> str | None:
        assert self.topology is not None
        partition = self.partition_of(frame)
        if partition is None:
            node = next(iter(self.topology.nodes.values()))
        else:
            node = self.topology.leader_of(partition)
        return f"{node.host}:{node.port}" if node else None

    def _apply_hint(self, frame: dict[str, Any], exc: CommandError) -> None:
        hint = exc.reply.get("leader")
        partition = self.partition_of(frame)
        if hint and partition is not None and self.topology is not None:
            info = self.topology.partition_map[partition]
            self.topology = self.topology.with_leader(partition, str(hint["nodeId"]), info.term + 1)

    async def _pause_and_refresh(self) -> None:
        await asyncio.sleep(_RETRY_PAUSE_S)
        try:
            await self.refresh_topology()
        except ShoalError:
            pass

    async def fan_out(self, frame: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Send a partition-routed command to every partition; replies by partition."""
        if self.topology is None:
            await self.connect()
        assert self.topology is not None
        partitions = range(self.topology.partitions)
        replies = await asyncio.gather(*(self.call({**frame, "partition": p}) for p in partitions))
        return dict(zip(partitions, replies))

    # --- events ---------------------------------------------------------------------------------

    async def events(self, queue: str | None = None, *, max_buffered: int = 10_000) -> AsyncIterator[dict[str, Any]]:
        """Job events of ``queue`` (or every queue) from every partition leader."""
        if self.topology is None:
            await self.connect()
        assert self.topology is not None
        buffer: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max_buffered)

        def listener(frame: dict[str, Any]) -> None:
            if queue is None or frame.get("queue") == queue:
                if not buffer.full():
                    buffer.put_nowait(frame)

        self._listeners.append(listener)
        try:
            frame: dict[str, Any] = {"cmd": "Subscribe"}
            if queue is not None:
                frame["queue"] = queue
            leaders = {f"{n.host}:{n.port}" for p in self.topology.partition_map
                       if (n := self.topology.leader_of(p.id)) is not None}
            for address in leaders:
                for conn in self._pool(address).connections:
                    await conn.call(frame, self.options.command_timeout)
            while True:
                yield await buffer.get()
        finally:
            self._listeners.remove(listener)

    # --- high-level handles ---------------------------------------------------------------------

    def queue(self, name: str) -> "AsyncQueue":
        from .queue import AsyncQueue
        return AsyncQueue(self, name)

    def tube(self, name: str) -> "AsyncTube":
        from .tube import AsyncTube
        return AsyncTube(self, name)

    async def ping(self) -> dict[str, Any]:
        return await self.call({"cmd": "Ping"})

    async def list_queues(self) -> list[str]:
        replies = await self.fan_out({"cmd": "ListQueues"})
        return sorted({q for r in replies.values() for q in r.get("queues", [])})

    async def stats(self) -> dict[str, Any]:
        replies = await self.fan_out({"cmd": "Stats"})
        return {str(p): r.get("stats") for p, r in replies.items()}

    async def cron_list(self) -> list[dict[str, Any]]:
        replies = await self.fan_out({"cmd": "CronList"})
        return [c for r in replies.values() for c in r.get("crons", [])]

    async def cron_delete(self, name: str) -> bool:
        replies = await self.fan_out({"cmd": "CronDelete", "name": name})
        return any(r.get("deleted") for r in replies.values())


from .queue import AsyncQueue  # noqa: E402  (type names for the handles above)
from .tube import AsyncTube  # noqa: E402
