"""``shoal chaos …`` — fault-injection commands over :mod:`shoal.chaos`."""

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


@chaos.command("run")
@click.argument("scenario")
@click.option("--duration", type=click.FloatRange(5, 24 * 3600), default=20.0, show_default=True,
              help="Seconds of load; faults happen within it, then the queue is drained and checked.")
@click.option("--nodes", type=click.IntRange(3, 5), default=3, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 8), default=2, show_default=True)
@click.option("--seed", type=int, default=None, help="Seed of the proxies' randomness (printed when omitted).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for summary.txt, result.json, history.jsonl and timeline.png "
                   "[default: ./chaos-<scenario>].")
@click.option("--toxiproxy", default=None, metavar="HOST:PORT",
              help="Drive a running Toxiproxy instead of starting the built-in proxy.")
@click.option("--recovery-max", type=float, default=10.0, show_default=True,
              help="Seconds within which writes must be back after each fault is healed.")
@click.option("--soak", is_flag=True, help="Repeat the scenario until one run breaks an invariant or "
              "--duration runs out, each run 60 s of load.")
def run_command(scenario: str, duration: float, nodes: int, partitions: int, seed: int | None,
                out_dir: Path | None, toxiproxy: str | None, recovery_max: float, soak: bool) -> None:
    """Run SCENARIO against a fresh local cluster behind proxies; exit 1 if an invariant broke.

    Scenarios: leader-kill, leader-pause, partition-leader, majority-minority, flapping,
    slow-network, full-restart, bridge, one-way, reset-peer; membership changes under load:
    add-node, remove-leader-node (4 nodes), replace-wiped-node, membership-cut; real operations:
    pause-leader, pause-transfer-target, rolling-restart-during-rebalance,
    membership-change-under-partition. Reads are checked too: none may go back in time.
    """
    import random
    import time

    from shoal.chaos.scenarios import SCENARIOS, run_scenario

    if scenario not in SCENARIOS:
        raise click.BadParameter(f"choose from {', '.join(SCENARIOS)}", param_hint="SCENARIO")
    out = out_dir or Path(f"chaos-{scenario}")
    runs = 0
    deadline = time.monotonic() + duration
    rng = random.Random(seed)
    while True:
        runs += 1
        run_seed = seed if (seed is not None and not soak) else rng.randrange(1 << 30)
        report = run_scenario(scenario, duration_s=60.0 if soak else duration, nodes=nodes, seed=run_seed,
                              out_dir=out / f"run-{runs}" if soak else out, toxiproxy=toxiproxy,
                              partitions=partitions, recovery_max_s=recovery_max)
        click.echo(report.summary())
        click.echo(f"  report: {report.out_dir}")
        if not report.valid:
            sys.exit(1)
        if not soak or time.monotonic() + 60 > deadline:
            break
    if soak:
        click.echo(f"soak: {runs} runs of {scenario}, every invariant held")
