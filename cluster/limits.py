"""Validation limits of the protocol (seed 001's table), units last in every name."""

from __future__ import annotations

__all__ = [
    "QUEUE_NAME_CHARS_MAX", "DATA_BYTES_MAX", "PRIORITY_MIN", "PRIORITY_MAX", "DELAY_MS_MAX",
    "TIMEOUT_MS_MAX", "ATTEMPTS_MIN", "ATTEMPTS_MAX", "BACKOFF_MS_MAX", "TTL_MS_MAX", "TTR_MS_MAX",
    "KEY_CHARS_MAX", "BATCH_JOBS_MAX", "PULL_COUNT_MAX", "ERROR_CHARS_MAX", "LOG_CHARS_MAX",
    "PAGE_LIMIT_MAX",
]

DAY_MS = 24 * 3600 * 1000

QUEUE_NAME_CHARS_MAX = 256
DATA_BYTES_MAX = 10 * 1024 * 1024
PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000
DELAY_MS_MAX = 365 * DAY_MS
TIMEOUT_MS_MAX = DAY_MS
ATTEMPTS_MIN = 1
ATTEMPTS_MAX = 1_000
BACKOFF_MS_MAX = DAY_MS
TTL_MS_MAX = 365 * DAY_MS
TTR_MS_MAX = DAY_MS
KEY_CHARS_MAX = 256          # customId, idempotencyKey, group, tag, cron name, session
BATCH_JOBS_MAX = 10_000      # PUSHB jobs, ACKB ids
PULL_COUNT_MAX = 10_000      # PULLB count
ERROR_CHARS_MAX = 64 * 1024  # FAIL/Bury error text
LOG_CHARS_MAX = 64 * 1024    # AddLog message
PAGE_LIMIT_MAX = 10_000      # GetJobs/Dlq/Read/GetLogs limit
