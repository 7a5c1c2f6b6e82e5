"""The node's HTTP port (aiohttp): health, readiness and metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .server import Node

__all__ = ["start_http", "build_app"]


def build_app(node: "Node") -> web.Application:
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def ready(_: web.Request) -> web.Response:
        missing = [p.id for p in node.topology.partition_map if p.leader is None]
        body: dict[str, Any] = {"ready": not missing and not node.stopping, "partitionsWithoutLeader": missing}
        return web.json_response(body, status=200 if body["ready"] else 503)

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(text=node.metrics.exposition(), content_type="text/plain", charset="utf-8")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(node.local_stats())

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/ready", ready)
    app.router.add_get("/prometheus", prometheus)
    app.router.add_get("/stats", stats)
    return app


async def start_http(node: "Node", host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(build_app(node), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner
