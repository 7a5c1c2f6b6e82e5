"""A local cluster whose every Raft link and client link passes through a Toxiproxy proxy.

A node keeps one Raft connection per peer, every partition multiplexed over it,
dialled by the node listed later in the cluster (``ClusterConfig.raft_dials``);
the handshake names the dialler, so the acceptor does not care where it comes
from. So for each pair (hi, lo) the harness gives ``hi`` a route to ``lo``'s Raft
port through one proxy, which carries both directions of that pair's link: toxics
on its ``upstream`` stream hit hi→lo, on ``downstream`` lo→hi. Clients reach each
node through a proxy too: the node advertises the proxy's port and binds another
(``listen_port``).

The proxies are served by ``shoal chaos proxy`` in a child process (or by a real
Toxiproxy given as ``toxiproxy="host:port"``) and driven with toxiproxy-python.

Nodes can join while the cluster runs (:meth:`ProxiedCluster.add_node`): the newcomer is listed
last, so it dials every other node, each link through a new proxy; it is registered through
a running node's HTTP admin API (:meth:`ProxiedCluster.admin`) before it starts.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from toxiproxy import Toxiproxy
from toxiproxy.proxy import Proxy

from shoal.cluster.admin_client import AdminClient, ClusterShape
from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.launcher import (LocalCluster, _port_free, free_base_port, hello, new_secret, port_layout,
                                   write_cluster_file)

__all__ = ["ProxiedCluster", "ProxyServerProcess"]

PROXY_PORT_OFFSET = 10   # proxies listen on base+10 .. base+99: below the Raft ports (base+100+i)
PROXY_PORTS_MAX = 90
START_TIMEOUT_S = 10.0
ASK_TIMEOUT_S = 1.0
RECV_BYTES = 1 << 16


class ProxyServerProcess:
    """``shoal chaos proxy`` in a child process on a free port; stopped by pid."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.proc: subprocess.Popen[str] | None = None
        self.host = "127.0.0.1"
        self.port = 0

    def start(self) -> "ProxyServerProcess":
        cmd = [sys.executable, "-m", "shoal.cli", "chaos", "proxy", "--listen", "127.0.0.1:0"]
        if self.seed is not None:
            cmd += ["--seed", str(self.seed)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "shoal chaos proxy: API on http://127.0.0.1:PORT (…)"
        if "API on http://" not in line:
            self.stop()
            raise RuntimeError(f"chaos proxy did not start: {line!r}")
        self.port = int(line.split("API on http://", 1)[1].split()[0].rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


class ProxiedCluster:
    """N local nodes (RF 3) with every link through a named proxy; a context manager."""

    def __init__(self, data_dir: str | os.PathLike[str], nodes: int = 3, partitions: int = 2,
                 toxiproxy: str | None = None, seed: int | None = None,
                 node_command: list[str] | None = None) -> None:
        pairs = nodes * (nodes - 1) // 2
        if pairs + 2 * nodes > PROXY_PORTS_MAX:
            raise ValueError(f"{nodes} nodes need more than {PROXY_PORTS_MAX} proxy ports")
        self.data_dir = Path(data_dir).absolute()
        self.nodes_n, self.partitions = nodes, partitions
        self.external = toxiproxy
        self.seed = seed
        self.node_command = node_command
        self.server: ProxyServerProcess | None = None
        self.toxiproxy = Toxiproxy()
        self.cluster: LocalCluster | None = None
        self.config: ClusterConfig | None = None
        self.raft_links: dict[tuple[str, str], list[str]] = {}   # (hi, lo) -> [proxy name]
        self.client_proxy: dict[str, str] = {}                   # node -> proxy name

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> "ProxiedCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.external:
            host, port = self.external.rsplit(":", 1)
            self.toxiproxy.update_api_consumer(host, int(port))
        else:
            self.server = ProxyServerProcess(self.seed).start()
            self.toxiproxy.update_api_consumer(self.server.host, self.server.port)
        self.toxiproxy.reset()
        for proxy in self.toxiproxy.proxies().values():   # a reused external Toxiproxy
            if proxy.name.startswith(("shoal-raft-", "shoal-client-")):
                proxy.destroy()
        config_path = self.data_dir / "cluster.toml"
        if config_path.exists():
            from shoal.cluster.config import load_config
            self.config = load_config(config_path, env={})
        else:
            self.config = self._layout()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            write_cluster_file(config_path, self.config)
        self._create_proxies()
        self.cluster = LocalCluster(data_dir=self.data_dir, node_command=self.node_command)
        self.cluster.start()
        self.cluster.wait_ready()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.server is not None:
            self.server.stop()
        elif self.external:
            try:
                self.heal()
            except Exception:  # the external proxy may be gone; nothing else to undo
                pass

    def _layout(self) -> ClusterConfig:
        """Ports: clients advertise base+2i (a proxy), bind base+80+i; Raft proxies from base+10."""
        for _ in range(50):
            base = free_base_port(self.nodes_n, self.partitions)
            extra = [base + PROXY_PORT_OFFSET + i for i in range(PROXY_PORTS_MAX)]
            if all(_port_free(p) for p in extra):
                break
        else:
            raise RuntimeError("no free port range for the proxies")
        layout = port_layout(base, self.nodes_n, self.partitions)
        ids = [f"n{i + 1}" for i in range(self.nodes_n)]
        ports = itertools.count(base + PROXY_PORT_OFFSET)
        routes: dict[str, list[tuple[str, str]]] = {i: [] for i in ids}
        for a, b in itertools.combinations(range(self.nodes_n), 2):
            hi, lo = ids[b], ids[a]      # the later node dials (ClusterConfig.raft_dials)
            routes[hi].append((lo, f"127.0.0.1:{next(ports)}"))
        listen_ports = [base + PROXY_PORTS_MAX - self.nodes_n + PROXY_PORT_OFFSET + i for i in range(self.nodes_n)]
        specs = tuple(NodeSpec(ids[i], "127.0.0.1", client, http, raft, None, listen_ports[i],
                               tuple(sorted(routes[ids[i]])))
                      for i, (client, http, raft) in enumerate(layout))
        return ClusterConfig(nodes=specs, partitions=self.partitions, replication=3, secret=new_secret(),
                             data_dir=str(self.data_dir)).validate()

    def _create_proxies(self, only: str | None = None) -> None:
        """Proxies for every node's links (``only``: that node's)."""
        assert self.config is not None
        specs = {n.id: n for n in self.config.nodes}
        wanted: list[dict[str, Any]] = []
        for n in self.config.nodes:
            if only is not None and n.id != only:
                continue
            for lo, address in n.raft_routes:
                name = f"shoal-raft-{n.id}-{lo}"
                wanted.append({"name": name, "listen": address, "upstream": specs[lo].raft_address(),
                               "enabled": True})
                self.raft_links[(n.id, lo)] = [name]
            name = f"shoal-client-{n.id}"
            self.client_proxy[n.id] = name
            wanted.append({"name": name, "listen": f"127.0.0.1:{n.port}",
                           "upstream": f"127.0.0.1:{n.client_listen_port}", "enabled": True})
        self.toxiproxy.populate(wanted)

    # --- membership ----------------------------------------------------------------------------

    def _free_port(self, taken: set[int]) -> int:
        """A free loopback port above every port the cluster uses (below the ephemeral range)."""
        port = max(taken) + 1
        while port in taken or not _port_free(port):
            port += 1
            if port > 65_000:
                raise RuntimeError("no free port for a new node")
        taken.add(port)
        return port

    def add_node(self) -> str:
        """List a new node (``n<k>``) in ``cluster.toml`` with proxies for its links; returns its id.

        It is neither registered nor started: :meth:`register` and ``cluster.start_node`` do that
        (a fault may be set on its links first).
        """
        assert self.config is not None and self.cluster is not None
        ids = {n.id for n in self.config.nodes}
        node_id = next(f"n{k}" for k in itertools.count(len(ids) + 1) if f"n{k}" not in ids)
        taken = {p for n in self.config.nodes for p in (n.port, n.http_port, n.raft_port, n.client_listen_port)}
        taken |= {int(a.rsplit(":", 1)[1]) for n in self.config.nodes for _, a in n.raft_routes}
        client, http, raft, listen = (self._free_port(taken) for _ in range(4))
        routes = tuple(sorted((n.id, f"127.0.0.1:{self._free_port(taken)}") for n in self.config.nodes))
        spec = NodeSpec(node_id, "127.0.0.1", client, http, raft, None, listen, routes)
        self.config = replace(self.config, nodes=self.config.nodes + (spec,),
                              bootstrap_nodes=self.config.bootstrap_ids()).validate()
        write_cluster_file(self.data_dir / "cluster.toml", self.config)
        self.cluster.config = self.config
        self._create_proxies(only=node_id)
        return node_id

    def admin(self, avoid: tuple[str, ...] = ()) -> AdminClient:
        """An admin API client of a running node not in ``avoid``."""
        assert self.config is not None and self.cluster is not None
        token = self.config.tokens[0] if self.config.tokens else None
        for n in self.config.nodes:
            if n.id not in avoid and self.cluster.pid(n.id) is not None:
                return AdminClient(f"http://{n.host}:{n.http_port}", token)
        raise RuntimeError("no running node to ask")

    def register(self, node_id: str) -> None:
        """Add ``node_id`` (listed by :meth:`add_node`) to the cluster's registry."""
        assert self.config is not None
        n = self.config.node(node_id)
        self.admin(avoid=(node_id,)).add_node(n.id, n.host, n.port, n.http_port, n.raft_port)

    def wait_shape(self, done: Any, timeout_s: float, avoid: tuple[str, ...] = ()) -> ClusterShape:
        """Poll the cluster's shape (from a running node not in ``avoid``) until ``done(shape)``."""
        return self.admin(avoid).wait(done, timeout_s, poll_s=0.5)

    # --- info ----------------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[str]:
        assert self.config is not None
        return [n.id for n in self.config.nodes]

    @property
    def addresses(self) -> list[str]:
        """Client addresses as clients see them (the client proxies)."""
        assert self.config is not None
        return [f"{n.host}:{n.port}" for n in self.config.nodes]

    def proxy(self, name: str) -> Proxy:
        proxy = self.toxiproxy.get_proxy(name)
        if proxy is None:
            raise KeyError(f"no proxy {name!r}")
        return proxy

    def link(self, a: str, b: str) -> tuple[list[str], str, str]:
        """The proxy of the a–b Raft link (a one-item list), and which stream carries a→b and b→a."""
        if (a, b) in self.raft_links:
            return self.raft_links[(a, b)], "upstream", "downstream"
        return self.raft_links[(b, a)], "downstream", "upstream"

    def leader_of(self, partition: int, timeout_s: float = 10.0) -> str:
        """The node that leads ``partition`` (waits up to ``timeout_s`` for one)."""
        assert self.cluster is not None
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.cluster.leader_of(partition)
            if leader is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if leader is None:
            raise TimeoutError(f"partition {partition} has no leader")
        return leader

    def ask(self, node: str, frame: dict[str, Any], timeout_s: float = ASK_TIMEOUT_S) -> dict[str, Any]:
        """One command to ``node``'s client port (through its proxy) on a fresh connection; its reply.
        OSError or TimeoutError when the node does not answer in time (a paused node)."""
        assert self.config is not None
        n = self.config.node(node)
        with socket.create_connection((n.host, n.port), timeout=timeout_s) as sock:
            sock.sendall(encode({**frame, "reqId": 1}))
            decoder = FrameDecoder(requests=False)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                data = sock.recv(RECV_BYTES)
                if not data:
                    raise ConnectionError(f"{node} closed the connection")
                decoder.feed(data)
                for reply in decoder:
                    if reply.get("reqId") == 1:
                        return reply
        raise TimeoutError(f"{node} did not answer {frame.get('cmd')} in {timeout_s} s")

    def raft_status(self, node: str, partition: int) -> dict[str, Any] | None:
        """``node``'s Raft status of ``partition`` (``Stats {local}``: state, term, commit, last, and the
        followers' progress when it leads), or None when it does not host it."""
        reply = self.ask(node, {"cmd": "Stats", "local": True, "partition": partition})
        replica = (reply.get("replicas") or {}).get(str(partition))
        return replica.get("raft") if isinstance(replica, dict) else None

    def readiness(self, node: str) -> dict[str, Any]:
        """``node``'s ``/ready`` body (``ready``, and why not), or ``{"ready": False, "error": …}``."""
        assert self.config is not None
        n = self.config.node(node)
        try:
            with urllib.request.urlopen(f"http://{n.host}:{n.http_port}/ready", timeout=ASK_TIMEOUT_S) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            try:
                return dict(json.loads(exc.read()))
            except ValueError:
                return {"ready": False, "error": f"HTTP {exc.code}"}
        except (OSError, ValueError) as exc:
            return {"ready": False, "error": str(exc)}

    def claim(self, node: str, partition: int) -> tuple[str | None, int]:
        """(leader, term) of ``partition`` as ``node`` sees it (its ``Hello`` topology)."""
        assert self.config is not None
        n = self.config.node(node)
        info = hello(n.host, n.port, ASK_TIMEOUT_S)["topology"]["partitionMap"][partition]
        return info.get("leader"), int(info.get("term") or 0)

    # --- faults on links -----------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """Cut the Raft link between ``a`` and ``b`` (both directions: connections reset, refused)."""
        for name in self.link(a, b)[0]:
            self.proxy(name).disable()

    def cut_one_way(self, a: str, b: str) -> None:
        """Drop everything ``a`` sends to ``b`` (a ``timeout`` toxic of 0: blackhole, no close)."""
        names, a_to_b, _ = self.link(a, b)
        for name in names:
            self.proxy(name).add_toxic(name=f"oneway-{a}-{b}", type="timeout", stream=a_to_b,
                                       attributes={"timeout": 0})

    def cut_clients(self, node: str) -> None:
        self.proxy(self.client_proxy[node]).disable()

    def isolate(self, node: str, clients: bool = False) -> None:
        """Cut every Raft link of ``node`` (and its client link when ``clients``)."""
        for other in self.node_ids:
            if other != node:
                self.cut(node, other)
        if clients:
            self.cut_clients(node)

    def partition(self, *groups: list[str]) -> None:
        """Cut every link between nodes of different groups."""
        for g1, g2 in itertools.combinations(groups, 2):
            for a in g1:
                for b in g2:
                    self.cut(a, b)

    def toxic_everywhere(self, type: str, attributes: dict[str, Any], name: str,
                         raft: bool = True, clients: bool = False) -> None:
        """Add a toxic to both streams of every Raft (and/or client) proxy."""
        names = [n for names in self.raft_links.values() for n in names] if raft else []
        if clients:
            names += list(self.client_proxy.values())
        for proxy_name in names:
            proxy = self.proxy(proxy_name)
            for stream in ("upstream", "downstream"):
                proxy.add_toxic(name=f"{name}-{stream}", type=type, stream=stream, attributes=attributes)

    def heal(self) -> None:
        """Every proxy enabled, every toxic removed (Toxiproxy's ``POST /reset``)."""
        self.toxiproxy.reset()
