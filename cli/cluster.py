"""``shoal cluster``: run a local cluster (``up``, ``down``) and change a running cluster's shape
(``add-node``, ``remove-node``, ``replace-node``, ``rebalance``, ``settings``, ``status``).

The work is done by :mod:`shoal.cluster.launcher` (:class:`~shoal.cluster.launcher.LocalCluster`)
and :mod:`shoal.cluster.operator`; these commands parse options, print what the work says, and
turn an :class:`~shoal.cluster.operator.OperatorError` into an error exit (status 1).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from shoal.cluster import operator
from shoal.cluster.config import ConfigError
from shoal.cluster.guard import parse_tls
from shoal.cluster.launcher import NODES_MAX, READY_TIMEOUT_S, LocalCluster, settings_from_env, stop_detached
from shoal.cluster.operator import TIMEOUT_S, OperatorError, parse_bytes

from ._options import cluster_options

__all__ = ["cluster_group"]


@click.group("cluster")
def cluster_group() -> None:
    """Run a local cluster of node processes, and grow, shrink or rebalance a running cluster
    (local with --data, remote with --url)."""


# --- a local cluster -----------------------------------------------------------------------------------

@cluster_group.command("up")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, NODES_MAX))
@click.option("--partitions", default=8, show_default=True, type=click.IntRange(1, 1024))
@click.option("--data", "data_dir", default="./.shoal", show_default=True, type=click.Path(file_okay=False))
@click.option("--base-port", default=6789, show_default=True, type=click.IntRange(1024, 65000))
@click.option("--replication", default=3, show_default=True, type=click.IntRange(1, 7),
              help="Replicas per partition (capped at the node count).")
@click.option("--secret", default=None, envvar="SHOAL_CLUSTER_SECRET",
              help="Cluster secret for the Raft links (default: SHOAL_CLUSTER_SECRET, else a random one; "
                   "written to cluster.toml with mode 0600).")
@click.option("--detach", is_flag=True, help="Return once ready and leave the nodes running "
                                             "(stop them with `shoal cluster down`).")
@click.option("--token", "tokens", multiple=True, metavar="TOKEN",
              help="Client token the nodes require (repeatable). Default: SHOAL_AUTH_TOKENS, else none.")
def cluster_up(nodes: int, partitions: int, data_dir: str, base_port: int, replication: int, secret: str | None,
               detach: bool, tokens: tuple[str, ...]) -> None:
    """Start N local nodes and wait until every partition has a leader and every node is ready.

    Runs in the foreground: Ctrl-C or SIGTERM stops every node of the cluster
    cleanly, nodes `shoal cluster add-node` started since included. Run
    again on the same --data to bring the same cluster back with its data.
    Fails at once, naming the port, when a port a node needs is taken; a node
    counts as ready only once it answers with this cluster's id and the pid
    started for it.
    """
    try:
        tokens, node_env = settings_from_env(tokens, os.environ)
        # TLS goes into cluster.toml, so the launcher's own readiness checks speak it too.
        tls = parse_tls({}, os.environ)
        cluster = LocalCluster(nodes, partitions, data_dir, base_port, replication, tokens=tokens,
                               secret=secret or "", extra_env=node_env, tls=tls)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if tokens and cluster.config.tokens != tokens:  # an existing cluster.toml: the flags win
        cluster.config = replace(cluster.config, tokens=tokens)
        cluster.config_path.write_text(cluster.config.to_toml())
        click.echo(f"{cluster.config_path}: client tokens replaced", err=True)
    if not cluster.config.tokens:
        click.echo("warning: no client tokens: every local process can use this cluster "
                   "(secure it with --token)", err=True)
    if cluster.config_path.exists() and (len(cluster.config.nodes), cluster.config.partitions) != (nodes, partitions):
        click.echo(f"reusing {cluster.config_path}: {len(cluster.config.nodes)} nodes, "
                   f"{cluster.config.partitions} partitions (flags ignored)", err=True)
    stop_requested = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster.start(wait=False)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not stop_requested:
            try:
                cluster.wait_ready(min(1.0, max(0.1, deadline - time.monotonic())))
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        # Ready means settled: leaders on their preferred replicas, so no leadership moves
        # (and no TIMEOUT of an in-flight write) follow the "ready" line.
        while not stop_requested and time.monotonic() < deadline:
            if cluster.wait_balanced(min(1.0, max(0.1, deadline - time.monotonic()))):
                break
        else:
            if not stop_requested:
                raise TimeoutError(f"leaders did not settle on their preferred replicas within {READY_TIMEOUT_S}s")
    except (RuntimeError, TimeoutError) as exc:
        cluster.stop()
        raise click.ClickException(str(exc)) from exc
    except BaseException:
        cluster.stop()  # whatever went wrong, no node is left running behind the command
        raise
    if stop_requested:
        cluster.stop_all(click.echo)
        return
    click.echo(f"Shoal cluster ready: {len(cluster.node_ids)} nodes, {cluster.config.partitions} partitions, "
               f"cluster id {cluster.config.cluster_id}, data in {cluster.data_dir}")
    for n in cluster.config.nodes:
        click.echo(f"  {n.id}: client {n.host}:{n.port}  http http://{n.host}:{n.http_port}  "
                   f"pid {cluster.pid(n.id)}")
    token_hint = ", token=..." if cluster.config.tokens else ""
    click.echo(f"Connect with: Client({cluster.addresses!r}{token_hint})")
    if detach:
        click.echo("Detached; stop with: shoal cluster down --data " + str(cluster.data_dir))
        return
    click.echo("Press Ctrl-C to stop.")
    while not stop_requested:
        time.sleep(0.2)
        dead = [nid for nid, p in cluster.procs.items() if p.poll() is not None]
        for nid in dead:
            click.echo(f"node {nid} exited with code {cluster.procs[nid].returncode}; "
                       f"see {cluster.log_file(nid)}", err=True)
            cluster.procs.pop(nid)
        if not cluster.procs:
            cluster.stop_all(click.echo)  # nodes added since may still run
            raise click.ClickException("every node it started has exited")
    click.echo("stopping...")
    # Every node the data directory's pid files name, as `shoal cluster down` finds them.
    cluster.stop_all(click.echo)
    click.echo("stopped")


@cluster_group.command("down")
@click.option("--data", "data_dir", default="./.shoal", show_default=True, type=click.Path(file_okay=False))
def cluster_down(data_dir: str) -> None:
    """Stop the nodes of a detached local cluster (SIGTERM, then SIGKILL)."""
    stopped = stop_detached(Path(data_dir), click.echo)
    click.echo(f"{stopped} node(s) stopped")


# --- changing a running cluster's shape ------------------------------------------------------------------

def _options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every operator command takes: where the cluster is, how to authenticate, how long to wait."""
    command = click.option("--timeout", "timeout_s", default=TIMEOUT_S, show_default=True,
                           type=click.FloatRange(1, 86_400),
                           help="Seconds to wait for the cluster to reach the asked-for shape.")(command)
    return cluster_options(command)


