"""Connection settings as small value objects, with their defaults.

    opts = ConnectionOptions(command_timeout=5.0, ping_interval=1.0)
    opts = ConnectionOptions(reconnect=RetryPolicy(max_s=5.0), tls=True)

Every time is in seconds (float); ``0`` disables a periodic check or a limit.
"""

from __future__ import annotations

import random
import ssl
from dataclasses import dataclass

__all__ = ["ConnectionOptions", "RetryPolicy", "NODE_IN_FLIGHT_MAX"]

#: Commands a node runs at once per v2 connection (``inflight_per_connection``); more wait in its backlog.
NODE_IN_FLIGHT_MAX = 100
_POOL_SIZE_MAX = 256
_IN_FLIGHT_MAX = 100_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Reconnect backoff: ``base_s`` × ``factor``ⁿ, capped at ``max_s``, then ±``jitter`` (a fraction).

    The default: 100 ms, ×2, at most 30 s, ±30 %.
    """

    base_s: float = 0.1
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.3

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_s < self.base_s:
            raise ValueError("RetryPolicy: need 0 < base_s <= max_s")
        if self.factor < 1:
            raise ValueError("RetryPolicy: factor must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("RetryPolicy: jitter must be in [0, 1)")

    def nominal_s(self, attempt: int) -> float:
        """The capped exponential delay before reconnect attempt ``attempt`` (0-based), without jitter."""
        exponent = min(max(0, attempt), 64)  # 2**64 × base is far past any cap: no float overflow
        return min(self.max_s, self.base_s * self.factor ** exponent)

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before reconnect attempt ``attempt`` (0-based), jittered by ±``jitter``."""
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, self.nominal_s(attempt) * (1 + spread))


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """How the client talks to nodes (options and defaults).

    - ``pipelining``: protocol v2 (``Hello``, many commands in flight, replies matched by
      ``reqId``); ``False`` gives v1 sequential mode (one command at a time per connection).
    - ``max_in_flight``: commands in flight per connection; excess waits locally. The node
      runs :data:`NODE_IN_FLIGHT_MAX` at once per connection, so the client sends at most
      that many minus one (the last slot is kept for the health-check ping).
    - ``pool_size``: connections per node.
    - ``command_timeout``: seconds a command may take, retries included (a long-poll PULL
      adds its own wait).
    - ``connect_timeout``: seconds for TCP connect + Hello + Auth.
    - ``ping_interval`` / ``max_ping_failures``: health-check pings; that many failures in a
      row declare the link dead.
    - ``max_command_timeouts``: that many command timeouts in a row (no success between)
      declare the link dead.
    - ``topology_refresh``: seconds between background topology refreshes.
    - ``reconnect``: the backoff between reconnect attempts.
    - ``tls``: ``True`` for the default TLS context, or an :class:`ssl.SSLContext`.
    """

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
    tls: bool | ssl.SSLContext = False

    def __post_init__(self) -> None:
        if not 1 <= self.max_in_flight <= _IN_FLIGHT_MAX:
            raise ValueError(f"max_in_flight must be in 1..{_IN_FLIGHT_MAX}")
        if not 1 <= self.pool_size <= _POOL_SIZE_MAX:
            raise ValueError(f"pool_size must be in 1..{_POOL_SIZE_MAX}")
        if self.command_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("command_timeout and connect_timeout must be positive")
        if self.ping_interval < 0 or self.max_ping_failures < 0 or self.max_command_timeouts < 0:
            raise ValueError("ping_interval, max_ping_failures and max_command_timeouts must be >= 0")
        if self.topology_refresh < 0:
            raise ValueError("topology_refresh must be >= 0")
        if not isinstance(self.reconnect, RetryPolicy):
            raise TypeError("reconnect must be a RetryPolicy")

    @property
    def in_flight_per_connection(self) -> int:
        """Commands the client keeps in flight on one connection (1 in v1 mode)."""
        if not self.pipelining:
            return 1
        return max(1, min(self.max_in_flight, NODE_IN_FLIGHT_MAX - 1))

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context to connect with, or ``None`` for plain TCP."""
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return ssl.create_default_context() if self.tls else None
