"""ForkSnapshotter: a forked child writes the snapshot; the parent polls, never blocks, keeps the
journal prefix on failure and retries after a backoff."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from pysyncobj.config import SERIALIZER_STATE

from shoal.node.raft._io import RealIO
from shoal.node.raft.snapshot_file import read_snapshot_info
from shoal.node.raft.snapshots import RETRY_MIN_S, ForkSnapshotter, SnapshotSettings, align_journal, load_snapshot
from shoal.node.state import PartitionEngine

PREV = (b"prev-command", 9, 2)
LAST = (b"last-command", 10, 3)


def engine_with(jobs: int) -> PartitionEngine:
    engine = PartitionEngine(0)
    for k in range(jobs):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": k.to_bytes(4, "big")}, 1_000 + k)
    return engine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, engine: PartitionEngine, clock: Clock | None = None) -> tuple[ForkSnapshotter, list]:
    adopted: list[PartitionEngine] = []
    snap = ForkSnapshotter(str(tmp_path / "p0.dump"), 0, lambda: engine, lambda e, _p, _l: adopted.append(e), 4096,
                           io=RealIO(disk_free_min_bytes=0), clock=clock or time.monotonic)
    return snap, adopted


def wait_done(snap: ForkSnapshotter, timeout_s: float = 20.0) -> tuple[int, int | None]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state, ident = snap.checkSerializing()
        if state != SERIALIZER_STATE.SERIALIZING:
            return state, ident
        time.sleep(0.01)
    snap.cancel()
    raise AssertionError("snapshot child did not finish")


def test_child_writes_a_durable_snapshot_of_the_state_at_fork(tmp_path: Path) -> None:
    engine = engine_with(200)
    snap, adopted = make(tmp_path, engine)
    snap.serialize((None, LAST, PREV, None), PREV[1])
    assert snap.in_progress
    digest_at_fork = engine.digest()
    engine.apply({"cmd": "PUSH", "queue": "q", "data": b"after the fork"}, 5_000)  # not in the snapshot
    state, ident = wait_done(snap)
    assert (state, ident) == (SERIALIZER_STATE.SUCCESS, PREV[1])  # pysyncobj drops entries below PREV
    info = read_snapshot_info(RealIO(disk_free_min_bytes=0), snap.path)
    assert (info.last_index, info.last_term) == (LAST[1], LAST[2])
    assert not os.path.exists(snap.path + ".tmp")
    assert snap.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)

    data = snap.deserialize()
    assert data == (None, LAST, PREV, None)
    assert adopted[0].digest() == digest_at_fork != engine.digest()
    assert snap.written == 1 and snap.failed == 0


def test_failed_write_is_logged_keeps_the_prefix_and_is_retried_after_a_backoff(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    engine = engine_with(20)
    snap, _ = make(tmp_path, engine, clock)
    os.mkdir(snap.path + ".tmp")  # the temp file cannot be created: every write fails
    caplog.set_level(logging.ERROR, logger="shoal.node.raft.snapshots")

    snap.serialize((None, LAST, PREV, None), PREV[1])
    assert wait_done(snap)[0] == SERIALIZER_STATE.FAILED  # never SUCCESS: pysyncobj keeps the prefix
    assert not os.path.exists(snap.path)
    assert "snapshot at entry 10 failed, journal prefix kept" in caplog.text
    assert "IsADirectoryError" in caplog.text  # the child's own error reaches the parent's log

    snap.serialize((None, LAST, PREV, None), PREV[1])  # within the backoff: no new child
    assert not snap.in_progress
    clock.now += RETRY_MIN_S
    snap.serialize((None, LAST, PREV, None), PREV[1])
    assert snap.in_progress
    assert wait_done(snap)[0] == SERIALIZER_STATE.FAILED
    clock.now += RETRY_MIN_S  # the second failure doubled the backoff
    snap.serialize((None, LAST, PREV, None), PREV[1])
    assert not snap.in_progress
    assert snap.failed == 2

    os.rmdir(snap.path + ".tmp")  # space is back
    clock.now += RETRY_MIN_S
    snap.serialize((None, LAST, PREV, None), PREV[1])
    assert wait_done(snap)[0] == SERIALIZER_STATE.SUCCESS
    assert snap.written == 1


def test_transmission_round_trip_and_damage_refused(tmp_path: Path) -> None:
    engine = engine_with(300)
    (tmp_path / "a").mkdir()
    leader, _ = make(tmp_path / "a", engine)
    leader.serialize((None, LAST, PREV, None), PREV[1])
    assert wait_done(leader)[0] == SERIALIZER_STATE.SUCCESS

    (tmp_path / "b").mkdir()
    follower, adopted = make(tmp_path / "b", PartitionEngine(0))
    pieces = []
    for _ in range(10_000):
        piece = leader.getTransmissionData("node-b")
        assert piece is not None
        pieces.append(piece)
        if piece[2]:
            break
    assert pieces[0][1] and pieces[-1][2] and len(pieces) > 2
    assert [follower.setTransmissionData(p) for p in pieces][-1] is True
    follower.deserialize()
    assert adopted[0].digest() == engine.digest()

    (tmp_path / "c").mkdir()
    damaged, _ = make(tmp_path / "c", PartitionEngine(0))
    first = pieces[0]
    bad = [(first[0][:-1] + bytes([first[0][-1] ^ 1]), True, False), *pieces[1:]]
    results = [damaged.setTransmissionData(p) for p in bad]
    assert results[-1] is True  # header and trailer are whole: the file is stored ...
    with pytest.raises(Exception, match="checksum"):
        damaged.deserialize()  # ... but never adopted: the content checksum fails


def test_cancel_stops_the_child_and_writes_nothing(tmp_path: Path) -> None:
    snap, _ = make(tmp_path, engine_with(10))
    snap.serialize((None, LAST, PREV, None), PREV[1])
    snap.cancel()
    assert not snap.in_progress
    assert snap.checkSerializing() == (SERIALIZER_STATE.NOT_SERIALIZING, None)


def test_settings_from_env() -> None:
    assert SnapshotSettings.from_env({}) == SnapshotSettings()
    assert SnapshotSettings.from_env({"SHOAL_SNAPSHOT_ENTRIES_MIN": "50", "SHOAL_SNAPSHOT_INTERVAL_S": "2"}) \
        == SnapshotSettings(50, 2.0)
    with pytest.raises(ValueError):
        SnapshotSettings.from_env({"SHOAL_SNAPSHOT_ENTRIES_MIN": "1"})


def test_load_snapshot_round_trip(tmp_path: Path) -> None:
    engine = engine_with(50)
    snap, _ = make(tmp_path, engine)
    snap.serialize((None, LAST, PREV, None), PREV[1])
    assert wait_done(snap)[0] == SERIALIZER_STATE.SUCCESS
    loaded, prev, last = load_snapshot(RealIO(disk_free_min_bytes=0), snap.path)
    assert (prev, last) == (PREV, LAST) and loaded.digest() == engine.digest()


def test_a_large_snapshot_is_sent_in_bounded_bursts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.node.raft import snapshots

    monkeypatch.setattr(snapshots, "TRANSMISSION_BURST_BYTES", 8192)
    clock = Clock()
    leader, _ = make(tmp_path, engine_with(300), clock)
    leader.serialize((None, LAST, PREV, None), PREV[1])
    assert wait_done(leader)[0] == SERIALIZER_STATE.SUCCESS
    burst = [leader.getTransmissionData("n") for _ in range(4)]
    assert [p is None for p in burst] == [False, False, True, True]  # 2 x 4096 bytes, then wait
    clock.now += 2 * snapshots.TRANSMISSION_BURST_WINDOW_S
    piece = leader.getTransmissionData("n")
    assert piece is not None and not piece[1]  # the next burst goes on where the last stopped


def test_a_damaged_snapshot_file_stops_the_start(tmp_path: Path) -> None:
    snap, _ = make(tmp_path, engine_with(5))
    snap.check_at_start()  # no file: nothing to check
    Path(snap.path).write_bytes(b"SHOALSNAP1 an older format or garbage")
    with pytest.raises(Exception, match="p0.dump"):
        snap.check_at_start()


class ListJournal(list):
    """pysyncobj's journal interface, as far as align_journal uses it."""

    def deleteEntriesTo(self, k: int) -> None:  # noqa: N802 (pysyncobj's name)
        del self[:k]


