"""ForkSnapshotter and the snapshot file's checks: a forked child writes the snapshot and reads it
back whole, the parent polls without blocking and checks the child's report against the file's
envelope before reporting it, kills a child past its time
limit, keeps the journal prefix on failure and retries after a backoff; one child at a time."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal.node.raft import snapshots
from shoal.node.raft._io import RealIO
from shoal.node.raft.membership import Membership
from shoal.node.raft.snapshot_file import SnapshotCorrupt, write_snapshot
from shoal.node.partition.machine import SNAPSHOT_JOBS_PER_CHUNK, PartitionMachine, load_engine, snapshot_chunks
from shoal.node.partition.payload_files import PayloadFiles
from shoal.node.raft.snapshots import (RETRY_MIN_S, ForkSnapshotter, SnapshotFile, SnapshotSettings, read_snapshot_head,
                                       read_snapshot_meta, verify_snapshot)
from shoal.node.state import PartitionEngine

INDEX, TERM = 10, 3
MEMBERS = Membership.of(["a", "b", "c"], ["d"])
#: How long a test waits for a child (a loaded machine forks slowly); polled, never slept through.
CHILD_WAIT_S = 30.0


def state_of(engine: PartitionEngine) -> Callable[[], Iterator[bytes]]:
    """What the snapshotter writes: the engine's content, as the application hands it out."""
    return lambda: engine.snapshot_chunks(SNAPSHOT_JOBS_PER_CHUNK)


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


def io() -> RealIO:
    return RealIO(disk_free_min_bytes=0)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[ForkSnapshotter]]:
    """Snapshotters a test makes; any child still running is stopped when it ends."""
    made: list[ForkSnapshotter] = []
    yield made
    for snap in made:
        snap.cancel()


def make(made: list[ForkSnapshotter], directory: Path, clock: Clock | None = None, partition: int = 0,
         settings: SnapshotSettings | None = None) -> ForkSnapshotter:
    directory.mkdir(parents=True, exist_ok=True)
    snap = ForkSnapshotter(str(directory / f"p{partition}.snap"), partition, io(), settings or SnapshotSettings(),
                           clock=clock or time.monotonic)
    made.append(snap)
    return snap


def wait_done(snap: ForkSnapshotter) -> SnapshotFile | None:
    """Poll until the child is reaped: the verified snapshot, or None when it failed."""
    deadline = time.monotonic() + CHILD_WAIT_S
    while time.monotonic() < deadline:
        result = snap.poll()
        if not snap.in_progress:
            return result
        time.sleep(0.01)
    snap.cancel()
    raise AssertionError("snapshot child did not finish")


def test_child_writes_a_verified_snapshot_of_the_state_at_fork(tmp_path: Path, made: list) -> None:
    engine = engine_with(200)
    snap = make(made, tmp_path)
    assert snap.start(state_of(engine), INDEX, TERM, MEMBERS)
    assert snap.in_progress
    digest_at_fork = engine.digest()
    engine.apply({"cmd": "PUSH", "queue": "q", "data": b"after the fork"}, 5_000)  # not in the snapshot
    written = wait_done(snap)
    assert written is not None
    assert (written.index, written.term, written.membership) == (INDEX, TERM, MEMBERS)
    assert written == verify_snapshot(io(), snap.path)  # size and whole-file CRC of what is on disk
    assert written.size == os.path.getsize(snap.path)
    assert not os.path.exists(snap.path + ".tmp")
    assert snap.poll() is None  # reported once

    loaded, index, term, membership = load_engine(io(), snap.path)
    assert (index, term, membership) == (INDEX, TERM, MEMBERS)
    assert loaded.digest() == digest_at_fork != engine.digest()
    assert read_snapshot_meta(io(), snap.path) == (INDEX, TERM, MEMBERS)
    assert snap.written == 1 and snap.failed == 0


