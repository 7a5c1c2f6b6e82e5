"""``shoal cluster add-node | remove-node | replace-node | rebalance | settings | status``.

Theory of operation. Every command talks to one node's HTTP admin API
(:mod:`.admin_client`): it asks for a change, which the node registry spreads by gossip and
the partitions' leaders carry out one membership change at a time, then polls
``GET /admin/cluster?all=1`` until the cluster has the asked-for shape. While it waits it
prints a line whenever something changed (:class:`ProgressPrinter`); ``--timeout`` bounds the
wait. It exits 0 only once the shape is reached, else non-zero saying what was not in place.

Two forms of every command:

- local (``--data DIR``, a cluster of ``shoal cluster up``): the command also does what an
  operator does by hand elsewhere. It picks the next node id and ports, writes the node into
  ``cluster.toml`` (keeping ``[cluster] bootstrap``, the nodes the cluster was created with,
  which every node needs to know its partitions' first memberships), starts and stops node
  processes by pid, and moves a replaced node's data directory aside;
- remote (``--url`` of any node's HTTP port, ``--token``): compose or Kubernetes, where the
  operator starts and stops the node processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from .admin_client import AdminClient, AdminError, ClusterShape
from .config import ClusterConfig, ConfigError, NodeSpec, load_config
from .launcher import (PORT_RELEASE_WAIT_S, STOP_TIMEOUT_S, ForeignNode, LocalCluster, PortInUse, _is_our_node,
                       _PASSED_TO_NODES, _pids_in, _port_free, check_ports_free, node_health, write_cluster_file)
from .registry import ACTIVE, REMOVED, Registry, node_of_member

__all__ = ["add_node", "remove_node", "replace_node", "rebalance", "settings", "status", "ProgressPrinter",
           "parse_bytes", "format_bytes", "format_move", "next_node_id", "next_ports", "with_node", "without_node",
           "unsettled", "COMMANDS", "TIMEOUT_S", "HEARTBEAT_S"]

#: Default bound of every command's wait.
TIMEOUT_S = 600.0
#: While moves run and nothing else changes, how often their bytes, rate and time left are printed.
HEARTBEAT_S = 10.0
POLL_S = 0.5
#: Moves listed in one progress or status line before "and N more".
MOVES_SHOWN_MAX = 4
#: Node ids the local form picks: ``n1``, ``n2``, ...
_NODE_ID = re.compile(r"n(\d+)")
#: Ports of node *i* in a local cluster's layout (:func:`~.launcher.port_layout`) stay below the
#: first Raft port for fewer than this many nodes.
_LAYOUT_NODES_MAX = 50
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*(?:/s)?\s*", re.IGNORECASE)


# --- pure helpers (no sockets) ---------------------------------------------------------------------

def parse_bytes(text: str) -> int:
    """``"64MiB"``, ``"64MB"``, ``"1.5G"``, ``"1048576"`` (and with ``/s``) as a number of bytes.

    Units are powers of 1024 whether or not written with an ``i``: a byte rate is no disk size.
    """
    found = _SIZE.fullmatch(text)
    if not found:
        raise ValueError(f"{text!r} is not a size (like 64MiB, 512KiB, 1GiB or a number of bytes)")
    number, unit = float(found.group(1)), found.group(2).lower()
    return int(number * 1024 ** " kmgt".index(unit or " "))


def format_bytes(n: float | None) -> str:
    """``512 B``, ``1.5 KiB``, ``64.0 MiB``, ``2.0 GiB``."""
    if n is None:
        return "-"
    units = ("B", "KiB", "MiB", "GiB")
    k = 0
    while abs(n) >= 1024 and k < len(units) - 1:
        n /= 1024
        k += 1
    return f"{n:.0f} B" if k == 0 else f"{n:.1f} {units[k]}"


def format_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = max(0, round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _arrow(move: dict[str, Any]) -> str:
    """``n1 → n4``; member ids where they are not plain node ids (``n3 → n3/<incarnation>``); a new
    replica ``→ n4``, one leaving ``n1 →``."""
    src = move.get("fromMember") or move.get("from") or ""
    dst = move.get("toMember") or move.get("to") or ""
    return f"{src} → {dst}".strip()


def format_move(move: dict[str, Any]) -> str:
    """One move as ``p3 n1 → n4 catching up 1.0 MiB/4.0 MiB 512.0 KiB/s ETA 6s``."""
    parts = [f"p{move.get('partition')}", _arrow(move), str(move.get("state", ""))]
    if "bytesSent" in move:
        parts.append(f"{format_bytes(move['bytesSent'])}/{format_bytes(move.get('bytesTotal'))}")
        if move.get("rateBytesPerS") is not None:
            parts.append(f"{format_bytes(move['rateBytesPerS'])}/s")
        parts.append(f"ETA {format_duration(move.get('etaS'))}")
    elif "matchIndex" in move:
        parts.append(f"log {move['matchIndex']}/{move.get('commitIndex')}")
    return " ".join(parts)


def _moves_text(moves: list[dict[str, Any]]) -> str:
    shown = "; ".join(format_move(m) for m in moves[:MOVES_SHOWN_MAX])
    more = len(moves) - MOVES_SHOWN_MAX
    return shown + (f"; and {more} more" if more > 0 else "")


def holdings(shape: ClusterShape) -> str:
    """Every live node with its state, replicas held and partitions led: ``n1 (leaving): 2 replicas, leads 0``."""
    parts = shape.topology["partitionMap"]
    out = []
    for entry in shape.registry.live():
        held = sum(entry.id in p["replicas"] for p in parts)
        led = sum(p["leader"] == entry.id for p in parts)
        state = "" if entry.state == ACTIVE else f" ({entry.state})"
        out.append(f"{entry.id}{state}: {held} replicas, leads {led}")
    return " | ".join(out)


def unsettled(shape: ClusterShape, limit: int = 8) -> list[str]:
    """What keeps ``shape`` from being settled, one line per partition out of place (at most ``limit``)."""
    out: list[str] = []
    for p, target in sorted(shape.placement.items()):
        replicas, leader = shape.replicas(p), shape.leader(p)
        members = shape.members(p)
        if leader is None:
            out.append(f"p{p}: no leader")
        elif sorted(replicas) != sorted(node_of_member(m) for m in target):
            out.append(f"p{p}: replicas {','.join(replicas)}, target {','.join(map(node_of_member, target))}")
        elif members is not None and (sorted(members[0]) != sorted(target) or members[1]):
            learners = f", learners {','.join(members[1])}" if members[1] else ""
            out.append(f"p{p}: members {','.join(members[0])}{learners}, target {','.join(target)}")
        elif shape.memberships is not None and members is None:
            out.append(f"p{p}: its leader {leader} did not report its membership")
    if shape.moves:
        out.append(f"moves running: {_moves_text(shape.moves)}")
    if len(out) > limit:
        out = out[:limit] + [f"and {len(out) - limit} more"]
    return out


def balance_gaps(shape: ClusterShape) -> list[str]:
    """Partitions not led by their preferred (first target) node."""
    return [f"p{p}: led by {shape.leader(p) or 'nobody'}, preferred {node_of_member(t[0])}"
            for p, t in sorted(shape.placement.items()) if t and shape.leader(p) != node_of_member(t[0])]


def _move_key(move: dict[str, Any]) -> tuple[Any, ...]:
    """A move's identity across polls: its partition and the member leaving (or, for a new
    replica, the one joining), so ``n1 → n4`` that becomes ``n1 →`` once n4 votes stays one move."""
    src = move.get("fromMember") or move.get("from")
    return (move.get("partition"), "-", src) if src else (move.get("partition"), "+", move.get("toMember") or move.get("to"))


def _phase(move: dict[str, Any]) -> tuple[Any, bool]:
    """What a progress line reports a change of: the move's state, and whether a snapshot streams."""
    return move.get("state"), "bytesTotal" in move


