"""Snapshot streaming (install.py): SnapshotSender and SnapshotReceiver over an in-memory link.

The sender streams a verified snapshot file in chunks within a window and a byte rate; the
receiver writes them to a temp file, acknowledges each with the offset it wants next, and
hands the file over only once its whole-file CRC32C equals the leader's. Time is a number
the test moves (the rates take it as an argument); nothing sleeps.
"""

from __future__ import annotations

import pytest

from shoal.node.partition.machine import load_engine, snapshot_chunks
from shoal.node.raft import install
from shoal.node.raft._io import SimIO
from shoal.node.raft.install import (COMPLETE, GO_ON, NO_FILES, NOT_WANTED, START_OVER, ByteRate, Received,
                                     SnapshotReceiver, SnapshotSender)
from shoal.node.raft.membership import Membership
from shoal.node.raft.messages import Message, SnapshotChunk, SnapshotChunkAck
from shoal.node.raft.snapshot_file import SnapshotCorrupt, write_snapshot
from shoal.node.raft.snapshots import SnapshotFile, verify_snapshot
from shoal.node.state import PartitionEngine

INDEX, TERM = 40, 3
LEADER_PATH, FOLLOWER_PATH = "/leader/p0.snap", "/follower/p0.snap"
#: The directory beside a snapshot holding the files it refers to.
FILES_NAME = f"p0.snap.files.{INDEX}"
#: Chunk and window sizes for these tests: a ~30 kB file travels in a few dozen chunks.
CHUNK_BYTES, WINDOW_BYTES = 1024, 4 * 1024
#: Deliveries a test allows before it calls a stream stuck.
ROUNDS_MAX = 10_000
UNLIMITED = 1e12


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "CHUNK_BYTES", CHUNK_BYTES)
    monkeypatch.setattr(install, "WINDOW_BYTES", WINDOW_BYTES)


def engine_with(jobs: int) -> PartitionEngine:
    engine = PartitionEngine(0)
    for k in range(jobs):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": k.to_bytes(4, "big") * 8}, 1_000 + k)
    return engine


def leader_snapshot(io: SimIO, engine: PartitionEngine) -> SnapshotFile:
    members = Membership.of(["a", "b", "c"])
    write_snapshot(io, LEADER_PATH, INDEX, TERM, snapshot_chunks(engine, INDEX, TERM, members))
    return verify_snapshot(io, LEADER_PATH)


class Link:
    """The leader's sender and the follower's receiver, with the messages between them.

    The follower side does what its replica does with a complete file: check its envelope,
    rename it into place and acknowledge the stream as complete (``install=False`` stops at
    the complete file).
    """

    def __init__(self, io: SimIO, snap: SnapshotFile, term: int = TERM, rates: list[ByteRate] | None = None,
                 install: bool = True, files: list[tuple[str, str]] | None = None) -> None:
        self.io = io
        self.files = files
        self.install = install
        self.snap = snap
        self.now = 0.0
        self.to_follower: list[Message] = []
        self.to_leader: list[SnapshotChunkAck] = []
        self.receiver = SnapshotReceiver(FOLLOWER_PATH, io, 0)
        self.follower_term = term
        self.received: Received | None = None
        self.sender = self.new_sender(term, rates)

    def new_sender(self, term: int = TERM, rates: list[ByteRate] | None = None) -> SnapshotSender:
        """A new stream of the same file (the leader retries after a broken one)."""
        self.sender = SnapshotSender("b", self.snap, term, self.io, self._send,
                                     rates if rates is not None else [ByteRate(UNLIMITED)], self.now, self.files)
        return self.sender

    def _send(self, peer: str, message: Message) -> bool:
        self.to_follower.append(message)
        return True

    def follower_step(self) -> None:
        """The follower takes every chunk in flight and answers each."""
        chunks, self.to_follower = self.to_follower, []
        for chunk in chunks:
            assert isinstance(chunk, SnapshotChunk)
            ack, received = self.receiver.on_chunk(chunk, self.follower_term)
            if received is None:
                self.to_leader.append(ack)
                continue
            self.received = received
            if self.install:
                self.receiver.finish(received)
                self.receiver.install(received, FILES_NAME if received.files_dir is not None else None)
                self.to_leader.append(SnapshotChunkAck(self.follower_term, received.index, received.size, COMPLETE))

    def leader_step(self) -> list[int]:
        """The leader takes every ack in flight and sends what the window allows; the statuses."""
        acks, self.to_leader = self.to_leader, []
        statuses = [self.sender.on_ack(ack, self.now) for ack in acks]
        self.sender.pump(self.now)
        return statuses

    def run(self, chunks_max: int | None = None, until: int | None = None) -> list[int]:
        """Exchange until the stream ends, ``chunks_max`` chunks reached the follower or an ack
        of status ``until`` reached the leader; the statuses of the acks."""
        statuses: list[int] = []
        delivered = 0
        self.sender.pump(self.now)
        for _ in range(ROUNDS_MAX):
            if chunks_max is not None and delivered + len(self.to_follower) > chunks_max:
                self.to_follower = self.to_follower[:chunks_max - delivered]
            delivered += len(self.to_follower)
            self.follower_step()
            statuses += self.leader_step()
            if self.sender.done or (chunks_max is not None and delivered >= chunks_max) \
                    or until in statuses or not (self.to_follower or self.to_leader):
                return statuses
        raise AssertionError("the stream did not end")


