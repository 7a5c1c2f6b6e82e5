"""``Client``: the synchronous facade. The same methods as :class:`AsyncClient`, run on an
event loop in a background thread, so blocking code and notebooks can use Shoal."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

from ._async import AsyncClient
from .options import ConnectionOptions

__all__ = ["Client", "SyncHandle"]


class SyncHandle:
    """Wraps an async object (queue, tube): every coroutine method becomes a blocking call."""

    def __init__(self, target: Any, client: "Client") -> None:
        self._target = target
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._client._run(attr(*args, **kwargs))
            call.__doc__ = attr.__doc__
            call.__name__ = name
            return call
        if inspect.isasyncgenfunction(attr):
            def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
                return self._client._iterate(attr(*args, **kwargs))
            return iterate
        return attr

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._target)))


class Client:
    """Blocking client: ``with Client(["127.0.0.1:6789"]) as client: client.queue("q").add(...)``."""

    def __init__(self, seeds: list[str] | str, token: str | None = None,
                 options: ConnectionOptions | None = None, *, session: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shoal-client", daemon=True)
        self._thread.start()
        self._async = AsyncClient(seeds, token, options, session=session)
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, agen: Any) -> Iterator[Any]:
        while True:
            try:
                yield self._run(agen.__anext__())
            except StopAsyncIteration:
                return

    def connect(self) -> "Client":
        self._run(self._async.connect())
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> "Client":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def queue(self, name: str) -> SyncHandle:
        return SyncHandle(self._async.queue(name), self)

    def tube(self, name: str) -> SyncHandle:
        return SyncHandle(self._async.tube(name), self)

    def __getattr__(self, name: str) -> Any:
        # call, ping, list_queues, stats, cron_list, ... : the AsyncClient's methods, blocking.
        return getattr(SyncHandle(self._async, self), name)

    @property
    def topology(self) -> Any:
        return self._async.topology
