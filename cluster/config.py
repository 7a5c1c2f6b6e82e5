"""Cluster configuration: one TOML file and/or ``SHOAL_*`` environment variables.

Every deployment (``shoal cluster up``, docker-compose, Helm) configures a node
the same way. The file::

    [cluster]
    # The cluster's id: Hello, the Raft handshake and every node's identity file name it.
    # `shoal cluster up` writes a random one; a configuration without one is "shoal-local".
    id = "shoal-3f9c2a7d41e0b865"
    partitions = 8
    replication = 3             # RF; capped at the node count
    secret = ""                 # cluster secret: Raft peers authenticate with it (required unless
                                # every Raft port binds loopback; `shoal cluster up` generates one)
    tokens = []                 # client auth tokens; empty = no auth
    session_grace_ms = 0
    frame_bytes_max = 67108864
    inflight_per_connection = 100
    data_dir = ".shoal"         # node data goes under data_dir/<node id> unless set per node
    dashboard_read_only = false # the web dashboard hides its actions and the API refuses them

    [[nodes]]
    id = "n1"
    host = "127.0.0.1"          # advertised to clients and peers
    port = 6789                 # binary protocol
    http_port = 6790
    raft_port = 7789            # the node's one Raft port (every partition shares it)

Environment variables override the file (names are the contract with deploy/):

=========================  ==================================================
SHOAL_CONFIG               path of the TOML file (optional)
SHOAL_NODE_ID              this node's id (Kubernetes: the pod's hostname)
SHOAL_PEERS                ``id=host[:port[:http_port[:raft_port]]]`` comma list (IPv6: ``[::1]``)
SHOAL_CLUSTER_ID           cluster id (``[A-Za-z0-9][A-Za-z0-9_.:-]*``, at most 128 characters)
SHOAL_PARTITIONS           partition count
SHOAL_REPLICATION          replication factor
SHOAL_CLUSTER_SECRET       cluster secret (Raft link authentication)
SHOAL_AUTH_TOKENS          comma-separated client tokens
SHOAL_DATA_DIR             this node's data directory
SHOAL_LISTEN               bind address of every listener (default: the node's host)
SHOAL_CLIENT_PORT          default client port for peers without one
SHOAL_HTTP_PORT            default HTTP port
SHOAL_RAFT_PORT            default Raft port
SHOAL_SESSION_GRACE_MS     lease grace after a disconnect
SHOAL_FRAME_BYTES_MAX      maximum frame size
SHOAL_DASHBOARD_READ_ONLY  ``1``/``true``: the dashboard's actions are refused (``READ_ONLY``)
SHOAL_SYNC_INTERVAL_MS     how soon disk-class (``durable: false``) entries reach the disk
SHOAL_DISK_FREE_MIN_BYTES  below this much free space, partitions refuse new data (``NO_SPACE``)
SHOAL_BOOTSTRAP_NODES      the nodes the cluster was created with (default: every node listed)
SHOAL_NODE_HOST            this node's host (as peers and clients reach it) when ``SHOAL_PEERS``
                           does not list it: a node added after the cluster was created joins
                           with the first nodes as its peers; its ports are the defaults above
SHOAL_REPAIR_DAMAGED       ``1``/``0``: a damaged replica is fetched again from its leader (default)
                           or the node refuses to start naming the file
=========================  ==================================================

Limits on what clients can make a node hold (``[limits]``) and TLS
(``[tls]``) are described, with their variables, in :mod:`shoal.cluster.guard`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w

from .codec import FRAME_BYTES_MAX_DEFAULT
from .guard import LIMITS_ENV_VARS, TLS_ENV_VARS, NodeLimits, TlsSettings, parse_limits, parse_tls
from .partitioning import default_rf, place_replicas
from .topology import NodeAddress, PartitionInfo, Topology

__all__ = ["NodeSpec", "ClusterConfig", "ConfigError", "load_config", "ENV_VARS",
           "DEFAULT_CLIENT_PORT", "DEFAULT_HTTP_PORT", "DEFAULT_RAFT_PORT", "DEFAULT_CLUSTER_ID",
           "CLUSTER_ID_CHARS_MAX"]

DEFAULT_CLIENT_PORT = 6789
DEFAULT_HTTP_PORT = 6790
DEFAULT_RAFT_PORT = 7789
#: The cluster id of a configuration that names none (every deployment names its own).
DEFAULT_CLUSTER_ID = "shoal-local"
CLUSTER_ID_CHARS_MAX = 128
_CLUSTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")

#: Every environment variable ``load_config`` reads (deploy/ tests check against this).
ENV_VARS = (
    "SHOAL_CONFIG", "SHOAL_NODE_ID", "SHOAL_PEERS", "SHOAL_CLUSTER_ID", "SHOAL_PARTITIONS",
    "SHOAL_REPLICATION", "SHOAL_CLUSTER_SECRET", "SHOAL_AUTH_TOKENS", "SHOAL_DATA_DIR",
    "SHOAL_LISTEN", "SHOAL_CLIENT_PORT", "SHOAL_HTTP_PORT", "SHOAL_RAFT_PORT",
    "SHOAL_SESSION_GRACE_MS", "SHOAL_FRAME_BYTES_MAX", "SHOAL_DASHBOARD_READ_ONLY",
    "SHOAL_SYNC_INTERVAL_MS", "SHOAL_DISK_FREE_MIN_BYTES", "SHOAL_BOOTSTRAP_NODES", "SHOAL_NODE_HOST",
    "SHOAL_REPAIR_DAMAGED",
) + tuple(LIMITS_ENV_VARS) + TLS_ENV_VARS


class ConfigError(ValueError):
    """The configuration is incomplete or contradictory."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the cluster as every peer sees it."""

    id: str
    host: str
    port: int = DEFAULT_CLIENT_PORT
    http_port: int = DEFAULT_HTTP_PORT
    raft_port: int = DEFAULT_RAFT_PORT
    data_dir: str | None = None
    # The client port to bind when it differs from the advertised ``port`` (a proxy or a
    # NAT in front of the node: the chaos harness routes client links through proxies).
    listen_port: int | None = None
    # (peer id, "host:port") pairs: this node reaches ``peer``'s Raft port at host:port
    # instead of the peer's own address (a proxy per node pair, for chaos tests).
    raft_routes: tuple[tuple[str, str], ...] = ()

    def raft_address(self) -> str:
        """``host:port`` of this node's Raft port, as peers dial it."""
        return f"{self.host}:{self.raft_port}"

    @property
    def client_listen_port(self) -> int:
        """The port the client listener binds."""
        return self.listen_port or self.port

    def address(self) -> NodeAddress:
        return NodeAddress(self.id, self.host, self.port, self.http_port)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The whole cluster's settings plus, for a running node, which node it is."""

    nodes: tuple[NodeSpec, ...]
    cluster_id: str = DEFAULT_CLUSTER_ID
    partitions: int = 8
    replication: int = 3
    secret: str = ""
    tokens: tuple[str, ...] = ()
    session_grace_ms: int = 0
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    inflight_per_connection: int = 100
    data_dir: str = ".shoal"
    node_id: str | None = None
    listen: str | None = None
    limits: NodeLimits = NodeLimits()
    tls: TlsSettings | None = None
    dashboard_read_only: bool = False
    #: Disk-class (``durable: false``) journal writes are synced at least this often.
    sync_interval_ms: int = 1_000
    #: Below this much free space on the data directory's filesystem, partitions refuse new data.
    disk_free_min_bytes: int = 256 * 1024 * 1024
    #: A replica whose journal or snapshot is damaged at start moves the files aside and fetches a
    #: fresh copy from its leader (True), or the node refuses to start naming the file (False).
    repair_damaged: bool = True
    #: The nodes the cluster was created with (every partition's first membership); empty means
    #: every node listed. A node added later is listed in ``nodes`` but not here; a node removed
    #: later stays here (the list is history).
    bootstrap_nodes: tuple[str, ...] = ()

    def bootstrap_ids(self) -> tuple[str, ...]:
        """The nodes the cluster was created with (``bootstrap_nodes``, else every node listed)."""
        return self.bootstrap_nodes or tuple(n.id for n in self.nodes)

    @property
    def rf(self) -> int:
        return min(self.replication, len(self.nodes)) if self.replication > 0 else default_rf(len(self.nodes))

    def node(self, node_id: str | None = None) -> NodeSpec:
        """The spec of ``node_id`` (default: this node)."""
        wanted = node_id or self.node_id
        for spec in self.nodes:
            if spec.id == wanted:
                return spec
        raise ConfigError(f"node {wanted!r} is not in the cluster's node list {[n.id for n in self.nodes]}")

    def peer_raft_address(self, from_id: str, to_id: str) -> tuple[str, int]:
        """(host, port) ``from_id`` dials for ``to_id``'s Raft port (routes honoured)."""
        for peer, address in self.node(from_id).raft_routes:
            if peer == to_id:
                host, _, port = address.rpartition(":")
                return host.strip("[]"), int(port)
        spec = self.node(to_id)
        return spec.host, spec.raft_port

    def raft_dials(self, node_id: str) -> list[str]:
        """The peers ``node_id`` dials: of each pair, the node listed later dials the earlier one."""
        ids = [n.id for n in self.nodes]
        return ids[:ids.index(node_id)]

    def raft_bind_host(self, node_id: str | None = None) -> str:
        """The address ``node_id``'s Raft listener binds: ``listen`` if set, else the node's host."""
        return self.listen or self.node(node_id).host

    def node_data_dir(self, node_id: str | None = None) -> Path:
        spec = self.node(node_id)
        return Path(spec.data_dir) if spec.data_dir else Path(self.data_dir) / spec.id

    def placement(self) -> dict[int, list[str]]:
        """Replicas per partition, preferred leader first."""
        return place_replicas([n.id for n in self.nodes], self.partitions, self.rf)

    def initial_topology(self) -> Topology:
        """The topology before any leader is known."""
        nodes = {n.id: n.address() for n in self.nodes}
        parts = tuple(PartitionInfo(p, tuple(r)) for p, r in sorted(self.placement().items()))
        return Topology(self.cluster_id, self.partitions, nodes, parts, 0)

    def raft_needs_secret(self) -> bool:
        """True when some Raft listener may bind beyond loopback (a wildcard counts).

        What is bound decides, not what is advertised: each node binds ``listen`` if set,
        else its host. Without a node id every node's host is checked, since any may be this one.
        """
        hosts = [self.listen] if self.listen else (
            [self.node().host] if self.node_id else [n.host for n in self.nodes])
        return any(not _is_loopback(h) for h in hosts)

    def validate(self) -> "ClusterConfig":
        if not self.nodes:
            raise ConfigError("no nodes configured (set [[nodes]] or SHOAL_PEERS)")
        if len(self.cluster_id) > CLUSTER_ID_CHARS_MAX or not _CLUSTER_ID.fullmatch(self.cluster_id):
            raise ConfigError(f"cluster id {self.cluster_id[:40]!r} must be 1..{CLUSTER_ID_CHARS_MAX} characters "
                              "of A-Z a-z 0-9 _ . : - starting with a letter or digit")
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"duplicate node ids in {ids}")
        if not 1 <= self.partitions <= 1024:
            raise ConfigError("partitions must be 1..1024")
        if self.replication < 0 or self.replication > 7:
            raise ConfigError("replication must be 0 (auto) .. 7")
        if not 1024 <= self.frame_bytes_max <= 0xFFFFFFFF:  # the length header is 4 bytes
            raise ConfigError("frame_bytes_max must be 1024 .. 4294967295")
        if not 1 <= self.sync_interval_ms <= 60_000:
            raise ConfigError("sync_interval_ms must be 1 .. 60000")
        if self.disk_free_min_bytes < 0:
            raise ConfigError("disk_free_min_bytes must be 0 or more")
        if self.inflight_per_connection < 1 or self.session_grace_ms < 0:
            raise ConfigError("inflight_per_connection must be ≥ 1 and session_grace_ms ≥ 0")
        if not all(isinstance(t, str) and t for t in self.tokens):
            raise ConfigError("tokens must be a list of non-empty strings")
        for n in self.nodes:
            if n.listen_port is not None and not 1 <= n.listen_port <= 65535:
                raise ConfigError(f"node {n.id}: listen_port must be 1..65535")
            for peer, address in n.raft_routes:
                host, sep, port = address.rpartition(":")
                if peer not in ids or peer == n.id or not sep or not host or not port.isdigit():
                    raise ConfigError(f"node {n.id}: raft route {peer!r} = {address!r} must name another "
                                      "node and a host:port")
        if self.raft_needs_secret() and not self.secret:
            raise ConfigError("Raft binds a non-loopback address but no cluster secret is set "
                              "(SHOAL_CLUSTER_SECRET / [cluster] secret): anyone who reaches the Raft "
                              "port could join the cluster's replication")
        return self

    def to_toml(self) -> str:
        """The file form of this configuration (node id and listen are not written)."""
        cluster: dict[str, Any] = {
            "id": self.cluster_id, "partitions": self.partitions, "replication": self.replication,
            "secret": self.secret, "tokens": list(self.tokens), "session_grace_ms": self.session_grace_ms,
            "frame_bytes_max": self.frame_bytes_max, "inflight_per_connection": self.inflight_per_connection,
            "data_dir": self.data_dir, "dashboard_read_only": self.dashboard_read_only,
            "sync_interval_ms": self.sync_interval_ms, "disk_free_min_bytes": self.disk_free_min_bytes,
            "repair_damaged": self.repair_damaged,
        }
        if self.bootstrap_nodes:
            cluster["bootstrap"] = list(self.bootstrap_nodes)
        doc: dict[str, Any] = {"cluster": cluster}
        if self.limits.to_table():
            doc["limits"] = self.limits.to_table()
        if self.tls is not None:
            doc["tls"] = self.tls.to_table()
        nodes = []
        for n in self.nodes:
            d: dict[str, Any] = {"id": n.id, "host": n.host, "port": n.port, "http_port": n.http_port,
                                 "raft_port": n.raft_port}
            if n.data_dir:
                d["data_dir"] = n.data_dir
            if n.listen_port is not None:
                d["listen_port"] = n.listen_port
            if n.raft_routes:
                d["raft_routes"] = dict(n.raft_routes)
            nodes.append(d)
        doc["nodes"] = nodes
        return tomli_w.dumps(doc)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parse_peers(text: str, port: int, http_port: int, raft_port: int) -> tuple[NodeSpec, ...]:
    specs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        node_id, sep, rest = item.partition("=")
        if not sep or not node_id or not rest:
            raise ConfigError(f"SHOAL_PEERS item {item!r} is not id=host[:port[:http_port[:raft_port]]]")
        if rest.startswith("["):  # IPv6: [::1]:port:http_port:raft_port
            host, _, tail = rest[1:].partition("]")
            parts = [host, *tail.split(":")[1:]]
        else:
            parts = rest.split(":")
        try:
            nums = [int(x) for x in parts[1:]]
        except ValueError as exc:
            raise ConfigError(f"SHOAL_PEERS item {item!r}: ports must be integers") from exc
        nums += [port, http_port, raft_port][len(nums):]
        specs.append(NodeSpec(node_id, parts[0], nums[0], nums[1], nums[2]))
    return tuple(specs)


