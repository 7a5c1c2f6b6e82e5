"""The Raft link handshake, sans I/O: bytes in, events out.

Two nodes prove to each other that they hold the cluster secret before either
decodes anything else the other sends. The dialer opens::

    dialer   -> HELLO     magic, cluster id, dialer id, dialer nonce
    listener -> CHALLENGE listener id, listener nonce, listener proof
    dialer   -> PROOF     dialer proof
                (or either side -> REJECT reason, then close)

A proof is HMAC-SHA256(secret, role label + transcript) where the transcript
binds the cluster id, both node ids and both fresh 32-byte nonces, so a
recorded handshake replayed later proves nothing (the other side's nonce is new)
and a listener's proof cannot pass for a dialer's (different label). Both sides
then derive one session key per direction from the same transcript; every later
frame carries a MAC under that key over a per-direction frame counter (see
:mod:`._frames`), so frames cannot be replayed, reordered or moved between links.

Handshake frames are tiny fixed-layout binary records (2-byte length prefix, at
most :data:`HANDSHAKE_FRAME_BYTES_MAX`): nothing from an unauthenticated peer
reaches a general-purpose decoder.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from enum import Enum

__all__ = ["Handshake", "Role", "SendBytes", "Established", "NEED_DATA", "HandshakeFailed",
           "HANDSHAKE_FRAME_BYTES_MAX", "NONCE_BYTES", "RejectReason"]

#: Names the link's version: 2 = small frames MACed with keyed BLAKE2b (1 used HMAC-SHA256 for all).
MAGIC = b"SHR2"
NONCE_BYTES = 32
PROOF_BYTES = 32
#: The largest handshake frame either side accepts (ids and the cluster id are short).
HANDSHAKE_FRAME_BYTES_MAX = 512
_ID_BYTES_MAX = 200
_HELLO, _CHALLENGE, _PROOF, _REJECT = b"H", b"C", b"P", b"R"


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


class HandshakeFailed(Exception):
    """The handshake cannot succeed; ``reason`` says why, ``remote`` whether the peer said so."""

    def __init__(self, reason: RejectReason, detail: str, remote: bool = False) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.remote = remote


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
    """Both sides proved the secret. ``rest`` is what the peer sent after the handshake."""

    peer_id: str
    send_key: bytes
    recv_key: bytes
    rest: bytes


def _frame(kind: bytes, body: bytes) -> bytes:
    payload = MAGIC + kind + body
    return len(payload).to_bytes(2, "big") + payload


def _short(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > _ID_BYTES_MAX:
        raise ValueError(f"{value[:40]!r}... is longer than {_ID_BYTES_MAX} bytes")
    return bytes([len(raw)]) + raw


def _read_short(body: bytes, pos: int) -> tuple[str, int]:
    if pos >= len(body):
        raise ValueError("truncated field")
    size = body[pos]
    end = pos + 1 + size
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
    """

    def __init__(self, role: Role, node_id: str, secret: bytes, cluster_id: str, *,
                 peer_id: str | None = None, known_peers: frozenset[str] = frozenset(),
                 nonce: bytes | None = None) -> None:
        if role is Role.DIALER and peer_id is None:
            raise ValueError("a dialer must know which node it dials")
        self.role = role
        self.node_id = node_id
        self.peer_id = peer_id
        self._secret = secret
        self._cluster_id = cluster_id
        self._known_peers = known_peers
        self._nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)
        if len(self._nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        self._buffer = bytearray()
        self._events: list[SendBytes | Established] = []
        self._transcript = b""
        self._done = False
        if role is Role.DIALER:
            self._expect = _CHALLENGE
            self._events.append(SendBytes(_frame(_HELLO, _short(cluster_id) + _short(node_id) + self._nonce)))
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

    def reject_frame(self, reason: RejectReason) -> bytes:
        """A REJECT frame naming ``reason`` (best effort: the peer may be gone)."""
        return _frame(_REJECT, reason.value.encode())

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
            try:
                reason = RejectReason(body.decode())
            except (UnicodeDecodeError, ValueError):
                reason = RejectReason.BAD_FRAME
            raise HandshakeFailed(reason, "refused by the peer", remote=True)
        if kind != self._expect:
            raise HandshakeFailed(RejectReason.BAD_FRAME, f"unexpected handshake frame {kind!r}")
        try:
            if kind == _HELLO:
                self._on_hello(body)
            elif kind == _CHALLENGE:
                self._on_challenge(body)
            else:
                self._on_proof(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HandshakeFailed(RejectReason.BAD_FRAME, str(exc)) from exc

    def _transcript_of(self, dialer: str, listener: str, dialer_nonce: bytes, listener_nonce: bytes) -> bytes:
        return b"".join((_short(self._cluster_id), _short(dialer), _short(listener), dialer_nonce, listener_nonce))

    def _on_hello(self, body: bytes) -> None:
        cluster_id, pos = _read_short(body, 0)
        dialer, pos = _read_short(body, pos)
        nonce = body[pos:]
        if len(nonce) != NONCE_BYTES:
            raise ValueError("bad nonce length")
        if cluster_id != self._cluster_id:
            raise HandshakeFailed(RejectReason.WRONG_CLUSTER, f"cluster {cluster_id!r}")
        if dialer not in self._known_peers or dialer == self.node_id:
            raise HandshakeFailed(RejectReason.UNKNOWN_PEER, f"node {dialer!r} is not a peer")
        self.peer_id = dialer
        self._transcript = self._transcript_of(dialer, self.node_id, nonce, self._nonce)
        proof = _mac(self._secret, b"listener proof", self._transcript)
        self._events.append(SendBytes(_frame(_CHALLENGE, _short(self.node_id) + self._nonce + proof)))
        self._expect = _PROOF

    def _on_challenge(self, body: bytes) -> None:
        listener, pos = _read_short(body, 0)
        nonce, proof = body[pos:pos + NONCE_BYTES], body[pos + NONCE_BYTES:]
        if len(nonce) != NONCE_BYTES or len(proof) != PROOF_BYTES:
            raise ValueError("bad challenge length")
        if listener != self.peer_id:
            raise HandshakeFailed(RejectReason.WRONG_PEER, f"dialled {self.peer_id!r}, {listener!r} answered")
        self._transcript = self._transcript_of(self.node_id, listener, self._nonce, nonce)
        if not hmac.compare_digest(proof, _mac(self._secret, b"listener proof", self._transcript)):
            raise HandshakeFailed(RejectReason.BAD_PROOF, f"{listener!r} does not hold the cluster secret")
        self._events.append(SendBytes(_frame(_PROOF, _mac(self._secret, b"dialer proof", self._transcript))))
        self._finish()

    def _on_proof(self, body: bytes) -> None:
        if len(body) != PROOF_BYTES:
            raise ValueError("bad proof length")
        if not hmac.compare_digest(body, _mac(self._secret, b"dialer proof", self._transcript)):
            raise HandshakeFailed(RejectReason.BAD_PROOF, f"{self.peer_id!r} does not hold the cluster secret")
        self._finish()

    def _finish(self) -> None:
        d2l = _mac(self._secret, b"key dialer->listener", self._transcript)
        l2d = _mac(self._secret, b"key listener->dialer", self._transcript)
        send, recv = (d2l, l2d) if self.role is Role.DIALER else (l2d, d2l)
        assert self.peer_id is not None
        self._events.append(Established(self.peer_id, send, recv, bytes(self._buffer)))
        self._buffer.clear()
        self._done = True
