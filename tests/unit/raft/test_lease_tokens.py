"""Lease tokens never repeat across a restart (issue 41, finding 5).

A lone voter answers the jobs a take leases before the take's entry is synced
(``PartitionReplica._apply_ahead``). A power cut right then loses the entry, while the
consumer holds its token. After the restart the same job is taken again; its new token must
differ from the lost one, or the first consumer's late ACK completes the job under the second
consumer's lease. Tokens of a Raft term are numbered from ``term << TERM_LEASE_BITS`` and a
restarted replica leads in a newer term, so they cannot.

The replica is the real one, on the simulated disk (:class:`~shoal.node.raft._io.SimIO`),
whose power cut loses everything not synced.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.partition.pushes import session_pull
from shoal.node.raft._io import SimIO
from shoal.node.raft.storage import NodeStorage
from shoal.node.state import TERM_LEASE_BITS

from test_lone_early_takes import Lone

DATA_DIR = "/lone"


class _Crash(BaseException):
    """The process dies (a power cut) where this is raised."""


class Incarnation(Lone):
    """One run of a lone replica's process on the simulated disk ``io``."""

    def __init__(self, io: SimIO) -> None:
        self.storage = NodeStorage(io, DATA_DIR)
        super().__init__(DATA_DIR, storage=self.storage)

    def abandon(self) -> None:
        """The process is gone: nothing of it runs again (its files stay as the disk has them)."""
        self.scheduler.close()
        self.loop.close()


def _take(node: Incarnation, session: str) -> list[Any]:
    return [session_pull({"cmd": "PULLB", "queue": "q", "count": 1}, session, 0)]


def test_a_take_lost_to_a_power_cut_is_never_followed_by_the_same_token() -> None:
    io = SimIO()
    first = Incarnation(io)
    first.propose([{"cmd": "PUSH", "queue": "q", "data": msgpack.packb({"n": 1})}], early=False)
    term = first.replica.term()
    early: list[Any] = []

    def crash_before_the_sync() -> None:
        raise _Crash()

    def on_early(results: list[Any]) -> None:
        early.append(results[0])  # answered to the consumer: it holds the job and its token
        first.storage.sync_all_now = crash_before_the_sync  # type: ignore[method-assign]

    with pytest.raises(_Crash):
        first.replica.propose(1_000, _take(first, "s1"), lambda r, e: None, on_early)
    first.abandon()
    io.power_cut()
    (lost,) = early
    lost_token = lost["tokens"][0]
    assert int(lost_token.split(".")[1]) >> TERM_LEASE_BITS == term

    second = Incarnation(io)  # leads in a newer term, with the take's entry gone
    try:
        assert second.replica.term() > term
        (again,) = second.propose(_take(second, "s2"), early=False)
        assert again["jobs"][0]["id"] == lost["jobs"][0]["id"]
        assert again["tokens"][0] != lost_token
        (stale,) = second.propose([{"cmd": "ACK", "id": lost["jobs"][0]["id"], "token": lost_token}], early=False)
        assert isinstance(stale, CommandError) and stale.code is ErrorCode.LEASE_MISMATCH
        (fresh,) = second.propose([{"cmd": "ACK", "id": again["jobs"][0]["id"], "token": again["tokens"][0]}],
                                  early=False)
        assert fresh == {}
    finally:
        second.close()
