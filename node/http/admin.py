"""The HTTP admin API: the cluster's nodes, their moves, and the commands that change its shape.

Every route needs a client token when the node has tokens (the port's auth middleware), and
a node in ``dashboard_read_only`` mode still serves the admin API (it is not the dashboard).
A change goes into the node registry (:mod:`shoal.node.cluster_map`), which reaches every
node by gossip; the partitions' leaders then move replicas (:mod:`shoal.node.moves`).

- ``GET /admin/cluster``: registry, settings, topology, the target placement, this node's moves
  and the memberships (Raft member ids) of the partitions it leads (``?all=1``: every node's,
  gathered from every live peer over the node-to-node link);
- ``GET /admin/moves``: the moves this node runs as a leader, and its led partitions' memberships;
- ``POST /admin/nodes`` ``{id, host, port, httpPort, raftPort}``: add a node;
- ``POST /admin/nodes/{id}/decommission``: move every replica off it (state ``leaving``);
- ``POST /admin/nodes/{id}/remove``: mark a node no partition lists any more as ``removed``;
- ``POST /admin/nodes/{id}/replace`` ``{incarnation}``: the node runs a new incarnation (a new
  disk): it joins as a new member and its old replicas are replaced;
- ``POST /admin/rebalance``: move toward the targets now (also with ``rebalanceAuto`` off);
- ``PUT /admin/settings`` ``{replication?, rebalanceAuto?, moveRateBytesPerS?}``.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from shoal.cluster.errors import CommandError
from shoal.cluster.registry import LEAVING, REMOVED, NodeEntry, RegistryError

from .util import json_response

if TYPE_CHECKING:
    from ..view import NodeView

__all__ = ["add_admin_routes", "led_memberships", "ADMIN_BODY_BYTES_MAX"]

#: The largest admin request body.
ADMIN_BODY_BYTES_MAX = 16 * 1024
PEER_TIMEOUT_S = 2.0


def _error(status: int, code: str, message: str) -> web.Response:
    return json_response({"ok": False, "code": code, "error": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > ADMIN_BODY_BYTES_MAX:
        raise web.HTTPRequestEntityTooLarge(max_size=ADMIN_BODY_BYTES_MAX, actual_size=request.content_length)
    raw = await request.content.read(ADMIN_BODY_BYTES_MAX + 1)
    if len(raw) > ADMIN_BODY_BYTES_MAX:
        raise web.HTTPRequestEntityTooLarge(max_size=ADMIN_BODY_BYTES_MAX, actual_size=len(raw))
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise _Invalid(f"body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise _Invalid("body must be a JSON object")
    return doc


class _Invalid(Exception):
    pass


def led_memberships(node: "NodeView") -> dict[str, dict[str, Any]]:
    """The Raft membership (member ids) of every partition ``node`` leads, with its term."""
    out: dict[str, dict[str, Any]] = {}
    for p, part in sorted(node.partitions.items()):
        replica = part.replica
        if replica.is_leader():
            members = replica.membership
            out[str(p)] = {"leader": node.node_id, "term": replica.term(), "voters": sorted(members.voters),
                           "learners": sorted(members.learners)}
    return out


class AdminApi:
    """Handlers of the admin routes (see the module docstring)."""

    def __init__(self, node: "NodeView") -> None:
        self.node = node

    def _summary(self) -> dict[str, Any]:
        node = self.node
        reg = node.cluster_map.registry
        return {"ok": True, "nodeId": node.node_id, "registry": reg.to_wire(),
                "placement": {str(p): m for p, m in reg.placement().items()},
                "topology": node.topology.to_wire(), **self._own_moves(),
                "moveCounters": node.moves.counters()}

    async def cluster(self, request: web.Request) -> web.Response:
        body = self._summary()
        if request.query.get("all") in ("1", "true"):
            body["moves"], body["memberships"] = await self._gather(request)
        return json_response(body)

    def _own_moves(self) -> dict[str, Any]:
        """The moves this node runs and the memberships of the partitions it leads."""
        return {"moves": list(self.node.moves.moves()), "memberships": led_memberships(self.node)}

    async def moves(self, _: web.Request) -> web.Response:
        return json_response({"ok": True, "nodeId": self.node.node_id, **self._own_moves()})

    async def _moves_call(self, _: Any) -> dict[str, Any]:
        """:meth:`_own_moves`, for another node's :meth:`_gather`."""
        return self._own_moves()

    async def _gather(self, request: web.Request) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """This node's moves and led memberships and every live peer's, asked over the
        node-to-node link (of two leaders of one partition, the one of the higher term counts)."""
        node = self.node
        own = self._own_moves()
        moves, memberships = own["moves"], own["memberships"]
        relay = node.dispatcher.relay

        async def ask(entry: NodeEntry) -> dict[str, Any]:
            if relay is None:
                return {}
            try:
                found = await relay.ask_node(entry.id, "admin.moves", None, PEER_TIMEOUT_S)
            except CommandError:
                return {}  # unreachable now: its moves are missing from this answer, not an error
            return found if isinstance(found, dict) else {}

        peers = [e for e in node.cluster_map.registry.live() if e.id != node.node_id]
        for found in await asyncio.gather(*(ask(e) for e in peers)):
            moves.extend(m for m in found.get("moves", []) if isinstance(m, dict))
            theirs = found.get("memberships")
            for p, m in (theirs.items() if isinstance(theirs, dict) else ()):
                mine = memberships.get(p)
                if isinstance(m, dict) and (mine is None or m.get("term", 0) > mine["term"]):
                    memberships[p] = m
        moves.sort(key=lambda m: (m.get("partition", 0), m.get("to") or "", m.get("from") or ""))
        return moves, dict(sorted(memberships.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1))

    async def add_node(self, request: web.Request) -> web.Response:
        try:
            doc = await _body(request)
            entry = NodeEntry(str(doc["id"]), str(doc["host"]), int(doc["port"]), int(doc["httpPort"]),
                              int(doc["raftPort"]), incarnation=str(doc.get("incarnation", "")))
            entry.check()
            self.node.cluster_map.add_node(entry)
        except _Invalid as exc:
            return _error(400, "INVALID", str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            return _error(400, "INVALID", f"a node needs id, host, port, httpPort and raftPort: {exc}")
        return json_response(self._summary())

    async def decommission(self, request: web.Request) -> web.Response:
        node_id = request.match_info["id"]
        reg = self.node.cluster_map.registry
        entry = reg.nodes.get(node_id)
        if entry is None or entry.state == REMOVED:
            return _error(404, "NOT_FOUND", f"no live node {node_id!r}")
        if len(reg.active()) <= 1 and entry.state != LEAVING:
            return _error(409, "INVALID_STATE", "the last active node cannot leave")
        self.node.cluster_map.set_state(node_id, LEAVING)
        return json_response(self._summary())

    async def remove(self, request: web.Request) -> web.Response:
        node_id = request.match_info["id"]
        reg = self.node.cluster_map.registry
        if node_id not in reg.nodes:
            return _error(404, "NOT_FOUND", f"no node {node_id!r}")
        holding = [p.id for p in self.node.topology.partition_map if node_id in p.replicas]
        if holding:
            return _error(409, "INVALID_STATE", f"{node_id} still holds replicas of partitions {holding}: "
                                                f"decommission it and wait for its moves first")
        self.node.cluster_map.set_state(node_id, REMOVED)
        return json_response(self._summary())

    async def replace(self, request: web.Request) -> web.Response:
        node_id = request.match_info["id"]
        try:
            doc = await _body(request)
            self.node.cluster_map.replace_incarnation(node_id, str(doc.get("incarnation", "")))
        except _Invalid as exc:
            return _error(400, "INVALID", str(exc))
        return json_response(self._summary())

    async def rebalance(self, _: web.Request) -> web.Response:
        cm = self.node.cluster_map
        cm.update(cm.registry.with_settings(rebalance_epoch=cm.registry.settings.rebalance_epoch + 1))
        return json_response(self._summary())

    async def settings(self, request: web.Request) -> web.Response:
        try:
            doc = await _body(request)
            changes: dict[str, Any] = {}
            if "replication" in doc:
                changes["replication"] = int(doc["replication"])
            if "rebalanceAuto" in doc:
                if not isinstance(doc["rebalanceAuto"], bool):
                    raise _Invalid("rebalanceAuto must be true or false")
                changes["rebalance_auto"] = doc["rebalanceAuto"]
            if "moveRateBytesPerS" in doc:
                changes["move_rate_bytes_per_s"] = int(doc["moveRateBytesPerS"])
            unknown = set(doc) - {"replication", "rebalanceAuto", "moveRateBytesPerS"}
            if unknown:
                raise _Invalid(f"unknown settings: {', '.join(sorted(unknown))}")
            if changes:
                cm = self.node.cluster_map
                cm.update(cm.registry.with_settings(**changes))
        except _Invalid as exc:
            return _error(400, "INVALID", str(exc))
        except (TypeError, ValueError) as exc:
            return _error(400, "INVALID", str(exc))
        return json_response(self._summary())


def add_admin_routes(app: web.Application, node: "NodeView") -> None:
    """Register the admin routes on the node's application."""
    admin = AdminApi(node)

    async def serve_peers(_: web.Application) -> None:
        relay = node.dispatcher.relay
        if relay is not None:  # other nodes' ``/admin/cluster?all=1`` ask this one over the node link
            relay.serve_node_calls("admin.moves", admin._moves_call)

    app.on_startup.append(serve_peers)

    async def guarded(handler: Any, request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except RegistryError as exc:
            return _error(409 if "already" in str(exc) else 400, "INVALID", str(exc))

    def route(handler: Any) -> Any:
        async def wrapped(request: web.Request) -> web.Response:
            return await guarded(handler, request)
        return wrapped

    r = app.router
    r.add_get("/admin/cluster", route(admin.cluster))
    r.add_get("/admin/moves", route(admin.moves))
    r.add_post("/admin/nodes", route(admin.add_node))
    r.add_post("/admin/nodes/{id}/decommission", route(admin.decommission))
    r.add_post("/admin/nodes/{id}/remove", route(admin.remove))
    r.add_post("/admin/nodes/{id}/replace", route(admin.replace))
    r.add_post("/admin/rebalance", route(admin.rebalance))
    r.add_put("/admin/settings", route(admin.settings))
