"""Connection settings as small value objects (seed 001's defaults)."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ConnectionOptions", "RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Reconnect backoff: ``base`` × ``factor``ⁿ, capped at ``max_s``, with ±``jitter``."""

    base_s: float = 0.1
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.3

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before reconnect attempt ``attempt`` (0-based)."""
        raw = min(self.max_s, self.base_s * self.factor ** max(0, attempt))
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, raw * (1 + spread))


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """How the client talks to nodes. Times in seconds; 0 disables a check."""

    pipelining: bool = True
    max_in_flight: int = 100
    pool_size: int = 4
    command_timeout: float = 30.0
    connect_timeout: float = 5.0
    ping_interval: float = 30.0
    max_ping_failures: int = 3
    max_command_timeouts: int = 3
    topology_refresh: float = 30.0
    reconnect: RetryPolicy = RetryPolicy()
    tls: bool = False

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.pool_size < 1:
            raise ValueError("max_in_flight and pool_size must be at least 1")
        if self.command_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("command_timeout and connect_timeout must be positive")
        if self.ping_interval < 0 or self.max_ping_failures < 0 or self.max_command_timeouts < 0:
            raise ValueError("ping_interval, max_ping_failures and max_command_timeouts must be ≥ 0")