def test_a_journal_not_yet_compacted_is_compacted_to_the_snapshot_at_start() -> None:
    # The node stopped after the snapshot ending at entry 10 was renamed into place but before the
    # journal dropped its prefix: entries 1-12 are still there.
    journal = ListJournal((f"c{i}".encode(), i, 2 if i < 10 else 3) for i in range(1, 13))
    prev, last = (b"c9", 9, 2), (b"c10", 10, 3)
    assert align_journal(journal, prev, last) == 8
    assert [e[1] for e in journal] == [9, 10, 11, 12]  # pysyncobj now keeps it: it begins with (prev, last)
    assert align_journal(journal, prev, last) == 0  # already aligned

    other = ListJournal([(b"x9", 9, 1), (b"x10", 10, 1), (b"x11", 11, 1)])
    assert align_journal(ListJournal(other), prev, last) == 0  # different entries: left to pysyncobj
    assert align_journal(ListJournal([(b"c1", 1, 1)]), prev, last) == 0


def test_covers_every_method_pysyncobj_calls_on_its_serializer() -> None:
    from pysyncobj.serializer import Serializer

    wanted = {name for name in vars(Serializer) if not name.startswith("_")}
    assert wanted == {"checkSerializing", "serialize", "deserialize", "getTransmissionData",
                      "setTransmissionData", "cancelTransmisstion"}, "pysyncobj's Serializer changed"
    assert all(callable(getattr(ForkSnapshotter, name, None)) for name in wanted)


def test_one_child_at_a_time_the_next_snapshotter_is_called_back(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _ = make(tmp_path / "a", engine_with(10))
    calls: list[str] = []
    second = ForkSnapshotter(str(tmp_path / "b" / "p1.dump"), 1, lambda: engine_with(5), lambda *_: None, 4096,
                             io=RealIO(disk_free_min_bytes=0), on_slot=lambda: calls.append("slot"))
    first.serialize((None, LAST, PREV, None), PREV[1])
    second.serialize((None, LAST, PREV, None), PREV[1])
    assert first.in_progress and not second.in_progress  # waits: one fork and one child at a time
    assert wait_done(first)[0] == SERIALIZER_STATE.SUCCESS
    assert calls == ["slot"]  # the replica asks pysyncobj again
    second.serialize((None, LAST, PREV, None), PREV[1])
    assert second.in_progress
    assert wait_done(second)[0] == SERIALIZER_STATE.SUCCESS