def test_failed_write_is_logged_keeps_the_prefix_and_is_retried_after_a_backoff(
        tmp_path: Path, made: list, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    engine = engine_with(20)
    snap = make(made, tmp_path, clock)
    os.mkdir(snap.path + ".tmp")  # the temp file cannot be created: every write fails
    caplog.set_level(logging.ERROR, logger="shoal.node.raft.snapshots")

    assert snap.start(state_of(engine), INDEX, TERM, MEMBERS)
    assert wait_done(snap) is None  # never reported: the replica keeps the journal prefix
    assert not os.path.exists(snap.path)
    assert "snapshot at entry 10 failed, journal prefix kept" in caplog.text
    assert "IsADirectoryError" in caplog.text  # the child's own error reaches the parent's log

    assert not snap.start(state_of(engine), INDEX, TERM, MEMBERS)  # within the backoff: no new child
    clock.now += RETRY_MIN_S
    assert snap.start(state_of(engine), INDEX, TERM, MEMBERS)
    assert wait_done(snap) is None
    clock.now += RETRY_MIN_S  # the second failure doubled the backoff
    assert not snap.start(state_of(engine), INDEX, TERM, MEMBERS)
    assert snap.failed == 2

    os.rmdir(snap.path + ".tmp")  # space is back
    clock.now += RETRY_MIN_S
    assert snap.start(state_of(engine), INDEX, TERM, MEMBERS)
    assert wait_done(snap) is not None
    assert snap.written == 1


def test_a_child_past_its_time_limit_is_killed_and_counted_as_failed(
        tmp_path: Path, made: list, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def stuck(*_args: object, **_kwargs: object) -> None:
        time.sleep(600)  # runs in the child only: the parent kills it

    monkeypatch.setattr(snapshots, "write_snapshot", stuck)
    caplog.set_level(logging.ERROR, logger="shoal.node.raft.snapshots")
    clock = Clock()
    snap = make(made, tmp_path, clock, settings=SnapshotSettings(child_time_limit_s=5.0))
    assert snap.start(state_of(engine_with(5)), INDEX, TERM, MEMBERS)
    assert snap.poll() is None and snap.in_progress  # within the limit: left alone
    clock.now += 5.1
    assert snap.poll() is None
    assert not snap.in_progress and snap.failed == 1
    assert "child ran longer than 5 s; killed" in caplog.text
    assert not os.path.exists(snap.path) and not os.path.exists(snap.path + ".tmp")
    assert not snap.start(state_of(engine_with(5)), INDEX, TERM, MEMBERS)  # the backoff applies


def test_a_file_that_ends_at_another_entry_is_not_reported(tmp_path: Path, made: list,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = snapshots.write_snapshot

    def elsewhere(io_: object, path: str, index: int, term: int, chunks: object) -> object:
        engine = engine_with(1)
        return real(io_, path, index + 1, term, snapshot_chunks(engine, index + 1, term, MEMBERS))  # type: ignore

    monkeypatch.setattr(snapshots, "write_snapshot", elsewhere)
    snap = make(made, tmp_path)
    assert snap.start(state_of(engine_with(5)), INDEX, TERM, MEMBERS)
    assert wait_done(snap) is None and snap.failed == 1


def test_the_child_reads_the_file_back_and_the_parent_only_its_envelope(tmp_path: Path, made: list,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot of gigabytes is read back whole in the child, never on the node's loop."""
    snap = make(made, tmp_path)
    assert snap.start(state_of(engine_with(50)), INDEX, TERM, MEMBERS)

    def whole_read(*_args: object) -> None:
        raise AssertionError("the parent read the whole snapshot")

    monkeypatch.setattr(snapshots, "verify_snapshot", whole_read)  # the forked child kept the real one
    monkeypatch.setattr(snapshots.SnapshotChecker, "update_from_file", whole_read)
    written = wait_done(snap)
    assert written is not None and written.size == os.path.getsize(snap.path)
    monkeypatch.undo()
    assert written == verify_snapshot(io(), snap.path)


def test_a_write_that_does_not_read_back_is_not_reported(tmp_path: Path, made: list, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    real = snapshots.write_snapshot

    def damaged(io_: object, path: str, *args: object) -> object:
        info = real(io_, path, *args)  # type: ignore[arg-type]
        with open(path, "r+b") as f:  # a bit flipped on its way to the disk
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 1]))
        return info

    monkeypatch.setattr(snapshots, "write_snapshot", damaged)
    caplog.set_level(logging.ERROR, logger="shoal.node.raft.snapshots")
    snap = make(made, tmp_path)
    assert snap.start(state_of(engine_with(50)), INDEX, TERM, MEMBERS)
    assert wait_done(snap) is None and snap.failed == 1
    assert "SnapshotCorrupt" in caplog.text and snap.path in caplog.text


def test_a_file_changed_after_the_child_verified_it_is_not_reported(tmp_path: Path, made: list) -> None:
    snap = make(made, tmp_path)
    assert snap.start(state_of(engine_with(50)), INDEX, TERM, MEMBERS)
    child = snap._pid
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # exited, not reaped: poll() still reaps it
    with open(snap.path, "ab") as f:
        f.write(b"x")
    assert wait_done(snap) is None and snap.failed == 1


def test_cancel_stops_the_child_and_writes_nothing(tmp_path: Path, made: list) -> None:
    snap = make(made, tmp_path)
    assert snap.start(state_of(engine_with(10)), INDEX, TERM, MEMBERS)
    snap.cancel()
    assert not snap.in_progress
    assert snap.poll() is None
    assert not os.path.exists(snap.path + ".tmp")


def test_one_child_at_a_time_the_next_snapshotter_is_called_back(tmp_path: Path, made: list) -> None:
    first = make(made, tmp_path / "a")
    second = make(made, tmp_path / "b", partition=1)
    calls: list[str] = []
    second.on_slot = lambda: calls.append("slot")
    assert first.start(state_of(engine_with(10)), INDEX, TERM, MEMBERS)
    assert not second.start(state_of(engine_with(5)), INDEX, TERM, MEMBERS)  # waits: one fork and one child at a time
    assert second.waiting and not second.in_progress
    assert wait_done(first) is not None
    assert calls == ["slot"]  # the replica asks again
    assert second.start(state_of(engine_with(5)), INDEX, TERM, MEMBERS)
    assert wait_done(second) is not None


def test_a_cancelled_waiter_gives_up_its_turn(tmp_path: Path, made: list) -> None:
    first = make(made, tmp_path / "a")
    second = make(made, tmp_path / "b", partition=1)
    calls: list[str] = []
    second.on_slot = lambda: calls.append("slot")
    assert first.start(state_of(engine_with(10)), INDEX, TERM, MEMBERS)
    assert not second.start(state_of(engine_with(5)), INDEX, TERM, MEMBERS)
    second.cancel()
    assert not second.waiting
    assert wait_done(first) is not None
    assert calls == []


def write(path: Path, engine: PartitionEngine, index: int = INDEX, term: int = TERM) -> None:
    write_snapshot(io(), str(path), index, term, snapshot_chunks(engine, index, term, MEMBERS))


def test_verify_refuses_a_flipped_byte_anywhere_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p0.snap"
    write(path, engine_with(300))
    good = path.read_bytes()
    verified = verify_snapshot(io(), str(path))
    assert verified.size == len(good)
    for offset in (3, 40, len(good) // 2, len(good) - 30, len(good) - 1):
        damaged = bytearray(good)
        damaged[offset] ^= 0x10
        path.write_bytes(bytes(damaged))
        with pytest.raises(SnapshotCorrupt, match="p0.snap"):
            verify_snapshot(io(), str(path))
        with pytest.raises(SnapshotCorrupt, match="p0.snap"):
            load_engine(io(), str(path))  # a damaged body is never loaded into an engine
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(SnapshotCorrupt, match="p0.snap"):
        verify_snapshot(io(), str(path))


def test_verify_refuses_metadata_that_contradicts_the_header(tmp_path: Path) -> None:
    path = tmp_path / "p0.snap"
    engine = engine_with(3)
    write_snapshot(io(), str(path), INDEX, TERM, snapshot_chunks(engine, INDEX + 1, TERM, MEMBERS))
    with pytest.raises(SnapshotCorrupt, match="header says entry 10/3"):
        verify_snapshot(io(), str(path))
    with pytest.raises(SnapshotCorrupt, match="header says entry 10/3"):
        read_snapshot_meta(io(), str(path))


def test_read_snapshot_meta_reads_only_the_envelope_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "p0.snap"
    write(path, engine_with(300))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1  # the body is not read: its damage shows at verify or load
    path.write_bytes(bytes(data))
    assert read_snapshot_meta(io(), str(path)) == (INDEX, TERM, MEMBERS)


def test_settings_from_env() -> None:
    assert SnapshotSettings.from_env({}) == SnapshotSettings()
    assert SnapshotSettings.from_env({"SHOAL_SNAPSHOT_ENTRIES_MIN": "50", "SHOAL_SNAPSHOT_INTERVAL_S": "2",
                                      "SHOAL_SNAPSHOT_CHILD_LIMIT_S": "30"}) == SnapshotSettings(50, 2.0, 30.0)
    for bad in ({"SHOAL_SNAPSHOT_ENTRIES_MIN": "1"}, {"SHOAL_SNAPSHOT_CHILD_LIMIT_S": "0"}):
        with pytest.raises(ValueError):
            SnapshotSettings.from_env(bad)


def test_a_child_that_cannot_read_a_payload_file_tells_the_application(tmp_path: Path, made: list) -> None:
    """On a follower the snapshot child may be the only reader of its payload files: what it could
    not read reaches the machine, which tells the node as a read of its own would; a failure of
    the snapshot's own file tells it nothing."""
    told: list[OSError] = []
    machine = PartitionMachine(0, PayloadFiles(tmp_path / "payloads", on_damage=told.append))
    for k in range(100):
        machine.engine.apply({"cmd": "PUSH", "queue": "q", "data": bytes([k]) * 20_000}, 1_000 + k)
    space = machine.payloads.spaces[0]
    space.flush()
    with open(space.directory / "00000000.pay", "r+b") as f:
        f.seek(40_000)
        f.write(b"\xff")
    snap = make(made, tmp_path / "snaps")
    snap.on_failed = machine.snapshot_failed
    assert snap.start(machine.snapshot_chunks, INDEX, TERM, MEMBERS)
    assert wait_done(snap) is None
    assert len(told) == 1 and "00000000.pay: the 16384 bytes at offset 32768 fail their checksum" in str(told[0])

    machine.snapshot_failed("IsADirectoryError: [Errno 21] Is a directory: " + snap.path + ".tmp")
    assert len(told) == 1


def test_a_snapshot_referring_to_files_names_their_directory_and_loads_with_them(tmp_path: Path, made: list) -> None:
    """The files are linked before the fork: what the node does with its own afterwards (here,
    every job removed) leaves the snapshot whole, and it costs its index, not its data."""
    machine = PartitionMachine(0, PayloadFiles(tmp_path / "payloads", file_bytes=1 << 16))
    machine.apply(machine.encode(1_000, [{"cmd": "PUSHB", "queue": "q", "jobs": [
        {"data": bytes([k % 251]) * 500} for k in range(2_000)]}]), 1, leading=True, replies=True)
    digest = machine.view.digest()
    snap = make(made, tmp_path / "snaps")
    files = str(tmp_path / "snaps" / "p0.snap.files.10")
    assert snap.start(machine.snapshot_chunks, INDEX, TERM, MEMBERS,
                      prepare=lambda: files if machine.link_snapshot_files(files) else None)
    machine.apply(machine.encode(2_000, [{"cmd": "Obliterate", "queue": "q"}]), 1, leading=True, replies=True)
    machine.payloads.collect()  # type: ignore[union-attr]
    machine.payloads.collect()  # type: ignore[union-attr]
    written = wait_done(snap)
    assert written is not None and written.files == "p0.snap.files.10"
    assert written.size < 2_000 * 500 // 5  # about 60 bytes a job against 500 of data
    assert verify_snapshot(io(), snap.path) == written
    assert read_snapshot_head(io(), snap.path) == (INDEX, TERM, MEMBERS, "p0.snap.files.10")
    loaded, index, term, membership = load_engine(io(), snap.path)
    assert (index, term, membership) == (INDEX, TERM, MEMBERS) and loaded.digest() == digest

    carried = make(made, tmp_path / "carried")  # prepare says no files: the data is in the file
    assert carried.start(machine.snapshot_chunks, INDEX, TERM, MEMBERS, prepare=lambda: None)
    written = wait_done(carried)
    assert written is not None and written.files is None
    assert read_snapshot_head(io(), carried.path) == (INDEX, TERM, MEMBERS, None)
