"""The Raft link handshake as a sans-I/O unit: bytes in, events out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.node.raft.handshake import (HANDSHAKE_FRAME_BYTES_MAX, INCARNATION_BYTES_MAX, MAGIC, NEED_DATA,
                                       Established, Handshake, HandshakeFailed, PeerPolicy, RejectReason, Role,
                                       SendBytes, accept_any_incarnation, expect_incarnations)

SECRET = b"s3cret"
PEERS = frozenset({"n1", "n2", "n3"})
#: Incarnations of the dialer (n2) and the listener (n1).
INC_D, INC_L = "d1a1e2", "11573e"


def pair(dialer_secret: bytes = SECRET, listener_secret: bytes = SECRET, *, dial: str = "n1",
         cluster: tuple[str, str] = ("c", "c"), incarnations: tuple[str, str] = (INC_D, INC_L),
         policies: tuple[PeerPolicy, PeerPolicy] = (accept_any_incarnation, accept_any_incarnation)
         ) -> tuple[Handshake, Handshake]:
    dialer = Handshake(Role.DIALER, "n2", dialer_secret, cluster[0], incarnation=incarnations[0], peer_id=dial,
                       check_peer=policies[0])
    listener = Handshake(Role.LISTENER, "n1", listener_secret, cluster[1], incarnation=incarnations[1],
                         known_peers=PEERS, check_peer=policies[1])
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
    new_d = drain(dialer)
    d_events: list[object] = list(new_d)
    l_events: list[object] = []
    for _ in range(4):
        if sent(new_d) and not listener.done:
            listener.receive_data(sent(new_d))
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
    """A whole good handshake, step by step; the four frames on the wire (HELLO, CHALLENGE, PROOF, WELCOME)."""
    dialer, listener = pair()
    wire: list[bytes] = []
    hello = sent(drain(dialer))
    wire.append(hello)
    listener.receive_data(hello)
    challenge = sent(drain(listener))
    wire.append(challenge)
    dialer.receive_data(challenge)
    proof_events = drain(dialer)
    assert not any(isinstance(e, Established) for e in proof_events), "the dialer waits for the WELCOME"
    proof = sent(proof_events)
    wire.append(proof)
    listener.receive_data(proof)
    l_events = drain(listener)
    welcome = sent(l_events)
    wire.append(welcome)
    dialer.receive_data(welcome)
    d_est = next(e for e in drain(dialer) if isinstance(e, Established))
    l_est = next(e for e in l_events if isinstance(e, Established))
    return d_est, l_est, wire


def test_both_sides_establish_with_matching_keys() -> None:
    d, l, _ = handshake_ok()
    assert (d.peer_id, l.peer_id) == ("n1", "n2")
    assert d.send_key == l.recv_key and d.recv_key == l.send_key and d.send_key != d.recv_key


def test_each_side_learns_the_other_s_incarnation() -> None:
    d, l, _ = handshake_ok()
    assert (d.peer_incarnation, l.peer_incarnation) == (INC_L, INC_D)


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
    hello, _, proof, _ = wire
    listener = Handshake(Role.LISTENER, "n1", SECRET, "c", incarnation=INC_L, known_peers=PEERS)
    listener.receive_data(hello)
    assert any(isinstance(e, SendBytes) for e in drain(listener))  # a new challenge, new nonce
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data(proof)
    assert exc.value.reason is RejectReason.BAD_PROOF


def test_replayed_listener_side_does_not_authenticate() -> None:
    _, _, wire = handshake_ok()
    dialer = Handshake(Role.DIALER, "n2", SECRET, "c", incarnation=INC_D, peer_id="n1")
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
    l_events = drain(listener)
    assert any(isinstance(e, Established) for e in l_events)
    welcome = sent(l_events)
    for i in range(len(welcome)):  # the WELCOME split too
        dialer.receive_data(welcome[i:i + 1])
    assert any(isinstance(e, Established) for e in drain(dialer))


def test_bytes_after_the_handshake_are_handed_on() -> None:
    dialer, listener = pair()
    listener.receive_data(sent(drain(dialer)))
    dialer.receive_data(sent(drain(listener)))
    listener.receive_data(sent(drain(dialer)) + b"first frame")
    l_events = drain(listener)
    assert next(e for e in l_events if isinstance(e, Established)).rest == b"first frame"
    dialer.receive_data(sent(l_events) + b"first answer")  # the listener writes right after its WELCOME
    assert next(e for e in drain(dialer) if isinstance(e, Established)).rest == b"first answer"


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
    stranger = Handshake(Role.DIALER, "n9", SECRET, "c", incarnation=INC_D, peer_id="n1")
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
    listener = Handshake(Role.LISTENER, "n1", SECRET, "c", incarnation=INC_L, known_peers=PEERS)
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


@pytest.mark.parametrize("version", [b"1", b"2", b"3", b"4", b"5", b"6"])
def test_a_peer_of_another_link_version_is_refused_by_name(version: bytes) -> None:
    """A node of an earlier link version (other frame MAC; no incarnations; other Raft messages;
    pickled data entries; engine states 1 and 2 only) is told apart from a stranger."""
    listener = Handshake(Role.LISTENER, "n1", SECRET, "c", incarnation=INC_L, known_peers=PEERS)
    old = b"SHR" + version + b"H" + b"\0" * 40
    ours = MAGIC[3:].decode()
    with pytest.raises(HandshakeFailed, match=f"Raft link version '{version.decode()}', this node '{ours}'"):
        listener.receive_data(len(old).to_bytes(2, "big") + old)


def test_a_replayed_welcome_does_not_establish() -> None:
    _, _, wire = handshake_ok()
    dialer, listener = pair()
    listener.receive_data(sent(drain(dialer)))
    dialer.receive_data(sent(drain(listener)))
    drain(dialer)
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(wire[3])  # the old WELCOME answered the old transcript
    assert exc.value.reason is RejectReason.BAD_PROOF


# --- incarnations and the peer policy -------------------------------------------------------------

def test_a_stale_dialer_incarnation_is_refused_naming_both_on_both_sides() -> None:
    """The listener asks its policy once the dialer proved the secret; the dialer hears why."""
    policy = expect_incarnations({"n2": "0ld1nc"})
    dialer, listener = pair(policies=(accept_any_incarnation, policy))
    listener.receive_data(sent(drain(dialer)))
    dialer.receive_data(sent(drain(listener)))
    proof = sent(drain(dialer))
    with pytest.raises(HandshakeFailed) as refused:
        listener.receive_data(proof)
    assert refused.value.reason is RejectReason.STALE_INCARNATION and not refused.value.remote
    assert f"'n2' offered incarnation '{INC_D}'" in str(refused.value) and "expected incarnation '0ld1nc'" in str(
        refused.value)
    assert not any(isinstance(e, (Established, SendBytes)) for e in drain(listener)), "no WELCOME"
    with pytest.raises(HandshakeFailed) as told:
        dialer.receive_data(listener.reject_frame(refused.value.reason, refused.value.note))
    assert told.value.remote and told.value.reason is RejectReason.STALE_INCARNATION
    assert INC_D in str(told.value) and "0ld1nc" in str(told.value)


def test_a_stale_listener_incarnation_is_refused_before_the_dialer_proves_anything() -> None:
    policy = expect_incarnations({"n1": "0ld1nc"})
    dialer, listener = pair(policies=(policy, accept_any_incarnation))
    listener.receive_data(sent(drain(dialer)))
    with pytest.raises(HandshakeFailed) as refused:
        dialer.receive_data(sent(drain(listener)))
    assert refused.value.reason is RejectReason.STALE_INCARNATION
    assert f"'n1' offered incarnation '{INC_L}': expected incarnation '0ld1nc'" in str(refused.value)
    assert not any(isinstance(e, SendBytes) for e in drain(dialer)), "no PROOF after a refusal"
    with pytest.raises(HandshakeFailed) as told:
        listener.receive_data(dialer.reject_frame(refused.value.reason, refused.value.note))
    assert told.value.remote and INC_L in str(told.value) and "0ld1nc" in str(told.value)


def test_the_policy_is_asked_only_about_a_peer_that_proved_the_secret() -> None:
    asked: list[tuple[str, str]] = []

    def policy(peer: str, incarnation: str) -> None:
        asked.append((peer, incarnation))

    dialer, listener = pair(dialer_secret=b"wrong", policies=(policy, policy))
    listener.receive_data(sent(drain(dialer)))
    with pytest.raises(HandshakeFailed):
        dialer.receive_data(sent(drain(listener)))
    assert asked == []
    dialer, listener = pair(policies=(policy, policy))
    run(dialer, listener)
    assert asked == [("n1", INC_L), ("n2", INC_D)]


def test_a_policy_that_fails_refuses() -> None:
    def broken(peer: str, incarnation: str) -> str | None:
        raise KeyError(peer)

    dialer, listener = pair(policies=(accept_any_incarnation, broken))
    listener.receive_data(sent(drain(dialer)))
    dialer.receive_data(sent(drain(listener)))
    with pytest.raises(HandshakeFailed) as refused:
        listener.receive_data(sent(drain(dialer)))
    assert refused.value.reason is RejectReason.STALE_INCARNATION and "policy failed" in str(refused.value)


def test_expect_incarnations_reads_the_mapping_at_each_handshake() -> None:
    expected: dict[str, str] = {}
    policy = expect_incarnations(expected)
    assert policy("n2", "a") is None  # a peer it does not name
    expected["n2"] = "b"
    assert policy("n2", "b") is None and policy("n2", "a") == "expected incarnation 'b'"


def test_another_cluster_is_refused_naming_both_cluster_ids_on_both_sides() -> None:
    dialer, listener = pair(cluster=("cluster-b", "cluster-a"))
    with pytest.raises(HandshakeFailed) as refused:
        listener.receive_data(sent(drain(dialer)))
    assert refused.value.reason is RejectReason.WRONG_CLUSTER
    assert "'cluster-b'" in str(refused.value) and "'cluster-a'" in str(refused.value)
    with pytest.raises(HandshakeFailed) as told:
        dialer.receive_data(listener.reject_frame(refused.value.reason, refused.value.note))
    assert told.value.remote and told.value.reason is RejectReason.WRONG_CLUSTER
    assert "it is in cluster 'cluster-a', this node in 'cluster-b'" in str(told.value)


def _replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1 and len(old) == len(new)
    return data.replace(old, new)


def test_a_dialer_incarnation_changed_in_flight_fails_the_proofs() -> None:
    """The incarnations are in the transcript: a relay that rewrites one breaks the listener's proof."""
    dialer, listener = pair()
    hello = _replace_once(sent(drain(dialer)), INC_D.encode(), b"f0f0f0")
    listener.receive_data(hello)
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(sent(drain(listener)))
    assert exc.value.reason is RejectReason.BAD_PROOF


