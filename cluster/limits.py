"""Validation limits of the protocol, units last in every name.

The lower-case names are canonical (TigerStyle: ``delay_ms_max``); the
upper-case spellings are aliases of the same values for code that prefers
PEP 8 constant style. Times are integer milliseconds, sizes bytes, text
lengths characters.
"""

from __future__ import annotations

__all__ = [
    "day_ms", "hour_ms",
    "queue_name_chars_max", "data_bytes_max", "priority_min", "priority_max", "delay_ms_max",
    "timeout_ms_max", "attempts_min", "attempts_max", "backoff_ms_max", "ttl_ms_max", "ttr_ms_min",
    "ttr_ms_max", "key_chars_max", "batch_jobs_max", "pull_count_max", "error_chars_max",
    "log_chars_max", "page_limit_max", "token_chars_max", "auth_token_chars_max", "partition_max",
    "list_items_max", "rate_max", "concurrency_max", "stack_lines_max", "log_lines_max",
    "trace_context_entries_max", "trace_context_key_chars_max", "trace_context_chars_max",
    # PEP 8 aliases
    "DAY_MS", "QUEUE_NAME_CHARS_MAX", "DATA_BYTES_MAX", "PRIORITY_MIN", "PRIORITY_MAX", "DELAY_MS_MAX",
    "TIMEOUT_MS_MAX", "ATTEMPTS_MIN", "ATTEMPTS_MAX", "BACKOFF_MS_MAX", "TTL_MS_MAX", "TTR_MS_MAX",
    "KEY_CHARS_MAX", "BATCH_JOBS_MAX", "PULL_COUNT_MAX", "ERROR_CHARS_MAX", "LOG_CHARS_MAX",
    "PAGE_LIMIT_MAX",
]

hour_ms = 3600 * 1000
day_ms = 24 * hour_ms

# A job's own fields.
queue_name_chars_max = 256            # of [A-Za-z0-9_.:-]
data_bytes_max = 10 * 1024 * 1024     # job data, measured as its MessagePack encoding
priority_min = -1_000_000
priority_max = 1_000_000
delay_ms_max = 365 * day_ms
timeout_ms_max = 24 * hour_ms         # PULL/PULLB long-poll wait, PUSH capacity wait
attempts_min = 1
attempts_max = 1_000
backoff_ms_max = 24 * hour_ms
ttl_ms_max = 365 * day_ms

# Everything else a client can send.
ttr_ms_min = 1                        # a lease of 0 ms would expire before it is returned
ttr_ms_max = 24 * hour_ms
key_chars_max = 256                   # customId, idempotencyKey, group, tag, cron name, session, workerId
token_chars_max = 256                 # lease token when sent as a string
auth_token_chars_max = 4096
batch_jobs_max = 10_000               # PUSHB jobs, ACKB ids
pull_count_max = 10_000               # PULLB count
error_chars_max = 64 * 1024           # FAIL/Bury error text
log_chars_max = 64 * 1024             # AddLog/Progress message
page_limit_max = 10_000               # GetJobs/Dlq/Read/GetLogs/Clean limit
partition_max = 1023                  # partitions are 0..1023 (config allows 1..1024)
list_items_max = 1_000                # capabilities, RegisterWorker queues
rate_max = 100_000                    # limit/groupLimit max: a window keeps one stamp per lease
concurrency_max = 1_000_000           # concurrency/groupConcurrency
stack_lines_max = 100                 # FAIL stack lines (bunqueue caps the same), stackTraceLimit
log_lines_max = 100                   # a job's log lines kept, keepLogs
trace_context_entries_max = 8         # traceContext: a job's trace propagation fields (traceparent, ...)
trace_context_key_chars_max = 64      # traceContext: one key, of [A-Za-z0-9_.-]
trace_context_chars_max = 4096        # traceContext: its keys and values together

DAY_MS = day_ms
QUEUE_NAME_CHARS_MAX = queue_name_chars_max
DATA_BYTES_MAX = data_bytes_max
PRIORITY_MIN = priority_min
PRIORITY_MAX = priority_max
DELAY_MS_MAX = delay_ms_max
TIMEOUT_MS_MAX = timeout_ms_max
ATTEMPTS_MIN = attempts_min
ATTEMPTS_MAX = attempts_max
BACKOFF_MS_MAX = backoff_ms_max
TTL_MS_MAX = ttl_ms_max
TTR_MS_MAX = ttr_ms_max
KEY_CHARS_MAX = key_chars_max
BATCH_JOBS_MAX = batch_jobs_max
PULL_COUNT_MAX = pull_count_max
ERROR_CHARS_MAX = error_chars_max
LOG_CHARS_MAX = log_chars_max
PAGE_LIMIT_MAX = page_limit_max
