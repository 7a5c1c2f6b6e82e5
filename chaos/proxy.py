"""A Toxiproxy-compatible TCP fault-injection proxy, in asyncio.

``ProxyServer`` serves Toxiproxy 2.x's HTTP API (so ``toxiproxy-python`` and
the other Toxiproxy clients drive it) and offers the same operations as a
Python API for Shoal's own chaos harness::

    server = ProxyServer("127.0.0.1", 0, seed=7)
    with server.run_in_thread() as srv:          # or: await server.start()
        proxy = srv.call(srv.create_proxy, "raft_1_2", "127.0.0.1:7001")
        srv.call(proxy.add_toxic, {"type": "latency", "attributes": {"latency": 50}})
        ...                                     # connect to proxy.listen

All proxy and toxic state lives on one event loop; from another thread use
``call()``. Randomness (jitter, toxicity, slicer sizes) comes from one
``random.Random(seed)``; each connection gets its own generator drawn from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import random
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from aiohttp import web

from shoal.chaos._api import build_app
from shoal.chaos._link import CHUNK_BYTES, Connection
from shoal.chaos.errors import (BadRequest, ChaosProxyError, PopulateError, ProxyExists, ProxyNotFound, ToxicExists,
                                ToxicNotFound)
from shoal.chaos.toxics import ToxicSpec

__all__ = ["Proxy", "ProxyServer", "PopulateError", "DEFAULT_API_PORT", "parse_address", "format_address"]

DEFAULT_API_PORT = 8474
CONNECT_TIMEOUT_S = 5.0
PROXIES_MAX = 10_000
TOXICS_PER_PROXY_MAX = 64

T = TypeVar("T")


def parse_address(address: Any) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → ``(host, port)``; an empty host is loopback.

    Toxiproxy binds every interface for an empty host; here it means
    127.0.0.1, so a forgotten host never exposes a port beyond loopback.
    """
    if not isinstance(address, str) or ":" not in address:
        raise BadRequest(f"bad address {address!r}: expected host:port")
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise BadRequest(f"bad address {address!r}: port is not a number") from None
    if not 0 <= port <= 65535:
        raise BadRequest(f"bad address {address!r}: port out of range")
    return host or "127.0.0.1", port