def _refusals(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with a change the cluster did not make turned into an error exit saying why."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except OperatorError as exc:
            raise click.ClickException(str(exc)) from exc
    return run


@cluster_group.command("add-node")
@_options
@click.option("--id", "node_id", default=None, help="The new node's id (local default: the next n<k>).")
@click.option("--host", default=None, help="The host clients and peers reach it at (local default: the first node's).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Client port (local default: the next free).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=None, help="HTTP port.")
@click.option("--raft-port", type=click.IntRange(1, 65535), default=None, help="Raft port.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the node joined and the cluster settled, or return once it is registered.")
@_refusals
def add_node(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
             timeout_s: float, node_id: str | None, host: str | None, port: int | None, http_port: int | None,
             raft_port: int | None, wait: bool) -> None:
    """Add a node to the cluster and wait until it holds and leads its share of partitions.

    Locally: picks the next id and free ports, writes the node into cluster.toml, registers
    it, starts its process and waits. With --url: registers the node you describe (--id,
    --host, --port, --http-port, --raft-port); start its process yourself (before or after).
    With rebalance_auto off, it waits only until the node joined: `shoal cluster rebalance`
    then moves replicas onto it.
    """
    if url:
        missing = [flag for flag, value in (("--id", node_id), ("--host", host), ("--port", port),
                                            ("--http-port", http_port), ("--raft-port", raft_port)) if value is None]
        if missing:
            raise click.UsageError(f"with --url, give the new node's {', '.join(missing)} (you start its process)")
    deadline = time.monotonic() + timeout_s
    where = operator.connect(data_dir, url, token, ca, cert, key)
    operator.add_node(where, node_id, host, port, http_port, raft_port, wait=wait, deadline=deadline, say=click.echo)


@cluster_group.command("remove-node")
@click.argument("node_id")
@_options
@_refusals
def remove_node(node_id: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
                key: str | None, timeout_s: float) -> None:
    """Move every replica and leadership off NODE_ID, remove it from the cluster, then stop it.

    Locally the node's process is stopped and the node dropped from cluster.toml (its data
    directory stays). With --url, stop its process yourself once this returns.
    """
    deadline = time.monotonic() + timeout_s
    where = operator.connect(data_dir, url, token, ca, cert, key, exclude=[node_id])
    operator.remove_node(where, node_id, deadline=deadline, say=click.echo)


@cluster_group.command("replace-node")
@click.argument("node_id")
@_options
@click.option("--incarnation", default=None,
              help="With --url: the incarnation the new node runs (its /health says), started with the old "
                   "id and ports on an empty data directory.")
@_refusals
def replace_node(node_id: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
                 key: str | None, timeout_s: float, incarnation: str | None) -> None:
    """Rebuild a dead node's replicas on a fresh node of the same id and ports.

    The fresh node joins as a new Raft member (NODE_ID/<incarnation>): it never votes as the
    node whose disk was lost. Locally: stops NODE_ID's process if it runs, moves its data
    directory aside, starts a fresh process and replaces the old one with it. With --url: start
    the fresh node yourself and pass its --incarnation (from its /health).
    """
    if url and not incarnation:
        raise click.UsageError("with --url, give the fresh node's --incarnation (its /health names it)")
    deadline = time.monotonic() + timeout_s
    where = operator.connect(data_dir, url, token, ca, cert, key, exclude=[node_id])
    operator.replace_node(where, node_id, incarnation, deadline=deadline, say=click.echo)


@cluster_group.command("rebalance")
@_options
@_refusals
def rebalance(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
              timeout_s: float) -> None:
    """Move replicas to their targets and leadership to each partition's preferred node; wait until done.

    Needed only with rebalance_auto off (`shoal cluster settings --no-rebalance-auto`): with it on
    (the default) replicas move by themselves after a node joins or leaves.
    """
    where = operator.connect(data_dir, url, token, ca, cert, key)
    operator.rebalance(where, timeout_s, click.echo)


@cluster_group.command("settings")
@_options
@click.option("--move-rate", default=None, metavar="SIZE",
              help="Cluster-wide byte rate of moves (snapshots and catch-up to new replicas), e.g. 64MiB.")
@click.option("--rebalance-auto/--no-rebalance-auto", default=None,
              help="Move replicas by themselves after a node joins or leaves (default on).")
@click.option("--replication", type=click.IntRange(1, 7), default=None,
              help="Replicas per partition (capped at the active node count); waits until every partition has them.")
@_refusals
def settings(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
             timeout_s: float, move_rate: str | None, rebalance_auto: bool | None, replication: int | None) -> None:
    """Show the cluster's settings, or change them while the cluster runs (and moves run).

    A new move rate applies to running moves at once. A new replication factor is reached one
    membership change at a time per partition (also with rebalance_auto off: the command asks
    for a rebalance); the command waits until every partition has it.
    """
    changes: dict[str, Any] = {}
    if move_rate is not None:
        try:
            changes["moveRateBytesPerS"] = parse_bytes(move_rate)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--move-rate") from exc
    if rebalance_auto is not None:
        changes["rebalanceAuto"] = rebalance_auto
    if replication is not None:
        changes["replication"] = replication
    where = operator.connect(data_dir, url, token, ca, cert, key)
    operator.settings(where, changes, timeout_s, click.echo)


@cluster_group.command("status")
@_options
@_refusals
def status(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
           timeout_s: float) -> None:
    """Show the cluster's nodes (state, incarnation), partitions and every move in progress.

    Moves: partition, from → to, state, bytes sent of the total, rate and time left.
    """
    del timeout_s  # a status does not wait
    operator.status(data_dir, url, token, ca, cert, key, click.echo)
