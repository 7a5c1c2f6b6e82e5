"""Local clusters: the :class:`LocalCluster` API behind ``shoal cluster up`` and ``down``
(:mod:`shoal.cli.cluster`).

A local cluster is N node processes on loopback started from one data
directory that holds ``cluster.toml``, one pid file and one log file per node
and each node's data. Starting again on the same directory reuses its
``cluster.toml``, so the same cluster comes back with its data.

Ports for node *i* (0-based) from ``base_port``: client ``base + 2i``, HTTP
``base + 2i + 1``, Raft ``base + 100 + i`` (one Raft port per node, whatever
the partition count).

Every local cluster is authenticated: unless a secret is given, a random one is
generated into ``cluster.toml``, which is written readable by its owner only. Every
local cluster has its own random cluster id, written there too.

Starting cannot be fooled by another cluster on the same ports: every port a node
will listen on is checked before any node starts (:func:`check_ports_free`), a node
that exits early is reported with the line of its log that says why, and a node
counts as up only once its ports answer with this cluster's id, its node id and the
pid this launcher started (``Hello``'s ``clusterId``/``nodeId``, ``/health``'s
``clusterId``/``pid``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .codec import FrameDecoder, encode
from .config import ClusterConfig, ConfigError, NodeSpec, load_config
from .guard import LIMITS_ENV_VARS, TLS_ENV_VARS, TlsSettings
from .topology import Topology

__all__ = ["LocalCluster", "free_base_port", "port_layout", "write_cluster_file", "new_secret", "new_cluster_id",
           "busy_ports", "check_ports_free", "PortInUse", "ForeignNode", "settings_from_env", "stop_detached",
           "NODES_MAX", "READY_TIMEOUT_S", "STOP_TIMEOUT_S"]

NODES_MAX = 32
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
#: How long :meth:`LocalCluster.start` lets a taken port be released before it refuses: a process
#: on its way out may still hold one (a killed node's forked snapshot child finishing its write).
PORT_RELEASE_WAIT_S = 5.0
#: How much of the end of a node's log is searched for why it exited.
EXIT_LOG_TAIL_BYTES = 64 * 1024
#: How many parents up /health's pid may be from the process the launcher started (a wrapper).
_ANCESTRY_MAX = 8


class PortInUse(RuntimeError):
    """A port a node must listen on is taken; the message names every such port."""


class ForeignNode(RuntimeError):
    """A node's port is answered by something other than the node this launcher started."""


def port_layout(base_port: int, nodes: int, partitions: int = 0) -> list[tuple[int, int, int]]:
    """(client, http, raft) ports of every node (``partitions`` is accepted and does not matter)."""
    return [(base_port + 2 * i, base_port + 2 * i + 1, base_port + 100 + i) for i in range(nodes)]


def _ports_of(base_port: int, nodes: int, partitions: int = 0) -> list[int]:
    ports = []
    for client, http, raft in port_layout(base_port, nodes, partitions):
        ports += [client, http, raft]
    return ports


def new_secret() -> str:
    """A random cluster secret (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def new_cluster_id() -> str:
    """A random cluster id (``shoal-`` and 64 bits in hex)."""
    return f"shoal-{secrets.token_hex(8)}"


def write_cluster_file(path: Path, config: ClusterConfig) -> None:
    """Write ``config`` to ``path`` readable by its owner only (it holds the cluster secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its old mode through O_CREAT
        f.write(config.to_toml())


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a listener could bind ``host:port`` now (as the node binds: SO_REUSEADDR)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, IndexError):
        return False
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError:
            return False
    return True


def _listening_ports(config: ClusterConfig, node_id: str) -> list[tuple[str, str, int]]:
    """(role, bind host, port) of every port ``node_id`` listens on."""
    spec = config.node(node_id)
    host = config.listen or spec.host
    return [("client", host, spec.client_listen_port), ("http", host, spec.http_port),
            ("raft", config.raft_bind_host(node_id), spec.raft_port)]