def test_a_snapshot_streams_whole_and_installs_as_the_leaders_file() -> None:
    io = SimIO()
    engine = engine_with(400)
    snap = leader_snapshot(io, engine)
    assert snap.size > 20 * CHUNK_BYTES
    link = Link(io, snap)
    statuses = link.run()
    assert statuses[-1] == COMPLETE and link.sender.done
    received = link.received
    assert received is not None
    assert (received.index, received.term, received.size, received.file_crc) == (INDEX, TERM, snap.size, snap.file_crc)
    installed = verify_snapshot(io, FOLLOWER_PATH)
    assert (installed.size, installed.file_crc, installed.index) == (snap.size, snap.file_crc, INDEX)
    assert load_engine(io, FOLLOWER_PATH)[0].digest() == engine.digest()
    assert link.sender.bytes_sent == snap.size  # every byte once
    assert not io.exists(FOLLOWER_PATH + ".recv.tmp")


def test_the_window_bounds_unacknowledged_bytes() -> None:
    io = SimIO()
    link = Link(io, leader_snapshot(io, engine_with(400)))
    link.sender.pump(link.now)  # the offer (an empty chunk asking where to start)
    link.follower_step()
    link.leader_step()  # the answer: start at 0; the window fills
    assert sum(len(m.data) for m in link.to_follower if isinstance(m, SnapshotChunk)) == WINDOW_BYTES
    link.sender.pump(link.now)
    assert sum(len(m.data) for m in link.to_follower if isinstance(m, SnapshotChunk)) == WINDOW_BYTES


def test_a_broken_stream_resumes_where_the_follower_stopped() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(400))
    link = Link(io, snap)
    link.run(chunks_max=12)  # the link breaks: what was in flight is lost
    link.to_follower.clear()
    link.to_leader.clear()
    held = io.open(FOLLOWER_PATH + ".recv.tmp", create=False).size
    assert 0 < held < snap.size
    link.sender.close()  # the leader's stream timed out ...
    second = link.new_sender()  # ... and it retries: a new stream of the same file
    statuses = link.run()
    assert statuses[-1] == COMPLETE
    assert second.bytes_sent == snap.size - held  # only what the follower lacked
    assert link.received is not None and link.received.file_crc == snap.file_crc


