"""A lone voter (a 1-node cluster) answers the jobs a PULL takes before it syncs the entry,
and everything else only after (node/raft/replica.py, ``_apply_ahead``).

The replica is a real PartitionReplica with its own journal and the node's storage; its
storage's sync is wrapped to record when it runs and which entry the engine had applied last
then (its ``_state_index``: the core counts an entry applied only once the sync committed it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from shoal.node.partition import PartitionMachine
from shoal.node.partition.pushes import session_pull
from shoal.node.raft.storage import NodeStorage

from lone_replica import LoneReplica


class Lone(LoneReplica):
    """A partition replica of the queue engine with no peers, its syncs logged."""

    def __init__(self, data_dir: str, storage: NodeStorage | None = None) -> None:
        super().__init__(data_dir, PartitionMachine(0), storage)
        self.log: list[Any] = []
        storage = self.replica.storage
        sync = storage.sync_all_now

        def logged_sync() -> None:
            self.log.append(("sync", self.replica._state_index))
            sync()

        storage.sync_all_now = logged_sync  # type: ignore[method-assign]

    def propose(self, cmds: list[Any], early: bool) -> list[Any]:
        """Propose ``cmds`` as one entry; the results it was answered with (``done``'s)."""
        answered: list[Any] = []

        def on_early(results: list[Any]) -> None:
            self.log.append(("early", self.replica._state_index))

        def done(results: Any, reason: int) -> None:
            self.log.append(("done", self.replica._state_index))
            answered.append((results, reason))

        self.log.clear()
        self.replica.propose(1_000, cmds, done, on_early if early else None)
        self.run_until(lambda: answered, "the entry's answer")
        results, reason = answered[0]
        assert reason == 0
        return results  # type: ignore[no-any-return]


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Lone]:
    node = Lone(str(tmp_path))
    try:
        yield node
    finally:
        node.close()


def push(queue: str, n: int) -> dict[str, Any]:
    return {"cmd": "PUSH", "queue": queue, "data": msgpack.packb({"n": n})}


def test_a_take_is_answered_after_its_entry_is_applied_and_before_it_is_synced(lone: Lone) -> None:
    lone.propose([push("q", 1), push("q", 2)], early=False)
    index = lone.replica.applied_index()
    results = lone.propose([session_pull({"cmd": "PULLB", "queue": "q", "count": 2}, "s1", 0)], early=True)
    assert len(results[0]["jobs"]) == 2
    assert lone.log == [("early", index + 1), ("sync", index + 1), ("done", index + 1)]


def test_an_entry_without_a_take_is_applied_after_its_sync(lone: Lone) -> None:
    index = lone.replica.applied_index()
    lone.propose([push("q", 1)], early=False)
    assert lone.log == [("sync", index), ("done", index + 1)]


def test_an_ack_with_a_take_is_applied_ahead_but_answered_after_the_sync(lone: Lone) -> None:
    lone.propose([push("q", 1), push("q", 2)], early=False)
    taken = lone.propose([session_pull({"cmd": "PULLB", "queue": "q", "count": 1}, "s1", 0)], early=False)
    job = taken[0]["jobs"][0]
    index = lone.replica.applied_index()
    results = lone.propose([{"cmd": "ACK", "id": job["id"], "token": taken[0]["tokens"][0]},
                            session_pull({"cmd": "PULLB", "queue": "q", "count": 1}, "s1", 0)], early=True)
    assert results[0] == {}  # the ACK applied (an error would be a CommandError)
    assert len(results[1]["jobs"]) == 1
    assert lone.log == [("early", index + 1), ("sync", index + 1), ("done", index + 1)]