def format_address(host: str, port: int) -> str:
    """The inverse of ``parse_address`` (brackets around IPv6 literals)."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    return f"{host}:{port}"



class Proxy:
    """One named TCP proxy: a listener on ``listen`` forwarding to ``upstream``."""

    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self._rng = rng
        self._toxics: dict[str, ToxicSpec] = {}
        self._connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        # Bumped on every stop, so a connection that was still dialling the
        # upstream when the proxy went down is dropped rather than adopted.
        self._generation = 0

    @property
    def enabled(self) -> bool:
        """True while the proxy listens."""
        return self._server is not None

    @property
    def toxics(self) -> list[ToxicSpec]:
        """The toxics in the order they were added."""
        return list(self._toxics.values())

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def to_json(self) -> dict[str, Any]:
        """The API's JSON object for this proxy, toxics included."""
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in self._toxics.values()],
        }

    # Lifecycle.
    async def start(self) -> None:
        """Listen (enable); a port of 0 is resolved and written back to ``listen``."""
        if self._server is not None:
            return
        host, port = parse_address(self.listen)
        loop = asyncio.get_running_loop()
        try:
            # Bind one address only: "localhost" may resolve to two, and two
            # ephemeral binds would get two different ports.
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            bind_host = str(infos[0][4][0])
            self._server = await asyncio.start_server(
                self._accept, bind_host, port, limit=2 * CHUNK_BYTES, reuse_address=True
            )
        except OSError as exc:
            raise ChaosProxyError(f"proxy {self.name}: cannot listen on {self.listen}: {exc}") from exc
        bound = self._server.sockets[0].getsockname()
        self.listen = format_address(str(bound[0]), int(bound[1]))

    async def stop(self) -> None:
        """Stop listening (disable) and cut every connection."""
        self._generation += 1
        server, self._server = self._server, None
        if server is not None:
            server.close()
        connections = list(self._connections)
        for conn in connections:
            conn.close()
        await asyncio.gather(*(c.wait_closed() for c in connections), return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    async def update(
        self, *, listen: str | None = None, upstream: str | None = None, enabled: bool | None = None
    ) -> None:
        """Change fields; a new ``listen`` or ``upstream`` restarts the proxy."""
        if listen is not None:
            parse_address(listen)
        if upstream is not None:
            parse_address(upstream)
        want_enabled = self.enabled if enabled is None else enabled
        moved = (listen is not None and listen != self.listen) or (upstream is not None and upstream != self.upstream)
        if moved or not want_enabled:
            await self.stop()
        self.listen = listen if listen is not None else self.listen
        self.upstream = upstream if upstream is not None else self.upstream
        if want_enabled:
            await self.start()

    # Toxics.
    def add_toxic(self, spec: ToxicSpec | Mapping[str, Any]) -> ToxicSpec:
        """Add a toxic; it applies to live connections at once."""
        if not isinstance(spec, ToxicSpec):
            spec = ToxicSpec.from_json(spec)
        if spec.name in self._toxics:
            raise ToxicExists(spec.name)
        if len(self._toxics) >= TOXICS_PER_PROXY_MAX:
            raise BadRequest(f"too many toxics (max {TOXICS_PER_PROXY_MAX})")
        self._toxics[spec.name] = spec
        for conn in self._connections:
            conn.links[spec.stream].attach(spec)
        return spec

    def get_toxic(self, name: str) -> ToxicSpec:
        try:
            return self._toxics[name]
        except KeyError:
            raise ToxicNotFound(name) from None

    def update_toxic(self, name: str, body: Mapping[str, Any]) -> ToxicSpec:
        """Change a toxic's ``toxicity``/``attributes``; links redraw and restart it."""
        spec = self.get_toxic(name).updated(body)
        self._toxics[name] = spec
        for conn in self._connections:
            conn.links[spec.stream].attach(spec)
        return spec

    def remove_toxic(self, name: str) -> None:
        spec = self.get_toxic(name)
        del self._toxics[name]
        for conn in self._connections:
            conn.links[spec.stream].detach(name)

    def remove_all_toxics(self) -> None:
        for name in list(self._toxics):
            self.remove_toxic(name)

    # Connections.
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        generation = self._generation
        host, port = parse_address(self.upstream)
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=2 * CHUNK_BYTES), CONNECT_TIMEOUT_S
            )
        except (OSError, asyncio.TimeoutError):
            # Upstream down: the client sees its connection closed, as with Toxiproxy.
            writer.close()
            return
        if generation != self._generation or self._server is None:
            writer.close()
            upstream[1].close()
            return
        conn = Connection((reader, writer), upstream, random.Random(self._rng.getrandbits(64)), self._forget)
        self._connections.add(conn)
        conn.start(self._toxics.values())
        # Keep this callback's task alive for the connection's life, so the
        # streams stay referenced and stop() can await it through the conn.
        await conn.wait_closed()

    def _forget(self, conn: Connection) -> None:
        self._connections.discard(conn)