def test_a_chunk_from_an_older_term_is_refused() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    receiver = SnapshotReceiver(FOLLOWER_PATH, io, 0)
    data = io.read_all(LEADER_PATH)[:CHUNK_BYTES]
    chunk = SnapshotChunk(TERM, INDEX, TERM, 0, snap.size, snap.file_crc, install.google_crc32c.value(data), data)
    ack, received = receiver.on_chunk(chunk, current_term=TERM + 1)  # a deposed leader's stream
    assert ack == SnapshotChunkAck(TERM + 1, INDEX, 0, NOT_WANTED, files=True) and received is None
    assert not io.exists(FOLLOWER_PATH + ".recv.tmp")

    link = Link(io, snap, term=TERM)
    link.follower_term = TERM + 1
    statuses = link.run()
    assert statuses == [NOT_WANTED] and link.sender.done and link.received is None


def test_a_file_that_fails_its_whole_crc_is_dropped_and_sent_again() -> None:
    io = SimIO()
    engine = engine_with(400)
    snap = leader_snapshot(io, engine)
    good = io.read_all(LEADER_PATH)
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0x01  # the leader's file changed after it was verified
    handle = io.open(LEADER_PATH, create=False)
    handle.pwrite(0, bytes(damaged))
    handle.close()
    link = Link(io, snap)
    statuses = link.run(until=START_OVER)
    assert statuses[-1] == START_OVER  # every chunk passed its own CRC; the whole file did not
    assert link.received is None and link.receiver.restarted == 1
    assert not io.exists(FOLLOWER_PATH + ".recv.tmp")  # dropped, never renamed over anything
    assert not io.exists(FOLLOWER_PATH)

    handle = io.open(LEADER_PATH, create=False)
    handle.pwrite(0, good)  # the leader sends a good copy: the stream starts over and completes
    handle.close()
    statuses = link.run()
    assert statuses[-1] == COMPLETE and link.received is not None
    assert load_engine(io, FOLLOWER_PATH)[0].digest() == engine.digest()


def test_a_chunk_that_fails_its_crc_or_does_not_follow_is_asked_for_again() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    receiver = SnapshotReceiver(FOLLOWER_PATH, io, 0)
    data = io.read_all(LEADER_PATH)
    crc = install.google_crc32c.value

    def chunk(offset: int, part: bytes, part_crc: int | None = None) -> SnapshotChunk:
        return SnapshotChunk(TERM, INDEX, TERM, offset, snap.size, snap.file_crc,
                             crc(part) if part_crc is None else part_crc, part)

    first = data[:CHUNK_BYTES]
    assert receiver.on_chunk(chunk(0, first), TERM)[0].next_offset == CHUNK_BYTES
    later = data[2 * CHUNK_BYTES:3 * CHUNK_BYTES]
    assert receiver.on_chunk(chunk(2 * CHUNK_BYTES, later), TERM)[0].next_offset == CHUNK_BYTES  # a gap
    second = data[CHUNK_BYTES:2 * CHUNK_BYTES]
    assert receiver.on_chunk(chunk(CHUNK_BYTES, second, crc(second) ^ 1), TERM)[0].next_offset == CHUNK_BYTES
    assert receiver.on_chunk(chunk(CHUNK_BYTES, second), TERM)[0].next_offset == 2 * CHUNK_BYTES


def test_a_chunk_of_another_snapshot_midway_starts_over() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    receiver = SnapshotReceiver(FOLLOWER_PATH, io, 0)
    data = io.read_all(LEADER_PATH)
    crc = install.google_crc32c.value
    receiver.on_chunk(SnapshotChunk(TERM, INDEX, TERM, 0, snap.size, snap.file_crc, crc(data[:100]), data[:100]),
                      TERM)
    other = SnapshotChunk(TERM, INDEX + 5, TERM, 100, snap.size, 1234, crc(data[100:200]), data[100:200])
    ack, received = receiver.on_chunk(other, TERM)
    assert (ack.index, ack.next_offset, ack.status) == (INDEX + 5, 0, START_OVER) and received is None


