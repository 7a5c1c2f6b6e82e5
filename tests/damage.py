"""Damage to files on disk, as tests make it."""

from __future__ import annotations

import os


def flip_byte(path: str | os.PathLike[str], at: int, mask: int = 0x40) -> None:
    """Change the byte at offset ``at`` of ``path`` in place (XOR ``mask``)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))
