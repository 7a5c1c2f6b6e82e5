"""Flows across partitions (``shoal.node.flows``) without sockets: two nodes' flow services,
each leading one of two partitions, whose partitions are real engines; a partition's write
path applies a command to its engine on the next loop turn, and the node-to-node link (the
relay's ``call`` to a partition's leader) is an in-memory call into the leader's service.
Covers the order in which a flow's jobs are made, a re-sent flow, the child reports and
their acknowledgement, the peer requests a leader takes, leaders that move, and the limits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from shoal.cluster.commands import validate
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.partitioning import partition_for
from shoal.node import flows as flows_module
from shoal.node.flows import PEER_COMMANDS, FlowService
from shoal.node.partition import Partition
from shoal.node.state import PartitionEngine

PARENTS, KIDS = "q0", "q1"  # partition 1 (led by n2) and partition 0 (led by n1)
assert (partition_for(PARENTS, 2), partition_for(KIDS, 2)) == (1, 0)
CONFIG = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1", 7001), NodeSpec("n2", "127.0.0.1", 7002)),
                       partitions=2, secret="the cluster secret")


class Cluster:
    """The partitions' engines, one clock, and which node leads which partition."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.engines = {p: PartitionEngine(p) for p in range(2)}
        self.leaders = {0: "n1", 1: "n2"}
        self.now_ms = 1_000_000

    def apply(self, p: int, cmd: dict[str, Any]) -> dict[str, Any]:
        self.now_ms += 1
        return self.engines[p].apply(cmd, self.now_ms).result

    def state(self, job_id: str) -> str:
        return str(self.apply(int(job_id.split("-")[0]), {"cmd": "GetState", "id": job_id})["state"])


class View:
    """The part of a partition's read-only view the forwarder reads."""

    def __init__(self, engine: PartitionEngine) -> None:
        self._engine = engine

    def has_flow_reports(self) -> bool:
        return bool(self._engine.flow_outbox)

    def flow_reports(self, limit: int) -> tuple[tuple[int, tuple[Any, ...]], ...]:
        return tuple(list(self._engine.flow_outbox.items())[:limit])


class Replica:
    def __init__(self, cluster: Cluster, node_id: str, p: int) -> None:
        self.cluster, self.node_id, self.p = cluster, node_id, p
        self.view = View(cluster.engines[p])
        self.application = self  # where the view hangs, whichever way the replica exposes it

    #: Times this replica still answers that it does not lead (an election under way).
    refusals = 0

    def is_leader(self) -> bool:
        if self.refusals:
            self.refusals -= 1
            return False
        return self.cluster.leaders[self.p] == self.node_id


class GroupCommit:
    """A partition's write path: the command applied to the partition's engine, answered next turn."""

    def __init__(self, cluster: Cluster, p: int) -> None:
        self.cluster, self.p = cluster, p
        self.submitted: list[dict[str, Any]] = []

    def submit(self, cmd: dict[str, Any], done: Any) -> None:
        self.submitted.append(cmd)
        try:
            result: Any = self.cluster.apply(self.p, cmd)
        except CommandError as exc:
            result = exc
        self.cluster.loop.call_soon(done, result)


class Node:
    """One node as the flow service reads it."""

    def __init__(self, cluster: Cluster, node_id: str) -> None:
        self.dispatcher = Dispatcher()
        self.cluster = cluster
        self.config = CONFIG
        self.loop = cluster.loop
        self.node_id = node_id
        self.partitions = {p: Partition(p, Replica(cluster, node_id, p),  # type: ignore[arg-type]
                                        GroupCommit(cluster, p)) for p in range(2)}

    @property
    def topology(self) -> Any:
        topology = CONFIG.initial_topology()
        for p, leader in self.cluster.leaders.items():
            topology = topology.with_leader(p, leader, 1)
        return topology

    def not_leader_error(self, p: int) -> CommandError:
        return CommandError(ErrorCode.NOT_LEADER, f"not the leader of partition {p}",
                            leader=self.cluster.leaders[p])


