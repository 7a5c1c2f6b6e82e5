"""Payload files: what is appended reads back from the buffer, the last block or the files;
released files are deleted, one collection later; a failed write keeps the bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from shoal.cluster.codec import encode_body, raw_bytes, raw_of
from shoal.cluster.errors import ProtocolError
from shoal.node.partition.machine import FILES_TAG, PartitionMachine, restore_engine
from shoal.node.partition.payload_files import FileSpace, PayloadFiles
from shoal.node.state import MemorySpace, PartitionEngine, Stored
from waiting import eventually


def _files(space: FileSpace) -> set[str]:
    return set(os.listdir(space.directory)) if space.directory.exists() else set()


def _collect(space: FileSpace) -> int:
    """A collection, and the compaction it started copied to its end; files deleted."""
    deleted = space.collect()
    for _ in range(10_000):
        if not space.compact():
            break
    return deleted


@settings(max_examples=60, deadline=None)
@given(blobs=st.lists(st.binary(min_size=1, max_size=90), min_size=1, max_size=40),
       file_bytes=st.sampled_from([64, 100, 1 << 20]), buffer_bytes=st.sampled_from([1, 50, 1 << 20]),
       read_ahead=st.sampled_from([1, 30, 500]), data=st.data())
def test_every_append_reads_back_across_buffer_blocks_and_files(tmp_path_factory: Any, blobs: list[bytes],
                                                                  file_bytes: int, buffer_bytes: int,
                                                                  read_ahead: int, data: st.DataObject) -> None:
    space = FileSpace(tmp_path_factory.mktemp("space"), file_bytes, buffer_bytes, read_ahead)
    memory = MemorySpace()
    starts = [(space.append(b), memory.append(b), b) for b in blobs]
    assert all(s == m for s, m, _ in starts)
    if data.draw(st.booleans()):
        space.flush()
    for start, _, blob in data.draw(st.permutations(starts)):
        assert space.read(start, start + len(blob)) == blob
        cut = data.draw(st.integers(0, len(blob)))
        assert space.read(start + cut, start + len(blob)) == memory.read(start + cut, start + len(blob))
    whole = b"".join(blobs)
    assert space.read(0, len(whole)) == whole


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("append"), st.integers(1, 30)),
                              st.tuples(st.just("release"), st.integers(0, 1000))), max_size=80))
def test_memory_space_reads_what_is_held_and_refuses_what_is_released(ops: list[tuple[str, int]]) -> None:
    """Blobs released in any order (front first, as a drained queue releases them, or not):
    every held byte reads back, every released blob's offsets are refused, and the blobs kept
    are exactly those with bytes held."""
    space = MemorySpace()
    held: dict[int, bytes] = {}
    gone: list[int] = []
    for i, (op, arg) in enumerate(ops):
        if op == "append":
            blob = bytes([i % 251]) * arg
            held[space.append(blob)] = blob
        elif held:
            start = sorted(held)[arg % len(held)]
            space.release(start, start + len(held.pop(start)))
            gone.append(start)
        for start, blob in held.items():
            assert space.read(start, start + len(blob)) == blob
        for start in gone:
            with pytest.raises(KeyError, match="not held"):
                space.read(start, start + 1)
        assert space.held_bytes == sum(map(len, held.values()))


def test_a_file_goes_one_collection_after_its_last_bytes_are_released(tmp_path: Path) -> None:
    space = FileSpace(tmp_path / "s", file_bytes=100, buffer_bytes=1)
    for _ in range(5):
        space.append(b"x" * 50)           # files 0, 1 and half of 2
    assert _files(space) == {"00000000.pay", "00000001.pay", "00000002.pay"}
    space.release(0, 100)                 # file 0 all released
    space.release(100, 150)               # file 1 half
    space.release(200, 250)               # file 2, still written to
    assert _collect(space) == 0 and _files(space) == {"00000000.pay", "00000001.pay", "00000002.pay"}
    # File 0 goes; file 1, half released before the last collection, is compacted to its half.
    assert _collect(space) == 1 and _files(space) == {"00000001.1.pay", "00000002.pay"}
    assert space.read(150, 200) == b"x" * 50
    assert space.append(b"y" * 60) == 250  # the rest of file 2 and 10 bytes of file 3
    space.release(250, 300)               # file 2 all released, and no longer written to
    _collect(space)
    assert _collect(space) == 1 and _files(space) == {"00000001.1.pay", "00000003.pay"}
    assert space.stats() == {"files": 2, "liveBytes": 50 + 10, "end": 310, "diskBytes": 50 + 10,
                             "compactions": 1, "copiedBytes": 50, "compacting": 0,
                             "readErrors": 0}
    assert space.read(300, 310) == b"y" * 10


def test_a_deleted_file_is_closed_on_the_retiring_thread(tmp_path: Path) -> None:
    """Its name goes at once; its descriptor, whose closing frees the file's blocks, on a worker."""
    space = FileSpace(tmp_path / "s", file_bytes=100, buffer_bytes=1)
    for _ in range(3):
        space.append(b"x" * 50)
    assert space.read(0, 100) == b"x" * 100  # file 0 opened
    fd = space._fds[0]
    space.release(0, 100)
    _collect(space)
    assert _collect(space) == 1 and "00000000.pay" not in _files(space)

    def closed() -> bool:
        try:
            os.fstat(fd)
        except OSError:
            return True
        return False

    eventually(closed, "the deleted file's descriptor closed")


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("append"), st.integers(1, 70)),
                              st.tuples(st.just("release"), st.integers(0, 10_000)),
                              st.tuples(st.just("collect"), st.just(0)),
                              st.tuples(st.just("compact"), st.just(0))), min_size=40, max_size=160),
       file_bytes=st.sampled_from([64, 100, 256]), read_ahead=st.sampled_from([1, 30, 500]),
       step=st.sampled_from([1, 16, 1 << 20]))
