"""The steps a Helm chart pod runs around ``shoal node``: :func:`join` and :func:`leave`
(the commands ``shoal pod join`` and ``shoal pod leave`` of :mod:`shoal.cli.pod`).

A StatefulSet's pods are ``<name>-0 .. <name>-(N-1)``. The first ones (the chart's
``initialReplicas``, fixed at install) created the cluster; every later pod joins it.

- ``join`` runs as the init container, before ``shoal node``. It reads the node's identity from
  its volume (writing it on an empty volume: the incarnation the node will run), then asks the
  admin API of the first peer that answers what the cluster knows of this node. A node the
  registry lacks (or lists as removed) is added with that incarnation. A node it knows under
  another incarnation whose volume was empty (a lost disk, a deleted claim) is *replaced*: it
  joins as a new member and its old replicas are rebuilt on it. The same with a volume that holds
  older data (a restored copy, which could vote twice in a term) is refused: an operator decides.
  One of the first nodes that finds no peer answering is the cluster forming: nothing to join.
- ``leave`` runs as the preStop hook. A pod whose ordinal is at or past the StatefulSet's
  ``replicas`` is being scaled away: the nodes at or past ``replicas`` are decommissioned highest
  ordinal first (each one's replicas and leadership moved to the other nodes, then it is removed
  from the registry), down to this one, before it stops. Any other stop (a rolling update, an
  eviction, a drained Kubernetes node) is a plain graceful stop: the node comes back on its volume.
  The hook learns ``replicas`` from the Kubernetes API with the pod's service account.

Both talk to the nodes' HTTP admin API with the first client token and the node's TLS settings,
and every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from shoal.cluster.admin_client import AdminClient, AdminError, ClusterShape
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.registry import ACTIVE, REMOVED, NodeEntry, Registry

from .identity import IDENTITY_FILE, IdentityError, load_identity, read_identity
from .raft._io import RealIO

__all__ = ["join", "leave", "pod_ordinal", "statefulset_replicas", "PodError",
           "SERVICE_ACCOUNT_DIR", "JOIN_TIMEOUT_S", "LEAVE_TIMEOUT_S"]

#: Where Kubernetes mounts the pod's service account (token, CA, namespace).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: How long ``join`` waits for a peer's admin API (a later pod of a cluster still starting).
JOIN_TIMEOUT_S = 600.0
#: How long ``leave`` may take by default (the chart passes its own, inside the grace period).
LEAVE_TIMEOUT_S = 3600.0
POLL_S = 2.0
_API_BYTES_MAX = 4 * 1024 * 1024
_ORDINAL = re.compile(r"(.+)-(\d+)")

Say = Callable[[str], None]


class PodError(Exception):
    """A pod step that cannot go on; the message says why and what to do."""


def pod_ordinal(node_id: str) -> tuple[str, int] | None:
    """(StatefulSet name, ordinal) of a pod name like ``shoal-3``; None for any other id."""
    m = _ORDINAL.fullmatch(node_id)
    return (m.group(1), int(m.group(2))) if m else None


def admin_client(config: ClusterConfig, spec: NodeSpec, timeout_s: float = 5.0) -> AdminClient:
    """A client of ``spec``'s admin API with this node's first token and TLS settings."""
    scheme = "https" if config.tls else "http"
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return AdminClient(f"{scheme}://{host}:{spec.http_port}", config.tokens[0] if config.tokens else None,
                       config.tls.client_context() if config.tls else None, timeout_s)


def _first_registry(clients: list[AdminClient]) -> tuple[AdminClient, Registry] | None:
    for client in clients:
        try:
            return client, client.registry()
        except AdminError:
            continue
    return None


def _first_shape(clients: list[AdminClient]) -> tuple[AdminClient, ClusterShape] | None:
    for client in clients:
        try:
            return client, client.shape()
        except AdminError:
            continue
    return None


# --- join ----------------------------------------------------------------------------------------

def join(config: ClusterConfig, timeout_s: float = JOIN_TIMEOUT_S, poll_s: float = POLL_S,
         say: Say = print) -> None:
    """Make sure the cluster knows this node as the incarnation on its volume (module docstring).

    Raises :class:`PodError` when it cannot (no peer answered in time, or the volume holds data
    the cluster must not take back).
    """
    me = config.node_id
    if not me:
        raise PodError("no node id: set SHOAL_NODE_ID")
    spec = config.node()
    data_dir = str(config.node_data_dir())
    io = RealIO(disk_free_min_bytes=0)
    try:
        had_identity = read_identity(io, os.path.join(data_dir, IDENTITY_FILE)) is not None
        held = [name for name in (os.listdir(data_dir) if os.path.isdir(data_dir) else [])
                if name not in (IDENTITY_FILE, "lost+found")]
        identity = load_identity(data_dir, config.cluster_id, me, io=io)
    except (IdentityError, OSError) as exc:
        raise PodError(f"node {me}: {exc}") from exc
    empty = not had_identity and not held
    say(f"{me}: incarnation {identity.incarnation} ({'a new volume' if empty else 'data kept'})")
    first = me in config.bootstrap_ids()
    clients = [admin_client(config, n) for n in config.nodes if n.id != me]
    deadline = time.monotonic() + timeout_s
    while True:
        found = _first_registry(clients)
        if found is None:
            if first:
                say(f"{me}: no peer answers; the cluster is forming and {me} is one of its first nodes")
                return
            if time.monotonic() >= deadline:
                raise PodError(f"{me}: no peer's admin API answered within {timeout_s:.0f} s "
                               f"({', '.join(c.base_url for c in clients)})")
            time.sleep(poll_s)
            continue
        client, reg = found
        try:
            if _register(client, reg, spec, identity.incarnation, empty, say):
                return
        except AdminError as exc:
            if exc.code in ("HTTP", "UNAVAILABLE") and time.monotonic() < deadline:
                say(f"{me}: {client.base_url} answered {exc}; trying again")
                time.sleep(poll_s)
                continue
            raise PodError(f"{me}: {client.base_url} refused: {exc}") from exc
        if time.monotonic() >= deadline:
            raise PodError(f"{me}: the cluster did not take the registration within {timeout_s:.0f} s")
        time.sleep(poll_s)


def _register(client: AdminClient, reg: Registry, spec: NodeSpec, incarnation: str, empty: bool, say: Say) -> bool:
    """One look at the registry: register, replace, or nothing to do (True); False to look again."""
    me = spec.id
    entry = reg.nodes.get(me)
    if entry is None or entry.state == REMOVED:
        if entry is not None and not empty:
            raise PodError(f"{me} was removed from cluster {reg.cluster_id}, and its volume still holds the data "
                           f"of that membership: delete the volume (its PersistentVolumeClaim) so the pod joins "
                           f"anew")
        client.add_node(me, spec.host, spec.port, spec.http_port, spec.raft_port, incarnation=incarnation)
        say(f"{me}: registered with cluster {reg.cluster_id} through {client.base_url}; its leaders now move "
            f"replicas onto it")
        return False  # look again: the registry must name it now
    if entry.incarnation in ("", incarnation):
        say(f"{me}: a {entry.state} node of cluster {reg.cluster_id}")
        return True
    if empty:
        client.replace(me, incarnation)
        say(f"{me}: the cluster knew it as incarnation {entry.incarnation}, whose data is gone; replaced by "
            f"{incarnation} (its replicas are rebuilt on it)")
        return False
    raise PodError(f"{me}: its volume holds incarnation {incarnation}, but cluster {reg.cluster_id} knows {me} as "
                   f"incarnation {entry.incarnation}: a restored or foreign copy of its data, which must not vote "
                   f"again. Delete the volume to join as a new member (deploy/README.md, replacing a node)")


# --- leave ---------------------------------------------------------------------------------------

def statefulset_replicas(name: str, api_url: str | None = None, account_dir: str = SERVICE_ACCOUNT_DIR,
                         timeout_s: float = 5.0) -> int:
    """The StatefulSet's wanted replica count, read from the Kubernetes API with the pod's service account."""
    account = Path(account_dir)
    try:
        namespace = (account / "namespace").read_text().strip()
        token = (account / "token").read_text().strip()
    except OSError as exc:
        raise PodError(f"no service account at {account_dir}: {exc}") from exc
    if api_url is None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
        host = f"[{host}]" if ":" in host else host
        api_url = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
    context = None
    if api_url.startswith("https:"):
        ca = account / "ca.crt"
        context = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
    url = f"{api_url.rstrip('/')}/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            doc = json.loads(resp.read(_API_BYTES_MAX))
        return int(doc["spec"]["replicas"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PodError(f"cannot read statefulset {namespace}/{name} from {api_url}: {exc}") from exc


def _holds(shape: ClusterShape, node: str) -> bool:
    """True while some partition lists ``node`` or a move still involves it."""
    partitions = len(shape.topology["partitionMap"])
    return any(node in shape.replicas(p) for p in range(partitions)) or any(
        node in (m.get("from"), m.get("to")) for m in shape.moves)


def _leaving_order(reg: Registry, prefix: str, replicas: int) -> list[NodeEntry]:
    """The live nodes of this StatefulSet at or past ``replicas``, highest ordinal first."""
    out = []
    for entry in reg.live():
        parsed = pod_ordinal(entry.id)
        if parsed is not None and parsed[0] == prefix and parsed[1] >= replicas:
            out.append((parsed[1], entry))
    return [entry for _, entry in sorted(out, key=lambda oe: -oe[0])]


def leave(config: ClusterConfig, replicas: int | None, timeout_s: float = LEAVE_TIMEOUT_S,
          poll_s: float = POLL_S, say: Say = print) -> bool:
    """Before this pod stops: decommission it if a scale-down takes it away (module docstring).

    True when the node may stop (nothing to do, or it left the cluster); False when the time ran
    out with the node still leaving (its moves go on; the cluster removes it once they finish).
    """
    me = config.node_id or ""
    parsed = pod_ordinal(me)
    if parsed is None or replicas is None:
        say(f"{me}: a plain stop (no StatefulSet replica count)")
        return True
    prefix, ordinal = parsed
    if ordinal < replicas:
        say(f"{me}: ordinal {ordinal} < replicas {replicas}: a plain stop, the node comes back on its volume")
        return True
    clients = [admin_client(config, config.node())] + [admin_client(config, n) for n in config.nodes if n.id != me]
    deadline = time.monotonic() + timeout_s
    say(f"{me}: scaled away (ordinal {ordinal} >= replicas {replicas}); decommissioning, highest ordinal first")
    last = ""
    while True:
        found = _first_shape(clients)
        if found is not None:
            client, shape = found
            order = _leaving_order(shape.registry, prefix, replicas)
            if me not in {e.id for e in order}:
                say(f"{me}: removed from the cluster; stopping")
                return True
            step = _leave_step(client, shape, order[0], say)
            if step != last:
                say(step)
                last = step
        if time.monotonic() >= deadline:
            say(f"{me}: still leaving after {timeout_s:.0f} s; stopping anyway (its moves go on, see "
                "GET /admin/cluster; remove it once no partition lists it)")
            return False
        time.sleep(poll_s)


def _leave_step(client: AdminClient, shape: ClusterShape, entry: NodeEntry, say: Say) -> str:
    """One step of taking ``entry`` out; what it is waiting for."""
    node = entry.id
    try:
        if entry.state == ACTIVE:
            client.decommission(node)
            return f"{node}: decommissioned; its replicas and leadership move to the other nodes"
        if not _holds(shape, node):
            client.remove(node)
            return f"{node}: holds no replica any more; removed"
    except AdminError as exc:
        return f"{node}: {exc} (trying again)"
    moves = [m for m in shape.moves if node in (m.get("from"), m.get("to"))]
    held = [p for p in range(len(shape.topology["partitionMap"])) if node in shape.replicas(p)]
    return f"{node}: leaving; still in partitions {held}, {len(moves)} moves running"