def test_the_sender_resends_a_refused_chunk_once_and_ignores_stale_answers() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(400))
    link = Link(io, snap)
    link.sender.pump(link.now)
    link.follower_step()
    link.leader_step()  # the offer answered, the first window sent
    link.follower_step()
    link.leader_step()  # the first window acknowledged, the second sent
    sender = link.sender
    assert sender.sent > sender.acked > 0
    acked, sent_before = sender.acked, sender.bytes_sent
    # The follower refused the chunk at ``acked`` (it did not follow): resent from there, once,
    # though every chunk in flight behind it is refused with the same offset.
    for _ in range(3):
        assert sender.on_ack(SnapshotChunkAck(TERM, INDEX, acked), link.now) == GO_ON
    link.to_follower.clear()
    sender.pump(link.now)
    first = link.to_follower[0]
    assert isinstance(first, SnapshotChunk) and first.offset == acked  # resent from there
    assert sender.bytes_sent > sent_before
    resent = sender.sent
    for _ in range(3):
        sender.on_ack(SnapshotChunkAck(TERM, INDEX, acked), link.now)
    assert sender.sent == resent, "a refusal at the same position rewinds once"
    # An answer below what the follower acknowledged is stale (reordered or duplicated): ignored.
    sender.on_ack(SnapshotChunkAck(TERM, INDEX, max(0, acked - CHUNK_BYTES)), link.now)
    assert sender.acked == acked and sender.sent == resent
    assert sender.on_ack(SnapshotChunkAck(TERM, INDEX + 1, 0, COMPLETE), link.now) == GO_ON  # another snapshot's


def test_the_byte_rate_bounds_a_stream_over_time() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(400))
    rate_bytes_per_s = 8 * CHUNK_BYTES
    rate = ByteRate(rate_bytes_per_s, burst_bytes=2 * CHUNK_BYTES)
    link = Link(io, snap, rates=[rate])
    link.sender.pump(link.now)
    link.follower_step()
    link.leader_step()
    waits = 0
    for _ in range(ROUNDS_MAX):
        link.follower_step()
        link.leader_step()
        wait = link.sender.pump(link.now)
        # Never more than the burst plus what the rate allowed since the start.
        assert link.sender.bytes_sent <= rate_bytes_per_s * link.now + 2 * CHUNK_BYTES + CHUNK_BYTES
        if link.sender.done:
            break
        if wait:
            waits += 1
            link.now += wait
        elif not link.to_follower and not link.to_leader:
            link.now += 0.01
    assert link.sender.done and link.received is not None
    assert waits > 0
    assert link.now >= (snap.size - 2 * CHUNK_BYTES) / rate_bytes_per_s  # it really took that long


def test_byte_rate_takes_tokens_and_says_how_long_to_wait() -> None:
    rate = ByteRate(1000, burst_bytes=500)
    assert rate.take(500, 0.0) == 0.0  # the burst
    assert rate.take(100, 0.0) == pytest.approx(0.1)  # nothing taken: wait 100 bytes' worth
    assert rate.take(100, 0.1) == 0.0
    assert rate.take(2000, 10.0) == 0.0  # more than the burst passes once the bucket is full
    rate.rate = 0
    assert rate.take(10, 10.0) == 1.0  # no rate: look again later


def test_a_stream_without_progress_times_out() -> None:
    io = SimIO()
    link = Link(io, leader_snapshot(io, engine_with(50)))
    link.sender.pump(0.0)
    assert not link.sender.timed_out(install.ACK_TIMEOUT_S)
    assert link.sender.timed_out(install.ACK_TIMEOUT_S + 0.1)
    link.sender.close()
    assert not link.sender.timed_out(1e9)