def test_compaction_keeps_every_byte_still_referenced_and_copies_each_at_most_twice(
        tmp_path_factory: Any, ops: list[tuple[str, int]], file_bytes: int, read_ahead: int, step: int) -> None:
    space = FileSpace(tmp_path_factory.mktemp("space"), file_bytes, buffer_bytes=16, read_ahead=read_ahead)
    space.compact_step = step
    held: dict[int, bytes] = {}       # start -> bytes of each append not released
    readable: dict[int, bytes] = {}   # ... and of those released since the last collection
    for i, (op, arg) in enumerate(ops):
        if op == "append":
            blob = bytes([i % 251]) * arg
            start = space.append(blob)
            held[start] = readable[start] = blob
        elif op == "release" and held:
            start = sorted(held)[arg % len(held)]
            space.release(start, start + len(held.pop(start)))
        elif op == "collect":
            space.flush()
            space.collect()
            readable = dict(held)
        elif op == "compact":
            space.compact()
        for start, blob in readable.items():
            assert space.read(start, start + len(blob)) == blob
    space.flush()
    for _ in range(10_000):
        if not space.compact():
            break
    stats = space.stats()
    on_disk = sum(os.path.getsize(space.directory / name) for name in _files(space))
    assert stats["diskBytes"] == on_disk and stats["liveBytes"] == sum(map(len, held.values()))
    assert stats["copiedBytes"] <= 2 * space.end


def test_a_mostly_released_file_is_compacted_and_its_bytes_read_through_the_map(tmp_path: Path) -> None:
    space = FileSpace(tmp_path / "s", file_bytes=1000, buffer_bytes=1, read_ahead=400)
    for k in range(30):
        space.append(bytes([k]) * 100)    # files 0, 1, 2: ten jobs each
    for k in range(20):
        if k % 5:
            space.release(k * 100, k * 100 + 100)  # all but jobs 0, 5, 10 and 15
    _collect(space)                       # released before this one: may be dropped by the next
    _collect(space)                       # file 0: the fuller of the two (800 of 1000 released)
    assert _files(space) == {"00000000.1.pay", "00000001.pay", "00000002.pay"}
    _collect(space)
    assert _files(space) == {"00000000.1.pay", "00000001.2.pay", "00000002.pay"}
    assert space.stats()["diskBytes"] == 200 + 200 + 1000 and space.stats()["copiedBytes"] == 400
    for k in (0, 5, 10, 15, 20, 29):
        assert space.read(k * 100, k * 100 + 100) == bytes([k]) * 100
    assert space.read(520, 540) == bytes([5]) * 20
    space.release(0, 100)
    space.release(500, 600)               # file 0 all released: deleted, compacted copy and all
    _collect(space)
    _collect(space)
    assert _files(space) == {"00000001.2.pay", "00000002.pay"}
    with pytest.raises(OSError, match="released and not kept"):
        space.read(1100, 1200)            # the map knows what was dropped


