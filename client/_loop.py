"""The sync facade's machinery: an event loop in a background thread, and ``blocking()``,
which turns an async method of a handle into a blocking method of its sync twin
(same signature, same docstring)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = ["LoopThread", "LoopRunner", "SyncHandle", "blocking", "blocking_iter"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
_JOIN_TIMEOUT_S = 5.0


class LoopThread:
    """A private event loop running in a daemon thread."""

    def __init__(self, name: str = "shoal-client") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it is done (KeyboardInterrupt cancels it)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking Shoal call from the client's own loop thread would deadlock; "
                               "use the AsyncClient there")
        if self.loop.is_closed():
            coro.close()
            from .exceptions import ClientClosed
            raise ClientClosed("the client is closed")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async iterator from this thread, one item per blocking call."""
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self.loop.is_closed():
                try:
                    self.run(aclose())
                except Exception:
                    pass

    def stop(self) -> None:
        """Stop the loop and join the thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(_JOIN_TIMEOUT_S)
            if not self.thread.is_alive():
                self.loop.close()


class LoopRunner:
    """Runs coroutines on an existing loop from other threads (worker threads of a sync handler)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        while True:
            try:
                yield self.run(agen.__anext__())  # type: ignore[arg-type]
            except StopAsyncIteration:
                return


class SyncHandle:
    """Base of the sync twins: ``_async`` is the async handle, ``_runner`` the loop thread."""

    __slots__ = ("_async", "_runner")

    def __init__(self, target: Any, runner: "LoopThread | LoopRunner") -> None:
        self._async = target
        self._runner = runner


def blocking(fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]) -> Callable[Concatenate[Any, P], R]:
    """The blocking twin of the async method ``fn`` for a :class:`SyncHandle` subclass."""

    @functools.wraps(fn)
    def method(self: SyncHandle, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._runner.run(fn(self._async, *args, **kwargs))

    return method


def blocking_iter(fn: Callable[Concatenate[Any, P], AsyncIterator[R]]) -> Callable[Concatenate[Any, P], Iterator[R]]:
    """The blocking twin of the async generator method ``fn``."""

    @functools.wraps(fn)
    def method(self: SyncHandle, *args: P.args, **kwargs: P.kwargs) -> Iterator[R]:
        return self._runner.iterate(fn(self._async, *args, **kwargs))

    return method
