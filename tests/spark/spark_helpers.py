"""Helpers shared by the Spark connector tests."""

from __future__ import annotations

import threading
from typing import Any


def process_available_then_stop(query: Any, timeout_s: float) -> None:
    """Let a streaming ``query`` process everything available, then stop it; a watchdog stops
    it after ``timeout_s`` so ``processAllAvailable`` cannot wait forever."""
    watchdog = threading.Timer(timeout_s, query.stop)
    watchdog.start()
    try:
        query.processAllAvailable()
    finally:
        watchdog.cancel()
        query.stop()