class Conn:
    """A client connection: the replies it got."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answer: asyncio.Future[Any] = loop.create_future()

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        self.answer.set_result((req_id, body))

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self.answer.set_result((req_id, exc))


class Relay:
    """A node's relay as the flow service uses it: ``call`` takes a command to the partition's
    leader (here an in-memory call into the handler that node registered for peer commands);
    counts its calls. ``down``: the link is lost (the relay answers ``NO_LEADER``)."""

    def __init__(self, cluster: Cluster, me: str) -> None:
        self.cluster = cluster
        self.me = me
        self.peers: dict[str, Relay] = {}
        self.handlers: dict[str, Any] = {}
        self.calls = 0
        self.down = False

    def serve_peer_commands(self, names: frozenset[str], handler: Any) -> None:
        for name in names:
            self.handlers[name] = handler

    async def call(self, p: int, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.calls += 1
        if self.down:
            raise CommandError(ErrorCode.NO_LEADER, f"the link to partition {p}'s leader was lost")
        if self.cluster.leaders[p] == self.me:  # the real relay waits for another leader, to its deadline
            raise CommandError(ErrorCode.NO_LEADER, f"partition {p} has no leader elsewhere")
        leader = self.peers[self.cluster.leaders[p]]
        conn = Conn(asyncio.get_running_loop())
        leader.handlers[frame["cmd"]](conn, msgpack.unpackb(msgpack.packb(frame)))  # as it crosses the link
        _, body = await conn.answer
        if isinstance(body, CommandError):
            raise body
        return body


class Dispatcher:
    def __init__(self) -> None:
        self.relay: Relay | None = None


class Pair:
    """Two nodes' flow services on one loop, linked to each other."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.cluster = Cluster(loop)
        self.nodes = {n: Node(self.cluster, n) for n in ("n1", "n2")}
        self.links = {n: Relay(self.cluster, n) for n in self.nodes}
        for n, node in self.nodes.items():
            node.dispatcher.relay = self.links[n]
            self.links[n].peers = self.links
        self.services = {n: FlowService(node) for n, node in self.nodes.items()}  # type: ignore[arg-type]
        for service in self.services.values():
            service.serve_peers()


def run(test: Any) -> None:
    """Run ``test(pair)`` on a fresh loop."""
    async def main() -> None:
        await test(Pair(asyncio.get_running_loop()))

    asyncio.run(main())


@pytest.fixture(autouse=True)
def no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(flows_module, "PUSH_FLOW_RETRY_S", 0.0)
    yield


def flow(key: str | None = None) -> dict[str, Any]:
    """A parent in q0 with two children in q1, the first with a child of its own in q0."""
    frame: dict[str, Any] = {"cmd": "PushFlow", "parent": {"queue": PARENTS, "data": "root"}, "children": [
        {"queue": KIDS, "data": "a", "children": [{"queue": PARENTS, "data": "a.0"}]},
        {"queue": KIDS, "data": "b", "onFailure": "ignore"}]}
    if key is not None:
        frame["idempotencyKey"] = key
    validate(frame)
    return frame


def job(pair: Pair, job_id: str) -> dict[str, Any]:
    return dict(pair.cluster.apply(int(job_id.split("-")[0]), {"cmd": "GetJob", "id": job_id})["job"])


def finish(pair: Pair, queue: str, result: Any = "done") -> str:
    """Pull one job of ``queue`` and ack it, as a worker does at the leader; its id."""
    p = partition_for(queue, 2)
    pulled = pair.cluster.apply(p, {"cmd": "PULL", "queue": queue})
    assert pulled["job"] is not None, f"no job in {queue}"
    pair.cluster.apply(p, {"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"],
                           "result": msgpack.packb(result)})
    return str(pulled["job"]["id"])


# --- making a flow --------------------------------------------------------------------------------------