class ProxyServer:
    """The proxies plus the Toxiproxy HTTP API on ``host:port`` (port 0 = pick one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_API_PORT, *, seed: int | None = None) -> None:
        self.host = host
        self.port = port
        self.rng = random.Random(seed)
        self.proxies: dict[str, Proxy] = {}
        self._lock: asyncio.Lock | None = None
        self._runner: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def api_url(self) -> str:
        return f"http://{format_address(self.host, self.port)}"

    # Lifecycle.
    async def start(self) -> None:
        """Serve the HTTP API; afterwards ``port`` is the bound port."""
        if self._runner is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        runner = web.AppRunner(build_app(self), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop the API and every proxy (their connections are cut)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        proxies, self.proxies = list(self.proxies.values()), {}
        await asyncio.gather(*(p.stop() for p in proxies), return_exceptions=True)

    # Proxies.
    def _mutex(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def proxy(self, name: str) -> Proxy:
        """The proxy called ``name`` (``ProxyNotFound`` otherwise)."""
        try:
            return self.proxies[name]
        except KeyError:
            raise ProxyNotFound(name) from None

    async def create_proxy(
        self, name: str, upstream: str, listen: str = "127.0.0.1:0", enabled: bool = True
    ) -> Proxy:
        """Create (and unless ``enabled=False`` start) a proxy."""
        async with self._mutex():
            return await self._create(name, upstream, listen, enabled)

    async def _create(self, name: Any, upstream: Any, listen: Any, enabled: Any) -> Proxy:
        if not isinstance(name, str) or not name:
            raise BadRequest("missing required field: name")
        if not isinstance(upstream, str) or not upstream:
            raise BadRequest("missing required field: upstream")
        if not isinstance(enabled, bool):
            raise BadRequest("bad request body: enabled must be a boolean")
        listen = listen or "127.0.0.1:0"
        parse_address(listen)
        parse_address(upstream)
        if name in self.proxies:
            raise ProxyExists(name)
        if len(self.proxies) >= PROXIES_MAX:
            raise BadRequest(f"too many proxies (max {PROXIES_MAX})")
        proxy = Proxy(name, listen, upstream, self.rng)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def delete_proxy(self, name: str) -> None:
        async with self._mutex():
            proxy = self.proxy(name)
            del self.proxies[name]
            await proxy.stop()

    async def update_proxy(
        self, name: str, *, listen: str | None = None, upstream: str | None = None, enabled: bool | None = None
    ) -> Proxy:
        async with self._mutex():
            proxy = self.proxy(name)
            await proxy.update(listen=listen, upstream=upstream, enabled=enabled)
            return proxy

    async def populate(self, specs: Any) -> list[Proxy]:
        """Create or replace proxies from a list of ``{name, listen, upstream, enabled?}``.

        A proxy whose ``listen`` and ``upstream`` match is left alone. On an
        error, the ones done so far stay and ``PopulateError`` says which.
        """
        if not isinstance(specs, list):
            raise BadRequest("bad request body: expected a JSON array of proxies")
        done: list[Proxy] = []
        async with self._mutex():
            for spec in specs:
                try:
                    done.append(await self._populate_one(spec))
                except ChaosProxyError as exc:
                    raise PopulateError(exc, done) from exc
        return done

    async def _populate_one(self, spec: Any) -> Proxy:
        if not isinstance(spec, Mapping):
            raise BadRequest("bad request body: each proxy must be an object")
        name, listen, upstream = spec.get("name"), spec.get("listen") or "127.0.0.1:0", spec.get("upstream")
        existing = self.proxies.get(name) if isinstance(name, str) else None
        if existing is not None:
            if existing.listen == listen and existing.upstream == upstream:
                return existing
            del self.proxies[existing.name]
            await existing.stop()
        return await self._create(name, upstream, listen, spec.get("enabled", True))

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        failure: ChaosProxyError | None = None
        async with self._mutex():
            for proxy in self.proxies.values():
                proxy.remove_all_toxics()
                try:
                    await proxy.start()
                except ChaosProxyError as exc:  # e.g. its port was taken meanwhile
                    failure = failure or exc
        if failure is not None:
            raise failure

    # Threads.
    def call(self, fn: Callable[..., T | Awaitable[T]], *args: Any, timeout_s: float = 30.0, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the server's loop from another thread; await it if needed."""
        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("the proxy server is not running in a thread")

        async def invoke() -> T:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                return await result  # type: ignore[no-any-return]
            return result

        return asyncio.run_coroutine_threadsafe(invoke(), loop).result(timeout_s)

    @contextlib.contextmanager
    def run_in_thread(self, *, use_uvloop: bool = False, start_timeout_s: float = 10.0) -> Iterator[ProxyServer]:
        """Run the server on its own loop in a daemon thread for the ``with`` block."""
        if use_uvloop:
            import uvloop

            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="shoal-chaos-proxy", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(start_timeout_s)
            yield self
        finally:
            try:
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(self.stop(), loop).result(start_timeout_s)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(start_timeout_s)
                if not thread.is_alive():
                    loop.close()