def test_a_file_consumers_are_emptying_is_left_to_empty_and_compacted_once_they_stop(tmp_path: Path) -> None:
    """A queue drained in order releases its oldest file from the front: copying the rest would
    write every job twice. Once the releases stop short of the end, the stragglers are copied."""
    space = FileSpace(tmp_path / "s", file_bytes=1000, buffer_bytes=1, read_ahead=400)
    for k in range(20):
        space.append(bytes([k]) * 100)    # files 0 and 1: ten jobs each
    _collect(space)
    for k in range(8):                    # one job of file 0 per collection: 2 left after 8
        space.release(k * 100, k * 100 + 100)
        _collect(space)
        assert _files(space) == {"00000000.pay", "00000001.pay"}, k
        assert space.stats()["copiedBytes"] == 0
    _collect(space)                       # no release since the last: jobs 8 and 9 are copied
    assert _files(space) == {"00000000.1.pay", "00000001.pay"}
    assert space.stats()["copiedBytes"] == 200
    assert space.read(800, 1000) == bytes([8]) * 100 + bytes([9]) * 100


def test_a_read_ahead_stops_at_the_end_of_its_file(tmp_path: Path) -> None:
    """A job at the end of a file whose successor is all released and deleted still reads."""
    space = FileSpace(tmp_path / "s", file_bytes=100, buffer_bytes=1, read_ahead=500)
    for _ in range(6):
        space.append(b"x" * 50)           # files 0, 1 and 2
    space.release(0, 50)                  # file 0 keeps its second half
    space.release(100, 200)               # file 1 all released
    _collect(space)
    _collect(space)
    assert "00000001.pay" not in _files(space)
    assert space.read(50, 100) == b"x" * 50


def test_a_compaction_that_cannot_write_leaves_the_file_as_it_was(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    space = FileSpace(tmp_path / "s", file_bytes=100, buffer_bytes=1)
    for k in range(4):
        space.append(bytes([k]) * 50)
    space.release(0, 50)
    _collect(space)

    def full(fd: int, data: Any, at: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(space, "_write_all", full)
    _collect(space)
    assert _files(space) == {"00000000.pay", "00000001.pay"} and space.compactions == 0
    assert space.read(50, 100) == bytes([1]) * 50
    monkeypatch.undo()
    for _ in range(60):                   # compaction rests a minute of collections, then retries
        _collect(space)
    assert space.compactions == 0
    _collect(space)
    assert _files(space) == {"00000000.1.pay", "00000001.pay"} and space.read(50, 100) == bytes([1]) * 50


def test_a_failed_write_keeps_the_bytes_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    space = FileSpace(tmp_path / "s", file_bytes=1 << 20, buffer_bytes=1 << 20)
    start = space.append(b"kept in memory")

    def full(start: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(space, "_pwrite", full)
    space.flush()
    assert space.read(start, start + 14) == b"kept in memory"
    assert space.read(start + 5, start + 7) == b"in"


def test_stored_data_is_read_when_the_frame_is_encoded(tmp_path: Path) -> None:
    space = FileSpace(tmp_path / "s", buffer_bytes=1)
    start = space.append(raw_of({"n": 1}).packed)
    ref = Stored(space, start, space.end)
    assert encode_body({"data": ref}) == encode_body({"data": raw_of({"n": 1})})
    assert ref == raw_of({"n": 1}) and len(ref) == len(raw_of({"n": 1}).packed)


def test_an_engine_on_payload_files_answers_and_snapshots_as_one_in_memory(tmp_path: Path) -> None:
    """Bulk and single adds, pulls, acks and a restore: the same replies and digests."""
    payloads = PayloadFiles(tmp_path / "payloads")
    on_disk, in_memory = PartitionEngine(0, payloads.new()), PartitionEngine(0)
    on_disk.pulled_runs = True  # as a node's engine replies
    cmds: list[dict[str, Any]] = [
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of({"i": i, "pad": "p" * i})} for i in range(300)]},
        *({"cmd": "PUSH", "queue": "q", "data": raw_of(i), "priority": i % 3} for i in range(50)),
        {"cmd": "PULLB", "queue": "q", "count": 120},
    ]
    for now, cmd in enumerate(cmds, 1_000):
        assert encode_body(on_disk.apply(cmd, now).result) == encode_body(in_memory.apply(cmd, now).result)
    assert on_disk.digest() == in_memory.digest()
    restored = PartitionEngine.restore_chunks(on_disk.snapshot_chunks(jobs_per_chunk=7), payloads.new())
    payloads.discard(on_disk.segments.space)
    pull = {"cmd": "PULLB", "queue": "q", "count": 500}
    assert encode_body(restored.apply(pull, 2_000).result) == encode_body(in_memory.apply(pull, 2_000).result)
    assert restored.digest() == in_memory.digest()
    payloads.close()
    assert not payloads.root.exists()


