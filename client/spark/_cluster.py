"""Talking to the cluster from Spark's Python processes.

Nothing here is kept on the readers and writers that Spark pickles: every call
opens a client, does its work and closes it (``with connected(...)``), so no
socket, thread or lock ever travels to a worker.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from shoal.client import Client, ConnectionOptions, NotFound

from ._options import Connect, OptionError

__all__ = ["connected", "client_options", "discover_shards", "queue_type_of", "resolve_queues", "resolve_layout",
           "wire_names", "Layout"]

#: The queues a read covers: ``(queue, shard count or None)`` each, resolved once in the driver.
Layout = tuple[tuple[str, "int | None"], ...]
_SIDE_SUFFIX = ".spark-acks"

_SHARD_SUFFIX = re.compile(r"#(\d+)$")


def client_options(connect: Connect) -> ConnectionOptions:
    """Connection options for a Spark process: the command timeout from the options, no background refresh
    beyond the client's default."""
    return ConnectionOptions(command_timeout=connect.command_timeout_s,
                             connect_timeout=min(5.0, connect.command_timeout_s))


@contextlib.contextmanager
def connected(connect: Connect) -> Iterator[Client]:
    """A connected blocking :class:`Client`, closed when the block exits."""
    client = Client(list(connect.seeds), connect.token, client_options(connect))
    try:
        client.connect()
        yield client
    finally:
        client.close()


def discover_shards(client: Client, queue: str) -> int | None:
    """``k`` if the cluster holds sub-queues ``queue#0 ..`` (the highest index + 1), else ``None``."""
    top = -1
    for name in client.list_queues():
        base, sep, rest = name.rpartition("#")
        if sep and base == queue and rest.isdigit():
            top = max(top, int(rest))
    return top + 1 if top >= 0 else None


def queue_type_of(client: Client, queue_name: str) -> str | None:
    """``log`` or ``jobs`` for an existing (sub-)queue, ``None`` if it does not exist."""
    try:
        metrics = client.call({"cmd": "Metrics", "queue": queue_name})["metrics"]
    except NotFound:
        return None
    return "log" if metrics.get("type") == "log" else "jobs"


def wire_names(queue: str, shards: int | None) -> list[str]:
    """The wire names of a queue's (sub-)queues: ``q`` or ``q#0 .. q#k-1``."""
    return [f"{queue}#{i}" for i in range(shards)] if shards else [queue]


def resolve_queues(client: Client, connect: Connect) -> list[str]:
    """The queues named by ``queue``/``queues``, or those whose whole name matches ``queuePattern``
    (base names of sharded queues; the connector's side queues never match)."""
    if connect.queue_pattern is None:
        return list(connect.queues)
    pattern = re.compile(connect.queue_pattern)
    bases = set()
    for name in client.list_queues():
        base, sep, rest = name.rpartition("#")
        name = base if sep and rest.isdigit() else name
        if not name.endswith(_SIDE_SUFFIX) and pattern.fullmatch(name):
            bases.add(name)
    if not bases:
        raise OptionError(f"option queuePattern: {connect.queue_pattern!r} matches no queue of the cluster")
    return sorted(bases)


def resolve_layout(client: Client, connect: Connect) -> Layout:
    """Every queue of the read with its shard count (option ``shards``, else discovered)."""
    return tuple((q, connect.shards if connect.shards is not None else discover_shards(client, q))
                 for q in resolve_queues(client, connect))
