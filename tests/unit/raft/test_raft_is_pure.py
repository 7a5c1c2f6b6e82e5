"""``node/raft/`` is pure replication: it knows its state machine only through the application
protocol (:class:`~shoal.node.raft.application.Application`) and imports nothing of the engine.

Checked twice: from the source (``ast``: an import inside a function or under ``TYPE_CHECKING``
counts), and by driving a real :class:`~shoal.node.raft.replica.PartitionReplica` with an
application that is not a queue at all (a tally of named counters), through proposals,
a snapshot written by a forked child and a restart that loads it. The queue engine's side,
:class:`~shoal.node.partition.PartitionMachine`, is checked against the same protocol.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from shoal.node.partition import PartitionMachine, decode_batch, encode_batch
from shoal.node.raft._io import RealIO
from shoal.node.raft.application import Application
from shoal.node.raft.messages import ENTRY_DATA
from shoal.node.raft.replica import ApplyFailed
from shoal.node.raft.storage import NodeStorage
from shoal.node.state import PartitionEngine

from lone_replica import LoneReplica
from test_layering import imports_in

ROOT = Path(__file__).resolve().parents[3]
RAFT = ROOT / "node" / "raft"
#: What Raft may import of the node: only its own package.
RAFT_PACKAGE = "shoal.node.raft"


# --- the source ------------------------------------------------------------------------------------


def node_imports(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``source`` (a module of ``package``) of a
    module of ``shoal.node`` outside ``node/raft``."""
    return [(line, name) for line, name in imports_in(source, package)
            if (name == "shoal.node" or name.startswith("shoal.node."))
            and name != RAFT_PACKAGE and not name.startswith(RAFT_PACKAGE + ".")]


@pytest.mark.parametrize("path", sorted(RAFT.rglob("*.py")), ids=lambda p: str(p.relative_to(RAFT)))
def test_no_raft_module_imports_the_engine_or_anything_else_of_the_node(path: Path) -> None:
    package = ".".join(("shoal", "node", "raft", *path.relative_to(RAFT).parent.parts))
    assert node_imports(path.read_text(), package) == []


def test_the_import_check_sees_relative_lazy_and_type_only_imports() -> None:
    source = ("from typing import TYPE_CHECKING\nfrom .core import RaftCore\nfrom ..state import PartitionEngine\n"
              "if TYPE_CHECKING:\n    from ..partition import PartitionMachine\n"
              "def f():\n    import shoal.node.state._engine\n    from shoal.cluster.errors import CommandError\n")
    assert node_imports(source, RAFT_PACKAGE) == [
        (3, "shoal.node.state"), (5, "shoal.node.partition"), (7, "shoal.node.state._engine")]


# --- a replica driving an application that is not a queue ------------------------------------------