@pytest.mark.parametrize("runs", [False, True], ids=["maps", "runs"])
def test_a_pull_whose_data_cannot_be_read_is_applied_whole_and_its_reply_refused(tmp_path: Path, runs: bool) -> None:
    """A damaged payload file must not cut a pull short on one replica (the others apply all
    of it): the engine leases the same jobs, and the reply is refused as it is encoded (also
    by a node's engine, whose replies keep runs)."""
    space = FileSpace(tmp_path / "s", file_bytes=1 << 20, buffer_bytes=1)
    damaged, reference = PartitionEngine(0, space), PartitionEngine(0)
    damaged.pulled_runs = runs
    push = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of({"i": i, "pad": "p" * 200})} for i in range(50)]}
    damaged.apply(push, 1_000)
    reference.apply(push, 1_000)
    os.truncate(space.directory / "00000000.pay", 100)
    pull = {"cmd": "PULLB", "queue": "q", "count": 30}
    reply = damaged.apply(pull, 2_000).result
    assert len(reply["jobs"]) == len(reference.apply(pull, 2_000).result["jobs"]) == 30
    counts = {"cmd": "GetJobCounts", "queue": "q"}
    assert damaged.apply(counts, 2_001).result == reference.apply(counts, 2_001).result
    assert damaged.lease_seq == reference.lease_seq
    with pytest.raises(ProtocolError, match=r"job data could not be read: payload file .*00000000\.pay"):
        encode_body(reply)
    assert space.stats()["readErrors"] >= 1


def test_payload_files_of_an_earlier_run_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "payloads"
    PayloadFiles(root).new().append(b"left over")
    (root / "g1" / "00000000.pay").write_bytes(b"left over")
    fresh = PayloadFiles(root)
    assert not root.exists() and fresh.new().end == 0


def test_job_objects_keep_their_data_in_the_space_until_removed_or_replaced(tmp_path: Path) -> None:
    """Jobs with their own backoff or attempts (job objects), a slot made a job object, new data,
    removals."""
    payloads = PayloadFiles(tmp_path / "payloads")
    space = payloads.new()
    engine = PartitionEngine(0, space)
    pushes: list[dict[str, Any]] = [
        {"cmd": "PUSH", "queue": "q", "data": raw_of("grouped"), "backoff": 5},
        {"cmd": "PUSH", "queue": "q", "data": raw_of("custom"), "attempts": 3},
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(f"bulk-{i}")} for i in range(5)]},
    ]
    ids = [engine.apply(cmd, 1_000).result.get("id") for cmd in pushes]
    assert type(engine.jobs[1].data) is Stored and space.stats()["liveBytes"] > 0
    engine.apply({"cmd": "Update", "id": ids[0], "data": raw_of("grouped, updated")}, 1_001)
    engine.apply({"cmd": "GetJob", "id": "0-5"}, 1_002)  # a slot's job, made a job object by its id
    got = engine.apply({"cmd": "GetJob", "id": ids[0]}, 1_003).result
    assert got["job"]["data"] == raw_of("grouped, updated")
    held = sum(len(j.data) for j in engine.jobs.values()) + sum(
        seg.data_len(i) for seg in engine.segments for i, code in enumerate(seg.states) if code)
    assert space.stats()["liveBytes"] == held
    restored = PartitionEngine.restore_chunks(engine.snapshot_chunks(), payloads.new())
    assert restored.digest() == engine.digest()
    engine.apply({"cmd": "Obliterate", "queue": "q"}, 1_004)
    assert space.stats()["liveBytes"] == 0


class _SparseSpace(MemorySpace):
    """A memory space whose appends land 3 GiB apart (as a partition's other queues' data would
    put them): a segment's offsets outgrow 4 bytes."""

    def append(self, blob: bytes) -> int:
        self.end += 3 << 30
        return super().append(blob)


