"""The command schema: every command of the protocol, its routing and its fields.

``validate(frame)`` checks a decoded request against its command's spec and
raises :class:`CommandError` naming the field; it never changes the frame's
meaning. The table is the single source of truth for which commands exist,
how each is routed (``queue``, ``id``, ``partition`` or ``node``), whether it
is a read (answered from applied state) or a replicated write, and whether a
client may safely retry it after an unknown outcome.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from . import limits as L
from .codec import Raw
from .errors import CommandError, ErrorCode
from .jobid import parse_job_id

__all__ = ["CommandSpec", "Field", "COMMANDS", "READ_COMMANDS", "WRITE_COMMANDS", "validate", "routing_of",
           "route_key", "QUEUE_TYPES", "JOB_STATES"]

QUEUE_TYPES = ("standard", "fifo", "fifottl", "limfifottl", "utube", "utubettl", "log")
JOB_STATES = ("waiting", "delayed", "active", "completed", "failed")
_QUEUE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,%d}\Z" % L.QUEUE_NAME_CHARS_MAX)

Checker = Callable[[str, Any], None]


def _bad(field: str, reason: str) -> CommandError:
    return CommandError(ErrorCode.INVALID, f"{field}: {reason}")


def _int_range(lo: int, hi: int) -> Checker:
    def check(field: str, v: Any) -> None:
        if type(v) is not int:
            raise _bad(field, "must be an integer")
        if not lo <= v <= hi:
            raise _bad(field, f"must be between {lo} and {hi}")
    return check


def _queue(field: str, v: Any) -> None:
    if type(v) is not str or not _QUEUE_RE.match(v):
        raise _bad(field, f"must be 1..{L.QUEUE_NAME_CHARS_MAX} characters of A-Z a-z 0-9 _ . : -")


def _text(max_chars: int) -> Checker:
    def check(field: str, v: Any) -> None:
        if type(v) is not str:
            raise _bad(field, "must be a string")
        if not 0 < len(v) <= max_chars:
            raise _bad(field, f"must be 1..{max_chars} characters")
    return check


def _any_text(max_chars: int) -> Checker:
    def check(field: str, v: Any) -> None:
        if type(v) is not str:
            raise _bad(field, "must be a string")
        if len(v) > max_chars:
            raise _bad(field, f"must be at most {max_chars} characters")
    return check


def _data(field: str, v: Any) -> None:
    size = len(v.packed) if type(v) is Raw else len(msgpack.packb(v, use_bin_type=True))
    if size > L.DATA_BYTES_MAX:
        raise _bad(field, f"is {size} bytes encoded; the maximum is {L.DATA_BYTES_MAX}")


def _anything(field: str, v: Any) -> None:
    _data(field, v)


def _job_id(field: str, v: Any) -> None:
    try:
        parse_job_id(v)
    except CommandError as exc:
        raise _bad(field, f"{v!r} is not a job id like '3-17'") from exc


def _bool(field: str, v: Any) -> None:
    if type(v) is not bool:
        raise _bad(field, "must be true or false")


def _state(field: str, v: Any) -> None:
    if v not in JOB_STATES:
        raise _bad(field, f"must be one of {', '.join(JOB_STATES)}")


def _str_list(field: str, v: Any) -> None:
    if type(v) is not list or not all(type(x) is str for x in v) or len(v) > 1000:
        raise _bad(field, "must be a list of at most 1000 strings")


def _map(field: str, v: Any) -> None:
    if type(v) is not dict:
        raise _bad(field, "must be a map")


_priority = _int_range(L.PRIORITY_MIN, L.PRIORITY_MAX)
_delay = _int_range(0, L.DELAY_MS_MAX)
_timeout = _int_range(0, L.TIMEOUT_MS_MAX)
_attempts = _int_range(L.ATTEMPTS_MIN, L.ATTEMPTS_MAX)
_backoff = _int_range(0, L.BACKOFF_MS_MAX)
_ttl = _int_range(0, L.TTL_MS_MAX)
_ttr = _int_range(1, L.TTR_MS_MAX)
_key = _text(L.KEY_CHARS_MAX)
_count = _int_range(1, L.PULL_COUNT_MAX)
_kick_count = _int_range(1, 1_000_000_000)
_limit = _int_range(1, L.PAGE_LIMIT_MAX)
_offset = _int_range(0, 2**62)
_seq = _int_range(0, 2**62)
_partition = _int_range(0, 1023)
_progress = _int_range(0, 100)
_error_text = _any_text(L.ERROR_CHARS_MAX)
_log_text = _any_text(L.LOG_CHARS_MAX)
_token = _text(L.KEY_CHARS_MAX)

#: Optional fields of a job in PUSH and in each PUSHB item.
_JOB_OPTIONS: dict[str, Checker] = {
    "priority": _priority, "delay": _delay, "customId": _key, "ttl": _ttl, "ttr": _ttr, "attempts": _attempts,
    "backoff": _backoff, "group": _key, "tag": _key, "idempotencyKey": _key,
}


def _jobs(field: str, v: Any) -> None:
    if type(v) is not list or not v:
        raise _bad(field, "must be a non-empty list of jobs")
    if len(v) > L.BATCH_JOBS_MAX:
        raise _bad(field, f"at most {L.BATCH_JOBS_MAX} jobs per batch")
    for i, job in enumerate(v):
        name = f"{field}[{i}]"
        if type(job) is not dict:
            raise _bad(name, "must be a map with data")
        if "data" not in job:
            raise _bad(f"{name}.data", "required")
        _data(f"{name}.data", job["data"])
        for key, value in job.items():
            if key == "data" or value is None:
                continue
            check = _JOB_OPTIONS.get(key)
            if check is None:
                raise _bad(f"{name}.{key}", "unknown job field")
            check(f"{name}.{key}", value)


def _ids(field: str, v: Any) -> None:
    if type(v) is not list or not v:
        raise _bad(field, "must be a non-empty list of job ids")
    if len(v) > L.BATCH_JOBS_MAX:
        raise _bad(field, f"at most {L.BATCH_JOBS_MAX} ids per batch")
    partitions = set()
    for i, job_id in enumerate(v):
        _job_id(f"{field}[{i}]", job_id)
        partitions.add(parse_job_id(job_id)[0])
    if len(partitions) > 1:
        raise _bad(field, "all ids of one batch must belong to one partition (split the batch by partition)")


def _parallel(name: str, length_of: str) -> Checker:
    def check(field: str, v: Any) -> None:
        if type(v) is not list:
            raise _bad(field, "must be a list")
    check.__name__ = f"parallel_{name}_{length_of}"
    return check


def _tokens(field: str, v: Any) -> None:
    if type(v) is not list or not all(x is None or type(x) is str for x in v):
        raise _bad(field, "must be a list of tokens (strings or null)")


def _results(field: str, v: Any) -> None:
    if type(v) is not list:
        raise _bad(field, "must be a list")
    _data(field, v)


_QUEUE_OPTIONS: dict[str, Checker] = {
    "ttr": _ttr, "ttl": _ttl, "capacity": _int_range(1, 2**40), "discard": _text(16),
    "maxDeliveries": _int_range(1, 1_000_000), "attempts": _attempts, "backoff": _backoff,
    "historyMax": _int_range(0, 10_000_000), "historyAgeMs": _int_range(0, L.TTL_MS_MAX),
    "shards": _int_range(1, 1024), "priority": _priority, "delay": _delay,
}


def _queue_type(field: str, v: Any) -> None:
    if v not in QUEUE_TYPES:
        raise _bad(field, f"must be one of {', '.join(QUEUE_TYPES)}")


def _queue_options(field: str, v: Any) -> None:
    _map(field, v)
    for key, value in v.items():
        check = _QUEUE_OPTIONS.get(key)
        if check is None:
            raise _bad(f"{field}.{key}", "unknown queue option")
        if value is not None:
            check(f"{field}.{key}", value)
    if v.get("discard") not in (None, "reject"):
        raise _bad(f"{field}.discard", "only 'reject' is supported (nothing is ever dropped silently)")


def _cron_schedule(field: str, v: Any) -> None:
    _text(256)(field, v)
    try:
        from croniter import croniter  # deferred: croniter is only needed for Cron
    except ImportError as exc:  # pragma: no cover - croniter is a dependency
        raise _bad(field, "cron expressions need croniter") from exc
    if not croniter.is_valid(v):
        raise _bad(field, f"{v!r} is not a valid cron expression")


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """How one command is routed and which fields it takes."""

    name: str
    routing: str                       # "queue" | "id" | "partition" | "node"
    required: Mapping[str, Checker]
    optional: Mapping[str, Checker]
    read_only: bool = False
    retry_safe: bool = False           # may be re-sent after an unknown outcome


def _spec(name: str, routing: str, required: dict[str, Checker] | None = None,
          optional: dict[str, Checker] | None = None, *, read: bool = False, retry: bool | None = None) -> CommandSpec:
    return CommandSpec(name, routing, required or {}, optional or {}, read, read if retry is None else retry)


_Q = {"queue": _queue}
_ID = {"id": _job_id}
_TOK = {"token": _token}

_SPECS = [
    # core
    _spec("PUSH", "queue", {"queue": _queue, "data": _data}, {**_JOB_OPTIONS, "timeout": _timeout}, retry=True),
    _spec("PUSHB", "queue", {"queue": _queue, "jobs": _jobs}, retry=True),
    _spec("PULL", "queue", _Q, {"timeout": _timeout, "ttr": _ttr}),
    _spec("PULLB", "queue", {"queue": _queue, "count": _count}, {"timeout": _timeout, "ttr": _ttr}),
    _spec("ACK", "id", _ID, {"result": _anything, **_TOK}),
    _spec("ACKB", "id", {"ids": _ids}, {"results": _results, "tokens": _tokens}),
    _spec("FAIL", "id", _ID, {"error": _error_text, "delay": _delay, **_TOK}),
    # tarantool / lease extras
    _spec("Release", "id", _ID, {"delay": _delay, **_TOK}),
    _spec("Bury", "id", _ID, {"error": _error_text, **_TOK}),
    _spec("Kick", "queue", {"queue": _queue, "count": _kick_count}),
    _spec("Touch", "id", {"id": _job_id, "ttr": _ttr}, _TOK),
    _spec("JobHeartbeat", "id", _ID, {"ttr": _ttr, **_TOK}),
    _spec("ReleaseAll", "queue", _Q),
    _spec("CreateQueue", "queue", _Q, {"type": _queue_type, "options": _queue_options}, retry=True),
    _spec("Read", "queue", {"queue": _queue, "fromSeq": _seq}, {"limit": _limit}, read=True),
    _spec("Truncate", "queue", _Q, {"beforeSeq": _seq, "tag": _key}),
    # queries
    _spec("GetJob", "id", _ID, read=True),
    _spec("GetJobByCustomId", "queue", {"queue": _queue, "customId": _key}, read=True),
    _spec("GetState", "id", _ID, read=True),
    _spec("GetResult", "id", _ID, read=True),
    _spec("GetJobs", "queue", _Q, {"state": _state, "offset": _offset, "limit": _limit}, read=True),
    _spec("GetJobCounts", "queue", _Q, read=True),
    _spec("GetCountsPerPriority", "queue", _Q, read=True),
    _spec("GetProgress", "id", _ID, read=True),
    _spec("Count", "queue", _Q, {"state": _state}, read=True),
    # control
    _spec("Pause", "queue", _Q, retry=True),
    _spec("Resume", "queue", _Q, retry=True),
    _spec("IsPaused", "queue", _Q, read=True),
    _spec("Drain", "queue", _Q),
    _spec("Obliterate", "queue", _Q, retry=True),
    _spec("Clean", "queue", {"queue": _queue, "grace": _int_range(0, L.TTL_MS_MAX)},
          {"state": _state, "limit": _limit}),
    _spec("Cancel", "id", _ID),
    _spec("Promote", "id", _ID),
    _spec("MoveToDelayed", "id", {"id": _job_id, "delay": _delay}, _TOK),
    _spec("Progress", "id", {"id": _job_id, "progress": _progress}, {"message": _log_text, **_TOK}, retry=True),
    _spec("ListQueues", "partition", {}, {"partition": _partition}, read=True),
    # DLQ
    _spec("Dlq", "queue", _Q, {"limit": _limit}, read=True),
    _spec("RetryDlq", "queue", _Q, {"id": _job_id}),
    _spec("RetryCompleted", "queue", _Q, {"id": _job_id}),
    _spec("PurgeDlq", "queue", _Q),
    # cron
    _spec("Cron", "queue", {"name": _key, "queue": _queue},
          {"data": _anything, "schedule": _cron_schedule, "repeatEvery": _int_range(1, L.DELAY_MS_MAX),
           "priority": _priority, "limit": _int_range(1, 2**40)}, retry=True),
    _spec("CronDelete", "partition", {"name": _key}, {"partition": _partition}, retry=True),
    _spec("CronList", "partition", {}, {"partition": _partition}, read=True),
    # monitoring
    _spec("Stats", "partition", {}, {"partition": _partition, "local": _bool}, read=True),
    _spec("Metrics", "queue", _Q, read=True),
    _spec("Prometheus", "node", read=True),
    _spec("Ping", "node", read=True),
    _spec("Heartbeat", "node", {"workerId": _key}, retry=True),
    _spec("AddLog", "id", {"id": _job_id, "message": _log_text}),
    _spec("GetLogs", "id", _ID, {"limit": _limit}, read=True),
    _spec("RegisterWorker", "node", {}, {"name": _key, "queues": _str_list, "workerId": _key}, retry=True),
    _spec("UnregisterWorker", "node", {"workerId": _key}, retry=True),
    _spec("ListWorkers", "node", read=True),
    # connection
    _spec("Hello", "node", {}, {"protocolVersion": _int_range(1, 1000), "capabilities": _str_list}, read=True),
    _spec("Auth", "node", {"token": _text(4096)}, read=True),
    _spec("Identify", "node", {}, {"session": _key}, read=True),
    _spec("Subscribe", "node", {}, {"queue": _queue}, read=True),
    # internal: proposed by the leader itself, never accepted from a client
    _spec("_Tick", "partition"),
    _spec("_ReleaseSession", "partition", {"session": _key}),
]

COMMANDS: Mapping[str, CommandSpec] = {s.name: s for s in _SPECS}
READ_COMMANDS = frozenset(s.name for s in _SPECS if s.read_only)
WRITE_COMMANDS = frozenset(s.name for s in _SPECS if not s.read_only)
_ENVELOPE = frozenset({"cmd", "reqId"})


def validate(frame: dict[str, Any], *, internal: bool = False) -> dict[str, Any]:
    """Check ``frame`` against its command; return it unchanged or raise ``CommandError``.

    Unknown fields are refused (a typo must not be silently ignored); ``null``
    for an optional field means "not given".
    """
    name = frame.get("cmd")
    spec = COMMANDS.get(name) if type(name) is str else None
    if spec is None or (name[0] == "_" and not internal):
        raise CommandError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {name!r}")
    required, optional = spec.required, spec.optional
    for field, check in required.items():
        value = frame.get(field)
        if value is None:
            raise _bad(field, "required")
        check(field, value)
    for field, value in frame.items():
        if field in required or field in _ENVELOPE:
            continue
        check = optional.get(field)
        if check is None:
            if field[0] == "_" and internal:
                continue
            raise _bad(field, f"unknown field for {name}")
        if value is not None:
            check(field, value)
    return frame


def routing_of(cmd: str) -> str:
    """``queue``, ``id``, ``partition`` or ``node``."""
    spec = COMMANDS.get(cmd)
    if spec is None:
        raise CommandError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {cmd!r}")
    return spec.routing


def route_key(frame: Mapping[str, Any]) -> str | int | None:
    """What routes ``frame``: its queue name, its job id's partition, or its ``partition`` field."""
    routing = routing_of(frame["cmd"])
    if routing == "queue":
        return frame.get("queue")
    if routing == "id":
        job_id = frame.get("id")
        if job_id is None and frame.get("ids"):
            job_id = frame["ids"][0]
        return parse_job_id(job_id)[0] if job_id is not None else None
    if routing == "partition":
        return frame.get("partition")
    return None
