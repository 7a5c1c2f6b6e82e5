"""Flows across partitions: ``PushFlow`` coordination and the leader's child-report forwarder.

**PushFlow** is coordinated by the node that receives it, top down, one level of the
tree at a time: a level's jobs go, one ``_FlowPush`` per queue, to their partitions'
leaders, and only once every one of them is committed does the next level go, each child
naming its parent's id. A job with children is created in ``waiting-children`` with the
number of children it waits for; so a parent always exists before its first child, and a
child's report can only find a parent that exists or existed. Every job carries the
idempotency key ``<flow key>/<path in the tree>``, so re-sending a PushFlow with the same
``idempotencyKey`` (what the client does after a lost reply or a failover) finds the jobs
already made and makes the rest: a flow cut short by a crash is completed by the retry.

**The forwarder** runs on every partition leader: each finished child leaves a report in
its partition's replicated outbox (``node/state/_flows.py``); the forwarder sends the
reports as ``_ChildDone`` to each parent's partition leader and, once that partition
committed them, proposes ``_FlowAcked`` in its own partition. A leader that dies between
the two steps leaves the outbox to its successor, who sends again; ``_ChildDone`` is
idempotent by child id, so the parent counts each child once.

**Peer requests.** When this node does not lead the target partition, the internal command
goes to the leader over the node-to-node link (:meth:`~.relay.Relay.call`), which follows
the leadership and whose peers proved the cluster secret in its handshake. The leader takes
``_FlowPush`` and ``_ChildDone`` only from that link (:meth:`~.relay.Relay.serve_peer_commands`):
from a client they are unknown commands, so no client can forge a child's report.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import msgpack

from shoal.cluster.commands import validate
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.flow import FlowNode, flatten, item_key
from shoal.cluster.partitioning import partition_for

from .ports import Replier

if TYPE_CHECKING:
    from .view import NodeView

__all__ = ["FlowService", "FLOW_COMMANDS"]

log = logging.getLogger(__name__)

#: Commands the dispatcher hands to :class:`FlowService`.
FLOW_COMMANDS = frozenset({"PushFlow"})
#: Internal commands a peer node sends a partition's leader over the node-to-node link.
PEER_COMMANDS = frozenset({"_FlowPush", "_ChildDone"})
FORWARD_INTERVAL_S = 0.05
PEER_TIMEOUT_S = 5.0
REPORTS_PER_ROUND_MAX = 256
REPORT_BYTES_PER_ROUND_MAX = 16 * 1024 * 1024  # below the default 64 MiB frame
PUSH_FLOW_ATTEMPTS_MAX = 50  # per level: NOT_LEADER / NO_LEADER while leaders change
PUSH_FLOW_RETRY_S = 0.1
PUSH_FLOWS_INFLIGHT_MAX = 1_000  # PushFlows this node coordinates at once


class FlowService:
    """PushFlow coordination, the child-report forwarder and peer requests of one node."""

    #: The commands the dispatcher hands to :meth:`handle`.
    commands = FLOW_COMMANDS

    def __init__(self, node: "NodeView") -> None:
        self.node = node
        self._forwarding: set[int] = set()
        self._push_flows = 0
        self.reports_sent = 0

    # --- entry points from the dispatcher ------------------------------------------------------

    def serve_peers(self) -> None:
        """Take the peers' flow commands from the node-to-node link (once the relay exists)."""
        relay = self.node.dispatcher.relay
        if relay is not None:
            relay.serve_peer_commands(PEER_COMMANDS, self.peer_request)

    def handle(self, conn: Replier, frame: dict[str, Any]) -> None:
        """Answer a PushFlow (later, from a task)."""
        validate(frame)
        req_id = frame.get("reqId")
        if self._push_flows >= PUSH_FLOWS_INFLIGHT_MAX:
            raise CommandError(ErrorCode.OVERLOADED, f"{self._push_flows} flows are being created on this node; "
                               "retry later")
        self._push_flows += 1

        async def run() -> None:
            try:
                ids = await self.push_flow(frame)
            except CommandError as exc:
                conn.reply_error(req_id, exc)
            except Exception as exc:  # a bug: answer, keep serving
                log.exception("PushFlow failed")
                conn.reply_error(req_id, CommandError(ErrorCode.INTERNAL, f"internal error: {exc}"))
            else:
                conn.reply(req_id, {"ids": ids})
            finally:
                self._push_flows -= 1

        self.node.loop.create_task(run())

    def peer_request(self, conn: Replier, cmd: dict[str, Any]) -> None:
        """Commit a peer's ``_FlowPush``/``_ChildDone`` in its partition, which this node leads
        (``NOT_LEADER`` otherwise: the peer's relay sends it to the new leader)."""
        req_id = cmd.pop("reqId", None)
        p = self._partition(cmd)
        part = self.node.partitions.get(p)
        if part is None or not part.replica.is_leader():
            raise self.node.not_leader_error(p)

        def done(result: Any) -> None:
            if isinstance(result, CommandError):
                conn.reply_error(req_id, result)
            else:
                conn.reply(req_id, result)

        part.group_commit.submit(cmd, done)

    # --- PushFlow ----------------------------------------------------------------------------

    async def push_flow(self, frame: dict[str, Any]) -> list[str]:
        """Create a checked PushFlow's jobs level by level; their ids in depth-first order."""
        nodes = flatten(frame["parent"], frame["children"])
        flow_key = frame.get("idempotencyKey")
        ids: list[str | None] = [None] * len(nodes)
        depth = 0
        while True:
            level = [n for n in nodes if n.depth == depth]
            if not level:
                break
            by_queue: dict[str, list[FlowNode]] = {}
            for n in level:
                by_queue.setdefault(n.job["queue"], []).append(n)
            replies = await asyncio.gather(*(self._push_level(queue, group, ids, flow_key)
                                             for queue, group in by_queue.items()))
            for group, reply in zip(by_queue.values(), replies):
                for n, job_id in zip(group, reply["ids"]):
                    ids[n.index] = job_id
            depth += 1
        return [i for i in ids if i is not None]

    async def _push_level(self, queue: str, group: list[FlowNode], ids: list[str | None],
                          flow_key: str | None) -> dict[str, Any]:
        items = []
        for n in group:
            item = {k: v for k, v in n.job.items() if k not in ("queue", "data")}
            item["data"] = msgpack.packb(n.job["data"], use_bin_type=True)
            key = item_key(flow_key, n)
            if key is not None:
                item["idempotencyKey"] = key
            if n.children:
                item["_expect"] = n.children
            if n.parent is not None:
                item["_parent"] = ids[n.parent]
                item["_onFailure"] = n.on_failure
            items.append(item)
        cmd = {"cmd": "_FlowPush", "queue": queue, "_items": items}
        p = partition_for(queue, self.node.config.partitions)
        last: CommandError | None = None
        for _ in range(PUSH_FLOW_ATTEMPTS_MAX):
            try:
                return await self.send(p, cmd)
            except CommandError as exc:
                if exc.code not in (ErrorCode.NOT_LEADER, ErrorCode.NO_LEADER, ErrorCode.SHUTTING_DOWN,
                                    ErrorCode.TIMEOUT):
                    raise
                last = exc
            except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
                last = CommandError(ErrorCode.NO_LEADER, f"partition {p}: {exc}")
            await asyncio.sleep(PUSH_FLOW_RETRY_S)
        assert last is not None
        raise last

    # --- sending to a partition's leader -------------------------------------------------------

    async def send(self, p: int, cmd: dict[str, Any]) -> dict[str, Any]:
        """Commit ``cmd`` in partition ``p`` through its leader (this node or a peer)."""
        part = self.node.partitions.get(p)
        if part is not None and part.replica.is_leader():
            future: asyncio.Future[Any] = self.node.loop.create_future()
            part.group_commit.submit(cmd, lambda r: future.done() or future.set_result(r))
            async with asyncio.timeout(PEER_TIMEOUT_S):  # not wait_for: it can lose a cancellation
                result = await future
            if isinstance(result, CommandError):
                raise result
            return result
        relay = self.node.dispatcher.relay
        if relay is None:
            raise CommandError(ErrorCode.NO_LEADER, f"partition {p} is led elsewhere and this node has no peers")
        return await relay.call(p, cmd, PEER_TIMEOUT_S)

    def _partition(self, cmd: dict[str, Any]) -> int:
        if cmd["cmd"] == "_FlowPush":
            validate(cmd, internal=True)
            return partition_for(cmd["queue"], self.node.config.partitions)
        p = cmd.get("partition")
        if type(p) is not int or not 0 <= p < self.node.config.partitions:
            raise CommandError(ErrorCode.INVALID, "partition: not a partition of this cluster")
        return p

    # --- the forwarder -----------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: send the reports in the outboxes of the partitions this node leads."""
        while True:
            await asyncio.sleep(FORWARD_INTERVAL_S)
            for p, part in list(self.node.partitions.items()):
                replica = part.replica
                if p in self._forwarding or not replica.is_leader() or not replica.application.view.has_flow_reports():
                    continue
                self._forwarding.add(p)
                task = self.node.loop.create_task(self._forward(p))
                task.add_done_callback(lambda _t, p=p: self._forwarding.discard(p))

    async def _forward(self, p: int) -> None:
        reports = self.node.partitions[p].replica.application.view.flow_reports(REPORTS_PER_ROUND_MAX)
        by_parent: dict[int, list[tuple[int, list[Any]]]] = {}
        size = 0
        for seq, report in reports:
            parent, failed, result, error, on_failure = report[:5]
            key = report[5:]  # the child as bunqueue's client names it, "<queue>:<its id>" (the engine's)
            size += len(result or b"") + len(error or "") * 4
            if size > REPORT_BYTES_PER_ROUND_MAX and by_parent:
                break  # results are up to 10 MB each: the rest go next round
            child = f"{p}-{seq}"
            try:
                target = int(str(parent).split("-", 1)[0])
            except ValueError:
                target = -1
            by_parent.setdefault(target, []).append((seq, [parent, child, failed, result, error, on_failure, *key]))
        acked: list[int] = []

        async def deliver(target: int, reports: list[tuple[int, list[Any]]]) -> None:
            if not 0 <= target < self.node.config.partitions:
                acked.extend(seq for seq, _ in reports)  # no such parent partition: nothing to tell
                return
            cmd = {"cmd": "_ChildDone", "partition": target, "_reports": [r for _, r in reports]}
            try:
                await self.send(target, cmd)
            except (CommandError, OSError, asyncio.TimeoutError, ConnectionError) as exc:
                log.debug("partition %d: child reports to partition %d not delivered yet: %s", p, target, exc)
                return
            acked.extend(seq for seq, _ in reports)
            self.reports_sent += len(reports)

        # In parallel: one unreachable parent partition does not hold up the others' reports.
        await asyncio.gather(*(deliver(target, reports) for target, reports in by_parent.items()))
        if acked and self.node.partitions[p].replica.is_leader():
            try:
                await self.send(p, {"cmd": "_FlowAcked", "partition": p, "_children": acked})
            except (CommandError, asyncio.TimeoutError) as exc:
                log.debug("partition %d: _FlowAcked not committed: %s", p, exc)