def test_a_segment_whose_data_spans_4_gib_widens_its_offsets() -> None:
    from shoal.node.state._segments import Segment

    space = _SparseSpace()
    seg = Segment(1, [b"a", b"bb"], "q", 0, 1, 0, 0, space=space)
    assert seg.offs is not None and seg.offs.typecode == "I"
    for k in range(3):
        seg.append(b"x" * (k + 1), 1, 0, 0, 0, None)
    assert seg.offs.typecode == "q" and [seg.data(i) for i in range(5)] == [b"a", b"bb", b"x", b"xx", b"xxx"]
    assert [r.packed for r in seg.run_data(0, 5)] == [b"a", b"bb", b"x", b"xx", b"xxx"]
    seg.release(0, 5)
    assert space.held_bytes == 0


def _engine_on_files(payloads: PayloadFiles) -> tuple[PartitionMachine, list[dict[str, Any]]]:
    """A machine whose engine holds bulk and single adds in files of 4 KiB, 150 of the bulk
    ones leased (their pull's jobs returned)."""
    machine = PartitionMachine(0, payloads)
    cmds: list[dict[str, Any]] = [
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of({"i": i, "pad": "p" * (200 + i % 50)})}
                                                for i in range(400)]},
        *({"cmd": "PUSH", "queue": "r", "data": raw_of(i), "priority": i % 3} for i in range(60)),
        {"cmd": "PULLB", "queue": "q", "count": 150, "session": "s"},
    ]
    pulled = machine.apply(machine.encode(1_000, cmds), 1, leading=True, replies=True)[-1]
    return machine, [{"id": j["id"], "token": t} for j, t in zip(pulled["jobs"], pulled["tokens"])]


def test_a_snapshot_refers_to_its_linked_files_which_outlive_the_space_moving_on(tmp_path: Path) -> None:
    """Linked before the fork, the files hold what the snapshot refers to after the node
    released, deleted and compacted its own; the snapshot loads to the same state."""
    payloads = PayloadFiles(tmp_path / "payloads", file_bytes=4096)
    machine, _ = _engine_on_files(payloads)
    space = machine.engine.segments.space
    assert isinstance(space, FileSpace)
    files = tmp_path / "p0.snap.files.7"
    digest = machine.view.digest()
    assert machine.link_snapshot_files(str(files))
    chunks = list(machine.snapshot_chunks(str(files)))
    assert chunks[0][:1] == FILES_TAG
    by_ref, carried = sum(map(len, chunks)), sum(map(len, machine.snapshot_chunks()))
    assert by_ref * 3 < carried  # an index, not the data
    assert sorted(os.listdir(files)) == [f"{n:08d}.pay" for n in sorted(space._live)]
    # The node goes on: every job acked or removed, its files released and deleted.
    machine.apply(machine.encode(2_000, [{"cmd": "Obliterate", "queue": "q"}, {"cmd": "Obliterate", "queue": "r"}]),
                  1, leading=True, replies=True)
    for _ in range(3):
        _collect(space)
    assert len(_files(space)) == 1 < len(os.listdir(files))  # all but the one appended to deleted
    loaded = PartitionMachine(0, PayloadFiles(tmp_path / "other")).load_snapshot(iter(chunks), str(files))
    assert loaded.digest() == digest  # files of another size: the data is copied into them
    assert restore_engine(iter(chunks), str(files), None).digest() == digest  # and into memory


