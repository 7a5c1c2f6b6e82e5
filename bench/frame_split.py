"""Length-prefixed frame splitting shared by the benchmark driver and the bare reference server.

Both sit in the measured loop, so this is one tight pass over a burst with no decoding:
each caller decodes the bodies its own way.
"""

from __future__ import annotations

__all__ = ["split_frames"]


def split_frames(buf: bytearray) -> list[bytes]:
    """Remove every whole frame from the front of ``buf`` and return their bodies, in order."""
    out = []
    pos, size = 0, len(buf)
    while size - pos >= 4:
        end = pos + 4 + int.from_bytes(buf[pos:pos + 4], "big")
        if end > size:
            break
        out.append(bytes(buf[pos + 4:end]))
        pos = end
    del buf[:pos]
    return out