def test_a_flow_is_made_top_down_each_child_naming_its_parent() -> None:
    async def test(pair: Pair) -> None:
        root, a, a0, b = await pair.services["n1"].push_flow(flow())
        assert [int(i.split("-")[0]) for i in (root, a, a0, b)] == [1, 0, 1, 0]
        assert pair.cluster.state(root) == "waiting-children" and pair.cluster.state(a) == "waiting-children"
        assert pair.cluster.state(a0) == "waiting" and pair.cluster.state(b) == "waiting"
        assert job(pair, a)["parent"] == root and job(pair, b)["parent"] == root and job(pair, a0)["parent"] == a
        # A level went to its partition's leader only after the level above was made: the root
        # over the node link to n2, then the children here, then the grandchild over the link.
        assert pair.links["n1"].calls == 2
        assert [c["cmd"] for c in pair.nodes["n2"].partitions[1].group_commit.submitted] == ["_FlowPush", "_FlowPush"]
        (kids,) = pair.nodes["n1"].partitions[0].group_commit.submitted
        assert [item["_parent"] for item in kids["_items"]] == [root, root]
        assert [item["_expect"] for item in kids["_items"] if "_expect" in item] == [1]

    run(test)


def test_a_flow_sent_again_with_its_key_makes_nothing_twice() -> None:
    async def test(pair: Pair) -> None:
        service = pair.services["n1"]
        first = await service.push_flow(flow("order-7"))
        again = await service.push_flow(flow("order-7"))
        assert again == first
        assert [sum(pair.cluster.apply(p, {"cmd": "GetJobCounts", "queue": q})["counts"].values())
                for p, q in ((1, PARENTS), (0, KIDS))] == [2, 2]
        items = pair.nodes["n1"].partitions[0].group_commit.submitted[0]["_items"]
        assert [item["idempotencyKey"] for item in items] == ["order-7/0.0", "order-7/0.1"]
        # Without a key a flow sent again is a new flow.
        assert await service.push_flow(flow()) != first

    run(test)


def test_a_level_sent_while_the_leader_moves_is_sent_again() -> None:
    async def test(pair: Pair) -> None:
        pair.nodes["n2"].partitions[1].replica.refusals = 2  # n2 is between two terms: NOT_LEADER twice
        ids = await pair.services["n1"].push_flow(flow())
        assert len(ids) == 4 and pair.links["n1"].calls == 2 + 2  # the root's level three times, the grandchild's once

    run(test)


def test_a_level_no_leader_takes_fails_after_a_bounded_number_of_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows_module, "PUSH_FLOW_ATTEMPTS_MAX", 3)

    async def test(pair: Pair) -> None:
        pair.links["n1"].down = True
        with pytest.raises(CommandError) as failed:
            await pair.services["n1"].push_flow(flow())
        assert failed.value.code is ErrorCode.NO_LEADER and pair.links["n1"].calls == 3

    run(test)


def test_a_partition_without_a_known_leader_is_refused() -> None:
    async def test(pair: Pair) -> None:
        node = pair.nodes["n1"]
        node.cluster.leaders[1] = "n1"  # named here, but this node's replica does not lead it
        node.partitions[1].replica.is_leader = lambda: False  # type: ignore[method-assign]
        with pytest.raises(CommandError) as refused:
            await pair.services["n1"].send(1, {"cmd": "_FlowPush", "queue": PARENTS, "_items": []})
        assert refused.value.code is ErrorCode.NO_LEADER

    run(test)


# --- the dispatcher's entry point ----------------------------------------------------------------------


def test_a_push_flow_is_answered_with_its_ids_and_bad_ones_are_refused() -> None:
    async def test(pair: Pair) -> None:
        loop = asyncio.get_running_loop()
        conn = Conn(loop)
        pair.services["n1"].handle(conn, {**flow(), "reqId": 3})  # type: ignore[arg-type]
        req_id, body = await conn.answer
        assert req_id == 3 and len(body["ids"]) == 4
        with pytest.raises(CommandError) as refused:
            bad = {"cmd": "PushFlow", "parent": {"data": 1}, "children": []}  # no queue
            pair.services["n1"].handle(Conn(loop), bad)  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.INVALID

    run(test)