def test_a_restore_adopts_the_snapshots_files_and_goes_on_with_them(tmp_path: Path) -> None:
    """Files of the same size are adopted (hard links: no data read or written); the restored
    engine serves, appends to new files, snapshots them again, and gives them back as its jobs
    go, while the snapshot's own links keep what it refers to."""
    machine, jobs = _engine_on_files(PayloadFiles(tmp_path / "payloads", file_bytes=4096))
    digest = machine.view.digest()
    files = tmp_path / "p0.snap.files.7"
    assert machine.link_snapshot_files(str(files))
    chunks = list(machine.snapshot_chunks(str(files)))

    restored = PartitionMachine(0, PayloadFiles(tmp_path / "restored", file_bytes=4096))
    restored.install(restored.load_snapshot(iter(chunks), str(files)))
    space = restored.engine.segments.space
    assert isinstance(space, FileSpace)
    assert restored.view.digest() == digest and space.copied == 0
    linked = sorted(os.listdir(files))
    assert {f for f in _files(space)} == set(linked)
    assert all(os.stat(files / f).st_ino == os.stat(space.directory / f).st_ino for f in linked)
    assert space.stats()["liveBytes"] == machine.engine.segments.space.stats()["liveBytes"]

    # It goes on: a pull reads the adopted bytes, new adds go to a new file.
    pulled = restored.apply(restored.encode(2_000, [
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of({"new": i})} for i in range(20)]},
        {"cmd": "PULLB", "queue": "q", "count": 500, "session": "t"}]), 2, leading=True, replies=True)[-1]
    assert len(pulled["jobs"]) == 400 - 150 + 20
    assert raw_bytes(pulled["jobs"][0]["data"]) == raw_of({"i": 150, "pad": "p" * 200}).packed
    space.flush()
    assert set(_files(space)) - set(linked)  # the adds went to a file of their own

    again = tmp_path / "p0.snap.files.9"  # a snapshot of the restored engine links them again
    assert restored.link_snapshot_files(str(again))
    chunks_again = list(restored.snapshot_chunks(str(again)))
    digest_again = restored.view.digest()

    restored.apply(restored.encode(3_000, [{"cmd": "Obliterate", "queue": "q"}, {"cmd": "Obliterate", "queue": "r"}]),
                   2, leading=True, replies=True)
    for _ in range(3):
        restored.payloads.collect()  # type: ignore[union-attr]
    assert len(_files(space)) <= 1  # every adopted file released and deleted
    assert PartitionMachine(0, PayloadFiles(tmp_path / "third", file_bytes=4096)).load_snapshot(
        iter(chunks_again), str(again)).digest() == digest_again
    assert restore_engine(iter(chunks), str(files), None).digest() == digest  # the first one still whole


def test_a_compacted_file_is_linked_with_its_map(tmp_path: Path) -> None:
    payloads = PayloadFiles(tmp_path / "payloads", file_bytes=4096)
    machine, jobs = _engine_on_files(payloads)
    space = machine.engine.segments.space
    assert isinstance(space, FileSpace)
    leased = [j for j in jobs if j["id"] not in {k["id"] for k in jobs[::3]}]  # a third kept back
    machine.apply(machine.encode(3_000, [{"cmd": "ACKB", "ids": [j["id"] for j in leased],
                                          "tokens": [j["token"] for j in leased],
                                          "removeOnCompletes": [True] * len(leased)}]), 1, leading=True, replies=True)
    space.flush()
    for _ in range(3):
        _collect(space)
    assert space.compactions > 0
    digest = machine.view.digest()
    files = tmp_path / "p0.snap.files.9"
    assert machine.link_snapshot_files(str(files))
    chunks = list(machine.snapshot_chunks(str(files)))
    other = PartitionMachine(0, PayloadFiles(tmp_path / "other"))
    assert other.load_snapshot(iter(chunks), str(files)).digest() == digest


@pytest.mark.parametrize("damage", ["flipped", "missing"])
def test_a_damaged_or_missing_linked_file_is_named_when_the_snapshot_loads(tmp_path: Path, damage: str) -> None:
    payloads = PayloadFiles(tmp_path / "payloads", file_bytes=4096)
    machine, _ = _engine_on_files(payloads)
    files = tmp_path / "p0.snap.files.3"
    assert machine.link_snapshot_files(str(files))
    chunks = list(machine.snapshot_chunks(str(files)))
    victim = files / "00000001.pay"
    if damage == "flipped":
        blob = bytearray(victim.read_bytes())
        blob[100] ^= 0xFF
        os.unlink(victim)  # the live space's link keeps its own bytes
        victim.write_bytes(bytes(blob))
    else:
        os.unlink(victim)
    with pytest.raises(OSError, match="00000001.pay"):
        PartitionMachine(0, PayloadFiles(tmp_path / "other")).load_snapshot(iter(chunks), str(files))
    with pytest.raises(ValueError, match="none are beside it"):
        restore_engine(iter(chunks), None, None)


def test_an_engine_in_memory_has_no_files_to_link(tmp_path: Path) -> None:
    machine = PartitionMachine(0)
    assert not machine.link_snapshot_files(str(tmp_path / "files"))
    assert not (tmp_path / "files").exists()
