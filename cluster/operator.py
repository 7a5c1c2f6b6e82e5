"""Changing a running cluster's shape: what ``shoal cluster add-node | remove-node | replace-node |
rebalance | settings | status`` do (the commands are :mod:`shoal.cli.cluster`'s).

Theory of operation. Every change talks to one node's HTTP admin API
(:mod:`.admin_client`): it asks for a change, which the node registry spreads by gossip and
the partitions' leaders carry out one membership change at a time, then polls
``GET /admin/cluster?all=1`` until the cluster has the asked-for shape. While it waits it
says a line whenever something changed (:class:`ProgressPrinter`); a deadline bounds the
wait. It returns only once the shape is reached, else raises :class:`OperatorError` saying
what was not in place.

Two forms of every change (:func:`connect` finds the cluster):

- local (``--data DIR``, a cluster of ``shoal cluster up``): the change also does what an
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

from .admin_client import AdminClient, AdminError, ClusterShape
from .config import ClusterConfig, ConfigError, NodeSpec, load_config
from .launcher import (PORT_RELEASE_WAIT_S, STOP_TIMEOUT_S, ForeignNode, LocalCluster, PortInUse, _is_our_node,
                       _PASSED_TO_NODES, _pids_in, _port_free, check_ports_free, node_health, write_cluster_file)
from .registry import ACTIVE, REMOVED, Registry, node_of_member

__all__ = ["add_node", "remove_node", "replace_node", "rebalance", "settings", "status", "connect", "Where",
           "OperatorError", "ProgressPrinter", "parse_bytes", "format_bytes", "format_move", "next_node_id",
           "next_ports", "with_node", "without_node", "unsettled", "balance_gaps", "holdings", "Say", "TIMEOUT_S",
           "HEARTBEAT_S"]

#: Where the steps of a change say what they did and what they wait for (``click.echo`` for the commands).
Say = Callable[[str], None]
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

class OperatorError(Exception):
    """A change the command cannot make or finish; the message says what was not in place and what to do."""


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
        raise OperatorError(f"no cluster at {data_dir} (no cluster.toml); start one with "
                            f"`shoal cluster up --data {data_dir}`, or use --url for a remote cluster")
    try:
        return load_config(path, env={})
    except ConfigError as exc:
        raise OperatorError(f"{path}: {exc}") from exc


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


def connect(data_dir: str, url: str | None, token: str | None = None, ca: str | None = None,
            cert: str | None = None, key: str | None = None, exclude: Iterable[str] = ()) -> Where:
    """The cluster at ``url`` (any node's HTTP address, with ``token`` and the TLS files), else the
    local cluster of ``shoal cluster up`` at ``data_dir`` through a running node other than ``exclude``."""
    if url:
        return Where(_remote_admin(url, token, ca, cert, key))
    path = Path(data_dir).absolute()
    config = _local_config(path)
    admin = _local_admin(path, config, token, exclude)
    if admin is None:
        others = f" (other than {', '.join(exclude)})" if exclude else ""
        raise OperatorError(f"no node of the cluster at {path}{others} answers its admin API: is it running? "
                            f"(`shoal cluster up --data {path}`)")
    return Where(admin, path, config)


def _call(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except AdminError as exc:
        if not exc.status:
            raise OperatorError(f"cannot reach the admin API: {exc}") from exc
        raise OperatorError(f"the admin API refused (HTTP {exc.status} {exc.code}): {exc}") from exc


def _wait(where: Where, done: Callable[[ClusterShape], bool], timeout_s: float, what: str, say: Say,
          gaps: Callable[[ClusterShape], list[str]] = unsettled) -> ClusterShape:
    """Poll until ``done``, saying progress; :class:`OperatorError` naming what was not in place on timeout."""
    printer = ProgressPrinter(say)
    try:
        return where.admin.wait(done, timeout_s, POLL_S, printer)
    except TimeoutError as exc:
        shape = printer.last
        detail = "; ".join(gaps(shape)) if shape is not None else "no node answered the admin API"
        raise OperatorError(f"{what} did not happen within {timeout_s:.0f} s: {detail or 'see above'}") from exc


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
        raise OperatorError(f"{node_id} (pid {pid}) did not exit")
    if pid_file is not None:
        pid_file.unlink(missing_ok=True)


def _stop_local(where: Where, node_id: str, say: Say) -> int | None:
    """Stop ``node_id``'s process of the local cluster when it runs; its pid, or None."""
    assert where.data_dir is not None
    for found, pid, pid_file in _pids_in(where.data_dir):
        if found == node_id and _is_our_node(pid):
            say(f"stopping {node_id} (pid {pid})")
            _stop_pid(node_id, pid, pid_file)
            return pid
    return None


def _launcher(where: Where) -> LocalCluster:
    env = {k: v for k, v in os.environ.items() if k in _PASSED_TO_NODES and v}
    return LocalCluster(data_dir=where.data_dir or ".", extra_env=env)


def _start_local(where: Where, node_id: str, deadline: float, say: Say) -> tuple[LocalCluster, int]:
    """Start ``node_id`` from the cluster file and wait until its ports answer as this cluster's node."""
    cluster = _launcher(where)
    try:
        check_ports_free(cluster.config, [node_id], PORT_RELEASE_WAIT_S)
        pid = cluster.start_node(node_id)
    except (PortInUse, RuntimeError) as exc:
        raise OperatorError(str(exc)) from exc
    say(f"started {node_id} (pid {pid}, log {cluster.log_file(node_id)})")
    while True:
        if cluster.procs[node_id].poll() is not None:
            raise OperatorError(cluster.exit_report(node_id))
        try:
            if cluster.confirm_own(node_id):
                return cluster, pid
        except ForeignNode as exc:
            raise OperatorError(str(exc)) from exc
        if time.monotonic() >= deadline:
            raise OperatorError(f"{node_id} (pid {pid}) did not answer in time (log {cluster.log_file(node_id)})")
        time.sleep(0.2)


# --- the changes -----------------------------------------------------------------------------------


def add_node(where: Where, node_id: str | None, host: str | None, port: int | None, http_port: int | None,
             raft_port: int | None, *, wait: bool, deadline: float, say: Say) -> None:
    """Add a node and, with ``wait``, wait until it holds and leads its share of partitions (until
    it joined, with rebalance_auto off).

    Locally: picks the next id and free ports for what is not given, writes the node into
    cluster.toml, registers it and starts its process. Remote: registers the node described (every
    field given); its operator starts its process.
    """
    shape = _call(where.admin.shape)
    reg = shape.registry
    if where.local:
        assert where.config is not None and where.data_dir is not None
        config = where.config
        dirs = [p.name for p in where.data_dir.iterdir() if p.is_dir()]
        node_id = node_id or next_node_id([*reg.nodes, *(n.id for n in config.nodes), *dirs])
        if any(n.id == node_id for n in config.nodes):
            raise OperatorError(f"{node_id} is already in {where.config_path}")
        if (where.data_dir / node_id).exists():
            raise OperatorError(f"{where.data_dir / node_id} exists: a node of that id ran here; "
                                "choose another --id or move that directory away")
        first = config.nodes[0]
        taken = {p for n in reg.nodes.values() for p in (n.port, n.http_port, n.raft_port)}
        taken |= {p for n in config.nodes for p in (n.port, n.http_port, n.raft_port)}
        if port is None or http_port is None or raft_port is None:
            try:
                auto = next_ports(first, node_id, taken, lambda p: _port_free(p, host or first.host))
            except ValueError as exc:
                raise OperatorError(str(exc)) from exc
            port, http_port, raft_port = port or auto[0], http_port or auto[1], raft_port or auto[2]
        host = host or first.host
    assert node_id is not None and host is not None and port and http_port and raft_port
    old = reg.nodes.get(node_id)
    if old is not None and old.state != REMOVED:
        raise OperatorError(f"{node_id} is already a node of cluster {reg.cluster_id} ({old.state})")
    spec = NodeSpec(node_id, host, port, http_port, raft_port)
    if where.local:
        assert where.config is not None
        grown = with_node(where.config, spec, _bootstrap_of(where.config, reg))
        try:
            grown.validate()
            check_ports_free(grown, [node_id])
        except (ConfigError, PortInUse) as exc:
            raise OperatorError(str(exc)) from exc
    _call(lambda: where.admin.add_node(node_id, host, port, http_port, raft_port))
    say(f"registered {node_id} (client {host}:{port}, http {http_port}, raft {raft_port}) "
        f"in cluster {reg.cluster_id}")
    if where.local:
        write_cluster_file(where.config_path, grown)
        _start_local(where, node_id, deadline, say)
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

    shape = _wait(where, done, max(1.0, deadline - time.monotonic()), f"{node_id} joining", say, gaps=gaps)
    held = [p["id"] for p in shape.topology["partitionMap"] if node_id in p["replicas"]]
    led = [p["id"] for p in shape.topology["partitionMap"] if p["leader"] == node_id]
    say(f"{node_id} joined: holds {len(held)} of {shape.registry.partitions} partitions, leads {len(led)}")
    if not auto:
        say("rebalance_auto is off: run `shoal cluster rebalance` to move replicas onto it")


def remove_node(where: Where, node_id: str, *, deadline: float, say: Say) -> None:
    """Move every replica and leadership off ``node_id``, remove it from the cluster, then (locally)
    stop its process and drop it from cluster.toml (its data directory stays)."""
    reg = _call(where.admin.shape).registry
    entry = reg.nodes.get(node_id)
    if entry is None:
        raise OperatorError(f"{node_id} is not a node of cluster {reg.cluster_id}")
    if entry.state != REMOVED:
        _call(lambda: where.admin.decommission(node_id))
        say(f"decommissioning {node_id}: moving its replicas and leadership to the other nodes")
        _wait(where, lambda s: not s.holds(node_id), max(1.0, deadline - time.monotonic()),
              f"moving every replica off {node_id}", say,
              gaps=lambda s: [f"{node_id} still holds: {'; '.join(unsettled(s)) or 'leadership'}"])
        while True:
            try:
                where.admin.remove(node_id)
                break
            except AdminError as exc:
                # A node that answers slower than the one polled may still list it for a moment.
                if exc.code != "INVALID_STATE" or time.monotonic() >= deadline:
                    raise OperatorError(f"removing {node_id} refused: {exc}") from exc
                time.sleep(POLL_S)
        say(f"{node_id} removed from cluster {reg.cluster_id}: no partition lists it")
    else:
        say(f"{node_id} was already removed from cluster {reg.cluster_id}")
    if where.local:
        assert where.config is not None
        pid = _stop_local(where, node_id, say)
        if any(n.id == node_id for n in where.config.nodes):
            write_cluster_file(where.config_path, without_node(where.config, node_id, _bootstrap_of(where.config, reg)))
        stopped = f"its process (pid {pid}) has exited" if pid else "it was not running"
        say(f"{node_id}: {stopped}; dropped from {where.config_path} "
            f"(its data stays in {where.config.node_data_dir(node_id)})")
    else:
        say(f"stop {node_id}'s process now; the cluster no longer accepts it on the Raft link")


def replace_node(where: Where, node_id: str, incarnation: str | None, *, deadline: float, say: Say) -> None:
    """Rebuild a dead node's replicas on a fresh node of the same id and ports, which joins as a new
    Raft member (``node_id/<incarnation>``).

    Locally: stops ``node_id``'s process if it runs, moves its data directory aside, starts a fresh
    process and takes its incarnation. Remote: ``incarnation`` is the fresh node's, started by its
    operator.
    """
    reg = _call(where.admin.shape).registry
    entry = reg.nodes.get(node_id)
    if entry is None or entry.state == REMOVED:
        raise OperatorError(f"{node_id} is not a live node of cluster {reg.cluster_id}")
    if where.local:
        assert where.config is not None
        if not any(n.id == node_id for n in where.config.nodes):
            raise OperatorError(f"{node_id} is not in {where.config_path}")
        _stop_local(where, node_id, say)
        data = where.config.node_data_dir(node_id)  # as the node resolves it (the launcher's directory)
        if data.exists():
            aside = data.with_name(f"{data.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            data.rename(aside)
            say(f"moved {node_id}'s data directory aside to {aside}")
        cluster, pid = _start_local(where, node_id, deadline, say)
        spec = cluster.config.node(node_id)
        try:
            health = node_health(spec.host, spec.http_port, 2.0, cluster.config.tokens[0] if cluster.config.tokens
                                 else None, cluster.ssl_context)
        except (OSError, ForeignNode) as exc:
            raise OperatorError(f"{node_id}'s /health did not answer: {exc}") from exc
        incarnation = str(health.get("incarnation") or "")
        if not incarnation:
            raise OperatorError(f"{node_id}'s /health names no incarnation")
    if not incarnation:
        raise OperatorError(f"the incarnation {node_id}'s fresh node runs is needed (its /health names it)")
    fresh = incarnation
    _call(lambda: where.admin.replace(node_id, fresh))
    member = f"{node_id}/{fresh}" if fresh != entry.original else node_id
    say(f"{node_id} now runs incarnation {fresh}: it joins as member {member}, its old replicas are replaced")

    def done(s: ClusterShape) -> bool:
        e = s.registry.nodes.get(node_id)
        return e is not None and e.incarnation == fresh and s.settled()

    _wait(where, done, max(1.0, deadline - time.monotonic()), f"rebuilding {node_id}'s replicas", say)
    say(f"{node_id} replaced: its replicas are rebuilt on member {member}")


def rebalance(where: Where, timeout_s: float, say: Say) -> None:
    """Move replicas to their targets and leadership to each partition's preferred node; wait until done."""
    _call(where.admin.rebalance)
    say("rebalancing: replicas to their targets, leadership to preferred nodes")
    shape = _wait(where, _settled_and_balanced, timeout_s, "rebalancing", say, gaps=_gaps_and_balance)
    say(f"balanced: {holdings(shape)}")


def settings(where: Where, changes: dict[str, Any], timeout_s: float, say: Say) -> None:
    """Say the cluster's settings after applying ``changes`` (the admin API's names: ``moveRateBytesPerS``,
    ``rebalanceAuto``, ``replication``); a new replication factor is waited for until every partition has it."""
    if changes:
        _call(lambda: where.admin.settings(**changes))
    shape = _call(where.admin.shape)
    s = shape.registry.settings
    replication = changes.get("replication")
    if replication is not None and not s.rebalance_auto:
        _call(where.admin.rebalance)  # the operator asked for this shape: reach it now
    say(f"replication {s.replication} (now {shape.registry.rf()} per partition), rebalance_auto "
        f"{'on' if s.rebalance_auto else 'off'}, move rate {format_bytes(s.move_rate_bytes_per_s)}/s")
    if replication is not None:
        shape = _wait(where, ClusterShape.settled, timeout_s, f"replication {replication}", say)
        say(f"every partition has {shape.registry.rf()} replicas: {holdings(shape)}")


def status(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None, key: str | None,
           say: Say) -> None:
    """Say the cluster's nodes (state, incarnation), partitions and every move in progress; a local
    cluster none of whose nodes answers is shown from its file."""
    if url:
        where = connect(data_dir, url, token, ca, cert, key)
        _say_status(_call(where.admin.shape), {}, say)
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
        say(f"cluster {config.cluster_id}: no node answers (data in {path})")
        for n in config.nodes:
            say(f"  {n.id}: down  client {n.host}:{n.port}  http {n.http_port}")
        return
    _say_status(shape, pids, say)


def _say_status(shape: ClusterShape, pids: dict[str, int], say: Say) -> None:
    reg = shape.registry
    s = reg.settings
    say(f"cluster {reg.cluster_id}: {reg.partitions} partitions, replication {s.replication} "
        f"({reg.rf()} per partition), rebalance_auto {'on' if s.rebalance_auto else 'off'}, "
        f"move rate {format_bytes(s.move_rate_bytes_per_s)}/s")
    parts = shape.topology["partitionMap"]
    say("nodes:")
    for entry in sorted(reg.nodes.values(), key=lambda e: (e.ordinal, e.id)):
        held = sum(entry.id in p["replicas"] for p in parts)
        led = sum(p["leader"] == entry.id for p in parts)
        pid = f"  pid {pids[entry.id]}" if entry.id in pids else ""
        say(f"  {entry.id}: {entry.state:<8} incarnation {entry.incarnation or '-':<16} member "
            f"{entry.member():<20} client {entry.host}:{entry.port}  http {entry.http_port}  "
            f"replicas {held}  leads {led}{pid}")
    say("partitions:")
    for p in parts:
        target = ",".join(node_of_member(m) for m in shape.placement.get(p["id"], []))
        members = shape.members(p["id"])
        learners = f"  learners {','.join(members[1])}" if members and members[1] else ""
        say(f"  p{p['id']}: leader {p['leader'] or '-'}  term {p['term']}  replicas "
            f"{','.join(p['replicas'])}  target {target}{learners}")
    if shape.moves:
        say(f"moves ({len(shape.moves)}):")
        for m in shape.moves:
            say(f"  {format_move(m)}")
    else:
        say("moves: none")
