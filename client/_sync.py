"""``Client``: the blocking facade of :class:`AsyncClient`.

It runs an :class:`AsyncClient` on a private event loop in a background thread,
so routing, retries and connections are exactly the async client's; every
method is the async one, blocking. Handles (``queue()``, ``tube()``) are the
blocking twins :class:`Queue` and :class:`Tube`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from shoal.cluster.topology import Topology

from ._async import AsyncClient
from ._loop import LoopThread
from .options import ConnectionOptions
from .queue import Queue
from .tube import Tube

__all__ = ["Client"]


class Client:
    """Blocking client.

        with Client(["127.0.0.1:6789"], token=None, options=ConnectionOptions(command_timeout=5.0)) as client:
            job_id = client.queue("emails").add({"to": "a@example.com"})

    Thread-safe: calls from any number of threads share the background loop.
    """

    def __init__(self, seeds: list[str] | str, token: str | None = None,
                 options: ConnectionOptions | None = None, *, session: str | None = None) -> None:
        self._async = AsyncClient(seeds, token, options, session=session)
        self._runner = LoopThread()
        self._closed = False

    def __repr__(self) -> str:
        return f"<Client seeds={self._async.seeds}{' closed' if self._closed else ''}>"

    # --- lifecycle ------------------------------------------------------------------------------

    def connect(self) -> "Client":
        """Learn the topology from the seeds (see :meth:`AsyncClient.connect`)."""
        try:
            self._runner.run(self._async.connect())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Close the connections and stop the background loop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._async.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> "Client":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- properties -----------------------------------------------------------------------------

    @property
    def topology(self) -> Topology | None:
        """The freshest known topology."""
        return self._async.topology

    @property
    def options(self) -> ConnectionOptions:
        return self._async.options

    @property
    def session(self) -> str:
        return self._async.session

    # --- the AsyncClient's methods, blocking ----------------------------------------------------

    def queue(self, name: str, *, shards: int | None = None) -> Queue:
        """A blocking handle on queue ``name`` (``shards=k`` for a sharded queue)."""
        return Queue(self._async.queue(name, shards=shards), self._runner)

    def tube(self, name: str) -> Tube:
        """A blocking tarantool-style handle on queue ``name``."""
        return Tube(self._async.tube(name), self._runner)

    def call(self, frame: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Send a raw command frame to the right node (see :meth:`AsyncClient.call`)."""
        return self._runner.run(self._async.call(frame, timeout=timeout))

    def fan_out(self, frame: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Send a partition-routed command to every partition's leader; replies by partition."""
        return self._runner.run(self._async.fan_out(frame))

    def refresh_topology(self) -> Topology:
        """Ask the nodes for the topology now."""
        return self._runner.run(self._async.refresh_topology())

    def ping(self) -> dict[str, Any]:
        """``Ping`` any node."""
        return self._runner.run(self._async.ping())

    def list_queues(self) -> list[str]:
        """Every queue of the cluster."""
        return self._runner.run(self._async.list_queues())

    def stats(self) -> dict[int, Any]:
        """``Stats`` of every partition."""
        return self._runner.run(self._async.stats())

    def cron_list(self) -> list[dict[str, Any]]:
        """Every cron schedule of the cluster."""
        return self._runner.run(self._async.cron_list())

    def flow(self, parent: Mapping[str, Any], children: list[Mapping[str, Any]], *,
             idempotency_key: str | None = None) -> dict[str, Any]:
        """Add a flow (``PushFlow``); see :meth:`AsyncClient.flow`."""
        return self._runner.run(self._async.flow(parent, children, idempotency_key=idempotency_key))

    def get_children_values(self, job_id: str) -> dict[str, Any]:
        """A flow parent's children's results by child id."""
        return self._runner.run(self._async.get_children_values(job_id))

    def get_children_report(self, job_id: str) -> dict[str, Any]:
        """``GetChildrenValues`` in full (values, expected, done, errors by policy)."""
        return self._runner.run(self._async.get_children_report(job_id))

    def cron_delete(self, name: str) -> bool:
        """Delete a cron schedule; ``True`` if one was deleted."""
        return self._runner.run(self._async.cron_delete(name))

    def events(self, queue: str | None = None, *, max_buffered: int = 10_000) -> Iterator[dict[str, Any]]:
        """Job events (blocking iterator; break out of the loop to stop)."""
        return self._runner.iterate(self._async.events(queue, max_buffered=max_buffered))
