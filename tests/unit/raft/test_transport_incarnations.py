"""RaftNetwork's peer policy over loopback: incarnations recorded, refused, and links dropped on a change.

Two networks (n1 listens, n2 dials) with their own incarnations; the policy of either side
decides which incarnation of the other may link.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from shoal.node.raft.handshake import RejectReason, expect_incarnations
from shoal.node.raft.transport import RaftNetwork

from net_helpers import free_ports

WAIT_S = 5.0
INC1, INC2 = "1aaaaaaaaaaaaaaa", "2bbbbbbbbbbbbbbb"


@asynccontextmanager
async def _pair(n1_policy: Any = None, n2_policy: Any = None) -> AsyncIterator[tuple[RaftNetwork, RaftNetwork]]:
    loop = asyncio.get_running_loop()
    p1, p2 = free_ports(2)
    peers = {"n1": ("127.0.0.1", p1), "n2": ("127.0.0.1", p2)}
    n1 = RaftNetwork(loop, "n1", "test", b"secret", peers["n1"], {"n2": peers["n2"]}, set(), incarnation=INC1)
    n2 = RaftNetwork(loop, "n2", "test", b"secret", peers["n2"], {"n1": peers["n1"]}, {"n1"}, incarnation=INC2)
    if n1_policy is not None:
        n1.peer_policy = n1_policy
    if n2_policy is not None:
        n2.peer_policy = n2_policy
    await n1.start()
    await n2.start()
    try:
        yield n1, n2
    finally:
        n2.close()
        n1.close()
        await asyncio.sleep(0.05)


async def _until(condition: Any, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _connected(n1: RaftNetwork, n2: RaftNetwork) -> bool:
    return n1.connected_peers() == ["n2"] and n2.connected_peers() == ["n1"]


def test_each_side_records_the_incarnation_its_peer_proved() -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            await _until(lambda: _connected(n1, n2), "the link")
            assert (n1.peer_incarnation("n2"), n2.peer_incarnation("n1")) == (INC2, INC1)
            assert n1.peer_incarnation("n3") is None

    asyncio.run(main())


@pytest.mark.parametrize("refusing", ["listener", "dialer"])
def test_a_refused_incarnation_never_links_and_both_logs_name_both(refusing: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        if refusing == "listener":
            policies = (expect_incarnations({"n2": "0ld"}), None)
        else:
            policies = (None, expect_incarnations({"n1": "0ld"}))
        async with _pair(*policies) as (n1, n2):
            await _until(lambda: n1.refused_count >= 1 and n2.refused_count >= 1, "a refusal on both sides")
            assert n1.connected_peers() == [] and n2.connected_peers() == []

    with caplog.at_level(logging.WARNING, logger="shoal.node.raft.transport"):
        asyncio.run(main())
    offered = INC2 if refusing == "listener" else INC1
    lines = [r.getMessage() for r in caplog.records if RejectReason.STALE_INCARNATION.value in r.getMessage()]
    assert any("refused by" not in line and offered in line and "'0ld'" in line for line in lines), lines
    assert any("refused by" in line and offered in line and "'0ld'" in line for line in lines), lines


def test_a_new_policy_drops_the_links_it_refuses_and_lets_them_back_once_it_accepts() -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            await _until(lambda: _connected(n1, n2), "the link")
            expected = {"n2": "0ld"}
            assert n1.set_peer_policy(expect_incarnations(expected)) == ["n2"]
            await _until(lambda: n1.connected_peers() == [] and n2.connected_peers() == [], "the drop")
            refused = n1.refused_count
            await _until(lambda: n1.refused_count > refused, "n2 to redial and be refused")
            assert n1.connected_peers() == []
            expected["n2"] = INC2  # the policy reads the mapping at each handshake
            await _until(lambda: _connected(n1, n2), "the link back")
            assert n1.peer_incarnation("n2") == INC2
            assert n1.set_peer_policy(expect_incarnations(expected)) == []  # accepted: kept

    asyncio.run(main())


def test_drop_peer_closes_the_link_and_the_dialer_comes_back() -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            await _until(lambda: _connected(n1, n2), "the link")
            first = n1.links["n2"]
            assert n1.drop_peer("n2") and not n1.drop_peer("n3")
            await _until(lambda: "n2" in n1.links and n1.links["n2"] is not first, "a new link")

    asyncio.run(main())
