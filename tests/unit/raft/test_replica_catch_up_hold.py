"""A follower that was just sent a snapshot catches up by log: the leader's next snapshots keep
the journal entries it needs, instead of cutting them and sending it the newer snapshot too."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.node.raft.core import SNAPSHOT, Progress
from shoal.node.raft.snapshots import SnapshotFile

from test_replica_disk_class import lead
from test_replica_log_matching import Follower


class _Delivered:
    """What ``_end_sender`` reads of a finished stream."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.bytes_sent = 1

    def close(self) -> None:
        pass


@pytest.fixture()
def leader(tmp_path: Path) -> Iterator[Follower]:
    """A replica holding entries 1..100 of term 1, all applied, in the leader's seat, compacting
    often (a snapshot keeps 10 entries below it); peer ``c`` is being sent snapshot 40."""
    f = Follower(str(tmp_path / "replica"))
    try:
        f.append(1, (0, 0), [(i, 1) for i in range(1, 101)], commit=100)
        r = f.replica
        assert r.core.applied == 100
        lead(r.core, commit=100, applied=100, term_start=1)
        r.settings = dataclasses.replace(r.settings, entries_min=20)
        pr = r.core.progress["c"] = Progress(101, False)
        pr.state, pr.pending_snapshot = SNAPSHOT, 40
        r._senders["c"] = _Delivered(40)  # type: ignore[assignment]  # noqa: SLF001
        yield f
    finally:
        f.close()


def _snapshot_at(f: Follower, index: int, tmp_path: Path) -> None:
    """A snapshot at ``index`` written (a stand-in file) and, within the durable index, installed."""
    r = f.replica
    path = tmp_path / f"s{index}"
    path.write_bytes(b"\0" * 64)
    r._snapshot_written(SnapshotFile(str(path), index, 1, r.core.membership, 64, 0))  # noqa: SLF001


def test_a_snapshot_taken_right_after_a_delivery_keeps_what_the_follower_needs(leader: Follower, tmp_path: Path) -> None:
    r = leader.replica
    r._end_sender("c", ok=True)  # noqa: SLF001
    _snapshot_at(leader, 90, tmp_path)
    assert r.journal.first_index <= 40, "the entries after the delivered snapshot were cut"
    # The follower catches up part of the way: the hold follows it.
    r.core.progress["c"].match = 70
    _snapshot_at(leader, 95, tmp_path)
    assert 40 < r.journal.first_index <= 70
    # Past the newest snapshot: the journal is compacted as usual again.
    r.core.progress["c"].match = 96
    _snapshot_at(leader, 96, tmp_path)
    assert r.journal.first_index == 96 + 1 - 10
    assert "c" not in r._delivered  # noqa: SLF001


def test_a_follower_that_does_not_catch_up_is_held_for_only_a_while(leader: Follower, tmp_path: Path) -> None:
    r = leader.replica
    r._end_sender("c", ok=True)  # noqa: SLF001
    index, until = r._delivered["c"]  # noqa: SLF001
    r._delivered["c"] = (index, r._clock() - 1)  # noqa: SLF001  # its time is up
    _snapshot_at(leader, 90, tmp_path)
    assert r.journal.first_index == 90 + 1 - 10  # it is sent a snapshot again, when it answers


def test_a_failed_stream_holds_nothing_after_it(leader: Follower, tmp_path: Path) -> None:
    r = leader.replica
    r._end_sender("c", ok=False)  # noqa: SLF001
    _snapshot_at(leader, 90, tmp_path)
    assert r.journal.first_index == 90 + 1 - 10
