"""The Toxiproxy 2.x HTTP API over a ``ProxyServer`` (aiohttp).

Status codes follow Toxiproxy: 201 for a created proxy and for populate, 204
for delete and reset, 200 otherwise; errors are ``{"error", "status"}`` with
400, 404, 409 or 500. Toxic updates accept POST and PATCH, as Toxiproxy does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web

from shoal.chaos.errors import BadRequest, ChaosProxyError, PopulateError
from shoal.chaos.toxics import ToxicSpec

__all__ = ["build_app", "API_VERSION", "ApiProxy", "ApiServer"]

#: The Toxiproxy API level served, with build metadata naming this server.
API_VERSION = "2.12.0+shoal"
REQUEST_BYTES_MAX = 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiProxy(Protocol):
    """What the API serves of one proxy (:class:`~shoal.chaos.proxy.Proxy`)."""

    @property
    def toxics(self) -> list[ToxicSpec]:
        """The toxics in the order they were added."""

    def to_json(self) -> dict[str, Any]:
        """The API's JSON object for this proxy, toxics included."""

    def add_toxic(self, spec: ToxicSpec | Mapping[str, Any]) -> ToxicSpec:
        """Add a toxic."""

    def get_toxic(self, name: str) -> ToxicSpec:
        """The toxic called ``name``."""

    def update_toxic(self, name: str, body: Mapping[str, Any]) -> ToxicSpec:
        """Change a toxic's ``toxicity``/``attributes``."""

    def remove_toxic(self, name: str) -> None:
        """Remove the toxic called ``name``."""


class ApiServer(Protocol):
    """What the API drives of the proxy server (:class:`~shoal.chaos.proxy.ProxyServer`): the server
    builds this app over itself, so the API knows it only through this."""

    @property
    def proxies(self) -> Mapping[str, ApiProxy]:
        """Every proxy by name."""

    def proxy(self, name: str) -> ApiProxy:
        """The proxy called ``name``."""

    async def create_proxy(self, name: str, upstream: str, listen: str = ..., enabled: bool = ...) -> ApiProxy:
        """Create (and unless ``enabled=False`` start) a proxy."""

    async def update_proxy(self, name: str, *, listen: str | None = None, upstream: str | None = None,
                           enabled: bool | None = None) -> ApiProxy:
        """Change a proxy's fields."""

    async def delete_proxy(self, name: str) -> None:
        """Stop and forget a proxy."""

    async def populate(self, specs: Any) -> Sequence[ApiProxy]:
        """Create or replace proxies from a list of specs."""

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Like Toxiproxy, refuse browsers: a web page must not be able to drive a
    # proxy server on localhost through the user's browser.
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return _error(403, "User agent not allowed")
    try:
        return await handler(request)
    except ChaosProxyError as exc:
        return _error(exc.status, str(exc))


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"bad request body: {exc}") from exc


def build_app(server: ApiServer) -> web.Application:
    """An aiohttp application serving ``server``'s proxies."""

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": API_VERSION})

    async def list_proxies(request: web.Request) -> web.Response:
        return web.json_response({name: p.to_json() for name, p in server.proxies.items()})

    async def create_proxy(request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body, dict):
            raise BadRequest("bad request body: expected a JSON object")
        proxy = await server.create_proxy(
            body.get("name"), body.get("upstream"), body.get("listen") or "127.0.0.1:0", body.get("enabled", True)
        )
        return web.json_response(proxy.to_json(), status=201)

    async def populate(request: web.Request) -> web.Response:
        body = await _body(request)
        # Toxiproxy's clients send either a bare list or {"proxies": [...]}.
        if isinstance(body, dict) and "proxies" in body:
            body = body["proxies"]
        try:
            proxies = await server.populate(body)
        except PopulateError as exc:
            payload = {"error": str(exc), "status": exc.status, "proxies": [p.to_json() for p in exc.proxies]}
            return web.json_response(payload, status=exc.status)
        return web.json_response({"proxies": [p.to_json() for p in proxies]}, status=201)

    async def reset(request: web.Request) -> web.Response:
        await server.reset()
        return web.Response(status=204)

    async def show_proxy(request: web.Request) -> web.Response:
        return web.json_response(server.proxy(request.match_info["proxy"]).to_json())

    async def update_proxy(request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body, dict):
            raise BadRequest("bad request body: expected a JSON object")
        enabled = body.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise BadRequest("bad request body: enabled must be a boolean")
        proxy = await server.update_proxy(
            request.match_info["proxy"], listen=body.get("listen"), upstream=body.get("upstream"), enabled=enabled
        )
        return web.json_response(proxy.to_json())

    async def delete_proxy(request: web.Request) -> web.Response:
        await server.delete_proxy(request.match_info["proxy"])
        return web.Response(status=204)

    async def list_toxics(request: web.Request) -> web.Response:
        proxy = server.proxy(request.match_info["proxy"])
        return web.json_response([t.to_json() for t in proxy.toxics])

    async def create_toxic(request: web.Request) -> web.Response:
        proxy = server.proxy(request.match_info["proxy"])
        spec = proxy.add_toxic(await _body(request))
        return web.json_response(spec.to_json())

    async def show_toxic(request: web.Request) -> web.Response:
        proxy = server.proxy(request.match_info["proxy"])
        return web.json_response(proxy.get_toxic(request.match_info["toxic"]).to_json())

    async def update_toxic(request: web.Request) -> web.Response:
        proxy = server.proxy(request.match_info["proxy"])
        spec = proxy.update_toxic(request.match_info["toxic"], await _body(request))
        return web.json_response(spec.to_json())

    async def delete_toxic(request: web.Request) -> web.Response:
        proxy = server.proxy(request.match_info["proxy"])
        proxy.remove_toxic(request.match_info["toxic"])
        return web.Response(status=204)

    app = web.Application(middlewares=[_errors], client_max_size=REQUEST_BYTES_MAX)
    app.router.add_get("/version", version)
    app.router.add_post("/reset", reset)
    app.router.add_get("/proxies", list_proxies)
    app.router.add_post("/proxies", create_proxy)
    app.router.add_post("/populate", populate)
    app.router.add_get("/proxies/{proxy}", show_proxy)
    app.router.add_post("/proxies/{proxy}", update_proxy)
    app.router.add_patch("/proxies/{proxy}", update_proxy)
    app.router.add_delete("/proxies/{proxy}", delete_proxy)
    app.router.add_get("/proxies/{proxy}/toxics", list_toxics)
    app.router.add_post("/proxies/{proxy}/toxics", create_toxic)
    app.router.add_get("/proxies/{proxy}/toxics/{toxic}", show_toxic)
    app.router.add_post("/proxies/{proxy}/toxics/{toxic}", update_toxic)
    app.router.add_patch("/proxies/{proxy}/toxics/{toxic}", update_toxic)
    app.router.add_delete("/proxies/{proxy}/toxics/{toxic}", delete_toxic)
    return app
