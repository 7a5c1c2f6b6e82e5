"""RaftNetwork's links in one process over loopback: when queued messages are written.

Two networks (n1 listens, n2 dials) carry messages of two partitions. Messages queued in one
callback leave in one frame; a proposal's entry (sent inside a hold) and the answers to a
received frame are written in the same callback, not after the loop's other callbacks.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

from shoal.node.raft.messages import AppendEntries, AppendResponse, Heartbeat, MessageError, TimeoutNow
from shoal.node.raft.transport import PartitionTransport, RaftNetwork, decode_frame

WAIT_S = 5.0


def numbered(i: int) -> Heartbeat:
    """A Raft message told apart by ``i`` (its ``commit``)."""
    return Heartbeat(1, i)


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free right now (bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class _Partition:
    """One partition's transport on one node, recording what it receives and link changes."""

    def __init__(self, network: RaftNetwork, partition: int, peer: str) -> None:
        self.received: list[Any] = []
        self.on_receive: Any = None
        self.links: list[str] = []
        self.transport = PartitionTransport(network, partition, [peer], self._message,
                                            lambda p: self.links.append(f"up {p}"),
                                            lambda p: self.links.append(f"down {p}"))
        self.transport.attach()

    def _message(self, peer: str, message: Any) -> None:
        self.received.append(message)
        if self.on_receive is not None:
            self.on_receive(peer, message)


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[RaftNetwork, RaftNetwork]]:
    loop = asyncio.get_running_loop()
    p1, p2 = free_ports(2)
    peers = {"n1": ("127.0.0.1", p1), "n2": ("127.0.0.1", p2)}
    n1 = RaftNetwork(loop, "n1", "test", b"secret", peers["n1"], {"n2": peers["n2"]}, set())
    n2 = RaftNetwork(loop, "n2", "test", b"secret", peers["n2"], {"n1": peers["n1"]}, {"n1"})
    await n1.start()
    await n2.start()
    try:
        await _until(lambda: n1.connected_peers() == ["n2"] and n2.connected_peers() == ["n1"])
        yield n1, n2
    finally:
        n2.close()
        n1.close()
        await asyncio.sleep(0.05)


async def _until(condition: Any) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_messages_queued_in_one_callback_leave_in_one_frame() -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            a, b = _Partition(n2, 0, "n1"), _Partition(n2, 1, "n1")
            got0, got1 = _Partition(n1, 0, "n2"), _Partition(n1, 1, "n2")
            before = n2.frames_sent
            a.transport.send("n1", numbered(1))
            b.transport.send("n1", numbered(2))
            a.transport.send("n1", numbered(3))
            assert n2.frames_sent == before  # nothing written yet: the loop's turn has not ended
            await _until(lambda: len(got0.received) == 2 and len(got1.received) == 1)
            assert n2.frames_sent == before + 1
            assert [m.commit for m in got0.received] == [1, 3] and got1.received[0].commit == 2

    asyncio.run(main())


def test_a_flush_writes_now_and_answers_leave_with_the_received_frame() -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            sender, answers = _Partition(n2, 0, "n1"), _Partition(n1, 0, "n2")
            # Answer inside the receive callback, as Raft does; the answer must be written by
            # the time the callback that read the frame returns.
            written_in_callback: list[int] = []

            def answer(peer: str, message: Any) -> None:
                before = n1.frames_sent
                # Scheduled before the answer is sent: it runs ahead of any flush the send
                # itself might schedule, so it sees only what the receiving callback wrote.
                asyncio.get_running_loop().call_soon(lambda: written_in_callback.append(n1.frames_sent - before))
                answers.transport.send(peer, AppendResponse(1, message.commit))

            answers.on_receive = answer
            before = n2.frames_sent
            sender.transport.hold()  # as a proposal does
            sender.transport.send("n1", numbered(7))
            sender.transport.release()
            assert n2.frames_sent == before + 1  # a proposal's entry is written at once
            await _until(lambda: len(sender.received) == 1)
            assert sender.received[0] == AppendResponse(1, 7)
            await _until(lambda: bool(written_in_callback))
            assert written_in_callback == [1]

    asyncio.run(main())


