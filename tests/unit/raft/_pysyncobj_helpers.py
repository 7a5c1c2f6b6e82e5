"""Helpers shared by the tests that run pysyncobj groups in-process on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


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


def wait_for(pred: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``pred`` every 20 ms until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False
