"""The Raft link handshake as a sans-I/O unit: bytes in, events out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.node.raft.handshake import (HANDSHAKE_FRAME_BYTES_MAX, MAGIC, NEED_DATA, Established, Handshake,
                                       HandshakeFailed, RejectReason, Role, SendBytes)

SECRET = b"s3cret"
PEERS = frozenset({"n1", "n2", "n3"})


def pair(dialer_secret: bytes = SECRET, listener_secret: bytes = SECRET, *, dial: str = "n1",
         cluster: tuple[str, str] = ("c", "c")) -> tuple[Handshake, Handshake]:
    dialer = Handshake(Role.DIALER, "n2", dialer_secret, cluster[0], peer_id=dial)
    listener = Handshake(Role.LISTENER, "n1", listener_secret, cluster[1], known_peers=PEERS)
    return dialer, listener


def drain(hs: Handshake) -> list[object]:
    events = []
    while (event := hs.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def sent(events: list[object]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, SendBytes))


def run(dialer: Handshake, listener: Handshake) -> tuple[list[object], list[object]]:
    """Shuttle bytes until both sides are quiet; returns every event of each side."""
    d_events, l_events = drain(dialer), []
    for _ in range(4):
        data = sent(d_events[-2:] if d_events else [])
        if data and not listener.done:
            listener.receive_data(data)
        new_l = drain(listener)
        l_events += new_l
        if sent(new_l) and not dialer.done:
            dialer.receive_data(sent(new_l))
        new_d = drain(dialer)
        d_events += new_d
        if not new_d and not new_l:
            break
    return d_events, l_events


def handshake_ok() -> tuple[Established, Established, list[bytes]]:
    dialer, listener = pair()
    wire: list[bytes] = []
    hello = sent(drain(dialer))
    wire.append(hello)
    listener.receive_data(hello)
    challenge = sent(drain(listener))
    wire.append(challenge)
    dialer.receive_data(challenge)
    d_events = drain(dialer)
    proof = sent(d_events)
    wire.append(proof)
    listener.receive_data(proof)
    l_events = drain(listener)
    d_est = next(e for e in d_events if isinstance(e, Established))
    l_est = next(e for e in l_events if isinstance(e, Established))
    return d_est, l_est, wire


def test_both_sides_establish_with_matching_keys() -> None:
    d, l, _ = handshake_ok()
    assert (d.peer_id, l.peer_id) == ("n1", "n2")
    assert d.send_key == l.recv_key and d.recv_key == l.send_key and d.send_key != d.recv_key


def test_sessions_get_fresh_keys() -> None:
    first, _, _ = handshake_ok()
    second, _, _ = handshake_ok()
    assert first.send_key != second.send_key


def test_wrong_secret_is_refused_by_the_dialer_before_it_proves_anything() -> None:
    dialer, listener = pair(dialer_secret=b"wrong")
    listener.receive_data(sent(drain(dialer)))
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(sent(drain(listener)))
    assert exc.value.reason is RejectReason.BAD_PROOF and not exc.value.remote


def test_wrong_secret_dialer_cannot_forge_the_proof() -> None:
    # A dialer without the secret that ignores the listener's proof still cannot answer.
    dialer, listener = pair()
    listener.receive_data(sent(drain(dialer)))
    drain(listener)
    forged = len(MAGIC + b"P" + b"\0" * 32).to_bytes(2, "big") + MAGIC + b"P" + b"\0" * 32
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data(forged)
    assert exc.value.reason is RejectReason.BAD_PROOF


def test_replayed_dialer_side_does_not_authenticate() -> None:
    # Record a whole good session's dialer bytes, replay them to a new listener.
    _, _, wire = handshake_ok()
    hello, _, proof = wire
    listener = Handshake(Role.LISTENER, "n1", SECRET, "c", known_peers=PEERS)
    listener.receive_data(hello)
    assert any(isinstance(e, SendBytes) for e in drain(listener))  # a new challenge, new nonce
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data(proof)
    assert exc.value.reason is RejectReason.BAD_PROOF


def test_replayed_listener_side_does_not_authenticate() -> None:
    _, _, wire = handshake_ok()
    dialer = Handshake(Role.DIALER, "n2", SECRET, "c", peer_id="n1")
    drain(dialer)
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(wire[1])  # the old challenge answered the old nonce
    assert exc.value.reason is RejectReason.BAD_PROOF


def test_a_listener_proof_is_not_a_dialer_proof() -> None:
    # Reflect the listener's own proof back at it as a PROOF frame.
    dialer, listener = pair()
    listener.receive_data(sent(drain(dialer)))
    challenge = sent(drain(listener))
    reflected_proof = challenge[-32:]
    frame = MAGIC + b"P" + reflected_proof
    with pytest.raises(HandshakeFailed):
        listener.receive_data(len(frame).to_bytes(2, "big") + frame)


@pytest.mark.parametrize("cut", [1, 2, 5, 20])
def test_truncated_handshake_only_waits(cut: int) -> None:
    dialer, listener = pair()
    hello = sent(drain(dialer))
    listener.receive_data(hello[:cut])
    assert listener.next_event() is NEED_DATA and not listener.done
    listener.receive_data(hello[cut:])
    assert isinstance(listener.next_event(), SendBytes)


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_any_split_of_the_bytes_establishes(splits: list[int]) -> None:
    dialer, listener = pair()
    data = sent(drain(dialer))
    pos = 0
    for size in splits:
        listener.receive_data(data[pos:pos + size])
        pos += size
    listener.receive_data(data[pos:])
    challenge = sent(drain(listener))
    dialer.receive_data(challenge)
    proof_events = drain(dialer)
    listener.receive_data(sent(proof_events))
    assert any(isinstance(e, Established) for e in drain(listener))


def test_bytes_after_the_proof_are_handed_on() -> None:
    dialer, listener = pair()
    listener.receive_data(sent(drain(dialer)))
    dialer.receive_data(sent(drain(listener)))
    listener.receive_data(sent(drain(dialer)) + b"first frame")
    est = next(e for e in drain(listener) if isinstance(e, Established))
    assert est.rest == b"first frame"


def test_oversized_frame_is_refused_from_its_header() -> None:
    _, listener = pair()
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data((HANDSHAKE_FRAME_BYTES_MAX + 1).to_bytes(2, "big"))
    assert exc.value.reason is RejectReason.BAD_FRAME


@pytest.mark.parametrize("payload", [
    b"\x80\x04\x95" + b"\0" * 40,              # a pickle
    b"x\x9c" + b"\0" * 30,                     # a zlib stream, as pysyncobj's transport frames
    b"GET / HTTP/1.1\r\n\r\n",
])
def test_foreign_bytes_are_refused(payload: bytes) -> None:
    _, listener = pair()
    with pytest.raises(HandshakeFailed):
        listener.receive_data(len(payload).to_bytes(2, "big") + payload)
        listener.receive_data(payload * 20)


def test_unknown_peer_and_wrong_cluster_are_refused() -> None:
    stranger = Handshake(Role.DIALER, "n9", SECRET, "c", peer_id="n1")
    _, listener = pair()
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data(sent(drain(stranger)))
    assert exc.value.reason is RejectReason.UNKNOWN_PEER
    dialer, listener = pair(cluster=("other", "c"))
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data(sent(drain(dialer)))
    assert exc.value.reason is RejectReason.WRONG_CLUSTER


def test_answer_from_another_node_is_refused() -> None:
    dialer, _ = pair(dial="n3")
    listener = Handshake(Role.LISTENER, "n1", SECRET, "c", known_peers=PEERS)
    listener.receive_data(sent(drain(dialer)))
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(sent(drain(listener)))
    assert exc.value.reason is RejectReason.WRONG_PEER


def test_reject_frame_tells_the_other_side_why() -> None:
    dialer, listener = pair()
    drain(dialer)
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(listener.reject_frame(RejectReason.BAD_PROOF))
    assert exc.value.remote and exc.value.reason is RejectReason.BAD_PROOF


def test_frames_out_of_order_are_refused() -> None:
    dialer, listener = pair()
    drain(dialer)
    proof_first = MAGIC + b"P" + b"\0" * 32
    with pytest.raises(HandshakeFailed):
        listener.receive_data(len(proof_first).to_bytes(2, "big") + proof_first)


def test_a_peer_of_another_link_version_is_refused_by_name() -> None:
    """A node of the previous link version (other frame MAC) is told apart from a stranger."""
    listener = Handshake(Role.LISTENER, "n1", SECRET, "c", known_peers=PEERS)
    old = b"SHR1" + b"H" + b"\0" * 40
    with pytest.raises(HandshakeFailed, match="Raft link version '1', this node '2'"):
        listener.receive_data(len(old).to_bytes(2, "big") + old)