def test_a_listener_incarnation_changed_in_flight_fails_the_proofs() -> None:
    dialer, listener = pair()
    listener.receive_data(sent(drain(dialer)))
    challenge = _replace_once(sent(drain(listener)), INC_L.encode(), b"f0f0f0")
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(challenge)
    assert exc.value.reason is RejectReason.BAD_PROOF


def test_the_longest_ids_and_incarnations_fit_in_a_handshake_frame() -> None:
    long_id, long_cluster, long_inc = "n" * 200, "c" * 200, "i" * INCARNATION_BYTES_MAX
    dialer = Handshake(Role.DIALER, long_id, SECRET, long_cluster, incarnation=long_inc, peer_id="n1")
    listener = Handshake(Role.LISTENER, "n1", SECRET, long_cluster, incarnation=long_inc,
                         known_peers=frozenset({long_id, "n1"}))
    d_events, l_events = run(dialer, listener)
    assert {e.peer_incarnation for e in d_events + l_events if isinstance(e, Established)} == {long_inc}
    with pytest.raises(ValueError):
        Handshake(Role.DIALER, "n2", SECRET, "c", incarnation="i" * (INCARNATION_BYTES_MAX + 1), peer_id="n1")


def test_an_oversized_incarnation_from_the_peer_is_a_bad_frame() -> None:
    _, listener = pair()
    body = MAGIC + b"H" + b"\x01c" + b"\x02n2" + bytes([INCARNATION_BYTES_MAX + 1]) + b"i" * 65 + b"\0" * 32
    with pytest.raises(HandshakeFailed) as exc:
        listener.receive_data(len(body).to_bytes(2, "big") + body)
    assert exc.value.reason is RejectReason.BAD_FRAME


@pytest.mark.parametrize("body", [b"", b"\x03BAD", b"\x09NOT_A_REASON", b"\x0bBAD_PROOF"])
def test_an_unreadable_reject_is_still_a_refusal(body: bytes) -> None:
    dialer, _ = pair()
    drain(dialer)
    frame = MAGIC + b"R" + body
    with pytest.raises(HandshakeFailed) as exc:
        dialer.receive_data(len(frame).to_bytes(2, "big") + frame)
    assert exc.value.remote
