"""Helpers for the unit tests that bind real loopback sockets."""

from __future__ import annotations

import socket

__all__ = ["free_ports"]


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