class Tally:
    """Named counters: a command is ``[name, amount]``; its result is the counter's new value.

    A name that is not a string is refused by that command alone (its result is the error),
    which is what the protocol asks of an application: each command atomic, errors per command.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.applied: list[tuple[int, int, bool, bool]] = []  # (batch size, term, leading, replies)
        self.installs = 0
        self.failures: list[str] = []

    def encode(self, now_ms: int, commands: list[Any]) -> bytes:
        return bytes([ENTRY_DATA]) + msgpack.packb([now_ms, commands])

    def apply(self, payload: bytes, term: int, *, leading: bool, replies: bool) -> list[Any]:
        _now_ms, commands = msgpack.unpackb(payload[1:])
        self.applied.append((len(commands), term, leading, replies))
        results: list[Any] = []
        for name, amount in commands:
            if not isinstance(name, str):
                results.append(ValueError(f"not a counter name: {name!r}"))
                continue
            self.counts[name] = self.counts.get(name, 0) + amount
            results.append(self.counts[name])
        return results

    def link_snapshot_files(self, directory: str) -> bool:
        return False  # the counters are all in memory

    def snapshot_chunks(self, files: str | None = None) -> Iterable[bytes]:
        yield msgpack.packb(sorted(self.counts.items()))

    def load_snapshot(self, chunks: Iterator[bytes], files: str | None = None) -> object:
        return dict(msgpack.unpackb(b"".join(chunks)))

    def install(self, state: object) -> None:
        assert isinstance(state, dict)
        self.counts = state
        self.installs += 1

    def reset(self) -> None:
        self.counts = {}

    def describe(self) -> str:
        return f"{len(self.counts)} counters"

    def snapshot_failed(self, message: str) -> None:
        self.failures.append(message)


def _conforms(app: Application) -> Application:
    """Type-checks that ``app`` implements the protocol (mypy reads the call)."""
    return app


class Lone(LoneReplica):
    """A one-member group (it leads once it campaigned) over ``application``, on a real loop and disk."""

    def __init__(self, data_dir: str, application: Tally, storage: NodeStorage | None = None) -> None:
        self.app = application
        super().__init__(data_dir, _conforms(application), storage)

    def propose(self, commands: list[Any]) -> tuple[Any, int]:
        """``(results, fail reason)`` of one proposed batch."""
        answered: list[tuple[Any, int]] = []
        self.replica.propose(1_000, commands, lambda results, reason: answered.append((results, reason)))
        self.run_until(lambda: answered, "the batch's answer")
        return answered[0]


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Lone]:
    node = Lone(str(tmp_path), Tally())
    try:
        yield node
    finally:
        node.close()


def test_committed_batches_reach_the_application_and_its_results_the_proposer(lone: Lone) -> None:
    results, reason = lone.propose([["a", 2], ["b", 5], ["a", 1]])
    assert (results, reason) == ([2, 5, 3], 0)
    results, reason = lone.propose([["a", 10], [7, 1], ["b", -5]])
    assert reason == 0 and results[0] == 13 and isinstance(results[1], ValueError) and results[2] == 0
    term = lone.replica.term()
    assert lone.app.applied == [(3, term, True, True), (3, term, True, True)]
    assert lone.app.counts == {"a": 13, "b": 0}


def test_a_snapshot_is_written_from_the_application_and_loaded_back_at_a_restart(tmp_path: Path) -> None:
    node = Lone(str(tmp_path), Tally())
    try:
        node.propose([["a", 1], ["b", 2]])
        node.replica.snapshot_now()
        snapshots = node.replica.snapshots
        node.run_until(lambda: snapshots.stats()["written"] == 1 and not snapshots.in_progress)
        node.propose([["a", 40]])  # after the snapshot: replayed from the journal
        applied, counts = node.replica.applied_index(), dict(node.app.counts)
    finally:
        node.close()
    assert Path(tmp_path, "p0.snap").exists()

    again = Lone(str(tmp_path), Tally())
    try:
        again.run_until(lambda: again.replica.applied_index() >= applied)
        assert again.app.installs == 1  # the state came from the snapshot, the rest from the log
        assert again.app.counts == counts == {"a": 41, "b": 2}
    finally:
        again.close()


# --- the engine's side of the seam -----------------------------------------------------------------

PROTOCOL_METHODS = sorted(name for name, value in vars(Application).items()
                          if callable(value) and not name.startswith("_"))


@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_the_partition_machine_has_every_method_of_the_protocol(name: str) -> None:
    wanted = inspect.signature(getattr(Application, name))
    got = inspect.signature(getattr(PartitionMachine, name))
    assert [(p.name, p.kind) for p in got.parameters.values()] == [
        (p.name, p.kind) for p in wanted.parameters.values()]


def test_the_protocol_is_what_the_replica_needs() -> None:
    # which entries are disk class and which commands wait for space is the partition's business
    assert PROTOCOL_METHODS == ["apply", "describe", "encode", "install", "link_snapshot_files", "load_snapshot",
                                "reset", "snapshot_chunks", "snapshot_failed"]


def test_the_machine_applies_a_batch_as_the_engine_does_and_records_events_only_while_leading() -> None:
    machine = PartitionMachine(3)
    twin = PartitionEngine(3)
    batch = [{"cmd": "PUSH", "queue": "q", "data": b"\x01"}, {"cmd": "GetJob", "id": "nonsense"},
             {"cmd": "PUSH", "queue": "q", "data": b"\x02"}]
    payload = machine.encode(5_000, batch)
    assert payload[:1] == bytes([ENTRY_DATA]) and decode_batch(payload) == (5_000, batch)
    assert encode_batch(5_000, batch) == payload

    results = machine.apply(payload, 1, leading=False, replies=True)
    twin.enter_term(1)
    expected = []
    for cmd in batch:
        try:
            expected.append(twin.apply(cmd, 5_000).result)
        except Exception as exc:
            expected.append(exc)
    assert [type(r) for r in results] == [type(r) for r in expected]
    assert machine.view.digest() == twin.digest()
    assert machine.take_events() == []  # a follower records none

    machine.apply(machine.encode(6_000, [{"cmd": "PUSH", "queue": "q", "data": b"\x03"}]), 1,
                  leading=True, replies=True)
    assert [e[2] for e in machine.take_events()] == ["waiting"]
    machine.record_events = False  # nobody listens
    machine.apply(machine.encode(6_000, [{"cmd": "PUSH", "queue": "q", "data": b"\x04"}]), 1,
                  leading=True, replies=True)
    assert machine.take_events() == []


def test_the_machine_loads_installs_and_resets_its_engine() -> None:
    machine = PartitionMachine(0)
    machine.apply(machine.encode(1_000, [{"cmd": "PUSH", "queue": "q", "data": b"\x01"}]), 1,
                  leading=True, replies=True)
    digest, state_id = machine.view.digest(), machine.view.state_id()
    loaded = machine.load_snapshot(iter(machine.snapshot_chunks()))
    assert loaded is not machine.engine and machine.view.state_id() == state_id  # the live state is untouched
    machine.install(loaded)
    assert machine.view.digest() == digest and machine.view.state_id() != state_id
    assert machine.describe() == "1 jobs"
    machine.reset()
    assert machine.view.job_count() == 0
    with pytest.raises(TypeError):
        machine.install({"not": "an engine"})


def test_an_entry_the_application_cannot_apply_stops_the_replica_instead_of_being_skipped(tmp_path: Path) -> None:
    """Skipping a committed entry would leave this replica's state apart from its group's for
    good: the replica hands the failure to the node's fail-stop (which ends the process) instead."""
    failures: list[BaseException] = []
    storage = NodeStorage(RealIO(disk_free_min_bytes=0), str(tmp_path), on_sync_failed=failures.append)
    node = Lone(str(tmp_path), Tally(), storage)
    try:
        assert node.propose([["a", 1]]) == ([1], 0)
        try:  # a lone voter applies as it proposes: the failure surfaces right there, or on the loop
            node.replica.propose(1_000, [["a", "not a number"]], lambda results, reason: None)
        except ApplyFailed:
            pass
        node.run_until(lambda: failures)
        (failure,) = failures
        assert isinstance(failure, ApplyFailed) and "entry" in str(failure) and "TypeError" in str(failure)
    finally:
        node.close()


def test_a_command_the_application_cannot_encode_is_refused_alone(lone: Lone) -> None:
    """Only the command whose value the log cannot hold is answered INVALID; the rest of its
    batch is replicated and answered as usual."""
    from shoal.cluster.errors import CommandError, ErrorCode

    results, reason = lone.propose([["a", 1], ["b", 2**70], ["a", 2]])  # MessagePack holds 64 bits
    assert reason == 0 and results[0] == 1 and results[2] == 3
    assert isinstance(results[1], CommandError) and results[1].code is ErrorCode.INVALID
    assert lone.app.counts == {"a": 3}
