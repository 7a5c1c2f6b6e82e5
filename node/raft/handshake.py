"""The Raft link handshake, sans I/O: bytes in, events out.

Two nodes prove to each other that they hold the cluster secret, and say which
incarnation of themselves they are, before either decodes anything else the other
sends. The dialer opens::

    dialer   -> HELLO     magic, cluster id, dialer id, dialer incarnation, dialer nonce
    listener -> CHALLENGE listener id, listener incarnation, listener nonce, listener proof
    dialer   -> PROOF     dialer proof
    listener -> WELCOME   listener's acceptance
                (or either side -> REJECT reason, note; then close)

A proof is HMAC-SHA256(secret, role label + transcript) where the transcript
binds the cluster id, both node ids, both incarnations and both fresh 32-byte
nonces, so a recorded handshake replayed later proves nothing (the other side's
nonce is new), a listener's proof cannot pass for a dialer's (different label),
and neither incarnation can be changed in flight. Both sides then derive one
session key per direction from the same transcript; every later frame carries a
MAC under that key over a per-direction frame counter (see :mod:`._frames`), so
frames cannot be replayed, reordered or moved between links.

Incarnations (:mod:`shoal.node.identity`) tell a node that kept its disk from one
that lost it under the same node id. Once the other side has proved the secret,
its incarnation goes to the *peer policy* the link's owner gives
(``check_peer(peer_id, incarnation)``: None accepts, text says why not; a
refusal is ``STALE_INCARNATION``). The dialer asks it about the listener before
proving anything, the listener about the dialer once the dialer's proof checks
out, and only then WELCOMEs it: neither side counts a link as up that the other
refused.

A REJECT tells the other side the reason and, for ``WRONG_CLUSTER``, the refusing
side's cluster id, for ``STALE_INCARNATION`` the refusal's text, so both sides'
logs name both cluster ids or both incarnations. A REJECT is not authenticated:
its note is only ever logged, quoted.

Handshake frames are tiny fixed-layout binary records (2-byte length prefix, at
most :data:`HANDSHAKE_FRAME_BYTES_MAX`): nothing from an unauthenticated peer
reaches a general-purpose decoder.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = ["Handshake", "Role", "SendBytes", "Established", "NEED_DATA", "HandshakeFailed",
           "HANDSHAKE_FRAME_BYTES_MAX", "NONCE_BYTES", "INCARNATION_BYTES_MAX", "RejectReason", "PeerPolicy",
           "accept_any_incarnation", "expect_incarnations"]

#: Names the link's version: 7 = Raft messages with the durable index, heartbeat rounds and synced
#: indexes, carrying data entries in format 1 of :mod:`shoal.node.partition.log_format` and snapshots of
#: engine state version 3. Nodes of other versions are refused by name: version 6 reads engine
#: states 1 and 2, version 5 only engine state 1, version 4 only pickled data entries, and a node
#: that cannot read an entry or a snapshot must never be sent one (docs/formats.md).
MAGIC = b"SHR7"
NONCE_BYTES = 32
PROOF_BYTES = 32
#: The largest handshake frame either side accepts (ids, incarnations and the cluster id are short).
HANDSHAKE_FRAME_BYTES_MAX = 512
_ID_BYTES_MAX = 200
#: The longest incarnation id a handshake carries.
INCARNATION_BYTES_MAX = 64
_HELLO, _CHALLENGE, _PROOF, _WELCOME, _REJECT = b"H", b"C", b"P", b"W", b"R"

#: Decides whether a peer that proved the secret may link, from its id and incarnation:
#: None accepts, text says why not.
PeerPolicy = Callable[[str, str], "str | None"]


def accept_any_incarnation(peer_id: str, incarnation: str) -> str | None:
    """The default peer policy: every incarnation of a known peer is accepted."""
    return None


def expect_incarnations(expected: Mapping[str, str]) -> PeerPolicy:
    """A peer policy: a peer named in ``expected`` must offer that incarnation, others are accepted.

    ``expected`` is read at each handshake, so a dict the caller updates takes effect on the
    next link (drop the current ones to re-check them, :meth:`RaftNetwork.set_peer_policy`).
    """
    def check(peer_id: str, incarnation: str) -> str | None:
        wanted = expected.get(peer_id)
        if wanted is None or wanted == incarnation:
            return None
        return f"expected incarnation {wanted!r}"
    return check


class Role(Enum):
    DIALER = "dialer"
    LISTENER = "listener"


class RejectReason(str, Enum):
    """Why a handshake was refused; sent to the other side in a REJECT frame."""

    BAD_FRAME = "BAD_FRAME"
    WRONG_CLUSTER = "WRONG_CLUSTER"
    UNKNOWN_PEER = "UNKNOWN_PEER"
    WRONG_PEER = "WRONG_PEER"
    BAD_PROOF = "BAD_PROOF"
    STALE_INCARNATION = "STALE_INCARNATION"


class HandshakeFailed(Exception):
    """The handshake cannot succeed; ``reason`` says why, ``remote`` whether the peer said so.

    ``note`` is what a REJECT tells the peer besides the reason (empty: nothing).
    """

    def __init__(self, reason: RejectReason, detail: str, remote: bool = False, note: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.remote = remote
        self.note = note


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: :meth:`Handshake.next_event` has nothing until more bytes arrive.
NEED_DATA = _NeedData()


@dataclass(frozen=True, slots=True)
class SendBytes:
    """Write ``data`` to the peer."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Established:
    """Both sides proved the secret and accepted each other. ``rest`` is what the peer sent after the handshake."""

    peer_id: str
    peer_incarnation: str
    send_key: bytes
    recv_key: bytes
    rest: bytes


