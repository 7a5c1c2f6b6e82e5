"""The watchdog's event-loop lag: every wake-up counted in the histogram, a long one logged, at
most once per interval, with how many more were not."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from shoal.cluster.guard import NodeLimits
from shoal.node.guard import LAG_LOG_EVERY_S, LAG_WARN_S, NodeGuard


def test_a_long_lag_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    guard = NodeGuard(SimpleNamespace(config=SimpleNamespace(limits=NodeLimits())))  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="shoal.node.guard")
    guard.record_lag(0.002, 100.0)
    assert caplog.records == []
    guard.record_lag(1.7, 101.0)
    guard.record_lag(LAG_WARN_S, 102.0)            # within the interval: counted, not logged
    guard.record_lag(0.9, 101.0 + LAG_LOG_EVERY_S)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "held 1.70 s" in messages[0]
    assert "held 0.90 s" in messages[1] and "1 more of 0.5 s or more" in messages[1]
    assert guard.lag_max_s == 1.7 and sum(guard._lag_counts) == 4  # noqa: SLF001
