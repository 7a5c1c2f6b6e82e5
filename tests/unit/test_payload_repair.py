"""PayloadRepair: a leader hands over before its replica is rebuilt, a loading replica is rebuilt
once its load ends, a replica is rebuilt at most once per interval, and a forked child's report
of damage does nothing in the child."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from shoal.node import payload_repair
from shoal.node.payload_repair import REBUILD_INTERVAL_S, PayloadRepair


class Replica:
    """What the repair asks of a replica: whether it leads, a transfer, whether it loads."""

    def __init__(self, leading: bool = False, loading: bool = False, hands_over: bool = True) -> None:
        self.leading, self.loading, self.hands_over = leading, loading, hands_over
        self.transfers = 0

    def is_leader(self) -> bool:
        return self.leading

    def transfer_leadership(self) -> bool:
        self.transfers += 1
        if self.hands_over:
            asyncio.get_running_loop().call_later(0.01, setattr, self, "leading", False)
        return self.hands_over

    def status(self) -> dict[str, Any]:
        return {"loading": self.loading}


class Node:
    """The node's side: the replicas it hosts and the rebuilds it was asked for (each replaces
    the replica by a fresh one, as reopening does)."""

    def __init__(self, replica: Replica) -> None:
        self.replicas = {0: replica}
        self.rebuilt: list[tuple[int, bool]] = []  # (partition, whether the old replica still led)

    def replica_of(self, p: int) -> Any:
        return self.replicas.get(p)

    def rebuild(self, p: int) -> None:
        self.rebuilt.append((p, self.replicas[p].leading))
        self.replicas[p] = Replica()


async def _settle(repair: PayloadRepair, rounds: int = 200) -> None:
    """Until no repair is pending (bounded)."""
    for _ in range(rounds):
        await asyncio.sleep(0.01)
        if not repair._pending:  # noqa: SLF001
            return
    raise AssertionError("a repair is still pending")


def test_a_leader_hands_over_then_its_replica_is_rebuilt() -> None:
    async def scenario() -> None:
        node = Node(Replica(leading=True))
        repair = PayloadRepair(asyncio.get_running_loop(), node.replica_of, node.rebuild)
        repair.damaged(0, OSError("payload file x: damaged"))
        repair.damaged(0, OSError("payload file x: damaged again"))  # one repair for both
        await _settle(repair)
        assert node.rebuilt == [(0, False)] and repair.rebuilds == 1

    asyncio.run(scenario())


def test_a_leader_nobody_takes_over_from_is_rebuilt_anyway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payload_repair, "TRANSFER_WAIT_S", 0.05)

    async def scenario() -> None:
        stuck = Replica(leading=True, hands_over=False)
        node = Node(stuck)
        repair = PayloadRepair(asyncio.get_running_loop(), node.replica_of, node.rebuild)
        repair.damaged(0, OSError("damaged"))
        await _settle(repair)
        assert node.rebuilt == [(0, True)] and stuck.transfers == 1

    asyncio.run(scenario())


def test_a_loading_replica_is_rebuilt_once_its_load_ends() -> None:
    async def scenario() -> None:
        loading = Replica(loading=True)
        node = Node(loading)
        repair = PayloadRepair(asyncio.get_running_loop(), node.replica_of, node.rebuild)
        repair.damaged(0, OSError("damaged"))
        await asyncio.sleep(0.2)
        assert node.rebuilt == []
        loading.loading = False
        await _settle(repair)
        assert node.rebuilt == [(0, False)]

    asyncio.run(scenario())


def test_a_replica_is_rebuilt_at_most_once_per_interval() -> None:
    now = [1_000.0]

    async def scenario() -> None:
        node = Node(Replica())
        repair = PayloadRepair(asyncio.get_running_loop(), node.replica_of, node.rebuild, clock=lambda: now[0])
        repair.damaged(0, OSError("damaged"))
        await _settle(repair)
        now[0] += 1.0
        repair.damaged(0, OSError("damaged once more"))
        await asyncio.sleep(0.1)
        assert len(node.rebuilt) == 1 and repair._pending  # noqa: SLF001 - waits out the interval
        repair.close()
        await asyncio.sleep(0)
        assert not repair._pending  # noqa: SLF001
        repair.damaged(0, OSError("damaged while the node stops"))
        await asyncio.sleep(0.05)
        assert not repair._pending and len(node.rebuilt) == 1  # noqa: SLF001

    asyncio.run(scenario())
    assert REBUILD_INTERVAL_S >= 10


def test_a_gone_replica_or_a_forked_child_asks_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        node = Node(Replica())
        repair = PayloadRepair(asyncio.get_running_loop(), node.replica_of, node.rebuild)
        repair.damaged(7, OSError("a partition not hosted"))
        monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a snapshot child
        repair.damaged(0, OSError("damaged"))
        await asyncio.sleep(0.1)
        assert node.rebuilt == [] and not repair._pending  # noqa: SLF001

    asyncio.run(scenario())