def _frame(kind: bytes, body: bytes) -> bytes:
    payload = MAGIC + kind + body
    return len(payload).to_bytes(2, "big") + payload


def _short(value: str, limit: int = _ID_BYTES_MAX) -> bytes:
    raw = value.encode()
    if len(raw) > limit:
        raise ValueError(f"{value[:40]!r}... is longer than {limit} bytes")
    return bytes([len(raw)]) + raw


def _clipped(value: str, limit: int = _ID_BYTES_MAX) -> bytes:
    """``value`` as a short field, cut (at a character boundary) to ``limit`` bytes."""
    return _short(value.encode()[:limit].decode(errors="ignore"), limit)


def _read_short(body: bytes, pos: int, limit: int = _ID_BYTES_MAX) -> tuple[str, int]:
    if pos >= len(body):
        raise ValueError("truncated field")
    size = body[pos]
    end = pos + 1 + size
    if size > limit:
        raise ValueError(f"field of {size} bytes, more than {limit}")
    if end > len(body):
        raise ValueError("truncated field")
    return body[pos + 1:end].decode(), end


def _mac(key: bytes, label: bytes, transcript: bytes) -> bytes:
    return hmac.digest(key, label + transcript, hashlib.sha256)


class Handshake:
    """One side of one link's handshake.

    Feed received bytes with :meth:`receive_data`, then call :meth:`next_event`
    until it returns :data:`NEED_DATA`; write every :class:`SendBytes`. After
    :class:`Established` the handshake object is done. Any violation raises
    :class:`HandshakeFailed`; :meth:`reject_frame` gives the bytes that tell the
    peer why (send them, then close).

    ``incarnation`` is this node's (empty for a tool without one); ``check_peer``
    is the peer policy (default: any incarnation is accepted).
    """

    def __init__(self, role: Role, node_id: str, secret: bytes, cluster_id: str, *, incarnation: str,
                 peer_id: str | None = None, known_peers: frozenset[str] = frozenset(),
                 check_peer: PeerPolicy = accept_any_incarnation, nonce: bytes | None = None) -> None:
        if role is Role.DIALER and peer_id is None:
            raise ValueError("a dialer must know which node it dials")
        self.role = role
        self.node_id = node_id
        self.peer_id = peer_id
        #: The peer's incarnation as it claims it (proved once the handshake is established).
        self.peer_incarnation: str | None = None
        self._secret = secret
        self._cluster_id = cluster_id
        self._incarnation = incarnation
        self._known_peers = known_peers
        self._check_peer = check_peer
        self._nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)
        if len(self._nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        own_incarnation = _short(incarnation, INCARNATION_BYTES_MAX)
        self._buffer = bytearray()
        self._events: list[SendBytes | Established] = []
        self._transcript = b""
        self._done = False
        if role is Role.DIALER:
            self._expect = _CHALLENGE
            self._events.append(SendBytes(_frame(_HELLO, _short(cluster_id) + _short(node_id) + own_incarnation
                                                 + self._nonce)))
        else:
            self._expect = _HELLO

    @property
    def done(self) -> bool:
        return self._done

    def receive_data(self, data: bytes) -> None:
        """Bytes from the peer (any split). Raises :class:`HandshakeFailed` on a violation."""
        if self._done:
            raise RuntimeError("handshake already finished")
        self._buffer += data
        while not self._done:
            if len(self._buffer) < 2:
                return
            size = int.from_bytes(self._buffer[:2], "big")
            if size > HANDSHAKE_FRAME_BYTES_MAX or size < len(MAGIC) + 1:
                raise HandshakeFailed(RejectReason.BAD_FRAME, f"handshake frame of {size} bytes")
            if len(self._buffer) < 2 + size:
                return
            payload = bytes(self._buffer[2:2 + size])
            del self._buffer[:2 + size]
            self._on_frame(payload)

    def next_event(self) -> SendBytes | Established | _NeedData:
        """The next thing to do, or :data:`NEED_DATA`."""
        if self._events:
            return self._events.pop(0)
        return NEED_DATA

    def reject_frame(self, reason: RejectReason, note: str = "") -> bytes:
        """A REJECT frame naming ``reason`` and ``note`` (best effort: the peer may be gone)."""
        return _frame(_REJECT, _short(reason.value) + _clipped(note))

    # --- frames ----------------------------------------------------------------------------------

    def _on_frame(self, payload: bytes) -> None:
        if payload[:len(MAGIC)] != MAGIC:
            if payload[:3] == MAGIC[:3]:
                raise HandshakeFailed(RejectReason.BAD_FRAME, f"the peer speaks Raft link version "
                                      f"{payload[3:4].decode(errors='replace')!r}, this node {MAGIC[3:].decode()!r}")
            raise HandshakeFailed(RejectReason.BAD_FRAME, "not a Shoal Raft handshake")
        kind = payload[len(MAGIC):len(MAGIC) + 1]
        body = payload[len(MAGIC) + 1:]
        if kind == _REJECT:
            self._on_reject(body)
        if kind != self._expect:
            raise HandshakeFailed(RejectReason.BAD_FRAME, f"unexpected handshake frame {kind!r}")
        try:
            if kind == _HELLO:
                self._on_hello(body)
            elif kind == _CHALLENGE:
                self._on_challenge(body)
            elif kind == _PROOF:
                self._on_proof(body)
            else:
                self._on_welcome(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HandshakeFailed(RejectReason.BAD_FRAME, str(exc)) from exc

    def _on_reject(self, body: bytes) -> None:
        try:
            text, pos = _read_short(body, 0)
            reason = RejectReason(text)
            note = _read_short(body, pos)[0] if pos < len(body) else ""
        except (UnicodeDecodeError, ValueError) as exc:
            raise HandshakeFailed(RejectReason.BAD_FRAME, "refused by the peer (unreadable REJECT)",
                                  remote=True) from exc
        if reason is RejectReason.WRONG_CLUSTER and note:
            detail = f"refused by the peer: it is in cluster {note!r}, this node in {self._cluster_id!r}"
        elif note:
            detail = f"refused by the peer: {note!r}"
        else:
            detail = "refused by the peer"
        raise HandshakeFailed(reason, detail, remote=True)

    def _transcript_of(self, dialer: str, listener: str, dialer_incarnation: str, listener_incarnation: str,
                       dialer_nonce: bytes, listener_nonce: bytes) -> bytes:
        return b"".join((_short(self._cluster_id), _short(dialer), _short(listener),
                         _short(dialer_incarnation, INCARNATION_BYTES_MAX),
                         _short(listener_incarnation, INCARNATION_BYTES_MAX), dialer_nonce, listener_nonce))

    def _on_hello(self, body: bytes) -> None:
        cluster_id, pos = _read_short(body, 0)
        dialer, pos = _read_short(body, pos)
        incarnation, pos = _read_short(body, pos, INCARNATION_BYTES_MAX)
        nonce = body[pos:]
        if len(nonce) != NONCE_BYTES:
            raise ValueError("bad nonce length")
        if cluster_id != self._cluster_id:
            raise HandshakeFailed(RejectReason.WRONG_CLUSTER,
                                  f"the peer is in cluster {cluster_id!r}, this node in {self._cluster_id!r}",
                                  note=self._cluster_id)
        if dialer not in self._known_peers or dialer == self.node_id:
            raise HandshakeFailed(RejectReason.UNKNOWN_PEER, f"node {dialer!r} is not a peer")
        self.peer_id = dialer
        self.peer_incarnation = incarnation
        self._transcript = self._transcript_of(dialer, self.node_id, incarnation, self._incarnation,
                                               nonce, self._nonce)
        proof = _mac(self._secret, b"listener proof", self._transcript)
        self._events.append(SendBytes(_frame(_CHALLENGE, _short(self.node_id)
                                             + _short(self._incarnation, INCARNATION_BYTES_MAX)
                                             + self._nonce + proof)))
        self._expect = _PROOF

    def _on_challenge(self, body: bytes) -> None:
        listener, pos = _read_short(body, 0)
        incarnation, pos = _read_short(body, pos, INCARNATION_BYTES_MAX)
        nonce, proof = body[pos:pos + NONCE_BYTES], body[pos + NONCE_BYTES:]
        if len(nonce) != NONCE_BYTES or len(proof) != PROOF_BYTES:
            raise ValueError("bad challenge length")
        if listener != self.peer_id:
            raise HandshakeFailed(RejectReason.WRONG_PEER, f"dialled {self.peer_id!r}, {listener!r} answered")
        self._transcript = self._transcript_of(self.node_id, listener, self._incarnation, incarnation,
                                               self._nonce, nonce)
        if not hmac.compare_digest(proof, _mac(self._secret, b"listener proof", self._transcript)):
            raise HandshakeFailed(RejectReason.BAD_PROOF, f"{listener!r} does not hold the cluster secret")
        self.peer_incarnation = incarnation
        self._ask_policy(listener, incarnation)
        self._events.append(SendBytes(_frame(_PROOF, _mac(self._secret, b"dialer proof", self._transcript))))
        self._expect = _WELCOME

    def _on_proof(self, body: bytes) -> None:
        if len(body) != PROOF_BYTES:
            raise ValueError("bad proof length")
        if not hmac.compare_digest(body, _mac(self._secret, b"dialer proof", self._transcript)):
            raise HandshakeFailed(RejectReason.BAD_PROOF, f"{self.peer_id!r} does not hold the cluster secret")
        assert self.peer_id is not None and self.peer_incarnation is not None
        self._ask_policy(self.peer_id, self.peer_incarnation)
        self._events.append(SendBytes(_frame(_WELCOME, _mac(self._secret, b"listener welcome", self._transcript))))
        self._finish()

    def _on_welcome(self, body: bytes) -> None:
        if len(body) != PROOF_BYTES:
            raise ValueError("bad welcome length")
        if not hmac.compare_digest(body, _mac(self._secret, b"listener welcome", self._transcript)):
            raise HandshakeFailed(RejectReason.BAD_PROOF, f"{self.peer_id!r} sent a forged welcome")
        self._finish()

    def _ask_policy(self, peer: str, incarnation: str) -> None:
        """Put a peer that proved the secret to the policy; refuse it with STALE_INCARNATION if told to."""
        try:
            why = self._check_peer(peer, incarnation)
        except Exception as exc:  # the owner's bug must not let a peer in
            why = f"the peer policy failed: {exc!r}"
        if why is not None:
            text = f"{peer!r} offered incarnation {incarnation!r}: {why}"
            raise HandshakeFailed(RejectReason.STALE_INCARNATION, text, note=text)

    def _finish(self) -> None:
        d2l = _mac(self._secret, b"key dialer->listener", self._transcript)
        l2d = _mac(self._secret, b"key listener->dialer", self._transcript)
        send, recv = (d2l, l2d) if self.role is Role.DIALER else (l2d, d2l)
        assert self.peer_id is not None and self.peer_incarnation is not None
        self._events.append(Established(self.peer_id, self.peer_incarnation, send, recv, bytes(self._buffer)))
        self._buffer.clear()
        self._done = True
