"""``AsyncClient``: partition-aware, pipelined, self-healing.

The routing, retry policy and request building live in :mod:`._core` (no I/O);
this module adds the I/O: per-node pools of :class:`~._connection.Connection`,
topology refreshes, and the retry loop. ``NOT_LEADER``/``NO_LEADER`` (never
applied) refresh the topology and retry within the command timeout;
``ConnectionLost``/timeouts (outcome unknown) are retried only for commands
that are safe to repeat. Pushes carry an idempotency key made by the client, so
a retried push never enqueues twice. A topology event pushed by a node (or the
topology in any ``Hello`` reply) updates routing at once.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from shoal.cluster.topology import Topology

from . import _core
from ._core import Action, Router
from ._pool import SHARED_POOLS as _SHARED_POOLS
from ._pool import Pool, acquire, release
from .exceptions import AuthError, ClientClosed, CommandError, ConnectionLost, NoLeader, ProtocolError, ShoalError
from .options import ConnectionOptions
from .queue import AsyncQueue
from .tube import AsyncTube

__all__ = ["AsyncClient", "PROCESS_SESSION"]

#: One lease session per process by default: clients in a process share pools and leases, and a
#: reconnecting connection identifies with it again so its leases survive within the node's grace.
LIST_PAGES_MAX = 10_000  # list_queues pages (of up to 10,000 names from each partition)
PROCESS_SESSION = f"c-{secrets.token_hex(16)}"  # 128 random bits: Identify takes a session over by id
_EVENTS_BUFFERED_MAX = 100_000
_ = _SHARED_POOLS  # re-exported for tests and tools


class AsyncClient:
    """The asyncio client.

        async with AsyncClient(["10.0.0.1:6789", "10.0.0.2:6789"], token="s3cret") as client:
            q = client.queue("emails")
            job_id = await q.add({"to": "a@example.com"})

    ``seeds`` are ``host:port`` client addresses; any one that answers gives the
    topology. ``session`` names the lease session (default: one per process).
    """

    def __init__(self, seeds: list[str] | str, token: str | None = None,
                 options: ConnectionOptions | None = None, *, session: str | None = None) -> None:
        self.seeds = [seeds] if isinstance(seeds, str) else list(seeds)
        self.token = token
        self.options = options or ConnectionOptions()
        self.session = session or PROCESS_SESSION
        self.router = Router(self.seeds)
        self.new_idempotency_key = _core.IdempotencyKeys()
        self._pools: dict[str, tuple[Pool, tuple[Any, ...]]] = {}
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._shards: dict[str, int] = {}
        self._refresh_task: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[Topology] | None = None
        self._rng = random.Random()
        self._closed = False

    def __repr__(self) -> str:
        return f"<AsyncClient seeds={self.seeds} pools={len(self._pools)}{' closed' if self._closed else ''}>"

    # --- lifecycle ------------------------------------------------------------------------------

    async def connect(self) -> "AsyncClient":
        """Learn the topology from the seeds (raises :class:`ConnectionLost` if none answers,
        :class:`AuthError` on a wrong token)."""
        if self._closed:
            raise ClientClosed("the client is closed")
        if self.router.topology is None:
            await self.refresh_topology()
        if self.options.topology_refresh > 0 and self._refresh_task is None:
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_loop())
        return self

    async def close(self) -> None:
        """Close the client; shared pools close when their last client lets go."""
        if self._closed:
            return
        self._closed = True
        for task in (self._refresh_task, self._refreshing):
            if task is not None:
                task.cancel()
        for pool, key in list(self._pools.values()):
            await release(key, self._on_event)
        self._pools.clear()

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # --- topology -------------------------------------------------------------------------------

    @property
    def topology(self) -> Topology | None:
        """The freshest known topology (``None`` before :meth:`connect`)."""
        return self.router.topology

    @topology.setter
    def topology(self, value: Topology | None) -> None:
        self.router.topology = value

    def _pool(self, address: str) -> Pool:
        entry = self._pools.get(address)
        if entry is None:
            if self._closed:
                raise ClientClosed("the client is closed")
            entry = self._pools[address] = acquire(address, self.options, self.token, self.session, self._on_event)
        return entry[0]

    async def refresh_topology(self) -> Topology:
        """Ask every known node (and the seeds) at once; merge views by Raft term.

        Returns as soon as every partition has a leader in the merged view, or when
        every node answered or failed (a paused node costs at most ``connect_timeout``).
        Concurrent callers share one refresh.
        """
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        return await asyncio.shield(self._refreshing)

    async def _refresh(self) -> Topology:
        addresses = self.router.addresses()
        timeout = self.options.connect_timeout
        tasks = {asyncio.ensure_future(self._hello(a, timeout)): a for a in addresses}
        errors: list[str] = []
        auth_error: AuthError | None = None
        answered = False
        try:
            for next_done in asyncio.as_completed(list(tasks), timeout=timeout * 2):
                try:
                    reply = await next_done
                except AuthError as exc:
                    auth_error = exc
                    errors.append(str(exc))
                    continue
                except (ShoalError, OSError) as exc:
                    errors.append(str(exc))
                    continue
                except asyncio.TimeoutError:
                    break
                try:
                    self.router.learn_wire(reply["topology"])
                except (KeyError, Exception) as exc:  # a malformed topology is the node's bug: skip it
                    errors.append(f"bad topology: {exc}")
                    continue
                answered = True
                if self.router.complete():
                    break
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
        if not answered and self.router.topology is None:
            if auth_error is not None:
                raise auth_error  # a wrong token is not a network problem: say so
            raise ConnectionLost("no node answered: " + "; ".join(errors or ["timeout"]))
        assert self.router.topology is not None
        return self.router.topology

    async def _hello(self, address: str, timeout: float) -> dict[str, Any]:
        conn = self._pool(address).pick()
        return await conn.call({"cmd": "Hello", "protocolVersion": 2 if self.options.pipelining else 1}, timeout)

    async def _refresh_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.options.topology_refresh)
            try:
                await self.refresh_topology()
            except ShoalError:
                pass

    def _on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("event") == "topology":
            try:
                self.router.learn_wire(frame.get("topology"))
            except Exception:  # a malformed event must not break the connection's reader
                pass
            return
        for listener in list(self._listeners):
            listener(frame)

    # --- routing and retries --------------------------------------------------------------------

    def partition_of(self, frame: dict[str, Any]) -> int | None:
        """The partition ``frame`` routes to (``None`` for node-level commands)."""
        return self.router.partition_of(frame)

    async def call(self, frame: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Send one command (a wire frame ``{cmd, ...}``) to the right node and return the ``ok`` reply.

        Leader changes and, for commands safe to repeat, lost links are retried until
        ``timeout`` (default ``command_timeout``, plus a long-poll's own wait) runs out.
        """
        if self._closed:
            raise ClientClosed("the client is closed")
        if self.router.topology is None:
            await self.connect()
        budget = _core.budget_s(frame, timeout or self.options.command_timeout)
        deadline = time.monotonic() + budget
        last: BaseException | None = None
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _core.exhausted_error(frame, last, budget) from last
            address = self.router.address_for(frame)
            if address is None:
                last = NoLeader(f"partition {self.router.partition_of(frame)} has no known leader", "NO_LEADER")
            else:
                try:
                    return await self._pool(address).pick().call(frame, remaining)
                except (ShoalError, OSError) as exc:
                    if isinstance(exc, ClientClosed) and self._closed:
                        raise
                    error = ConnectionLost(f"{address}: {exc}") if isinstance(exc, OSError) else exc
                    if _core.retry_action(error, frame) is Action.RAISE:
                        if error is exc:
                            raise
                        raise error from exc
                    last = error
                    if isinstance(error, CommandError) and self.router.apply_hint(frame, error.reply):
                        attempt += 1
                        continue  # straight to the leader the hint names
                    if self.router.partition_of(frame) is None:
                        self.router.skip_node()
            attempt += 1
            await self._between_retries(attempt, deadline)

    async def _between_retries(self, attempt: int, deadline: float) -> None:
        pause = _core.retry_pause_s(attempt, self._rng.random())
        await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        if time.monotonic() < deadline:
            try:
                async with asyncio.timeout(max(0.001, deadline - time.monotonic())):  # keeps a cancellation
                    await self.refresh_topology()
            except (ShoalError, TimeoutError):
                pass

    async def fan_out(self, frame: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Send a partition-routed command to every partition's leader with ``{partition: p}``;
        the replies by partition."""
        if self.router.topology is None:
            await self.connect()
        assert self.router.topology is not None
        partitions = range(self.router.topology.partitions)
        replies = await asyncio.gather(*(self.call({**frame, "partition": p}) for p in partitions))
        return dict(zip(partitions, replies))

    # --- events ---------------------------------------------------------------------------------

    async def events(self, queue: str | None = None, *,
                     max_buffered: int = 10_000) -> AsyncIterator[dict[str, Any]]:
        """Job events (``{event: "job", ...}``) of ``queue`` (or of every queue), from every node.

        One connection per node subscribes (and subscribes again after a reconnect).
        Events beyond ``max_buffered`` unread ones are dropped.
        """
        queues = None if queue is None else {queue}
        async for event in self._events(queues, max_buffered):
            yield event

    async def _events(self, queues: set[str] | None, max_buffered: int) -> AsyncIterator[dict[str, Any]]:
        if self.router.topology is None:
            await self.connect()
        buffer: asyncio.Queue[dict[str, Any]] = asyncio.Queue(min(max(1, max_buffered), _EVENTS_BUFFERED_MAX))

        def listener(frame: dict[str, Any]) -> None:
            job = frame.get("job")
            name = frame.get("queue") or (job.get("queue") if isinstance(job, dict) else None)
            if (queues is None or name in queues) and not buffer.full():
                buffer.put_nowait(frame)

        self._listeners.append(listener)
        try:
            frames = [{"cmd": "Subscribe"}] if queues is None else \
                [{"cmd": "Subscribe", "queue": q} for q in sorted(queues)]
            for address in self.router.addresses():
                conn = self._pool(address).connections[0]
                for frame in frames:
                    conn.subscribe(frame)
                    try:
                        await conn.call(frame, self.options.command_timeout)
                    except (ConnectionLost, ProtocolError, OSError):
                        pass  # subscribes again when it reconnects
            while True:
                yield await buffer.get()
        finally:
            self._listeners.remove(listener)

    # --- high-level handles ---------------------------------------------------------------------

    def queue(self, name: str, *, shards: int | None = None) -> AsyncQueue:
        """A handle on queue ``name``; ``shards=k`` if it was created with ``k`` shards."""
        if shards is not None:
            self._shards[name] = shards
        return AsyncQueue(self, name, shards=self._shards.get(name))

    def tube(self, name: str) -> AsyncTube:
        """A tarantool-style handle on queue ``name``."""
        return AsyncTube(self, name)

    async def ping(self) -> dict[str, Any]:
        """``Ping`` any node: ``{pong: True, time}``."""
        return await self.call({"cmd": "Ping"})

    async def list_queues(self) -> list[str]:
        """Every queue of the cluster (merged from every partition's leader, page by page)."""
        names: set[str] = set()
        after: str | None = None
        for _ in range(LIST_PAGES_MAX):
            frame: dict[str, Any] = {"cmd": "ListQueues"}
            if after is not None:
                frame["after"] = after
            replies = await self.fan_out(frame)
            page = sorted({q for r in replies.values() for q in r.get("queues") or []})
            names.update(page)
            if not page or not any(r.get("more") for r in replies.values()):
                break
            # Every partition listed its names up to some point: the smallest of their last
            # names is where all of them are complete.
            after = min(r["queues"][-1] for r in replies.values() if r.get("more") and r.get("queues"))
        return sorted(names)

    async def stats(self) -> dict[int, Any]:
        """``Stats`` of every partition, by partition."""
        replies = await self.fan_out({"cmd": "Stats"})
        return {p: r.get("stats") for p, r in replies.items()}

    async def cron_list(self) -> list[dict[str, Any]]:
        """Every cron schedule of the cluster."""
        replies = await self.fan_out({"cmd": "CronList"})
        return [c for r in replies.values() for c in r.get("crons") or []]

    async def flow(self, parent: Mapping[str, Any], children: list[Mapping[str, Any]], *,
                   idempotency_key: str | None = None) -> dict[str, Any]:
        """Add a flow (``PushFlow``): ``parent`` waits in ``waiting-children`` until every child
        is done, then runs and reads their results with :meth:`get_children_values`.

        Jobs are wire-form dicts: ``{"queue", "data", ...PUSH options}``; a child may hold its
        own ``children`` and an ``onFailure`` (``fail`` the parent, the default; ``ignore``;
        ``remove``). Children may live in any queue. Returns the tree with ids:
        ``{"id", "queue", "children": [...]}``. Safe to retry: the flow carries one
        idempotency key, so a re-sent flow adds nothing twice.
        """
        frame = {"cmd": "PushFlow", "parent": dict(parent), "children": [dict(c) for c in children],
                 "idempotencyKey": idempotency_key or self.new_idempotency_key()}
        ids = iter((await self.call(frame))["ids"])

        def tree(item: Mapping[str, Any], subs: list[Mapping[str, Any]]) -> dict[str, Any]:
            node = {"id": next(ids), "queue": item["queue"]}
            node["children"] = [tree(c, c.get("children") or []) for c in subs]
            return node

        return tree(parent, children)

    async def get_children_values(self, job_id: str) -> dict[str, Any]:
        """A flow parent's children's results: ``{child id: result}`` of each completed child."""
        return dict((await self.call({"cmd": "GetChildrenValues", "id": job_id}))["values"])

    async def get_children_report(self, job_id: str) -> dict[str, Any]:
        """``GetChildrenValues`` in full: ``values``, ``expected``, ``done`` and the errors of
        failed children by policy (``ignored``, ``removed``, ``failed``)."""
        return await self.call({"cmd": "GetChildrenValues", "id": job_id})

    async def cron_delete(self, name: str) -> bool:
        """Delete the cron schedule ``name`` wherever it lives; ``True`` if one was deleted."""
        replies = await self.fan_out({"cmd": "CronDelete", "name": name})
        return any(r.get("deleted") for r in replies.values())
