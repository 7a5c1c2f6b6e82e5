"""Authenticated frames of an established Raft link, sans I/O.

A frame is ``length (4 bytes, big-endian) | mac (16 bytes) | payload`` where
``length`` counts mac and payload and ``mac`` is a 128-bit MAC (:class:`_FrameMac`:
keyed BLAKE2b for small payloads, HMAC-SHA256 for large ones) under the direction's
session key over ``counter (8 bytes) | payload``.
Both ends count the frames of each direction, so a replayed, dropped, reordered
or spliced frame fails its MAC and the link is closed. The payload is a
MessagePack array of ``[partition, message]`` pairs: every
Raft message a node sends one peer in one loop iteration travels in one frame.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FrameSealer", "FrameOpener", "FrameError", "MAC_BYTES", "HEADER_BYTES", "array_header"]

MAC_BYTES = 16
HEADER_BYTES = 4 + MAC_BYTES




#: Payloads up to this size are MACed with keyed BLAKE2b, larger ones with HMAC-SHA256.
BLAKE2B_BYTES_MAX = 8 * 1024
#: A sealed frame up to this size is one bytes (one write); a larger one leaves its parts uncopied.
JOIN_BYTES_MAX = 64 * 1024


class _FrameMac:
    """The MAC of a frame (128 bits), chosen by the payload's size, which both ends know.

    Small frames (acknowledgements, heartbeats, a lone write's entry) are MACed with keyed
    BLAKE2b (RFC 7693's MAC mode): every Raft round trip pays for them, and OpenSSL's HMAC
    costs several microseconds per call on a node whose caches went cold between two
    messages, where CPython's own BLAKE2b is small. Large frames (batches of entries) are
    MACed with HMAC-SHA256, which OpenSSL computes about twice as fast per byte. Each
    algorithm gets its own subkey of the direction's session key.
    """

    __slots__ = ("_small", "_large")

    def __init__(self, key: bytes) -> None:
        self._small = hashlib.blake2b(key=hmac.digest(key, b"shoal frame mac blake2b", "sha256"),
                                      digest_size=MAC_BYTES)
        self._large = hmac.new(hmac.digest(key, b"shoal frame mac hmac-sha256", "sha256"), digestmod=hashlib.sha256)

    def mac(self, counter: int, parts: Sequence[bytes | memoryview], size: int) -> bytes:
        """The MAC of frame number ``counter`` whose payload is ``parts`` joined (``size`` bytes)."""
        stream = self._small.copy() if size <= BLAKE2B_BYTES_MAX else self._large.copy()
        stream.update(counter.to_bytes(8, "big"))
        for part in parts:
            stream.update(part)
        return stream.digest()[:MAC_BYTES]


class FrameError(Exception):
    """A frame failed authentication or broke a limit: the link must be closed."""


def array_header(count: int) -> bytes:
    """The MessagePack header of an array of ``count`` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


class FrameSealer:
    """Seals outgoing payloads with the direction's key and counter."""

    __slots__ = ("_mac", "_counter")

    def __init__(self, key: bytes) -> None:
        self._mac = _FrameMac(key)
        self._counter = 0

    def seal(self, parts: list[bytes]) -> list[bytes]:
        """The frame carrying ``parts`` (joined) as its payload, in pieces for ``writelines``:
        one piece when it is small, the header and ``parts`` themselves (no copy) when large."""
        size = 0
        for part in parts:
            size += len(part)
        counter = self._counter
        self._counter += 1
        if size > JOIN_BYTES_MAX:
            return [(size + MAC_BYTES).to_bytes(4, "big") + self._mac.mac(counter, parts, size), *parts]
        body = b"".join(parts)
        return [b"".join(((size + MAC_BYTES).to_bytes(4, "big"), self._mac.mac(counter, (body,), size), body))]


class FrameOpener:
    """Splits, authenticates and decodes incoming frames; ``frame_bytes_max`` bounds each one.

    ``decode`` turns an authenticated payload into a value; it only ever sees
    payloads whose MAC checked.
    """

    __slots__ = ("_mac", "_counter", "_buffer", "_decode", "frame_bytes_max")

    def __init__(self, key: bytes, frame_bytes_max: int, decode: Callable[[memoryview], Any]) -> None:
        self._mac = _FrameMac(key)
        self._counter = 0
        self._buffer = bytearray()
        self._decode = decode
        self.frame_bytes_max = frame_bytes_max

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Any]:
        """The decoded payload of every complete frame, authenticated, in order.

        Raises :class:`FrameError` on a bad MAC, an oversized frame or a payload
        ``decode`` refuses; the link must then be closed.
        """
        buf = self._buffer
        if not buf and len(data) >= HEADER_BYTES and int.from_bytes(data[:4], "big") + 4 == len(data) \
                and len(data) - 4 <= self.frame_bytes_max:
            return [self._open(data, memoryview(data)[HEADER_BYTES:], 4)]  # the usual read: one whole frame
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data  # the usual case, whole frames in one read: no copy into the buffer
        out: list[Any] = []
        pos = 0
        end = len(src)
        with memoryview(src) as view:
            while end - pos >= HEADER_BYTES:
                size = int.from_bytes(view[pos:pos + 4], "big")
                if size > self.frame_bytes_max or size < MAC_BYTES:
                    raise FrameError(f"frame of {size} bytes (limit {self.frame_bytes_max})")
                if end - pos - 4 < size:
                    break
                start = pos + 4 + MAC_BYTES
                stop = pos + 4 + size
                with view[start:stop] as payload:
                    out.append(self._open(view, payload, pos + 4))
                pos = stop
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += data[pos:] if pos else data
        return out

    def _open(self, frame: bytes | memoryview, payload: memoryview, mac_at: int) -> Any:
        """Authenticate ``payload`` against the MAC at ``frame[mac_at:]``, then decode it."""
        if not hmac.compare_digest(self._mac.mac(self._counter, (payload,), len(payload)),
                                   frame[mac_at:mac_at + MAC_BYTES]):
            raise FrameError("frame failed authentication (forged, replayed or reordered)")
        self._counter += 1
        try:
            return self._decode(payload)
        except Exception as exc:
            raise FrameError(f"undecodable frame: {exc}") from exc
