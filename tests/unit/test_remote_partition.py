"""The dispatcher submits every command to a partition object: the ``Partition`` while this node
leads it, a ``RemotePartition`` (the relay) while another node does, ``NOT_LEADER`` for a
client that routes for itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgpack
import msgspec
import pytest

from shoal.cluster.codec import FrameDecoder, PlainBulk, PlainPush, Raw, encode
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.jobid import format_job_id
from shoal.cluster.partitioning import partition_for
from shoal.node.dispatch import Dispatcher
from shoal.node.partition import Partition, RemotePartition
from shoal.node.partition.pushes import PushBatch, replicated_form

from test_dispatch_ports import FixedClock, Flows, Info, Link, Metrics

PARTITIONS = 2


class Replica:
    """A replica that leads or follows, as the test says."""

    def __init__(self, leads: bool) -> None:
        self.leads = leads

    def is_leader(self) -> bool:
        return self.leads

    def read_ready(self) -> bool:
        return True


class Recording:
    """A group commit that keeps what was submitted to it, and the callbacks that answer it."""

    def __init__(self) -> None:
        self.submitted: list[Any] = []
        self.callbacks: list[Any] = []

    def submit(self, cmd: Any, done: Any) -> None:
        self.submitted.append(cmd)
        self.callbacks.append(done)


class Directory:
    def __init__(self, led: set[int]) -> None:
        self.partitions = {p: Partition(p, Replica(p in led), Recording())  # type: ignore[arg-type]
                           for p in range(PARTITIONS)}

    def leads(self, p: int) -> bool:
        return p in self.partitions and self.partitions[p].replica.is_leader()

    def not_leader_error(self, p: int) -> CommandError:
        return CommandError(ErrorCode.NOT_LEADER, f"not leader of {p}")


class Relay:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, int, bool]] = []

    def forward(self, conn: Any, frame: dict[str, Any], p: int, away: bool = False) -> None:
        self.sent.append(("one", frame["reqId"], p, away))

    def forward_pushes(self, conn: Any, frames: list[PlainPush], p: int, away: bool = False) -> None:
        self.sent.append(("block", [f.reqId for f in frames], p, away))

    def forward_received(self, conn: Any, frame: dict[str, Any], body: bytes, p: int, custom_ids: bool) -> None:
        self.sent.append(("received", (frame["reqId"], body), p, custom_ids))


QUEUE = "q"
P = partition_for(QUEUE, PARTITIONS)


def node(led: set[int]) -> tuple[Dispatcher, Directory, Relay]:
    config = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1"),), partitions=PARTITIONS)
    directory = Directory(led)
    d = Dispatcher(config, asyncio.new_event_loop(), clock=FixedClock(1_700_000_000_000), directory=directory,
                   info=Info(config), metrics=Metrics(), flows=Flows())
    for part in directory.partitions.values():
        part.serving = d
    relay = Relay()
    d.relay = relay  # type: ignore[assignment]
    return d, directory, relay


@pytest.fixture
def elsewhere() -> Iterator[tuple[Dispatcher, Directory, Relay]]:
    d, directory, relay = node(led=set())
    yield d, directory, relay
    d.loop.close()


@pytest.fixture
def here() -> Iterator[tuple[Dispatcher, Directory, Relay]]:
    d, directory, relay = node(led={P})
    yield d, directory, relay
    d.loop.close()


def push(req_id: int) -> dict[str, Any]:
    return {"cmd": "PUSH", "queue": QUEUE, "data": Raw(msgpack.packb({"n": req_id})), "reqId": req_id}


def block(*req_ids: int) -> list[PlainPush]:
    return [PlainPush(QUEUE, msgspec.Raw(msgpack.packb(i)), reqId=i) for i in req_ids]


def forwarding(yes: bool) -> Link:
    conn = Link()
    conn.wants_forwarding = yes  # type: ignore[attr-defined]
    return conn


def test_a_partition_led_elsewhere_takes_commands_and_blocks_through_the_relay(elsewhere: Any) -> None:
    d, _, relay = elsewhere
    conn = forwarding(True)
    d.handle(conn, push(1))
    d.handle_pushes(conn, block(2, 3))
    d.handle(conn, {"cmd": "GetJob", "id": format_job_id(P, 7), "reqId": 4})
    assert relay.sent == [("one", 1, P, False), ("block", [2, 3], P, False), ("one", 4, P, False)]
    assert conn.replies == []
    assert d._target(P, True) is d._target(P, True)  # one remote partition per partition
    assert isinstance(d._target(P, True), RemotePartition)


def test_a_client_that_routes_gets_not_leader_for_a_partition_led_elsewhere(elsewhere: Any) -> None:
    d, _, relay = elsewhere
    conn = forwarding(False)
    with pytest.raises(CommandError) as err:
        d.handle(conn, push(1))
    assert err.value.code is ErrorCode.NOT_LEADER
    d.handle_pushes(conn, block(2, 3))
    assert relay.sent == [] and conn.replies == [(2, ErrorCode.NOT_LEADER), (3, ErrorCode.NOT_LEADER)]


def test_a_partition_led_here_serves_what_is_submitted_to_it(here: Any) -> None:
    d, directory, relay = here
    conn = forwarding(True)
    d.handle(conn, push(1))
    d.handle_pushes(conn, block(2, 3))
    submitted = directory.partitions[P].group_commit.submitted
    assert relay.sent == [] and len(submitted) == 2
    assert submitted[0]["reqId"] == 1  # the frame, to group commit as it is
    assert submitted[1].queue == QUEUE and len(submitted[1].datas) == 2  # the block: one PushRun


def test_a_remote_partition_passes_its_number_and_away_on() -> None:
    relay = Relay()
    remote = RemotePartition(5, relay)
    remote.submit(Link(), push(1), away=True)
    remote.submit_pushes(Link(), block(2))
    assert relay.sent == [("one", 1, 5, True), ("block", [2], 5, False)]


def test_a_partition_without_a_server_refuses_to_take_commands() -> None:
    part = Partition(0, Replica(True), Recording())  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        part.submit(Link(), push(1))


def bulk(req_id: Any, n: int = 3, *, keyed: Any = False, queue: str = QUEUE, data: Any = "x") -> PlainBulk:
    """A plain PUSHB as the node's decoder gives it: items of ``data`` (keyed ``k0``, ``k1``, ...
    when ``keyed`` is True, or with ``keyed`` itself as every key when it is a string)."""
    def item(i: int) -> dict[str, Any]:
        if keyed is False:
            return {"data": data}
        return {"data": data, "idempotencyKey": f"k{i}" if keyed is True else keyed}

    frame = {"cmd": "PUSHB", "queue": queue, "jobs": [item(i) for i in range(n)], "reqId": req_id}
    (decoded,) = FrameDecoder(raw_data=True, plain_push=True).drain(encode(frame))
    assert type(decoded) is PlainBulk
    return decoded


@pytest.mark.parametrize("keyed", [False, True])
def test_a_plain_bulk_add_led_here_is_proposed_as_the_batch_its_dict_would_be(here: Any, keyed: bool) -> None:
    d, directory, relay = here
    conn = forwarding(True)
    fast = bulk(5, keyed=keyed)
    d.handle_bulk(conn, fast)
    d.handle(conn, fast.to_frame(Raw))  # the general path, for comparison
    group_commit = directory.partitions[P].group_commit
    batch, frame = group_commit.submitted
    assert type(batch) is PushBatch and relay.sent == []
    assert [batch] == replicated_form([frame], P)[0]
    assert batch.keys == (["k0", "k1", "k2"] if keyed else None)
    group_commit.callbacks[0]({"ids": ["a", "b", "c"]})
    group_commit.callbacks[0](CommandError(ErrorCode.QUEUE_FULL, "full"))
    assert conn.replies == [(5, {"ids": ["a", "b", "c"]}), (5, ErrorCode.QUEUE_FULL)]


def test_a_plain_bulk_add_refused_unproposed_goes_to_the_new_leader(here: Any) -> None:
    d, directory, relay = here
    conn = forwarding(True)
    d.handle_bulk(conn, bulk(6))
    directory.partitions[P].replica.leads = False
    directory.partitions[P].group_commit.callbacks[0](CommandError(ErrorCode.NOT_LEADER, "moved"))
    assert relay.sent == [("one", 6, P, True)] and conn.replies == []


def test_a_plain_bulk_add_led_elsewhere_goes_on_as_its_client_sent_it(elsewhere: Any) -> None:
    d, _, relay = elsewhere
    fast = bulk(7)
    d.handle_bulk(forwarding(True), fast)
    assert relay.sent == [("received", (7, fast.body), P, False)]
    with pytest.raises(CommandError) as err:
        d.handle_bulk(forwarding(False), bulk(8))
    assert err.value.code is ErrorCode.NOT_LEADER


@pytest.mark.parametrize("bad", ["queue", "data", "empty key", "long key", "too many"])
def test_a_plain_bulk_add_that_fails_a_check_is_refused_as_the_general_path_refuses_it(here: Any, bad: str,
                                                                                       monkeypatch: Any) -> None:
    from shoal.cluster import limits as L

    monkeypatch.setattr(L, "data_bytes_max", 100)
    monkeypatch.setattr(L, "batch_jobs_max", 10)
    fast = {"queue": lambda: bulk(1, queue="no spaces"), "data": lambda: bulk(1, data="x" * 200),
            "empty key": lambda: bulk(1, keyed=""), "long key": lambda: bulk(1, keyed="k" * (L.key_chars_max + 1)),
            "too many": lambda: bulk(1, n=11)}[bad]()
    d, directory, _ = here
    errors = []
    for handle, frame in ((d.handle_bulk, fast), (d.handle, fast.to_frame(Raw))):
        with pytest.raises(CommandError) as err:
            handle(forwarding(True), frame)
        errors.append((err.value.code, str(err.value)))
    assert errors[0] == errors[1] and errors[0][0] is ErrorCode.INVALID
    assert directory.partitions[P].group_commit.submitted == []


def test_a_bunqueue_clients_plain_bulk_add_takes_the_general_path(here: Any) -> None:
    d, directory, _ = here
    conn = forwarding(False)
    conn.bunqueue_envelope = True  # type: ignore[attr-defined]
    d.handle_bulk(conn, bulk(9, data={"data": {"n": 1}}))
    (cmd,) = directory.partitions[P].group_commit.submitted
    assert type(cmd) is dict and cmd["cmd"] == "PUSHB"