def _short(move: dict[str, Any]) -> str:
    return f"p{move.get('partition')} {_arrow(move)}"


def _listed(moves: list[dict[str, Any]], show: Callable[[dict[str, Any]], str]) -> str:
    text = ", ".join(show(m) for m in moves[:MOVES_SHOWN_MAX])
    more = len(moves) - MOVES_SHOWN_MAX
    return text + (f" and {more} more" if more > 0 else "")


class ProgressPrinter:
    """Called with every polled :class:`ClusterShape`; prints a line when something changed.

    Per poll at most: the nodes' holdings when they changed, one line of the moves that
    started, one of those whose state changed (or whose snapshot stream began), one of those
    that finished; and every
    ``heartbeat_s`` while moves run and nothing changed, their bytes, rate and time left.
    A poll that shows what the last one did prints nothing.
    """

    def __init__(self, echo: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.echo = echo
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.started = clock()
        self.last: ClusterShape | None = None
        self._holdings = ""
        self._moves: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._beat = self.started

    def _say(self, text: str) -> None:
        self.echo(f"[{self.clock() - self.started:5.0f}s] {text}")

    def __call__(self, shape: ClusterShape) -> None:
        self.last = shape
        now = self.clock()
        text = holdings(shape)
        if text != self._holdings:
            self._holdings = text
            self._say(text)
        current: dict[tuple[Any, ...], dict[str, Any]] = {}
        for move in shape.moves:
            key = _move_key(move)
            old = self._moves.get(key)
            if old is not None and not (move.get("toMember") or move.get("to")):
                # The joining replica votes now; the move goes on (the old one leaves): keep naming it.
                move = {**move, "to": old.get("to"), "toMember": old.get("toMember")}
            current[key] = move
        started = [m for k, m in current.items() if k not in self._moves]
        changed = [m for k, m in current.items() if k in self._moves and _phase(self._moves[k]) != _phase(m)]
        finished = [m for k, m in self._moves.items() if k not in current]
        if started:
            self._say(f"started {len(started)} move{'s' if len(started) > 1 else ''}: {_listed(started, _short)}")
        if changed:
            self._say(_listed(changed, format_move))
        if finished:
            self._say(f"finished {len(finished)} move{'s' if len(finished) > 1 else ''}: {_listed(finished, _short)}")
        self._moves = current
        if started or changed or finished:
            self._beat = now
        elif current and now - self._beat >= self.heartbeat_s:
            self._beat = now
            self._say(f"{len(current)} move{'s' if len(current) > 1 else ''} running: "
                      f"{_listed(list(current.values()), format_move)}")


def next_node_id(taken: Iterable[str]) -> str:
    """``n<k+1>`` for the highest ``n<k>`` among ``taken`` (ids in the registry, also removed
    ones, in the cluster file, and data directories): an id is never given twice."""
    numbers = [int(m.group(1)) for m in (_NODE_ID.fullmatch(t) for t in taken) if m]
    return f"n{max(numbers, default=0) + 1}"


def next_ports(first: NodeSpec, node_id: str, taken: set[int],
               free: Callable[[int], bool]) -> tuple[int, int, int]:
    """(client, http, raft) ports for ``node_id`` in the local layout that starts at ``first``
    (node *i*: client ``base + 2i``, HTTP ``base + 2i + 1``, Raft ``raft_base + i``): the node's
    own slot when it is free, else the next free slot. ValueError when the layout is full."""
    found = _NODE_ID.fullmatch(node_id)
    start = int(found.group(1)) - 1 if found else 0
    for i in range(start, _LAYOUT_NODES_MAX):
        ports = (first.port + 2 * i, first.port + 2 * i + 1, first.raft_port + i)
        if all(1 <= p <= 65535 and p not in taken and free(p) for p in ports):
            return ports
    raise ValueError(f"no free ports in the local layout from {first.port} (give --port, --http-port, --raft-port)")


def with_node(config: ClusterConfig, spec: NodeSpec, bootstrap: tuple[str, ...]) -> ClusterConfig:
    """``config`` with ``spec`` appended and ``bootstrap`` kept as the nodes the cluster was created with."""
    return replace(config, nodes=(*config.nodes, spec), bootstrap_nodes=config.bootstrap_nodes or bootstrap)


def without_node(config: ClusterConfig, node_id: str, bootstrap: tuple[str, ...]) -> ClusterConfig:
    """``config`` without ``node_id`` (and routes to it); the bootstrap list still names it."""
    nodes = tuple(replace(n, raft_routes=tuple(r for r in n.raft_routes if r[0] != node_id))
                  for n in config.nodes if n.id != node_id)
    return replace(config, nodes=nodes, bootstrap_nodes=config.bootstrap_nodes or bootstrap)


def _bootstrap_of(config: ClusterConfig, registry: Registry) -> tuple[str, ...]:
    """The nodes the cluster was created with: the registry's record (every node keeps it), else the
    file's list as it stands (a cluster file never grown lists exactly them)."""
    return tuple(registry.bootstrap) or config.bootstrap_ids()


# --- where the cluster is --------------------------------------------------------------------------

@dataclass
class Where:
    """The admin API to use, and for the local form the cluster's directory and file."""

    admin: AdminClient
    data_dir: Path | None = None
    config: ClusterConfig | None = None

    @property
    def local(self) -> bool:
        return self.config is not None

    @property
    def config_path(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "cluster.toml"


def _url(host: str, port: int, tls: bool) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{host}:{port}"


def _running_pids(data_dir: Path) -> dict[str, int]:
    return {node_id: pid for node_id, pid, _ in _pids_in(data_dir) if _is_our_node(pid)}


def _local_config(data_dir: Path) -> ClusterConfig:
    path = data_dir / "cluster.toml"
    if not path.exists():
        raise click.ClickException(f"no cluster at {data_dir} (no cluster.toml); start one with "
                                   f"`shoal cluster up --data {data_dir}`, or use --url for a remote cluster")
    try:
        return load_config(path, env={})
    except ConfigError as exc:
        raise click.ClickException(f"{path}: {exc}") from exc


def _local_admin(data_dir: Path, config: ClusterConfig, token: str | None,
                 exclude: Iterable[str] = ()) -> AdminClient | None:
    """The admin API of a running node of this cluster (its registry names this cluster's id)."""
    excluded = set(exclude)
    token = token or (config.tokens[0] if config.tokens else None)
    ctx = config.tls.client_context() if config.tls else None
    running = _running_pids(data_dir)
    # Nodes with a live pid first; then the others (a cluster started some other way).
    for n in sorted(config.nodes, key=lambda n: (n.id not in running, n.id)):
        if n.id in excluded:
            continue
        admin = AdminClient(_url(n.host, n.http_port, ctx is not None), token, ctx)
        try:
            shape = admin.shape()
        except (AdminError, KeyError, ValueError):
            continue
        if shape.registry.cluster_id == config.cluster_id:
            return admin
    return None


def _remote_admin(url: str, token: str | None, ca: str | None, cert: str | None, key: str | None) -> AdminClient:
    ctx = None
    if url.startswith("https://"):
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    return AdminClient(url, token, ctx)


def _connect(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
             exclude: Iterable[str] = ()) -> Where:
    if url:
        return Where(_remote_admin(url, token, ca, cert, key))
    path = Path(data_dir).absolute()
    config = _local_config(path)
    admin = _local_admin(path, config, token, exclude)
    if admin is None:
        others = f" (other than {', '.join(exclude)})" if exclude else ""
        raise click.ClickException(f"no node of the cluster at {path}{others} answers its admin API: is it running? "
                                   f"(`shoal cluster up --data {path}`)")
    return Where(admin, path, config)


def _options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every operator command takes: where the cluster is, how to authenticate, how long to wait."""
    for option in reversed((
        click.option("--data", "data_dir", default="./.shoal", show_default=True, type=click.Path(file_okay=False),
                     help="A local cluster's directory (of `shoal cluster up`)."),
        click.option("--url", default=None, envvar="SHOAL_ADMIN_URL", metavar="URL",
                     help="Any node's HTTP address (http[s]://host:port) for a remote cluster "
                          "(default: $SHOAL_ADMIN_URL); without it the local cluster at --data."),
        click.option("--token", default=None, envvar="SHOAL_TOKEN",
                     help="A client token of the cluster (default: $SHOAL_TOKEN; locally, the cluster file's first)."),
        click.option("--ca", default=None, type=click.Path(dir_okay=False, exists=True),
                     help="With an https --url: the CA certificate to trust (default: the system's)."),
        click.option("--cert", default=None, type=click.Path(dir_okay=False, exists=True),
                     help="With an https --url: a client certificate to present (nodes with client_certs)."),
        click.option("--key", default=None, type=click.Path(dir_okay=False, exists=True),
                     help="The key of --cert."),
        click.option("--timeout", "timeout_s", default=TIMEOUT_S, show_default=True, type=click.FloatRange(1, 86_400),
                     help="Seconds to wait for the cluster to reach the asked-for shape."),
    )):
        command = option(command)
    return command


def _call(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except AdminError as exc:
        if not exc.status:
            raise click.ClickException(f"cannot reach the admin API: {exc}") from exc
        raise click.ClickException(f"the admin API refused (HTTP {exc.status} {exc.code}): {exc}") from exc


def _wait(where: Where, done: Callable[[ClusterShape], bool], timeout_s: float, what: str,
          printer: ProgressPrinter | None = None,
          gaps: Callable[[ClusterShape], list[str]] = unsettled) -> ClusterShape:
    """Poll until ``done``, printing progress; ClickException naming what was not in place on timeout."""
    printer = printer or ProgressPrinter(click.echo)
    try:
        return where.admin.wait(done, timeout_s, POLL_S, printer)
    except TimeoutError as exc:
        shape = printer.last
        detail = "; ".join(gaps(shape)) if shape is not None else "no node answered the admin API"
        raise click.ClickException(f"{what} did not happen within {timeout_s:.0f} s: {detail or 'see above'}") from exc


def _settled_and_balanced(shape: ClusterShape) -> bool:
    return shape.settled() and shape.leaders_balanced()


def _gaps_and_balance(shape: ClusterShape) -> list[str]:
    return unsettled(shape) or balance_gaps(shape)[:MOVES_SHOWN_MAX]


def _stop_pid(node_id: str, pid: int, pid_file: Path | None) -> None:
    """SIGTERM (graceful: leadership handed over), SIGKILL after the launcher's stop timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _is_our_node(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_our_node(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _is_our_node(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    if _is_our_node(pid):
        raise click.ClickException(f"{node_id} (pid {pid}) did not exit")
    if pid_file is not None:
        pid_file.unlink(missing_ok=True)


def _stop_local(where: Where, node_id: str) -> int | None:
    """Stop ``node_id``'s process of the local cluster when it runs; its pid, or None."""
    assert where.data_dir is not None
    for found, pid, pid_file in _pids_in(where.data_dir):
        if found == node_id and _is_our_node(pid):
            click.echo(f"stopping {node_id} (pid {pid})")
            _stop_pid(node_id, pid, pid_file)
            return pid
    return None


def _launcher(where: Where) -> LocalCluster:
    env = {k: v for k, v in os.environ.items() if k in _PASSED_TO_NODES and v}
    return LocalCluster(data_dir=where.data_dir or ".", extra_env=env)


def _start_local(where: Where, node_id: str, deadline: float) -> tuple[LocalCluster, int]:
    """Start ``node_id`` from the cluster file and wait until its ports answer as this cluster's node."""
    cluster = _launcher(where)
    try:
        check_ports_free(cluster.config, [node_id], PORT_RELEASE_WAIT_S)
        pid = cluster.start_node(node_id)
    except (PortInUse, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"started {node_id} (pid {pid}, log {cluster.log_file(node_id)})")
    while True:
        if cluster.procs[node_id].poll() is not None:
            raise click.ClickException(cluster.exit_report(node_id))
        try:
            if cluster.confirm_own(node_id):
                return cluster, pid
        except ForeignNode as exc:
            raise click.ClickException(str(exc)) from exc
        if time.monotonic() >= deadline:
            raise click.ClickException(f"{node_id} (pid {pid}) did not answer in time (log {cluster.log_file(node_id)})")
        time.sleep(0.2)


# --- commands --------------------------------------------------------------------------------------

@click.command("add-node")
@_options
@click.option("--id", "node_id", default=None, help="The new node's id (local default: the next n<k>).")
@click.option("--host", default=None, help="The host clients and peers reach it at (local default: the first node's).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Client port (local default: the next free).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=None, help="HTTP port.")
@click.option("--raft-port", type=click.IntRange(1, 65535), default=None, help="Raft port.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the node joined and the cluster settled, or return once it is registered.")
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
    where = _connect(data_dir, url, token, ca, cert, key)
    shape = _call(where.admin.shape)
    reg = shape.registry
    if where.local:
        assert where.config is not None and where.data_dir is not None
        config = where.config
        dirs = [p.name for p in where.data_dir.iterdir() if p.is_dir()]
        node_id = node_id or next_node_id([*reg.nodes, *(n.id for n in config.nodes), *dirs])
        if any(n.id == node_id for n in config.nodes):
            raise click.ClickException(f"{node_id} is already in {where.config_path}")
        if (where.data_dir / node_id).exists():
            raise click.ClickException(f"{where.data_dir / node_id} exists: a node of that id ran here; "
                                       "choose another --id or move that directory away")
        first = config.nodes[0]
        taken = {p for n in reg.nodes.values() for p in (n.port, n.http_port, n.raft_port)}
        taken |= {p for n in config.nodes for p in (n.port, n.http_port, n.raft_port)}
        if port is None or http_port is None or raft_port is None:
            try:
                auto = next_ports(first, node_id, taken, lambda p: _port_free(p, host or first.host))
            except ValueError as exc:
                raise click.ClickException(str(exc)) from exc
            port, http_port, raft_port = port or auto[0], http_port or auto[1], raft_port or auto[2]
        host = host or first.host
    assert node_id is not None and host is not None and port and http_port and raft_port
    old = reg.nodes.get(node_id)
    if old is not None and old.state != REMOVED:
        raise click.ClickException(f"{node_id} is already a node of cluster {reg.cluster_id} ({old.state})")
    spec = NodeSpec(node_id, host, port, http_port, raft_port)
    if where.local:
        assert where.config is not None
        grown = with_node(where.config, spec, _bootstrap_of(where.config, reg))
        try:
            grown.validate()
            check_ports_free(grown, [node_id])
        except (ConfigError, PortInUse) as exc:
            raise click.ClickException(str(exc)) from exc
    _call(lambda: where.admin.add_node(node_id, host, port, http_port, raft_port))
    click.echo(f"registered {node_id} (client {host}:{port}, http {http_port}, raft {raft_port}) "
               f"in cluster {reg.cluster_id}")
    if where.local:
        write_cluster_file(where.config_path, grown)
        _start_local(where, node_id, deadline)
    if not wait:
        return
    auto = reg.settings.rebalance_auto

    def joined(s: ClusterShape) -> bool:
        entry = s.registry.nodes.get(node_id)
        return entry is not None and bool(entry.incarnation)

    def done(s: ClusterShape) -> bool:
        return joined(s) and (not auto or _settled_and_balanced(s))

    def gaps(s: ClusterShape) -> list[str]:
        if not joined(s):
            return [f"{node_id} has not linked with the cluster yet (is its process running and "
                    f"reaching the others' Raft ports?)"]
        return _gaps_and_balance(s)

    shape = _wait(where, done, max(1.0, deadline - time.monotonic()), f"{node_id} joining", gaps=gaps)
    held = [p["id"] for p in shape.topology["partitionMap"] if node_id in p["replicas"]]
    led = [p["id"] for p in shape.topology["partitionMap"] if p["leader"] == node_id]
    click.echo(f"{node_id} joined: holds {len(held)} of {shape.registry.partitions} partitions, leads {len(led)}")
    if not auto:
        click.echo("rebalance_auto is off: run `shoal cluster rebalance` to move replicas onto it")


@click.command("remove-node")
@click.argument("node_id")
@_options
def remove_node(node_id: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
                key: str | None, timeout_s: float) -> None:
    """Move every replica and leadership off NODE_ID, remove it from the cluster, then stop it.

    Locally the node's process is stopped and the node dropped from cluster.toml (its data
    directory stays). With --url, stop its process yourself once this returns.
    """
    deadline = time.monotonic() + timeout_s
    where = _connect(data_dir, url, token, ca, cert, key, exclude=[node_id])
    reg = _call(where.admin.shape).registry
    entry = reg.nodes.get(node_id)
    if entry is None:
        raise click.ClickException(f"{node_id} is not a node of cluster {reg.cluster_id}")
    if entry.state != REMOVED:
        _call(lambda: where.admin.decommission(node_id))
        click.echo(f"decommissioning {node_id}: moving its replicas and leadership to the other nodes")
        _wait(where, lambda s: not s.holds(node_id), max(1.0, deadline - time.monotonic()),
              f"moving every replica off {node_id}",
              gaps=lambda s: [f"{node_id} still holds: {'; '.join(unsettled(s)) or 'leadership'}"])
        while True:
            try:
                where.admin.remove(node_id)
                break
            except AdminError as exc:
                # A node that answers slower than the one polled may still list it for a moment.
                if exc.code != "INVALID_STATE" or time.monotonic() >= deadline:
                    raise click.ClickException(f"removing {node_id} refused: {exc}") from exc
                time.sleep(POLL_S)
        click.echo(f"{node_id} removed from cluster {reg.cluster_id}: no partition lists it")
    else:
        click.echo(f"{node_id} was already removed from cluster {reg.cluster_id}")
    if where.local:
        assert where.config is not None
        pid = _stop_local(where, node_id)
        if any(n.id == node_id for n in where.config.nodes):
            write_cluster_file(where.config_path, without_node(where.config, node_id, _bootstrap_of(where.config, reg)))
        stopped = f"its process (pid {pid}) has exited" if pid else "it was not running"
        click.echo(f"{node_id}: {stopped}; dropped from {where.config_path} "
                   f"(its data stays in {where.config.node_data_dir(node_id)})")
    else:
        click.echo(f"stop {node_id}'s process now; the cluster no longer accepts it on the Raft link")


@click.command("replace-node")
@click.argument("node_id")
@_options
@click.option("--incarnation", default=None,
              help="With --url: the incarnation the new node runs (its /health says), started with the old "
                   "id and ports on an empty data directory.")
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
    where = _connect(data_dir, url, token, ca, cert, key, exclude=[node_id])
    reg = _call(where.admin.shape).registry
    entry = reg.nodes.get(node_id)
    if entry is None or entry.state == REMOVED:
        raise click.ClickException(f"{node_id} is not a live node of cluster {reg.cluster_id}")
    if where.local:
        assert where.config is not None
        if not any(n.id == node_id for n in where.config.nodes):
            raise click.ClickException(f"{node_id} is not in {where.config_path}")
        _stop_local(where, node_id)
        data = where.config.node_data_dir(node_id)  # as the node resolves it (the launcher's directory)
        if data.exists():
            aside = data.with_name(f"{data.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            data.rename(aside)
            click.echo(f"moved {node_id}'s data directory aside to {aside}")
        cluster, pid = _start_local(where, node_id, deadline)
        spec = cluster.config.node(node_id)
        try:
            health = node_health(spec.host, spec.http_port, 2.0, cluster.config.tokens[0] if cluster.config.tokens
                                 else None, cluster.ssl_context)
        except (OSError, ForeignNode) as exc:
            raise click.ClickException(f"{node_id}'s /health did not answer: {exc}") from exc
        incarnation = str(health.get("incarnation") or "")
        if not incarnation:
            raise click.ClickException(f"{node_id}'s /health names no incarnation")
    assert incarnation is not None
    _call(lambda: where.admin.replace(node_id, incarnation))
    member = f"{node_id}/{incarnation}" if incarnation != entry.original else node_id
    click.echo(f"{node_id} now runs incarnation {incarnation}: it joins as member {member}, "
               f"its old replicas are replaced")

    def done(s: ClusterShape) -> bool:
        e = s.registry.nodes.get(node_id)
        return e is not None and e.incarnation == incarnation and s.settled()

    _wait(where, done, max(1.0, deadline - time.monotonic()), f"rebuilding {node_id}'s replicas")
    click.echo(f"{node_id} replaced: its replicas are rebuilt on member {member}")


@click.command("rebalance")
@_options
def rebalance(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
              timeout_s: float) -> None:
    """Move replicas to their targets and leadership to each partition's preferred node; wait until done.

    Needed only with rebalance_auto off (`shoal cluster settings --no-rebalance-auto`): with it on
    (the default) replicas move by themselves after a node joins or leaves.
    """
    where = _connect(data_dir, url, token, ca, cert, key)
    _call(where.admin.rebalance)
    click.echo("rebalancing: replicas to their targets, leadership to preferred nodes")
    shape = _wait(where, _settled_and_balanced, timeout_s, "rebalancing", gaps=_gaps_and_balance)
    click.echo(f"balanced: {holdings(shape)}")


@click.command("settings")
@_options
@click.option("--move-rate", default=None, metavar="SIZE",
              help="Cluster-wide byte rate of moves (snapshots and catch-up to new replicas), e.g. 64MiB.")
@click.option("--rebalance-auto/--no-rebalance-auto", default=None,
              help="Move replicas by themselves after a node joins or leaves (default on).")
@click.option("--replication", type=click.IntRange(1, 7), default=None,
              help="Replicas per partition (capped at the active node count); waits until every partition has them.")
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
    where = _connect(data_dir, url, token, ca, cert, key)
    if changes:
        _call(lambda: where.admin.settings(**changes))
    shape = _call(where.admin.shape)
    s = shape.registry.settings
    if replication is not None and not s.rebalance_auto:
        _call(where.admin.rebalance)  # the operator asked for this shape: reach it now
    click.echo(f"replication {s.replication} (now {shape.registry.rf()} per partition), rebalance_auto "
               f"{'on' if s.rebalance_auto else 'off'}, move rate {format_bytes(s.move_rate_bytes_per_s)}/s")
    if replication is not None:
        shape = _wait(where, ClusterShape.settled, timeout_s, f"replication {replication}")
        click.echo(f"every partition has {shape.registry.rf()} replicas: {holdings(shape)}")


@click.command("status")
@_options
def status(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
           timeout_s: float) -> None:
    """Show the cluster's nodes (state, incarnation), partitions and every move in progress.

    Moves: partition, from → to, state, bytes sent of the total, rate and time left.
    """
    del timeout_s  # a status does not wait
    if url:
        where = _connect(data_dir, url, token, ca, cert, key)
        _print_status(_call(where.admin.shape), {})
        return
    path = Path(data_dir).absolute()
    config = _local_config(path)
    pids = _running_pids(path)
    admin = _local_admin(path, config, token)
    shape = None
    if admin is not None:
        with contextlib.suppress(AdminError):
            shape = admin.shape()
    if shape is None:
        click.echo(f"cluster {config.cluster_id}: no node answers (data in {path})")
        for n in config.nodes:
            click.echo(f"  {n.id}: down  client {n.host}:{n.port}  http {n.http_port}")
        return
    _print_status(shape, pids)


def _print_status(shape: ClusterShape, pids: dict[str, int]) -> None:
    reg = shape.registry
    s = reg.settings
    click.echo(f"cluster {reg.cluster_id}: {reg.partitions} partitions, replication {s.replication} "
               f"({reg.rf()} per partition), rebalance_auto {'on' if s.rebalance_auto else 'off'}, "
               f"move rate {format_bytes(s.move_rate_bytes_per_s)}/s")
    parts = shape.topology["partitionMap"]
    click.echo("nodes:")
    for entry in sorted(reg.nodes.values(), key=lambda e: (e.ordinal, e.id)):
        held = sum(entry.id in p["replicas"] for p in parts)
        led = sum(p["leader"] == entry.id for p in parts)
        pid = f"  pid {pids[entry.id]}" if entry.id in pids else ""
        click.echo(f"  {entry.id}: {entry.state:<8} incarnation {entry.incarnation or '-':<16} member "
                   f"{entry.member():<20} client {entry.host}:{entry.port}  http {entry.http_port}  "
                   f"replicas {held}  leads {led}{pid}")
    click.echo("partitions:")
    for p in parts:
        target = ",".join(node_of_member(m) for m in shape.placement.get(p["id"], []))
        members = shape.members(p["id"])
        learners = f"  learners {','.join(members[1])}" if members and members[1] else ""
        click.echo(f"  p{p['id']}: leader {p['leader'] or '-'}  term {p['term']}  replicas "
                   f"{','.join(p['replicas'])}  target {target}{learners}")
    if shape.moves:
        click.echo(f"moves ({len(shape.moves)}):")
        for m in shape.moves:
            click.echo(f"  {format_move(m)}")
    else:
        click.echo("moves: none")


#: ``shoal cluster`` subcommands this module adds (name -> attribute), for the launcher's group.
COMMANDS: dict[str, str] = {"add-node": "add_node", "remove-node": "remove_node", "replace-node": "replace_node",
                            "rebalance": "rebalance", "settings": "settings", "status": "status"}