@pytest.mark.parametrize("count", [1, 40])
def test_every_message_arrives_in_order(count: int) -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            sender, receiver = _Partition(n1, 3, "n2"), _Partition(n2, 3, "n1")
            for i in range(count):
                sender.transport.send("n2", AppendEntries(1, i, 1, 0, [(b"x" * 1000, i + 1, 1)]))
                if i % 7 == 0:
                    n1.flush_queued()
            await _until(lambda: len(receiver.received) == count)
            assert [m.prev_index for m in receiver.received] == list(range(count))

    asyncio.run(main())


def test_a_tick_asked_for_by_a_received_frame_runs_before_its_answers_leave() -> None:
    """A deferred tick runs at the end of the frame, and what it sends leaves in the same write."""
    async def main() -> None:
        async with _pair() as (n1, n2):
            sender, receiver = _Partition(n2, 0, "n1"), _Partition(n1, 0, "n2")
            order: list[str] = []

            def tick() -> None:
                order.append("tick")
                receiver.transport.send("n2", TimeoutNow(1))

            def on_message(peer: str, message: Any) -> None:
                order.append(f"message {message.commit}")
                assert receiver.transport.defer_tick(tick)  # inside the frame: deferred, not run
                receiver.transport.send(peer, AppendResponse(1, message.commit))
                assert order[-1] != "tick"

            receiver.on_receive = on_message
            before = n1.frames_sent
            sender.transport.hold()
            sender.transport.send("n1", numbered(1))
            sender.transport.send("n1", numbered(2))
            sender.transport.release()
            await _until(lambda: len(sender.received) == 4)
            # Both messages of the frame first, then each deferred tick, then one write of everything.
            assert order == ["message 1", "message 2", "tick", "tick"]
            assert [type(m) for m in sender.received] == [AppendResponse, AppendResponse, TimeoutNow, TimeoutNow]
            assert n1.frames_sent == before + 1
            assert not receiver.transport.defer_tick(tick)  # outside a frame nothing holds

    asyncio.run(main())


def test_work_after_write_runs_once_the_frames_answers_have_left() -> None:
    """A follower's applies wait for nothing but its answers: work asked for while a received
    frame is handled runs right after that frame's answers are written, in the same callback,
    once the node has written what it owes its clients (``before_deferred``)."""
    async def main() -> None:
        async with _pair() as (n1, n2):
            sender, receiver = _Partition(n2, 0, "n1"), _Partition(n1, 0, "n2")
            seen: list[tuple[str, int]] = []
            before = n1.frames_sent
            n1.before_deferred = lambda: seen.append(("clients", n1.frames_sent - before))

            def work() -> None:
                seen.append(("work", n1.frames_sent - before))

            def on_message(peer: str, message: Any) -> None:
                receiver.transport.send(peer, AppendResponse(1, message.commit))
                assert receiver.transport.after_write(work)
                seen.append(("message", n1.frames_sent - before))

            receiver.on_receive = on_message
            sender.transport.hold()
            sender.transport.send("n1", numbered(1))
            sender.transport.send("n1", numbered(2))
            sender.transport.release()
            await _until(lambda: len(seen) == 5)
            # Both messages handled with nothing written, then one write, the clients' answers
            # and both works.
            assert seen == [("message", 0), ("message", 0), ("clients", 1), ("work", 1), ("work", 1)]
            assert not receiver.transport.after_write(work)  # outside a frame nothing holds

    asyncio.run(main())


def test_hold_writes_at_release_without_a_callback_of_its_own() -> None:
    async def main() -> None:
        async with _pair() as (n1, n2):
            sender, receiver = _Partition(n2, 0, "n1"), _Partition(n1, 0, "n2")
            before = n2.frames_sent
            sender.transport.hold()
            sender.transport.send("n1", numbered(1))
            sender.transport.hold()  # nested: only the outermost release writes
            sender.transport.send("n1", numbered(2))
            sender.transport.release()
            assert n2.frames_sent == before
            sender.transport.release()
            assert n2.frames_sent == before + 1 and n2.holding == 0
            await _until(lambda: len(receiver.received) == 2)
            assert [m.commit for m in receiver.received] == [1, 2]

    asyncio.run(main())


