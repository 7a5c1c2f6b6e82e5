"""Authenticated frames of an established Raft link, sans I/O.

A frame is ``length (4 bytes, big-endian) | mac (16 bytes) | payload`` where
``length`` counts mac and payload and ``mac`` is HMAC-SHA256 (truncated to 128
bits) under the direction's session key over ``counter (8 bytes) | payload``.
Both ends count the frames of each direction, so a replayed, dropped, reordered
or spliced frame fails its MAC and the link is closed. The payload is a
MessagePack array of ``[partition, message]`` pairs: every
Raft message a node sends one peer in one loop iteration travels in one frame.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

__all__ = ["FrameSealer", "FrameOpener", "FrameError", "MAC_BYTES", "HEADER_BYTES", "array_header"]

MAC_BYTES = 16
HEADER_BYTES = 4 + MAC_BYTES


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

    __slots__ = ("_base", "_counter")

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._counter = 0

    def seal(self, parts: list[bytes]) -> list[bytes]:
        """Header pieces followed by ``parts``: join them or hand them to ``writelines``."""
        mac = self._base.copy()
        mac.update(self._counter.to_bytes(8, "big"))
        size = MAC_BYTES
        for part in parts:
            mac.update(part)
            size += len(part)
        self._counter += 1
        return [size.to_bytes(4, "big") + mac.digest()[:MAC_BYTES], *parts]


class FrameOpener:
    """Splits, authenticates and decodes incoming frames; ``frame_bytes_max`` bounds each one.

    ``decode`` turns an authenticated payload into a value; it only ever sees
    payloads whose MAC checked.
    """

    __slots__ = ("_base", "_counter", "_buffer", "_decode", "frame_bytes_max")

    def __init__(self, key: bytes, frame_bytes_max: int, decode: Callable[[memoryview], Any]) -> None:
        self._base = hmac.new(key, digestmod=hashlib.sha256)
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
        buf += data
        out: list[Any] = []
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:
            while end - pos >= HEADER_BYTES:
                size = int.from_bytes(view[pos:pos + 4], "big")
                if size > self.frame_bytes_max or size < MAC_BYTES:
                    raise FrameError(f"frame of {size} bytes (limit {self.frame_bytes_max})")
                if end - pos - 4 < size:
                    break
                start = pos + 4 + MAC_BYTES
                stop = pos + 4 + size
                with view[start:stop] as payload:
                    mac = self._base.copy()
                    mac.update(self._counter.to_bytes(8, "big"))
                    mac.update(payload)
                    if not hmac.compare_digest(mac.digest()[:MAC_BYTES], view[pos + 4:start]):
                        raise FrameError("frame failed authentication (forged, replayed or reordered)")
                    self._counter += 1
                    try:
                        out.append(self._decode(payload))
                    except Exception as exc:
                        raise FrameError(f"undecodable frame: {exc}") from exc
                pos = stop
        if pos:
            del buf[:pos]
        return out
