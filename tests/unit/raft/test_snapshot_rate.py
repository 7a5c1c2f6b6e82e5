"""A snapshot stream under the move rate (``install.SnapshotSender`` with shared ``ByteRate``s).

The cluster's move rate may be far below a chunk per ``ACK_TIMEOUT_S``: a stream that waits on
its rate is not a stalled follower, and a rate raised while it waits lets it go on at its next
pump. Time is an argument here (``now``), so nothing sleeps.
"""

from __future__ import annotations

from pathlib import Path

from shoal.node.raft._io import RealIO
from shoal.node.raft.install import (ACK_TIMEOUT_S, CHUNK_BYTES, GO_ON, WINDOW_BYTES, ByteRate, SnapshotSender)
from shoal.node.raft.membership import Membership
from shoal.node.raft.messages import SnapshotChunk, SnapshotChunkAck
from shoal.node.raft.snapshots import SnapshotFile

SIZE = 8 * CHUNK_BYTES


def _sender(tmp_path: Path, rates: list[ByteRate]) -> tuple[SnapshotSender, list[SnapshotChunk]]:
    path = tmp_path / "p0.dump"
    path.write_bytes(b"s" * SIZE)
    snap = SnapshotFile(str(path), 100, 3, Membership.of(["n1", "n2"]), SIZE, 0)
    sent: list[SnapshotChunk] = []

    def send(peer: str, msg: object) -> bool:
        assert isinstance(msg, SnapshotChunk)
        sent.append(msg)
        return True

    sender = SnapshotSender("n2", snap, 3, RealIO(disk_free_min_bytes=0), send, rates, now=0.0)
    sender.pump(0.0)  # the offer
    sender.on_ack(SnapshotChunkAck(3, 100, 0, GO_ON), 0.0)  # the follower holds nothing yet
    return sender, sent


def _ack_all(sender: SnapshotSender, sent: list[SnapshotChunk], now: float) -> None:
    top = max(c.offset + len(c.data) for c in sent)
    sender.on_ack(SnapshotChunkAck(3, 100, top, GO_ON), now)


def test_a_stream_waiting_on_its_rate_is_not_given_up(tmp_path: Path) -> None:
    shared = ByteRate(1024)  # far below a chunk per ACK_TIMEOUT_S
    sender, sent = _sender(tmp_path, [shared])
    assert sender.pump(0.0) is None  # the burst: a window's worth goes at once
    assert sender.sent == WINDOW_BYTES
    _ack_all(sender, sent, 0.1)
    wait = sender.pump(0.1)
    assert wait is not None and wait > ACK_TIMEOUT_S, "the next chunk waits on the rate"
    now = 0.1
    for _ in range(30):  # pumped on every tick while it waits: nothing in flight, nothing to time out
        now += 1.0
        sender.pump(now)
        assert not sender.timed_out(now), f"a stream waiting on its rate was given up at {now:.1f} s"
    assert sender.sent == WINDOW_BYTES


def test_a_rate_raised_while_a_stream_waits_lets_it_go_on(tmp_path: Path) -> None:
    shared = ByteRate(1024)
    sender, sent = _sender(tmp_path, [shared])
    sender.pump(0.0)
    _ack_all(sender, sent, 0.1)
    assert sender.pump(0.1) is not None
    shared.rate = 1024.0 ** 3  # PUT /admin/settings moveRateBytesPerS: the node's share changes in place
    assert sender.pump(0.2) is None and sender.sent > WINDOW_BYTES
    now = 0.2
    for _ in range(20):
        _ack_all(sender, sent, now)
        now += 0.01
        sender.pump(now)
        if sender.sent == SIZE:
            break
    assert sender.sent == SIZE


def test_a_follower_that_stops_answering_is_still_given_up(tmp_path: Path) -> None:
    sender, sent = _sender(tmp_path, [ByteRate(1024.0 ** 3)])
    sender.pump(0.0)
    assert sender.sent > sender.acked
    assert not sender.timed_out(ACK_TIMEOUT_S - 1)
    assert sender.timed_out(ACK_TIMEOUT_S + 1), "data in flight and no answer: the leader retries"
    # The same after a wait on the rate: the clock starts when the chunk leaves.
    slow = ByteRate(1024)
    sender, sent = _sender(tmp_path, [slow])
    sender.pump(0.0)
    _ack_all(sender, sent, 0.1)
    slow.rate = 1024.0 ** 3
    sender.pump(100.0)  # a chunk leaves long after the last answer
    assert not sender.timed_out(100.0 + ACK_TIMEOUT_S - 1)
    assert sender.timed_out(100.0 + ACK_TIMEOUT_S + 1)


def test_a_file_replaced_on_disk_is_not_sent_for_the_verified_one(tmp_path: Path) -> None:
    """A newer snapshot renamed over the path before the replica heard of it: the sender sees that
    what it opened is not the verified file (its size)."""
    sender, _ = _sender(tmp_path, [ByteRate(1024.0 ** 3)])
    assert sender.opened_whole()
    path = tmp_path / "p0.dump"
    path.write_bytes(b"n" * (SIZE + 100))  # the newer snapshot, at the same path
    snap = SnapshotFile(str(path), 100, 3, Membership.of(["n1", "n2"]), SIZE, 0)
    stale = SnapshotSender("n2", snap, 3, RealIO(disk_free_min_bytes=0), lambda p, m: True, [], now=0.0)
    assert not stale.opened_whole()
    stale.close()