def test_links_are_reported_by_peer_id_and_every_linked_peer_is_heard() -> None:
    """A group's members change, so a partition hears any authenticated peer (its replica decides
    what a message from a node that is no member means); every partition sees every link."""
    async def main() -> None:
        async with _pair() as (n1, n2):
            ours, other = _Partition(n1, 6, "n2"), _Partition(n1, 5, "n9")
            assert ours.links == ["up n2"] and "n2" in ours.transport.connected
            assert "n2" in other.transport.connected  # links are the node's, shared by its partitions
            sender = _Partition(n2, 5, "n1")
            sender.transport.send("n1", numbered(1))  # partition 5 on n1 expected n9, hears n2 all the same
            _Partition(n2, 6, "n1").transport.send("n1", numbered(2))
            await _until(lambda: len(ours.received) == 1 and len(other.received) == 1)
            assert ours.received == [numbered(2)] and other.received == [numbered(1)]
            assert not sender.transport.send("n9", numbered(3))  # no link to it: refused, not queued
            n2.close()
            await _until(lambda: ours.links[-1:] == ["down n2"])
            assert "n2" not in ours.transport.connected

    asyncio.run(main())


def test_a_frame_decodes_into_raft_messages_and_plain_channel_values() -> None:
    """Partition items become Message structs; one that is no Raft message becomes its own
    MessageError and costs nothing else of the frame; channel items stay plain MessagePack."""
    enc = msgspec.msgpack.encode
    frame = enc([(0, msgspec.Raw(enc(numbered(4)))), (1, msgspec.Raw(enc({"not": "raft"}))),
                 ("registry", msgspec.Raw(enc({"epoch": 3}))), (2, msgspec.Raw(enc(AppendResponse(2, 9))))])
    items = decode_frame(frame)
    assert [key for key, _ in items] == [0, 1, "registry", 2]
    assert items[0][1] == numbered(4) and items[3][1] == AppendResponse(2, 9)
    assert isinstance(items[1][1], MessageError)
    assert items[2][1] == {"epoch": 3}
    with pytest.raises(msgspec.ValidationError):
        decode_frame(enc({"not": "a list of pairs"}))


def test_side_channel_messages_never_wait_for_the_sync_barrier() -> None:
    """Forwarded commands and their replies vouch for nothing on this node's disk: a frame holding
    only those leaves without the journal sync that must come before Raft answers, and queued
    with Raft messages they leave first, in a frame of their own, before the sync runs."""
    async def main() -> None:
        async with _pair() as (n1, n2):
            frames_at_sync: list[int] = []
            n2.before_flush = lambda: frames_at_sync.append(n2.frames_sent)
            got: list[Any] = []
            n1.register_channel("relay", lambda peer, value: got.append(value))
            receiver = _Partition(n1, 0, "n2")
            sender = _Partition(n2, 0, "n1")
            assert n2.send_channel("n1", "relay", ["q", 1])
            await _until(lambda: got == [["q", 1]])
            assert frames_at_sync == []
            sent = n2.frames_sent
            sender.transport.send("n1", numbered(9))  # queued first, and waits for the sync
            n2.send_channel("n1", "relay", ["q", 2])
            await _until(lambda: len(receiver.received) == 1 and len(got) == 2)
            assert frames_at_sync == [sent + 1]  # the relay message's frame was out when the sync ran
            assert n2.frames_sent == sent + 2
            n2.send_channel("n1", "relay", ["q", 3])
            sender.transport.send("n1", numbered(10))
            n2.before_flush = None  # nothing to sync: one frame carries both
            await _until(lambda: len(receiver.received) == 2 and len(got) == 3)
            assert n2.frames_sent == sent + 3

    asyncio.run(main())