def busy_ports(config: ClusterConfig, node_ids: Iterable[str]) -> list[str]:
    """Every port ``node_ids`` would listen on that cannot be bound now, as ``host:port (node role)``."""
    return [f"{host}:{port} ({node_id} {role})" for node_id in node_ids
            for role, host, port in _listening_ports(config, node_id) if not _port_free(port, host)]


def check_ports_free(config: ClusterConfig, node_ids: Iterable[str], wait_s: float = 0.0) -> None:
    """Raise :class:`PortInUse` naming every port of ``node_ids`` another process holds
    (still held after ``wait_s``)."""
    node_ids = list(node_ids)
    deadline = time.monotonic() + wait_s
    busy = busy_ports(config, node_ids)
    while busy and time.monotonic() < deadline:
        time.sleep(0.1)
        busy = busy_ports(config, node_ids)
    if busy:
        raise PortInUse(f"port{'s' if len(busy) > 1 else ''} already in use: {', '.join(busy)}. Another "
                        "process (a running cluster?) holds them: stop it, or start this cluster on other ports "
                        "(--base-port)")


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_base_port(nodes: int = 3, partitions: int = 8, low: int = 20_000, high: int = 55_000,
                   attempts_max: int = 200) -> int:
    """A base port whose whole layout is free on loopback right now.

    The layout stays below the kernel's ephemeral range when it can: a port found free there
    can be taken by any outgoing connection (Raft peers, clients) before the node binds it.
    """
    rng = random.Random()
    span = max(_ports_of(low, nodes, partitions)) - low
    top = min(high, _ephemeral_low() - span)
    if top <= low + 1_000:
        top = high  # a machine whose ephemeral range starts low: take the chance
    for _ in range(attempts_max):
        base = rng.randrange(low, top)
        if all(_port_free(p) for p in _ports_of(base, nodes, partitions)):
            return base
    raise RuntimeError(f"no free port range found in {attempts_max} attempts")


def hello(host: str, port: int, timeout_s: float = 2.0, token: str | None = None,
          ssl_context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """One synchronous Hello (after Auth when a token is given); returns the reply."""
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout_s))
        if ssl_context is not None:
            sock = stack.enter_context(ssl_context.wrap_socket(sock, server_hostname=host))
        frames = []
        if token:
            frames.append({"cmd": "Auth", "token": token, "reqId": 0})
        frames.append({"cmd": "Hello", "protocolVersion": 2, "reqId": 1})
        sock.sendall(b"".join(encode(f) for f in frames))
        decoder = FrameDecoder(requests=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("node closed the connection")
            decoder.feed(data)
            for frame in decoder:
                if frame.get("reqId") == 1:
                    return frame
        raise TimeoutError("no Hello reply")


def node_health(host: str, http_port: int, timeout_s: float = 1.0, token: str | None = None,
                ssl_context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """The node's ``/health`` (with the token when given). OSError when nothing answers;
    :class:`ForeignNode` when something answers that is no Shoal node of this cluster's tokens."""
    scheme = "https" if ssl_context is not None else "http"
    url = f"{scheme}://{host}:{http_port}/health"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=ssl_context) as r:
            body = json.loads(r.read(1 << 20))
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # a node refusing for now (OVERLOADED): ask again
            raise
        raise ForeignNode(f"{url} answered HTTP {exc.code}: not a node of this cluster") from exc
    except ValueError as exc:
        raise ForeignNode(f"{url} answered something other than a Shoal node's health") from exc
    if not isinstance(body, dict):
        raise ForeignNode(f"{url} answered something other than a Shoal node's health")
    return body


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _is_or_descends_from(pid: int, ancestor: int) -> bool:
    """True when ``pid`` is ``ancestor`` or a process it started (a node command that wraps the node)."""
    for _ in range(_ANCESTRY_MAX):
        if pid == ancestor:
            return True
        parent = _parent_pid(pid)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


def _exit_line(log_text: str) -> str:
    """The line of a node's log that says why it exited: a taken address first, else its last error line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "address already in use" in line.lower():
            return line
    for line in reversed(lines):
        if line.startswith("Error:") or "Error" in line.split(":", 1)[0]:
            return line
    return lines[-1] if lines else "(nothing in its log)"


def node_ready(host: str, http_port: int, timeout_s: float = 1.0, ssl_context: ssl.SSLContext | None = None) -> bool:
    """True when the node's ``/ready`` answers 200 (open without a token)."""
    scheme = "https" if ssl_context is not None else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://{host}:{http_port}/ready", timeout=timeout_s,
                                    context=ssl_context) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):  # HTTPError (the 503) is a URLError
        return False