def test_an_unanswered_offer_is_sent_again_until_the_stream_times_out() -> None:
    """The follower dropped the offer (a joining node that did not host the group yet): the
    leader offers again every OFFER_RESEND_S instead of waiting out ACK_TIMEOUT_S, and the
    stream goes on from the answer to whichever offer arrived."""
    io = SimIO()
    link = Link(io, leader_snapshot(io, engine_with(50)))
    link.sender.pump(0.0)
    assert len(link.to_follower) == 1
    link.to_follower.clear()  # lost
    link.sender.pump(install.OFFER_RESEND_S / 2)
    assert link.to_follower == [], "not yet"
    link.now = install.OFFER_RESEND_S
    link.sender.pump(link.now)
    assert [len(m.data) for m in link.to_follower if isinstance(m, SnapshotChunk)] == [0], "offered again"
    assert not link.sender.timed_out(link.now)
    statuses = link.run()
    assert statuses[-1] == COMPLETE and link.sender.done
    assert link.received is not None and link.received.file_crc == link.snap.file_crc
    # Unanswered every time, the stream still ends at the timeout (the leader starts another).
    lost = Link(io, leader_snapshot(io, engine_with(50)))
    lost.sender.pump(0.0)
    assert lost.sender.timed_out(install.ACK_TIMEOUT_S + 0.1)


def test_finish_refuses_a_file_that_ends_at_another_entry() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    link = Link(io, snap, install=False)
    link.run()
    assert link.received is not None
    wrong = Received(link.received.tmp_path, INDEX + 1, TERM, snap.size, snap.file_crc)
    with pytest.raises(SnapshotCorrupt, match="leader announced 41/3"):
        link.receiver.finish(wrong)


# --- a snapshot with the files it refers to ------------------------------------------------------

LEADER_FILES = f"/leader/{FILES_NAME}"


def leader_files(io: SimIO, sizes: list[int]) -> list[tuple[str, str]]:
    """Files beside the leader's snapshot, of ``sizes`` bytes, each byte telling its file and place."""
    files = []
    for k, size in enumerate(sizes):
        name = f"{k + 1:08d}.pay"
        handle = io.open(f"{LEADER_FILES}/{name}")
        handle.append(bytes((k * 7 + i) % 251 for i in range(size)))
        handle.close()
        files.append((name, f"{LEADER_FILES}/{name}"))
    return files


def follower_files(io: SimIO) -> dict[str, bytes]:
    directory = f"/follower/{FILES_NAME}"
    return {name: io.read_all(f"{directory}/{name}") for name in io.listdir(directory)}