def _with_self(nodes: tuple[NodeSpec, ...], bootstrap: tuple[str, ...], me: str | None, host: str, port: int,
               http_port: int, raft_port: int) -> tuple[tuple[NodeSpec, ...], tuple[str, ...]]:
    """``SHOAL_NODE_HOST``: the node list with this node in it. A node the list already names must
    name the same host; one it does not name was added after the cluster was created, so it is not
    one of the nodes the cluster was created with (those default to the nodes listed)."""
    if not me:
        raise ConfigError("SHOAL_NODE_HOST needs SHOAL_NODE_ID (the node it describes)")
    listed = [n for n in nodes if n.id == me]
    if listed:
        if listed[0].host != host:
            raise ConfigError(f"SHOAL_NODE_HOST={host!r} but SHOAL_PEERS lists {me} at {listed[0].host!r}")
        return nodes, bootstrap
    return (*nodes, NodeSpec(me, host, port, http_port, raft_port)), bootstrap or tuple(n.id for n in nodes)


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{name}={value!r} is not an integer") from exc


def _bootstrap_nodes(env: Mapping[str, str], section: Mapping[str, Any]) -> tuple[str, ...]:
    """``SHOAL_BOOTSTRAP_NODES=a,b,c`` over the file's ``bootstrap`` list."""
    if env.get("SHOAL_BOOTSTRAP_NODES"):
        return tuple(n.strip() for n in env["SHOAL_BOOTSTRAP_NODES"].split(",") if n.strip())
    found = section.get("bootstrap", ())
    if isinstance(found, str) or not all(isinstance(n, str) for n in found):
        raise ConfigError("[cluster] bootstrap must be a list of node ids")
    return tuple(found)