def _is_our_node(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"shoal" in cmdline


class LocalCluster:
    """N real node processes on loopback, managed by pid.

    Use as a context manager: every process it started is stopped (SIGTERM,
    then SIGKILL) when the block exits, also on failure.
    """

    def __init__(self, nodes: int = 3, partitions: int = 8, data_dir: str | os.PathLike[str] = ".shoal",
                 base_port: int = 6789, replication: int = 3, tokens: tuple[str, ...] = (),
                 secret: str = "", session_grace_ms: int = 0, extra_env: dict[str, str] | None = None,
                 node_command: list[str] | None = None, tls: TlsSettings | None = None,
                 cluster_id: str = "") -> None:
        if not 1 <= nodes <= NODES_MAX:
            raise ValueError(f"nodes must be 1..{NODES_MAX}")
        self.data_dir = Path(data_dir).absolute()
        self.config_path = self.data_dir / "cluster.toml"
        self.extra_env = dict(extra_env or {})
        # How to start a node (before --config/--id); e.g. under coverage or a profiler.
        self.node_command = list(node_command or [sys.executable, "-m", "shoal.node"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: Node id -> the pid whose ports answered as this cluster's node (see :meth:`confirm_own`).
        self._confirmed: dict[str, int] = {}
        #: Node id -> where its log stood when this launcher last started it.
        self._log_start: dict[str, int] = {}
        if self.config_path.exists():
            self.config = load_config(self.config_path, env={})
        else:
            specs = []
            for i, (client, http, raft) in enumerate(port_layout(base_port, nodes, partitions)):
                specs.append(NodeSpec(f"n{i + 1}", "127.0.0.1", client, http, raft))
            self.config = ClusterConfig(nodes=tuple(specs), cluster_id=cluster_id or new_cluster_id(),
                                        partitions=partitions, replication=replication,
                                        tokens=tuple(tokens), secret=secret or new_secret(),
                                        session_grace_ms=session_grace_ms,
                                        data_dir=str(self.data_dir), tls=tls).validate()
        # The launcher's own Hello and /ready checks speak TLS when the nodes do.
        self.ssl_context: ssl.SSLContext | None = self.config.tls.client_context() if self.config.tls else None

    # --- info ----------------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[str]:
        return [n.id for n in self.config.nodes]

    @property
    def addresses(self) -> list[str]:
        """Client addresses ``host:port`` of every node."""
        return [f"{n.host}:{n.port}" for n in self.config.nodes]

    def address_of(self, node_id: str) -> str:
        n = self.config.node(node_id)
        return f"{n.host}:{n.port}"

    def pid_file(self, node_id: str) -> Path:
        return self.data_dir / f"{node_id}.pid"

    def log_file(self, node_id: str) -> Path:
        return self.data_dir / f"{node_id}.log"

    def pid(self, node_id: str) -> int | None:
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            return proc.pid
        return None

    @property
    def pids(self) -> dict[str, int]:
        return {nid: p.pid for nid, p in self.procs.items() if p.poll() is None}

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout_s: float = READY_TIMEOUT_S) -> "LocalCluster":
        """Write ``cluster.toml`` (first time) and start every node not already running.

        Before any node starts, every port those nodes will listen on is checked
        (:class:`PortInUse` names the ones another process still holds after
        :data:`PORT_RELEASE_WAIT_S`).
        """
        to_start = [node_id for node_id in self.node_ids if self.pid(node_id) is None]
        for node_id in to_start:
            self._refuse_if_running(node_id)
        # Before cluster.toml is written: a refused layout is not kept.
        check_ports_free(self.config, to_start, PORT_RELEASE_WAIT_S)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            write_cluster_file(self.config_path, self.config)
        for node_id in to_start:
            self.start_node(node_id)
        if wait:
            self.wait_ready(timeout_s)
        return self

    def _refuse_if_running(self, node_id: str) -> None:
        pid_file = self.pid_file(node_id)
        if pid_file.exists():
            try:
                old = int(pid_file.read_text().strip())
            except ValueError:
                old = 0
            if old and old not in self.pids.values() and _is_our_node(old):
                raise RuntimeError(f"node {node_id} is already running as pid {old} ({pid_file})")

    def start_node(self, node_id: str) -> int:
        """Start one node process; returns its pid (its ports are not checked first: :meth:`start` does)."""
        self._refuse_if_running(node_id)
        env = {**os.environ, **self.extra_env}
        for key in [k for k in env if k.startswith("SHOAL_") and k not in self.extra_env]:
            env.pop(key)  # the cluster file is the whole truth for a local cluster
        log = open(self.log_file(node_id), "ab")
        self._log_start[node_id] = log.seek(0, os.SEEK_END)
        try:
            proc = subprocess.Popen(
                [*self.node_command, "--config", str(self.config_path), "--id", node_id],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        finally:
            log.close()
        self.procs[node_id] = proc
        self.pid_file(node_id).write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> Topology:
        """Block until every running node is confirmed as this cluster's (:meth:`confirm_own`), every
        partition has a leader and every running node's ``/ready`` says 200.

        A node that exits raises ``RuntimeError`` with the line of its log that says why; a port
        answered by anything else raises :class:`ForeignNode`.
        """
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            for node_id, proc in list(self.procs.items()):
                if proc.poll() is not None:
                    raise RuntimeError(self.exit_report(node_id))
            try:
                waiting = [node_id for node_id in self.pids if not self.confirm_own(node_id)]
                if waiting:
                    last_error = RuntimeError(f"{', '.join(waiting)} not answering yet")
                else:
                    topo = self.topology()
                    # The merged view can name every leader before each node has learned its own
                    # (topology poll) or regained a quorum, which /ready checks per node.
                    if all(p.leader for p in topo.partition_map) and self.nodes_ready():
                        return topo
            except ForeignNode:
                raise
            except (OSError, RuntimeError) as exc:
                last_error = exc
            time.sleep(0.1)
        raise TimeoutError(f"cluster not ready within {timeout_s}s (last error: {last_error})")

    def exit_report(self, node_id: str) -> str:
        """Why node ``node_id``, which exited, did: its exit code and the telling line of its log."""
        proc = self.procs[node_id]
        path = self.log_file(node_id)
        try:
            with open(path, "rb") as f:
                start = max(self._log_start.get(node_id, 0), f.seek(0, os.SEEK_END) - EXIT_LOG_TAIL_BYTES)
                f.seek(start)
                text = f.read().decode(errors="replace")
        except OSError:
            text = ""
        return f"node {node_id} exited with {proc.returncode}: {_exit_line(text)} (log: {path})"

    def confirm_own(self, node_id: str) -> bool:
        """True once ``node_id``'s ports answer as this cluster's node ``node_id`` run by the process this
        launcher started: ``Hello`` names this cluster id and node id, ``/health`` this cluster id and
        that pid. False while they do not answer yet; :class:`ForeignNode` when anything else answers.
        """
        pid = self.pid(node_id)
        if pid is None:
            return False
        if self._confirmed.get(node_id) == pid:
            return True
        n = self.config.node(node_id)
        token = self.config.tokens[0] if self.config.tokens else None
        mine = f"node {node_id} of cluster {self.config.cluster_id!r} (pid {pid})"
        try:
            reply = hello(n.host, n.port, 1.0, token, self.ssl_context)
        except (OSError, TimeoutError):
            return False
        if (reply.get("clusterId"), reply.get("nodeId")) != (self.config.cluster_id, node_id):
            raise ForeignNode(f"{n.host}:{n.port} ({node_id}'s client port) is answered by node "
                              f"{reply.get('nodeId')!r} of cluster {reply.get('clusterId')!r}, not {mine}: "
                              "another cluster holds the port")
        try:
            health = node_health(n.host, n.http_port, 1.0, token, self.ssl_context)
        except ForeignNode as exc:
            raise ForeignNode(f"{n.host}:{n.http_port} ({node_id}'s HTTP port) is not {mine}: {exc}") from exc
        except OSError:
            return False
        answered = health.get("pid")
        if health.get("clusterId") != self.config.cluster_id or health.get("nodeId") != node_id \
                or not isinstance(answered, int) or not _is_or_descends_from(answered, pid):
            raise ForeignNode(f"{n.host}:{n.http_port} ({node_id}'s HTTP port) is answered by node "
                              f"{health.get('nodeId')!r} of cluster {health.get('clusterId')!r} (pid {answered}), "
                              f"not {mine}: another process holds the port")
        self._confirmed[node_id] = pid
        return True

    def nodes_ready(self) -> bool:
        """True when every running node's ``/ready`` answers 200."""
        return all(node_ready(n.host, n.http_port, ssl_context=self.ssl_context)
                   for n in map(self.config.node, self.pids))

    def wait_balanced(self, timeout_s: float = 15.0) -> bool:
        """Wait until every partition is led by its preferred replica and every node is ready again.

        False if it did not settle within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if all(p.leader == p.replicas[0] for p in self.topology().partition_map) and self.nodes_ready():
                    return True
            except RuntimeError:
                pass
            time.sleep(0.1)
        return False

    def topology(self) -> Topology:
        """The freshest view over every running node (highest term per partition)."""
        merged: Topology | None = None
        token = self.config.tokens[0] if self.config.tokens else None
        for node_id in self.pids:
            n = self.config.node(node_id)
            try:
                reply = hello(n.host, n.port, 1.0, token, self.ssl_context)
            except (OSError, TimeoutError):
                continue
            if not reply.get("ok") or (reply.get("clusterId"), reply.get("nodeId")) != (self.config.cluster_id,
                                                                                        node_id):
                continue  # another cluster's node on this port: its view is not ours
            topo = Topology.from_wire(reply["topology"])
            merged = topo if merged is None else merged.merge(topo)
        if merged is None:
            raise RuntimeError("no node answered Hello")
        return merged

    def leader_of(self, partition: int) -> str | None:
        return self.topology().partition_map[partition].leader

    def signal(self, node_id: str, sig: int) -> None:
        pid = self.pid(node_id)
        if pid is None:
            raise RuntimeError(f"node {node_id} is not running")
        os.kill(pid, sig)

    def kill(self, node_id: str) -> None:
        """SIGKILL a node and reap it."""
        self.signal(node_id, signal.SIGKILL)
        self.procs[node_id].wait(10)

    def pause(self, node_id: str) -> None:
        self.signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: str) -> None:
        self.signal(node_id, signal.SIGCONT)

    def stop_node(self, node_id: str, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (graceful), SIGKILL after ``timeout_s``; returns the exit code."""
        proc = self.procs.get(node_id)
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else None
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a paused node cannot handle SIGTERM
            proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        self._forget_pid(node_id, proc.pid)
        return proc.returncode

    def restart(self, node_id: str) -> int:
        if self.pid(node_id) is not None:
            self.stop_node(node_id)
        return self.start_node(node_id)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every node this object started: SIGTERM all, then SIGKILL stragglers."""
        for node_id, proc in self.procs.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
        deadline = time.monotonic() + timeout_s
        for node_id, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            self._forget_pid(node_id, proc.pid)

    def stop_all(self, say: Callable[[str], None] = lambda _: None, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every node of this cluster: the ones this object started and every other one its pid
        files name (nodes ``shoal cluster add-node`` or ``replace-node`` started since), all signalled
        at once (SIGTERM, then SIGKILL after ``timeout_s``), saying each one."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
        stop_detached(self.data_dir, say, timeout_s)
        self.stop(timeout_s)  # reaps this object's own processes (their pid files may be gone)

    def _forget_pid(self, node_id: str, pid: int) -> None:
        """Remove ``node_id``'s pid file if it still names ``pid`` (another process, such as
        ``shoal cluster replace-node``, may have started the node again since)."""
        _forget_pid_file(self.pid_file(node_id), pid)

    def __enter__(self) -> "LocalCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- what a local cluster passes to its nodes; stopping a detached one --------------------------------

#: ``SHOAL_*`` variables ``shoal cluster up`` passes to its nodes: limits apply to every node
#: alike. SHOAL_AUTH_TOKENS and SHOAL_TLS_* go into the cluster file; SHOAL_CLUSTER_SECRET is the
#: concern of ``--secret``. Any other (ports, peers, node id, data dir...) would contradict the
#: layout the launcher writes, so it is refused rather than silently dropped.
_PASSED_TO_NODES = frozenset({*LIMITS_ENV_VARS, "SHOAL_SNAPSHOT_ENTRIES_MIN", "SHOAL_SNAPSHOT_INTERVAL_S",
                              "SHOAL_DIGEST_INLINE_JOBS_MAX",  # node/raft/snapshots.py, node/digests.py
                              "SHOAL_PAYLOAD_FILE_MIB"})  # node/partition/payload_files.py
_HANDLED_ELSEWHERE = frozenset({"SHOAL_AUTH_TOKENS", "SHOAL_CLUSTER_SECRET", *TLS_ENV_VARS})
#: Variables of the project's own scripts, not settings of a node (``scripts/test``).
_NOT_NODE_SETTINGS = frozenset({"SHOAL_NO_SPARK"})


def settings_from_env(tokens: tuple[str, ...], env: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The client tokens of a local cluster (``tokens``, else ``SHOAL_AUTH_TOKENS``) and the variables of
    ``env`` to pass to its nodes; :class:`~.config.ConfigError` naming every other ``SHOAL_*`` setting."""
    refused = sorted(k for k, v in env.items() if k.startswith("SHOAL_") and v and not k.startswith("SHOAL_TEST_")
                     and k not in _PASSED_TO_NODES and k not in _HANDLED_ELSEWHERE and k not in _NOT_NODE_SETTINGS)
    if refused:
        raise ConfigError(
            f"{', '.join(refused)} set, but `shoal cluster up` lays its nodes out itself (flags and "
            "<data>/cluster.toml) and would not apply them: unset them, or edit cluster.toml")
    if not tokens and env.get("SHOAL_AUTH_TOKENS"):
        tokens = tuple(t.strip() for t in env["SHOAL_AUTH_TOKENS"].split(",") if t.strip())
    return tuple(tokens), {k: v for k, v in env.items() if k in _PASSED_TO_NODES and v}


def _pids_in(data_dir: Path) -> Iterator[tuple[str, int, Path]]:
    for pid_file in sorted(data_dir.glob("*.pid")):
        try:
            yield pid_file.stem, int(pid_file.read_text().strip()), pid_file
        except ValueError:
            continue


def _forget_pid_file(path: Path, pid: int) -> None:
    """Remove the pid file ``path`` if it still names ``pid``."""
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip()) == pid:
            path.unlink()


def stop_detached(data_dir: Path, say: Callable[[str], None], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Stop the nodes a local cluster's pid files name: SIGTERM to every one at once, SIGKILL to those
    still running after ``timeout_s``; say each one and remove the pid files. How many were running."""
    running: list[tuple[str, int, Path]] = []
    for node_id, pid, pid_file in _pids_in(data_dir):
        if not _is_our_node(pid):
            pid_file.unlink(missing_ok=True)
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a paused node cannot handle SIGTERM
            os.kill(pid, signal.SIGTERM)
        running.append((node_id, pid, pid_file))
    deadline = time.monotonic() + timeout_s
    while any(_is_our_node(pid) for _, pid, _ in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for node_id, pid, pid_file in running:
        if _is_our_node(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        say(f"stopped {node_id} (pid {pid})")
        _forget_pid_file(pid_file, pid)
    return len(running)