def test_flows_made_at_once_on_a_node_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows_module, "PUSH_FLOWS_INFLIGHT_MAX", 1)

    async def test(pair: Pair) -> None:
        loop = asyncio.get_running_loop()
        first = Conn(loop)
        pair.services["n1"].handle(first, flow())  # type: ignore[arg-type]
        with pytest.raises(CommandError) as refused:
            pair.services["n1"].handle(Conn(loop), flow())  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.OVERLOADED
        await first.answer
        later = Conn(loop)
        pair.services["n1"].handle(later, flow())  # type: ignore[arg-type]
        assert len((await later.answer)[1]["ids"]) == 4

    run(test)


# --- peer requests -------------------------------------------------------------------------------------


def test_a_leader_takes_the_peers_flow_commands_only_from_the_node_link() -> None:
    async def test(pair: Pair) -> None:
        assert set(pair.links["n2"].handlers) == set(PEER_COMMANDS) == {"_FlowPush", "_ChildDone"}
        n2 = pair.services["n2"]
        loop = asyncio.get_running_loop()
        push = {"cmd": "_FlowPush", "queue": PARENTS, "_items": [{"data": msgpack.packb(1)}]}
        conn = Conn(loop)
        n2.peer_request(conn, dict(push))  # type: ignore[arg-type]
        assert (await conn.answer)[1]["ids"][0].startswith("1-")
        cases = [
            ({"cmd": "_ChildDone", "partition": 9, "_reports": []}, ErrorCode.INVALID),
            ({**push, "queue": KIDS}, ErrorCode.NOT_LEADER),  # partition 0: led by n1
        ]
        for frame, code in cases:
            with pytest.raises(CommandError) as refused:
                n2.peer_request(Conn(loop), frame)  # type: ignore[arg-type]
            assert refused.value.code is code, frame
        # A client's connection reaches only PushFlow: the internal commands are unknown there.
        for cmd in PEER_COMMANDS:
            with pytest.raises(CommandError) as refused:
                validate({"cmd": cmd})
            assert refused.value.code is ErrorCode.UNKNOWN_COMMAND
        assert pair.cluster.apply(1, {"cmd": "Count", "queue": PARENTS})["count"] == 1

    run(test)


# --- child reports -------------------------------------------------------------------------------------


def test_finished_children_report_to_their_parent_which_then_runs() -> None:
    async def test(pair: Pair) -> None:
        root, a, a0, b = await pair.services["n1"].push_flow(flow())
        # the grandchild (q0, partition 1) finishes: its report goes from n2 to partition 0 (n1)
        assert finish(pair, PARENTS) == a0
        assert pair.nodes["n2"].partitions[1].replica.view.has_flow_reports()
        await pair.services["n2"]._forward(1)
        assert pair.cluster.state(a) == "waiting"
        assert not pair.nodes["n2"].partitions[1].replica.view.has_flow_reports()  # acknowledged by _FlowAcked
        assert pair.services["n2"].reports_sent == 1
        # both children finish: their reports go from n1 to partition 1 (n2); the root runs
        assert {finish(pair, KIDS), finish(pair, KIDS)} == {a, b}
        await pair.services["n1"]._forward(0)
        assert pair.cluster.state(root) == "waiting" and pair.services["n1"].reports_sent == 2
        assert not pair.nodes["n1"].partitions[0].replica.view.has_flow_reports()
        values = pair.cluster.apply(1, {"cmd": "GetChildrenValues", "id": root})
        assert len(values["values"]) == 2
        # reports sent again (a leader that died between the two steps) count once
        await pair.services["n1"]._forward(0)
        assert pair.cluster.state(root) == "waiting"

    run(test)


def test_reports_for_an_unreachable_parent_stay_until_it_can_be_told() -> None:
    async def test(pair: Pair) -> None:
        root, *_ = await pair.services["n1"].push_flow(flow())
        finish(pair, KIDS)
        pair.links["n1"].down = True
        await pair.services["n1"]._forward(0)
        replica = pair.nodes["n1"].partitions[0].replica
        assert replica.view.has_flow_reports() and pair.services["n1"].reports_sent == 0
        pair.links["n1"].down = False
        await pair.services["n1"]._forward(0)
        assert not replica.view.has_flow_reports() and pair.services["n1"].reports_sent == 1
        assert pair.cluster.state(root) == "waiting-children"  # one of its two children is done

    run(test)
