"""A leader's snapshot stream whose verified file a newer snapshot replaced before the replica reaped it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.node.raft.core import SNAPSHOT, Progress
from shoal.node.raft.snapshots import SnapshotFile

from test_replica_disk_class import lead
from test_replica_log_matching import Follower


@pytest.fixture()
def replica(tmp_path: Path) -> Iterator[Follower]:
    f = Follower(str(tmp_path / "replica"))
    try:
        yield f
    finally:
        f.close()


def test_a_peer_whose_snapshot_was_replaced_waits_for_the_next_one(replica: Follower, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The stream finds the verified file replaced by a newer snapshot the replica has not reaped
    yet: the peer waits for that one instead of being probed again, and asking again on every
    answer it sends meanwhile (a follower back from a pause answers thousands of heartbeats)."""
    r = replica.replica
    core = r.core
    lead(core, commit=0, applied=0, term_start=1)
    pr = core.progress["b"] = Progress(1, False)
    pr.state, pr.pending_snapshot = SNAPSHOT, 7
    (tmp_path / "replaced.snap").write_bytes(b"x" * 100)  # the newer file: another size
    r._snapshot_file = SnapshotFile(str(tmp_path / "replaced.snap"), 7, 1, core.membership, 64, 0)  # noqa: SLF001
    with caplog.at_level("INFO"):
        for _ in range(50):
            r._start_sender("b", 7, 1)  # noqa: SLF001
    assert "b" not in r._senders and r._awaiting_next == {"b"}  # noqa: SLF001
    assert pr.state == SNAPSHOT  # not probed again meanwhile
    assert sum("was replaced on disk" in m for m in caplog.messages) == 1

    # The child that renamed it failed (nothing in progress, no file reaped): probed again.
    r._background(r._clock())  # noqa: SLF001
    assert not r._awaiting_next and pr.state != SNAPSHOT  # noqa: SLF001
