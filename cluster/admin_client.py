"""A client of a node's HTTP admin API (``node/http/admin.py``): what operator commands, chaos
scenarios and benchmarks use to change the cluster's shape and watch it get there; the queue
commands (:mod:`.queue_admin`) reach the rest of the node's HTTP API through :meth:`AdminClient.call`
and :meth:`AdminClient.stream`.

Blocking (``urllib``), one request at a time, every call bounded by ``timeout_s``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from .registry import Registry, node_of_member

__all__ = ["AdminClient", "AdminError", "ClusterShape"]

#: The largest JSON answer read (the overview of a cluster of many queues is a few MiB).
ANSWER_BYTES_MAX = 16 * 1024 * 1024


class AdminError(Exception):
    """The admin API refused a request (``code`` is its error code) or could not be reached."""

    def __init__(self, message: str, code: str = "UNAVAILABLE", status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """What ``GET /admin/cluster?all=1`` says: registry, target placement, topology and moves."""

    registry: Registry
    placement: dict[int, list[str]]
    topology: dict[str, Any]
    moves: list[dict[str, Any]]
    #: Partition -> ``{leader, term, voters, learners}`` (Raft member ids) as its leader reports
    #: it; None when the node answering does not report memberships.
    memberships: dict[int, dict[str, Any]] | None = None

    def replicas(self, partition: int) -> list[str]:
        return list(self.topology["partitionMap"][partition]["replicas"])

    def leader(self, partition: int) -> str | None:
        leader = self.topology["partitionMap"][partition]["leader"]
        return str(leader) if leader is not None else None

    def members(self, partition: int) -> tuple[list[str], list[str]] | None:
        """(voters, learners) of ``partition`` as member ids, when its leader reported them."""
        m = (self.memberships or {}).get(partition)
        return (list(m["voters"]), list(m["learners"])) if m else None

    def settled(self) -> bool:
        """Every partition's voters are its target's nodes, it has a leader, and no move runs;
        where memberships are reported, its voters are exactly the target's member ids (a
        replaced node's new incarnation, not its old self) and it has no learner."""
        if self.moves:
            return False
        for p, target in self.placement.items():
            nodes = sorted(node_of_member(m) for m in target)
            if sorted(self.replicas(p)) != nodes or self.leader(p) is None:
                return False
            if self.memberships is not None:
                members = self.members(p)
                if members is None or sorted(members[0]) != sorted(target) or members[1]:
                    return False
        return True

    def holds(self, node: str) -> bool:
        """True while any partition lists ``node`` (as a voter, a learner, its leader, or in a move)."""
        for info in self.topology["partitionMap"]:
            if node in info["replicas"] or info["leader"] == node:
                return True
        for m in self.moves:
            if node in (m.get("from"), m.get("to")):
                return True
        for p in (self.memberships or {}):
            voters, learners = self.members(p) or ([], [])
            if any(node_of_member(m) == node for m in voters + learners):
                return True
        return False

    def leaders_balanced(self) -> bool:
        """Every partition is led by its preferred (first target) node."""
        return all(self.leader(p) == node_of_member(target[0]) for p, target in self.placement.items() if target)


class AdminClient:
    """Calls one node's admin API (``base_url`` like ``http://127.0.0.1:6790``)."""

    def __init__(self, base_url: str, token: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.ssl_context = ssl_context
        self.timeout_s = timeout_s

    def _open(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout_s: float | None = None) -> http.client.HTTPResponse:
        """The response to one request, its body unread; AdminError on an error status or no answer."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(
                request, timeout=timeout_s or self.timeout_s, context=self.ssl_context)
        except urllib.error.HTTPError as exc:
            try:
                doc = json.loads(exc.read(1024 * 1024))
            except (OSError, ValueError):
                doc = {}
            if not isinstance(doc, dict):
                doc = {}
            raise AdminError(str(doc.get("error") or exc), str(doc.get("code") or "HTTP"), exc.code) from exc
        except (OSError, ValueError) as exc:
            raise AdminError(f"{self.base_url}: {exc}") from exc
        return response

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request to any endpoint of the node's HTTP API (``/admin/…``, ``/cluster``, ``/queues/…``):
        its JSON answer. :class:`AdminError`: refused (its ``code`` and HTTP ``status``) or not answered
        (``status`` 0)."""
        try:
            with self._open(method, path, body) as resp:
                doc = json.loads(resp.read(ANSWER_BYTES_MAX))
        except (OSError, ValueError) as exc:
            raise AdminError(f"{self.base_url}: {exc}") from exc
        if not isinstance(doc, dict):
            raise AdminError(f"{self.base_url}{path}: the answer is not a JSON object")
        return doc

    def stream(self, path: str, idle_s: float) -> http.client.HTTPResponse:
        """The open response of a streaming GET (Server-Sent Events); a read waits at most ``idle_s``.
        The caller reads and closes it."""
        return self._open("GET", path, None, idle_s)

    def shape(self) -> ClusterShape:
        doc = self.call("GET", "/admin/cluster?all=1")
        found = doc.get("memberships")
        memberships = {int(p): m for p, m in found.items()} if isinstance(found, dict) else None
        return ClusterShape(Registry.from_wire(doc["registry"]),
                            {int(p): list(m) for p, m in doc["placement"].items()}, doc["topology"], doc["moves"],
                            memberships)

    def registry(self) -> Registry:
        """The node registry as this node holds it (one request, no peer asked)."""
        return Registry.from_wire(self.call("GET", "/admin/cluster")["registry"])

    def add_node(self, node_id: str, host: str, port: int, http_port: int, raft_port: int,
                 incarnation: str = "") -> dict[str, Any]:
        """Register a node; ``incarnation`` (when the joining node knows it) is recorded as its first."""
        body: dict[str, Any] = {"id": node_id, "host": host, "port": port, "httpPort": http_port,
                                "raftPort": raft_port}
        if incarnation:
            body["incarnation"] = incarnation
        return self.call("POST", "/admin/nodes", body)

    def decommission(self, node_id: str) -> dict[str, Any]:
        return self.call("POST", f"/admin/nodes/{node_id}/decommission")

    def remove(self, node_id: str) -> dict[str, Any]:
        return self.call("POST", f"/admin/nodes/{node_id}/remove")

    def replace(self, node_id: str, incarnation: str) -> dict[str, Any]:
        return self.call("POST", f"/admin/nodes/{node_id}/replace", {"incarnation": incarnation})

    def rebalance(self) -> dict[str, Any]:
        return self.call("POST", "/admin/rebalance")

    def settings(self, **changes: Any) -> dict[str, Any]:
        """``replication``, ``rebalanceAuto``, ``moveRateBytesPerS``."""
        return self.call("PUT", "/admin/settings", changes)

    def wait(self, done: Any, timeout_s: float, poll_s: float = 0.5, progress: Any = None) -> ClusterShape:
        """Poll :meth:`shape` until ``done(shape)`` (bounded by ``timeout_s``); ``progress(shape)``
        is called after each poll. TimeoutError names what was still running."""
        deadline = time.monotonic() + timeout_s
        shape: ClusterShape | None = None
        while True:
            try:
                shape = self.shape()
            except AdminError:
                shape = None
            if shape is not None:
                if progress is not None:
                    progress(shape)
                if done(shape):
                    return shape
            if time.monotonic() >= deadline:
                running = shape.moves if shape is not None else "the node did not answer"
                raise TimeoutError(f"the cluster did not reach the asked-for shape in {timeout_s:.0f} s "
                                   f"(still running: {running})")
            time.sleep(poll_s)