def _bool_setting(env: Mapping[str, str], name: str, section: Mapping[str, Any], key: str,
                  default: bool = False) -> bool:
    """A true/false setting: the environment variable (1/0, true/false, yes/no) over the file's key."""
    value = env.get(name)
    if value not in (None, ""):
        text = value.strip().lower()  # type: ignore[union-attr]
        if text not in ("1", "true", "yes", "0", "false", "no"):
            raise ConfigError(f"{name}={value!r} is not a boolean (1/0, true/false, yes/no)")
        return text in ("1", "true", "yes")
    found = section.get(key, default)
    if not isinstance(found, bool):
        raise ConfigError(f"[cluster] {key} must be true or false")
    return found


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
                node_id: str | None = None) -> ClusterConfig:
    """Read the TOML file (if any) and apply ``SHOAL_*`` overrides, then validate."""
    env = os.environ if env is None else env
    path = path or env.get("SHOAL_CONFIG") or None
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
    c = raw.get("cluster", {})
    port = _int_env(env, "SHOAL_CLIENT_PORT", DEFAULT_CLIENT_PORT)
    http_port = _int_env(env, "SHOAL_HTTP_PORT", DEFAULT_HTTP_PORT)
    raft_port = _int_env(env, "SHOAL_RAFT_PORT", DEFAULT_RAFT_PORT)
    try:
        nodes = tuple(NodeSpec(str(n["id"]), str(n.get("host", "127.0.0.1")), int(n.get("port", port)),
                               int(n.get("http_port", http_port)), int(n.get("raft_port", raft_port)),
                               n.get("data_dir"),
                               int(n["listen_port"]) if n.get("listen_port") is not None else None,
                               tuple(sorted((str(k), str(v)) for k, v in dict(n.get("raft_routes", {})).items())))
                      for n in raw.get("nodes", []))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"[[nodes]] entry is malformed: {exc}") from exc
    if env.get("SHOAL_PEERS"):
        nodes = _parse_peers(env["SHOAL_PEERS"], port, http_port, raft_port)
    tokens = c.get("tokens", ())
    if isinstance(tokens, str):  # tokens = "abc" would otherwise become three one-letter tokens
        raise ConfigError("[cluster] tokens must be a list of strings")
    tokens = tuple(tokens)
    if env.get("SHOAL_AUTH_TOKENS"):
        tokens = tuple(t.strip() for t in env["SHOAL_AUTH_TOKENS"].split(",") if t.strip())
    try:
        limits = parse_limits(raw.get("limits", {}), env)
        tls = parse_tls(raw.get("tls", {}), env)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from exc
    me = node_id or env.get("SHOAL_NODE_ID") or None
    bootstrap = _bootstrap_nodes(env, c)
    if env.get("SHOAL_NODE_HOST"):
        nodes, bootstrap = _with_self(nodes, bootstrap, me, env["SHOAL_NODE_HOST"], port, http_port, raft_port)
    if me and env.get("SHOAL_DATA_DIR"):
        nodes = tuple(replace(n, data_dir=env["SHOAL_DATA_DIR"]) if n.id == me else n for n in nodes)
    cfg = ClusterConfig(
        nodes=nodes,
        cluster_id=env.get("SHOAL_CLUSTER_ID") or str(c.get("id", DEFAULT_CLUSTER_ID)),
        partitions=_int_env(env, "SHOAL_PARTITIONS", int(c.get("partitions", 8))),
        replication=_int_env(env, "SHOAL_REPLICATION", int(c.get("replication", 3))),
        secret=env.get("SHOAL_CLUSTER_SECRET") or str(c.get("secret", "")),
        tokens=tokens,
        session_grace_ms=_int_env(env, "SHOAL_SESSION_GRACE_MS", int(c.get("session_grace_ms", 0))),
        frame_bytes_max=_int_env(env, "SHOAL_FRAME_BYTES_MAX", int(c.get("frame_bytes_max", FRAME_BYTES_MAX_DEFAULT))),
        inflight_per_connection=int(c.get("inflight_per_connection", 100)),
        data_dir=str(c.get("data_dir", ".shoal")),
        node_id=me,
        listen=env.get("SHOAL_LISTEN") or None,
        limits=limits,
        tls=tls,
        dashboard_read_only=_bool_setting(env, "SHOAL_DASHBOARD_READ_ONLY", c, "dashboard_read_only"),
        sync_interval_ms=_int_env(env, "SHOAL_SYNC_INTERVAL_MS", int(c.get("sync_interval_ms", 1_000))),
        disk_free_min_bytes=_int_env(env, "SHOAL_DISK_FREE_MIN_BYTES",
                                     int(c.get("disk_free_min_bytes", 256 * 1024 * 1024))),
        repair_damaged=_bool_setting(env, "SHOAL_REPAIR_DAMAGED", c, "repair_damaged", default=True),
        bootstrap_nodes=bootstrap,
    )
    cfg.validate()
    if me:
        cfg.node(me)
    return cfg