def test_the_files_a_snapshot_refers_to_follow_it_in_the_stream() -> None:
    io = SimIO()
    engine = engine_with(200)
    snap = leader_snapshot(io, engine)
    sizes = [5 * CHUNK_BYTES + 17, 0, CHUNK_BYTES // 3, 2 * CHUNK_BYTES]  # several chunks, empty, short, exact
    files = leader_files(io, sizes)
    link = Link(io, snap, files=files)
    statuses = link.run()
    assert statuses[-1] == COMPLETE and link.sender.done
    assert link.sender.total == snap.size + sum(sizes)
    assert link.sender.bytes_sent == link.sender.total  # every byte once
    received = link.received
    assert received is not None and received.size == snap.size and received.files == tuple(n for n, _ in files)
    assert follower_files(io) == {name: io.read_all(path) for name, path in files}
    assert verify_snapshot(io, FOLLOWER_PATH).file_crc == snap.file_crc
    assert load_engine(io, FOLLOWER_PATH)[0].digest() == engine.digest()
    assert not io.exists(FOLLOWER_PATH + ".recv.tmp") and not io.listdir(FOLLOWER_PATH + ".recv.files.tmp")


def test_a_stream_with_files_resumes_within_a_file() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    files = leader_files(io, [3 * CHUNK_BYTES, 6 * CHUNK_BYTES + 5])
    link = Link(io, snap, files=files)
    chunks_of_snapshot = -(-snap.size // CHUNK_BYTES)
    link.run(chunks_max=1 + chunks_of_snapshot + 5)  # the offer, the snapshot, 3 + 2 chunks of files
    link.to_follower.clear()
    link.to_leader.clear()
    held = link.receiver._offset
    assert snap.size + 3 * CHUNK_BYTES < held < link.sender.total
    link.sender.close()
    second = link.new_sender()
    statuses = link.run()
    assert statuses[-1] == COMPLETE
    assert second.bytes_sent == second.total - held  # only what the follower lacked
    assert follower_files(io) == {name: io.read_all(path) for name, path in files}


def test_a_file_the_leader_appends_to_streams_as_it_was_when_the_stream_began() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    files = leader_files(io, [2 * CHUNK_BYTES])
    before = io.read_all(files[0][1])
    link = Link(io, snap, files=files)
    handle = io.open(files[0][1], create=False)
    handle.append(b"x" * 3000)  # the leader's next appends (not in the snapshot)
    handle.close()
    assert link.run()[-1] == COMPLETE
    assert follower_files(io) == {files[0][0]: before}


def test_a_follower_that_takes_no_files_is_told_apart() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    link = Link(io, snap, files=leader_files(io, [CHUNK_BYTES]))
    link.sender.pump(link.now)
    offer = link.to_follower.pop()
    assert isinstance(offer, SnapshotChunk) and offer.files == [("00000001.pay", CHUNK_BYTES)]
    # An older release answers the offer without saying it takes files.
    assert link.sender.on_ack(SnapshotChunkAck(TERM, INDEX, 0), link.now) == NO_FILES
    assert link.sender.done
    # A snapshot without files goes to it as before.
    plain = Link(io, snap)
    assert plain.sender.on_ack(SnapshotChunkAck(TERM, INDEX, 0), plain.now) == GO_ON


@pytest.mark.parametrize("layout", [
    [("../p1.snap", 10)], [(".hidden", 10)], [("a/b", 10)], [("", 10)], [("x" * 65, 10)],
    [("00000001.pay", 10), ("00000001.pay", 10)], [("00000001.pay", -1)], [("00000001.pay", 10**9)],
])
def test_an_offer_naming_files_it_may_not_is_refused(layout: list[tuple[str, int]]) -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(20))
    receiver = SnapshotReceiver(FOLLOWER_PATH, io, 0)
    offer = SnapshotChunk(TERM, INDEX, TERM, 0, snap.size + 10, snap.file_crc, install.google_crc32c.value(b""), b"",
                          layout)
    ack, received = receiver.on_chunk(offer, TERM)
    assert ack.status == START_OVER and received is None and not receiver.active
    assert io.listdir("/follower") == []


def test_too_many_files_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "FILES_MAX", 3)
    io = SimIO()
    snap = leader_snapshot(io, engine_with(20))
    layout = [(f"{k:08d}.pay", 1) for k in range(4)]
    receiver = SnapshotReceiver(FOLLOWER_PATH, io, 0)
    offer = SnapshotChunk(TERM, INDEX, TERM, 0, snap.size + 4, snap.file_crc, 0, b"", layout)
    assert receiver.on_chunk(offer, TERM)[0].status == START_OVER


def test_a_sender_whose_file_is_gone_opens_nothing() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(20))
    files = leader_files(io, [100])
    with pytest.raises(FileNotFoundError):
        SnapshotSender("b", snap, TERM, io, lambda peer, msg: True, [], 0.0, files + [("00000009.pay", "/gone")])


def test_an_abort_drops_the_files_received_so_far() -> None:
    io = SimIO()
    snap = leader_snapshot(io, engine_with(50))
    link = Link(io, snap, files=leader_files(io, [4 * CHUNK_BYTES]))
    link.run(chunks_max=1 + -(-snap.size // CHUNK_BYTES) + 2)
    assert io.listdir(FOLLOWER_PATH + ".recv.files.tmp") == ["00000001.pay"]
    link.receiver.abort()
    assert io.listdir(FOLLOWER_PATH + ".recv.files.tmp") == [] and not io.exists(FOLLOWER_PATH + ".recv.tmp")
