"""``shoal chaos …`` — fault-injection commands."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

__all__ = ["chaos", "proxy_command"]


@click.group()
def chaos() -> None:
    """Fault injection: a Toxiproxy-compatible proxy, nemeses, checkers."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _serve(host: str, port: int, seed: int | None, config: Any, use_uvloop: bool) -> None:
    from shoal.chaos.proxy import ProxyServer

    server = ProxyServer(host, port, seed=seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    try:
        if config is not None:
            proxies = await server.populate(config)
            click.echo(f"populated {len(proxies)} proxies", err=True)
        # One parseable line on stdout: scripts started with --listen :0 read the port here.
        click.echo(f"shoal chaos proxy: API on {server.api_url} (loop={'uvloop' if use_uvloop else 'asyncio'})")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await server.stop()


@chaos.command("proxy")
@click.option("--listen", default="127.0.0.1:8474", show_default=True, help="host:port of the HTTP API (port 0 = any).")
@click.option("--seed", type=int, default=None, help="Seed for jitter, toxicity and slicer randomness.")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="JSON list of proxies to populate at start (as Toxiproxy's -config).",
)
@click.option("--uvloop/--no-uvloop", "use_uvloop", default=True, show_default=True, help="Run on uvloop if installed.")
def proxy_command(listen: str, seed: int | None, config: Path | None, use_uvloop: bool) -> None:
    """Run a Toxiproxy-API-compatible proxy server until SIGINT/SIGTERM."""
    from shoal.chaos.errors import ChaosProxyError
    from shoal.chaos.proxy import parse_address

    try:
        host, port = parse_address(listen)
    except ChaosProxyError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    if not _is_loopback(host):
        click.echo(f"warning: the proxy API has no authentication and listens on {host}", err=True)
    proxies = None
    if config is not None:
        try:
            proxies = json.loads(config.read_text())
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--config") from exc
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            use_uvloop = False
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop) if use_uvloop else asyncio.Runner()
    try:
        with runner:
            runner.run(_serve(host, port, seed, proxies, use_uvloop))
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {listen}: {exc}") from exc
    except ChaosProxyError as exc:
        raise click.ClickException(str(exc)) from exc
    with contextlib.suppress(Exception):
        sys.stdout.flush()
