"""The command schema: every command of the protocol, its routing and its fields.

``validate(frame)`` checks a decoded request against its command's spec and
raises :class:`~shoal.cluster.errors.CommandError` whose message starts with
the offending field's name (``"priority: must be between …"``); it never
changes the frame. The table below is the single source of truth for which
commands exist, how each is routed, whether it reads applied state or is a
replicated write, and whether a client may re-send it after an unknown outcome.

Routing:

- ``queue``: the partition of ``frame["queue"]`` (``partition_for``);
- ``id``: the partition in the job id (``id``, or ``ids[0]`` for ACKB, whose
  ids must all share one partition);
- ``partition``: the optional ``partition`` field; without it every leader
  answers for its own partitions and the client merges;
- ``node``: answered by the connected node itself, never replicated.

Field names are exactly the wire names listed in ``docs/commands.md``.
Unknown fields are refused so that a typo is never silently ignored; ``null``
for an optional field means "not given" (a required field must be present;
only ``data`` accepts ``null`` as its value). Commands whose name starts with
``_`` are proposed by the leader itself and refused from clients.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from . import _fields as F
from . import flow as _flow
from . import limits as L
from ._fields import JOB_STATES, QUEUE_TYPES, Checker
from .codec import Raw, item_fields
from .errors import CommandError, ErrorCode
from .jobid import parse_job_id

__all__ = [
    "Routing", "Field", "CommandSpec", "COMMANDS", "READ_COMMANDS", "WRITE_COMMANDS", "NODE_COMMANDS",
    "PRE_AUTH_COMMANDS", "LONG_POLL_COMMANDS", "NEW_JOB_COMMANDS", "SPACE_TAKING_COMMANDS",
    "INTERNAL_COMMANDS", "JOB_OPTION_FIELDS", "QUEUE_TYPES", "JOB_STATES", "validate", "routing_of",
    "route_key", "normalize", "COMMAND_ALIASES", "TRACE_CONTEXT_KEY_CHARS",
]

Routing = Literal["queue", "id", "partition", "node"]


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: its wire name, whether it must be present, and its checker."""

    name: str
    check: Checker
    required: bool = False


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """How one command is routed and which fields it takes.

    ``read_only``: answered from applied state without Raft (or by the node);
    ``retry_safe``: may be re-sent after an unknown outcome without a second effect.
    ``check`` runs after every field passed, for rules that span fields.
    ``pre_auth``: answered before the connection authenticated; ``long_poll``: may wait for
    jobs to become ready (parked until then or its timeout); ``new_jobs``: adds jobs, refused
    with ``OVERLOADED`` while the node is over its memory budget; ``takes_space``: brings new
    data into a partition, refused with ``NO_SPACE`` while its disk is nearly full.
    """

    name: str
    routing: Routing
    fields: Mapping[str, Field]
    read_only: bool = False
    retry_safe: bool = False
    check: Callable[[Mapping[str, Any]], None] | None = None
    pre_auth: bool = False
    long_poll: bool = False
    new_jobs: bool = False
    takes_space: bool = False
    # Derived once for the hot path: required names, and every field's checker in one dict.
    required: tuple[str, ...] = field(init=False, repr=False, compare=False)
    checks: Mapping[str, Checker] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))
        object.__setattr__(self, "required", tuple(f.name for f in self.fields.values() if f.required))
        # A plain dict (not a proxy): validate() looks every key up here.
        object.__setattr__(self, "checks", {f.name: f.check for f in self.fields.values()})


# --- field checkers --------------------------------------------------------------------------

_priority = F.int_range(L.priority_min, L.priority_max)
_delay = F.int_range(0, L.delay_ms_max)
_timeout = F.int_range(0, L.timeout_ms_max)
_attempts = F.int_range(L.attempts_min, L.attempts_max)
_backoff = F.int_range(0, L.backoff_ms_max)
_ttl = F.int_range(0, L.ttl_ms_max)
_ttr = F.int_range(L.ttr_ms_min, L.ttr_ms_max)
_key = F.text(L.key_chars_max)
_count = F.int_range(1, L.pull_count_max)
_kick_count = F.int_range(1, 1_000_000_000)
_limit = F.int_range(1, L.page_limit_max)
_offset = F.int_range(0, 2**62)
_seq = F.int_range(0, 2**62)
_partition = F.int_range(0, L.partition_max)
_grace = F.int_range(0, L.ttl_ms_max)
_error_text = F.text(L.error_chars_max, empty=True)
_log_text = F.text(L.log_chars_max, empty=True)
_state = F.one_of(JOB_STATES)
_listed_state = F.one_of((*JOB_STATES, "prioritized"))  # bunqueue lists waiting jobs with a priority apart
_names = F.str_list(L.list_items_max, L.key_chars_max)

def _custom_id(name: str, v: Any) -> None:
    """A custom id (bunqueue's ``jobId``): it becomes the job's id, so it may not look like
    Shoal's own ids (``"3-17"``), which route by the partition they name."""
    _key(name, v)
    if F.is_shoal_id(v):
        raise F.bad(name, f"{v!r} has the form of Shoal's own job ids (partition-seq); choose another id")


def _progress_value(name: str, v: Any) -> None:
    """A progress: a number 0..100, or a map or list (bunqueue's object progress)."""
    kind = type(v)
    if kind is int or kind is float:
        if not 0 <= v <= 100:
            raise F.bad(name, "must be between 0 and 100")
        return
    if kind is dict or kind is list:
        F.data(name, v)
        return
    raise F.bad(name, "must be a number 0..100 or an object")


def _stack(name: str, v: Any) -> None:
    """A failure's stack trace: a list of strings (kept up to the job's ``stackTraceLimit``)."""
    if type(v) is not list or len(v) > L.stack_lines_max:
        raise F.bad(name, f"must be a list of at most {L.stack_lines_max} strings")
    for i, line in enumerate(v):
        if type(line) is not str or len(line) > L.error_chars_max:
            raise F.bad(f"{name}[{i}]", f"must be a string of at most {L.error_chars_max} characters")


_DLQ_FILTER_FIELDS: dict[str, Checker] = {
    "reason": F.one_of(("explicit_fail", "max_attempts_exceeded", "timeout", "stalled", "ttl_expired",
                        "worker_lost", "unknown")),
    "olderThan": F.int_range(0, 2**62), "newerThan": F.int_range(0, 2**62), "retriable": F.boolean,
    "expired": F.boolean, "limit": F.int_range(0, L.page_limit_max), "offset": F.int_range(0, 2**62),
}


def _dlq_filter(name: str, v: Any) -> None:
    """bunqueue's DLQ filter ``{reason?, olderThan?, newerThan?, retriable?, expired?, limit?, offset?}``."""
    F.fields_map(name, v, _DLQ_FILTER_FIELDS, "DLQ filter field")


def _bools(name: str, v: Any) -> None:
    if type(v) is not list or any(type(x) is not bool for x in v):
        raise F.bad(name, "must be a list of true/false")


_DEDUPE_FIELDS: dict[str, Checker] = {"id": _key, "ttlMs": F.int_range(1, L.ttl_ms_max), "extend": F.boolean,
                                      "replace": F.boolean}
_DEBOUNCE_FIELDS: dict[str, Checker] = {"id": _key, "delayMs": F.int_range(1, L.delay_ms_max),
                                        "maxWaitMs": F.int_range(1, L.delay_ms_max)}


def _dedupe(name: str, v: Any) -> None:
    """``{id, ttlMs, extend?, replace?}``."""
    F.fields_map(name, v, _DEDUPE_FIELDS, "dedupe field", required=("id", "ttlMs"))


def _debounce(name: str, v: Any) -> None:
    """``{id, delayMs, maxWaitMs?}``."""
    F.fields_map(name, v, _DEBOUNCE_FIELDS, "debounce field", required=("id", "delayMs"))


#: The characters of a ``traceContext`` key (what propagators name their fields with).
TRACE_CONTEXT_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def _trace_context(name: str, v: Any) -> None:
    """``{key: text}``: what a tracing propagator writes to carry the job's trace (W3C
    ``traceparent``, ``tracestate``, ``baggage``), kept with the job and returned with it."""
    if type(v) is not dict or not v:
        raise F.bad(name, "must be a non-empty map of text to text")
    if len(v) > L.trace_context_entries_max:
        raise F.bad(name, f"at most {L.trace_context_entries_max} entries, got {len(v)}")
    size = 0
    for key, value in v.items():
        if (type(key) is not str or not 1 <= len(key) <= L.trace_context_key_chars_max
                or not TRACE_CONTEXT_KEY_CHARS.issuperset(key)):
            raise F.bad(f"{name} key", f"must be 1..{L.trace_context_key_chars_max} characters of A-Z a-z 0-9 _ . -")
        if type(value) is not str:
            raise F.bad(f"{name}.{key}", "must be a string")
        size += len(key) + len(value)
    if size > L.trace_context_chars_max:
        raise F.bad(name, f"at most {L.trace_context_chars_max} characters of keys and values, got {size}")


#: Optional per-job fields of PUSH and of each PUSHB ``jobs`` item (after :func:`normalize`
#: turned bunqueue's names into these): ``name`` is the job's name, ``customId`` its id,
#: ``backoffType`` ``fixed`` or ``exponential`` (the default), ``removeOnComplete`` /
#: ``removeOnFail`` drop the job when it ends instead of keeping it, ``stackTraceLimit`` /
#: ``keepLogs`` cap what it keeps of failures' stack traces and of its log lines, ``traceContext``
#: carries the trace the job was added in (the client's OpenTelemetry hooks write and read it).
JOB_OPTION_FIELDS: Mapping[str, Checker] = MappingProxyType({
    "name": F.text(L.key_chars_max),
    "priority": _priority, "delay": _delay, "customId": _custom_id, "ttl": _ttl, "ttr": _ttr,
    "attempts": _attempts, "backoff": _backoff, "backoffType": F.one_of(("fixed", "exponential")),
    "group": _key, "tag": _key, "idempotencyKey": _key,
    "dedupe": _dedupe, "debounce": _debounce, "removeOnComplete": F.boolean, "removeOnFail": F.boolean,
    "stackTraceLimit": F.int_range(0, L.stack_lines_max), "keepLogs": F.int_range(0, L.log_lines_max),
    "traceContext": _trace_context,
    # bunqueue's group admission: refused QUEUE_FULL when the group holds this many jobs waiting or delayed
    "groupMaxSize": F.int_range(1, 2**53 - 1),
})
_JOB_ITEM_FIELDS: dict[str, Checker] = {"data": F.data, **JOB_OPTION_FIELDS}

_RATE_LIMIT_FIELDS: dict[str, Checker] = {"max": F.int_range(0, L.rate_max), "durationMs": F.int_range(1, L.ttl_ms_max)}


def _rate_limit(name: str, v: Any) -> None:
    """``{max, durationMs}``: at most ``max`` leases per sliding ``durationMs`` (``max`` 0: no limit)."""
    F.fields_map(name, v, _RATE_LIMIT_FIELDS, "limit field", required=("max", "durationMs"))


def _per_group(what: str, check: Checker) -> Checker:
    """A queue option mapping at most ``list_items_max`` groups to a ``what`` that ``check`` accepts."""
    def checker(name: str, v: Any) -> None:
        if type(v) is not dict:
            raise F.bad(name, f"must be a map of group to {what}")
        if len(v) > L.list_items_max:
            raise F.bad(name, f"at most {L.list_items_max} groups, got {len(v)}")
        for group, value in v.items():
            _key(f"{name} key", group)
            check(f"{name}.{group}", value)
    return checker


#: The largest share of turns ``groupWeights`` gives a group (the engine's fair turns are
#: exact to 1.4e-5 up to it, ``shoal.node.state._ready``).
_GROUP_WEIGHT_MAX = 1_000
#: ``{group: {max, durationMs}}``: per-group overrides of ``groupLimit``.
_group_limits = _per_group("{max, durationMs}", _rate_limit)
#: ``{group: weight}``: a group's share of the turns between groups (1 unless named).
_group_weights = _per_group("weight", F.int_range(1, _GROUP_WEIGHT_MAX))


_QUEUE_OPTION_FIELDS: dict[str, Checker] = {
    "ttr": _ttr, "ttl": _ttl, "capacity": F.int_range(1, 2**40), "discard": F.one_of(("reject",)),
    "maxDeliveries": F.int_range(1, 1_000_000), "attempts": _attempts, "backoff": _backoff,
    "historyMax": F.int_range(0, 10_000_000), "historyAgeMs": F.int_range(0, L.ttl_ms_max),
    "shards": F.int_range(1, 1024), "priority": _priority, "delay": _delay, "durable": F.boolean,
    "limit": _rate_limit, "groupLimit": _rate_limit, "groupLimits": _group_limits,
    "concurrency": F.int_range(0, L.concurrency_max),
    "groupConcurrency": F.int_range(0, L.concurrency_max), "groupWeights": _group_weights,
}


def _jobs(name: str, v: Any) -> None:
    if type(v) is not list or not v:
        raise F.bad(name, "must be a non-empty list of jobs")
    if len(v) > L.batch_jobs_max:
        raise F.bad(name, f"at most {L.batch_jobs_max} jobs per batch, got {len(v)}")
    data_max = L.data_bytes_max
    key_max = L.key_chars_max
    for i, job in enumerate(v):
        if type(job) is dict:
            # The common items, ``{"data": <raw>}`` from the node's decoder, with a name and a key
            # maybe (bunqueue's addBulk, a forwarding node): checked inline.
            d = job.get("data", job)
            if type(d) is Raw and len(d.packed) <= data_max:
                if len(job) == 1:
                    continue
                if job.keys() <= _PLAIN_JOB_KEYS:
                    job_name = job.get("name", "-")
                    key = job.get("idempotencyKey", "-")
                    if type(job_name) is str and type(key) is str and 0 < len(job_name) <= key_max \
                            and 0 < len(key) <= key_max:
                        continue
        F.fields_map(f"{name}[{i}]", job, _JOB_ITEM_FIELDS, "job field", required=("data",))


def _queue_options(name: str, v: Any) -> None:
    F.fields_map(name, v, _QUEUE_OPTION_FIELDS, "queue option")


# --- cross-field rules -----------------------------------------------------------------------

def _same_length_as_ids(frame: Mapping[str, Any]) -> None:
    n = len(frame["ids"])
    for name in ("results", "tokens"):
        v = frame.get(name)
        if v is not None and len(v) != n:
            raise F.bad(name, f"must have one entry per id ({n}), got {len(v)}")


def _one_schedule(frame: Mapping[str, Any]) -> None:
    if (frame.get("schedule") is None) == (frame.get("repeatEvery") is None):
        raise F.bad("schedule", "give exactly one of schedule (cron expression) or repeatEvery (ms)")


def _one_pull_filter(frame: Mapping[str, Any]) -> None:
    if frame.get("group") is not None and frame.get("ungrouped"):
        raise F.bad("ungrouped", "give group (one group's jobs) or ungrouped (jobs without a group), not both")


#: What a PULL/PULLB may be limited to: ``group``, that group's jobs only (bunqueue's
#: ``groupAffinity``); ``ungrouped: true``, jobs without a group only.
_PULL_FILTER: dict[str, Checker] = {"group": _key, "ungrouped": F.boolean}


# --- the table -------------------------------------------------------------------------------

def _spec(name: str, routing: Routing, required: Mapping[str, Checker] | None = None,
          optional: Mapping[str, Checker] | None = None, *, read: bool = False, retry: bool | None = None,
          check: Callable[[Mapping[str, Any]], None] | None = None, pre_auth: bool = False,
          long_poll: bool = False, new_jobs: bool = False, takes_space: bool = False) -> CommandSpec:
    fields = {k: Field(k, c, True) for k, c in (required or {}).items()}
    fields.update({k: Field(k, c, False) for k, c in (optional or {}).items()})
    return CommandSpec(name, routing, fields, read, read if retry is None else retry, check,
                       pre_auth=pre_auth, long_poll=long_poll, new_jobs=new_jobs, takes_space=takes_space)


_Q = {"queue": F.queue}
#: The most jobs a schedule may be limited to.
CRON_LIMIT_MAX = 2**40
#: What bunqueue's worker reports with its heartbeat (kept in the worker's record).
_WORKER_COUNTS = {"activeJobs": F.int_range(0, 2**53), "processed": F.int_range(0, 2**53),
                  "failed": F.int_range(0, 2**53)}
_ID = {"id": F.job_id}
_TOK = {"token": F.lease_token}

_SPECS = [
    # core job commands
    _spec("PUSH", "queue", {"queue": F.queue, "data": F.data}, {**JOB_OPTION_FIELDS, "waitMs": _timeout},
          retry=True, new_jobs=True, takes_space=True),  # retried under its idempotencyKey, which the client always sets
    _spec("PUSHB", "queue", {"queue": F.queue, "jobs": _jobs}, retry=True, new_jobs=True, takes_space=True),
    _spec("PULL", "queue", _Q, {"timeout": _timeout, "ttr": _ttr, "detach": F.boolean, "owner": _key,
                                 **_PULL_FILTER}, check=_one_pull_filter, long_poll=True),
    _spec("PULLB", "queue", {"queue": F.queue, "count": _count}, {"timeout": _timeout, "ttr": _ttr,
                                                                  "detach": F.boolean, "owner": _key,
                                                                  **_PULL_FILTER},
          check=_one_pull_filter, long_poll=True),
    _spec("ACK", "id", _ID, {"result": F.data, "removeOnComplete": F.boolean, **_TOK}),
    _spec("ACKB", "id", {"ids": F.ids}, {"results": F.results, "tokens": F.tokens, "removeOnCompletes": _bools},
          check=_same_length_as_ids),
    _spec("FAIL", "id", _ID, {"error": _error_text, "delay": _delay, "stack": _stack, "unrecoverable": F.boolean,
                              "removeOnFail": F.boolean, **_TOK}),
    # lease and tarantool models
    _spec("Release", "id", _ID, {"delay": _delay, **_TOK}),
    _spec("Bury", "id", _ID, {"error": _error_text, **_TOK}),
    _spec("Kick", "queue", {"queue": F.queue, "count": _kick_count}),
    _spec("Touch", "id", {"id": F.job_id, "ttr": _ttr}, _TOK, retry=True),
    _spec("JobHeartbeat", "id", _ID, {"ttr": _ttr, **_TOK}, retry=True),
    _spec("JobHeartbeatB", "id", {"ids": F.ids}, {"tokens": F.tokens, "ttr": _ttr}, retry=True,
          check=_same_length_as_ids),
    _spec("ReleaseAll", "queue", _Q, retry=True),
    _spec("CreateQueue", "queue", _Q, {"type": F.one_of(QUEUE_TYPES), "options": _queue_options}, retry=True,
          takes_space=True),
    _spec("UpdateQueue", "queue", {"queue": F.queue, "options": _queue_options}, {"create": F.boolean},
          retry=True),
    _spec("Read", "queue", {"queue": F.queue, "fromSeq": _seq}, {"limit": _limit}, read=True),
    _spec("Truncate", "queue", _Q, {"beforeSeq": _seq, "tag": _key}),
    # queries
    _spec("GetJob", "id", _ID, read=True),
    _spec("GetJobByCustomId", "queue", {"queue": F.queue, "customId": _key}, read=True),
    _spec("GetState", "id", _ID, read=True),
    _spec("GetResult", "id", _ID, read=True),
    _spec("GetJobs", "queue", _Q, {"state": _listed_state, "offset": _offset, "limit": _limit, "tag": _key,
                                   "asc": F.boolean, "afterSeq": _seq}, read=True),
    _spec("GetJobCounts", "queue", _Q, read=True),
    _spec("GetCountsPerPriority", "queue", _Q, read=True),
    _spec("GetProgress", "id", _ID, read=True),
    _spec("Count", "queue", _Q, {"state": _listed_state}, read=True),
    _spec("GetQueueLimits", "queue", _Q, read=True),
    _spec("Locate", "partition", {"id": F.job_id}, {"partition": _partition}, read=True),
    # control
    _spec("Pause", "queue", _Q, retry=True),
    _spec("Resume", "queue", _Q, retry=True),
    _spec("IsPaused", "queue", _Q, read=True),
    _spec("Drain", "queue", _Q),
    _spec("Obliterate", "queue", _Q, retry=True),
    _spec("Clean", "queue", {"queue": F.queue, "grace": _grace}, {"state": _state, "limit": _limit}),
    _spec("Cancel", "id", _ID, {"by": _key}),
    _spec("Promote", "id", _ID),
    _spec("PromoteJobs", "queue", _Q, {"count": F.int_range(1, 2**40)}),
    _spec("MoveToDelayed", "id", {"id": F.job_id, "delay": _delay}, _TOK),
    _spec("Progress", "id", {"id": F.job_id, "progress": _progress_value}, {"message": _log_text, **_TOK},
          retry=True, takes_space=True),
    _spec("ChangePriority", "id", {"id": F.job_id, "priority": _priority}, retry=True),
    _spec("Update", "id", {"id": F.job_id, "data": F.data}, retry=True, takes_space=True),
    _spec("ClearLogs", "id", _ID, {"keepLogs": F.int_range(0, L.log_lines_max)}, retry=True),
    _spec("ListQueues", "partition", {}, {"partition": _partition, "after": F.text(L.queue_name_chars_max + 8),
                                          "limit": _limit}, read=True),
    # dead-letter queue
    _spec("Dlq", "queue", _Q, {"limit": _limit, "filter": _dlq_filter}, read=True),
    _spec("GetDlqStats", "queue", _Q, read=True),
    _spec("RetryDlq", "queue", _Q, {"id": F.job_id, "filter": _dlq_filter}),
    _spec("RetryCompleted", "queue", _Q, {"id": F.job_id}),
    _spec("PurgeDlq", "queue", _Q),
    # cron
    _spec("Cron", "queue", {"name": _key, "queue": F.queue},
          {"data": F.data, "schedule": F.cron_schedule, "repeatEvery": F.int_range(1, L.delay_ms_max),
           "priority": _priority, "limit": F.int_range(1, CRON_LIMIT_MAX), "jobName": _key,
           "immediately": F.boolean, "afterCompletion": F.boolean}, retry=True,
          check=_one_schedule, takes_space=True),
    _spec("CronGet", "partition", {"name": _key}, {"partition": _partition}, read=True),
    _spec("CronDelete", "partition", {"name": _key}, {"partition": _partition}, retry=True),
    _spec("CronList", "partition", {}, {"partition": _partition, "limit": _limit}, read=True),
    # monitoring
    _spec("Stats", "partition", {}, {"partition": _partition, "local": F.boolean}, read=True),
    _spec("Metrics", "queue", _Q, read=True),
    _spec("Prometheus", "node", read=True),
    _spec("Ping", "node", read=True, pre_auth=True),
    _spec("Heartbeat", "node", {"workerId": _key}, _WORKER_COUNTS, retry=True),
    _spec("AddLog", "id", {"id": F.job_id, "message": _log_text}, takes_space=True),
    _spec("GetLogs", "id", _ID, {"limit": _limit, "start": _offset, "end": _offset}, read=True),
    _spec("RegisterWorker", "node", {}, {"name": _key, "queues": _names, "workerId": _key,
                                        "concurrency": F.int_range(0, L.concurrency_max), "hostname": _key,
                                        "pid": F.int_range(0, 2**31), "startedAt": F.int_range(0, 2**53)},
          retry=True),
    _spec("UnregisterWorker", "node", {"workerId": _key}, retry=True),
    _spec("ListWorkers", "node", read=True),
    # connection
    _spec("Hello", "node", {"protocolVersion": F.int_range(1, 1000)}, {"capabilities": _names}, read=True,
          pre_auth=True),
    _spec("Auth", "node", {"token": F.text(L.auth_token_chars_max)}, read=True, pre_auth=True),
    _spec("Identify", "node", {}, {"session": _key}, read=True),
    _spec("Subscribe", "node", {}, {"queue": F.queue, "events": _names}, read=True),
    _spec("SubscribeEvents", "node", {"queue": F.queue}, read=True),  # bunqueue's job events of one queue
    # flows (cluster/flow.py): PushFlow is coordinated by the node that receives it
    _spec("PushFlow", "node", {"parent": _flow.parent_checker(JOB_OPTION_FIELDS),
                               "children": _flow.children_checker(JOB_OPTION_FIELDS)},
          {"idempotencyKey": F.text(_flow.FLOW_KEY_CHARS_MAX)}, retry=True, new_jobs=True, takes_space=True),  # with its key (client/_core.py)
    _spec("GetChildrenValues", "id", _ID, read=True),
    # internal: proposed by the leader itself, never accepted from a client
    _spec("_Tick", "partition"),
    _spec("_ReleaseSession", "partition", {"session": _key}),
    # a flow's jobs of one queue (``_items``), a child's final outcome for its parent's
    # partition (``_reports``), and the end of a child's retries (``_children``)
    _spec("_FlowPush", "queue", {"queue": F.queue}, takes_space=True),
    _spec("_ChildDone", "partition", {"partition": _partition}),
    _spec("_FlowAcked", "partition", {"partition": _partition}),
]

_BY_NAME: dict[str, CommandSpec] = {s.name: s for s in _SPECS}
COMMANDS: Mapping[str, CommandSpec] = MappingProxyType(_BY_NAME)
#: Answered by the connected node itself (connection, workers, Prometheus).
NODE_COMMANDS = frozenset(s.name for s in _SPECS if s.routing == "node")
#: Routed to a partition leader and answered from its applied state, without Raft.
READ_COMMANDS = frozenset(s.name for s in _SPECS if s.read_only and s.routing != "node")
#: Routed to a partition leader and replicated through its Raft group.
WRITE_COMMANDS = frozenset(s.name for s in _SPECS if not s.read_only and s.routing != "node")
#: Answered before the connection authenticated.
PRE_AUTH_COMMANDS = frozenset(s.name for s in _SPECS if s.pre_auth)
#: May wait for jobs to become ready (long polls).
LONG_POLL_COMMANDS = frozenset(s.name for s in _SPECS if s.long_poll)
#: Add jobs: refused with OVERLOADED while the node is over its memory budget.
NEW_JOB_COMMANDS = frozenset(s.name for s in _SPECS if s.new_jobs)
#: Bring new data into a partition: refused with NO_SPACE while its disk is nearly full.
SPACE_TAKING_COMMANDS = frozenset(s.name for s in _SPECS if s.takes_space)
#: Proposed by the leader only (``validate(..., internal=True)``).
INTERNAL_COMMANDS = frozenset(s.name for s in _SPECS if s.name.startswith("_"))
_ENVELOPE = frozenset({"cmd", "reqId"})


def validate(frame: dict[str, Any], *, internal: bool = False) -> dict[str, Any]:
    """Check ``frame`` against its command's spec and return it unchanged.

    Raises ``CommandError(UNKNOWN_COMMAND)`` for a command that does not exist
    (or is internal and ``internal`` is false) and ``CommandError(INVALID,
    "<field>: <reason>")`` otherwise. ``data`` may be a :class:`~shoal.cluster.codec.Raw`.
    With ``internal``, fields starting with ``_`` (stamped by the node) pass unchecked.
    """
    name = frame.get("cmd")
    spec = _BY_NAME.get(name) if type(name) is str else None
    if spec is None or (not internal and name[0] == "_"):
        raise CommandError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {name!r} (the commands Shoal "
                                                      "answers are listed in docs/commands.md and docs/compat.md)")
    checks = spec.checks
    # One pass over the frame: each key is a field, the envelope, or a mistake.
    for key, value in frame.items():
        check = checks.get(key)
        if check is not None:
            # null = "not given" for an optional field; a required one checks it (data may be nil).
            if value is not None or key in spec.required:
                check(key, value)
        elif key not in _ENVELOPE and not (internal and type(key) is str and key[:1] == "_"):
            raise F.bad(str(key), f"unknown field for {name}")
    for key in spec.required:
        if key not in frame:
            raise F.bad(key, "required")
    if spec.check is not None:
        spec.check(frame)
    return frame


def routing_of(cmd_name: str) -> Routing:
    """How ``cmd_name`` is routed: ``queue``, ``id``, ``partition`` or ``node``."""
    spec = COMMANDS.get(cmd_name)
    if spec is None:
        raise CommandError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {cmd_name!r}")
    return spec.routing


def route_key(frame: Mapping[str, Any]) -> str | int | None:
    """What routes ``frame``: its queue name (``queue``), its job id's partition
    (``id``), its optional ``partition`` field (``partition``), or ``None`` (``node``, and a
    custom job id: any node finds the partition of its queue).

    Call it on a validated frame.
    """
    routing = routing_of(frame["cmd"])
    if routing == "queue":
        return frame.get("queue")
    if routing == "id":
        job_id = frame.get("id")
        if job_id is None:
            ids = frame.get("ids")
            if not ids:
                return None
            job_id = ids[0]
        if not F.is_shoal_id(job_id):
            return None
        return parse_job_id(job_id)[0]
    if routing == "partition":
        return frame.get("partition")
    return None


# --- bunqueue's names ----------------------------------------------------------------------------
#
# bunqueue's client (npm ``bunqueue``) names some fields and commands differently, sends
# ``undefined`` (decoded as None: not given) for options it leaves unset, and has options
# Shoal stores under other names. :func:`normalize` rewrites a frame in place into the schema
# above before it is validated; an option Shoal cannot honour is refused with ``INVALID``
# naming it (docs/compat.md lists them), never dropped.

#: bunqueue command -> the schema's command of the same meaning (fields renamed by ``normalize``).
COMMAND_ALIASES: Mapping[str, str] = MappingProxyType({
    "ExtendLock": "Touch", "ChangeDelay": "MoveToDelayed", "MoveToWait": "Release",
    "RemoveDlqJob": "Cancel",
    "SetConcurrency": "UpdateQueue", "ClearConcurrency": "UpdateQueue",
    "RateLimit": "UpdateQueue", "RateLimitClear": "UpdateQueue",
})
#: Job option -> the schema's name for it.
_JOB_RENAMES = {"maxAttempts": "attempts", "jobId": "customId", "groupId": "group"}
#: bunqueue job options accepted only at their "off" value (false, 0, an empty list).
_OFF_ONLY = ("lifo", "failParentOnFailure", "removeDependencyOnFailure", "continueParentOnFailure",
             "ignoreDependencyOnFailure", "dependsOn", "childrenIds")
#: bunqueue job options that Shoal has no counterpart for: refused when set.
_UNSUPPORTED_JOB = {
    "repeat": "a repeating job is added alone (a PUSH of its own), not in a bulk add or a flow",
    "timestamp": "a job's creation time is the leader's clock",
    "parentId": "children are created with their parent by a flow (PUSHF / FlowProducer)",
    "sizeLimit": "job data is limited to 10 MiB on every queue",
}


#: A PUSHB item with only these keys is in the schema's names already.
_PLAIN_JOB_KEYS = frozenset({"data", "name", "idempotencyKey"})
#: A PUSHB whose items hold only these keys needs no renaming at all (no key that may be nil).
_UNNAMED_JOB_KEYS = frozenset({"data", "name"})


def _normalize_job(where: str, job: dict[str, Any]) -> None:
    """One job's options (PUSH, a PUSHB item, a flow job) in the schema's names, in place."""
    for old, new in _JOB_RENAMES.items():
        if old in job:
            value = job.pop(old)
            if value is not None:
                if job.get(new) is not None and job[new] != value:
                    raise F.bad(f"{where}{old}", f"given together with {new}")
                job[new] = value
    for name in _OFF_ONLY:
        if name in job:
            value = job.pop(name)
            if value:
                raise F.bad(f"{where}{name}", "is not supported (see docs/compat.md)")
    for name, why in _UNSUPPORTED_JOB.items():
        if name in job and job.pop(name) is not None:
            raise F.bad(f"{where}{name}", f"is not supported: {why}")
    if job.get("groupMaxSize") is not None and job.get("group") is None:
        raise F.bad(f"{where}groupMaxSize", "limits a group: give it with group (groupId)")
    for name in ("removeOnComplete", "removeOnFail"):
        if name in job and not job[name]:
            del job[name]  # false is the default: the plain form keeps its fast path
    if "durable" in job:
        value = job.pop("durable")  # every add is durable; the queue's class says how
        if value is not None and type(value) is not bool:
            raise F.bad(f"{where}durable", "must be true or false")
    for name in ("timeout", "stallTimeout"):
        # A job's processing time: the lease a pull gives it (a lapsed lease is retried).
        if name in job:
            value = job.pop(name)
            if value is not None:
                _ttr(f"{where}{name}", value)
                job.setdefault("ttr", value)
    backoff = job.get("backoff")
    if type(backoff) is dict:
        F.fields_map(f"{where}backoff", backoff, {"type": F.one_of(("fixed", "exponential")),
                                                  "delay": _backoff}, "backoff field", required=("delay",))
        job["backoff"] = backoff["delay"]
        if backoff.get("type") is not None:
            job["backoffType"] = backoff["type"]
    tags = job.pop("tags", None)
    if tags is not None:
        if type(tags) is not list or len(tags) > 1:
            raise F.bad(f"{where}tags", "at most one tag per job (Shoal's tag)")
        if tags:
            job["tag"] = tags[0]
    unique = job.pop("uniqueKey", None)
    dedup = job.pop("dedup", None)
    if unique is not None:
        spec = dedup if type(dedup) is dict else {}
        entry = {"id": unique, "ttlMs": spec.get("ttl") or L.ttl_ms_max}
        for flag in ("extend", "replace"):
            if spec.get(flag) is not None:
                entry[flag] = spec[flag]
        job["dedupe"] = entry
    elif dedup is not None:
        raise F.bad(f"{where}dedup", "needs uniqueKey (the deduplication id)")
    debounce_id = job.pop("debounceId", None)
    debounce_ttl = job.pop("debounceTtl", None)
    if debounce_id is not None:
        if debounce_ttl is None:
            raise F.bad(f"{where}debounceTtl", "required with debounceId")
        job["debounce"] = {"id": debounce_id, "delayMs": debounce_ttl}
    for name in [k for k, v in job.items() if v is None]:
        del job[name]  # sent as undefined: not given


def normalize(frame: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a bunqueue frame into the schema's names (in place, and returned).

    Frames already in the schema's names pass unchanged (only keys that are bunqueue's
    are touched), so Shoal's own client and bunqueue's share one path.
    """
    cmd = frame.get("cmd")
    alias = COMMAND_ALIASES.get(cmd) if type(cmd) is str else None
    if alias is not None:
        _alias(frame, cmd, alias)
        cmd = alias
    if cmd == "PUSH":
        repeat = frame.pop("repeat", None)
        _normalize_job("", frame)
        if repeat is not None:
            _repeat_as_cron(frame, repeat)
    elif cmd == "PUSHB":
        jobs = frame.get("jobs")
        # (items with data and names only, the bulk add and bunqueue's addBulk, seen in C)
        if type(jobs) is list and not ((fields := item_fields(jobs)) is not None and fields <= _UNNAMED_JOB_KEYS):
            for i, job in enumerate(jobs):
                # Only data, a name and a key (what bunqueue's addBulk and a forwarding node send):
                # nothing to rename.
                if type(job) is dict and not (job.keys() <= _PLAIN_JOB_KEYS
                                              and job.get("idempotencyKey", "") is not None):
                    _normalize_job(f"jobs[{i}].", job)
    elif cmd in ("PULL", "PULLB"):
        ttl = frame.pop("lockTtl", None)
        if ttl is not None:
            _ttr("lockTtl", ttl)
            frame.setdefault("ttr", ttl)
        if type(frame.get("group")) is dict:
            _pull_group(frame, frame.pop("group"))
    elif cmd in ("ACKB", "JobHeartbeatB"):
        tokens = frame.get("tokens")
        if type(tokens) is list and "" in tokens:
            # A worker without locks sends "" for "no token": it acks without a lease check.
            frame["tokens"] = [None if t == "" else t for t in tokens]
        if frame.get("removeOnCompletes") is not None and not any(frame["removeOnCompletes"]):
            del frame["removeOnCompletes"]
    elif cmd in ("ACK", "FAIL", "JobHeartbeat", "Touch", "Progress", "MoveToDelayed", "Release"):
        if frame.get("token") == "":
            del frame["token"]
        if cmd == "JobHeartbeat" and "duration" in frame:
            frame["ttr"] = frame.pop("duration")
    elif cmd in ("RetryDlq", "RetryCompleted"):
        if "jobId" in frame:
            job_id = frame.pop("jobId")
            if job_id is not None:
                frame["id"] = job_id
    elif cmd in ("Dlq", "RetryDlq"):
        spec = frame.get("filter")
        if type(spec) is dict:
            for key in [k for k, v in spec.items() if v is None]:
                del spec[key]
            for key in ("olderThan", "newerThan"):  # JavaScript numbers: whole milliseconds
                if type(spec.get(key)) is float and spec[key].is_integer():
                    spec[key] = int(spec[key])
        count = frame.pop("count", None)
        if count is not None:
            frame.setdefault("limit", count)
    elif cmd == "Clean":
        if frame.get("state") == "wait":
            frame["state"] = "waiting"
    elif cmd == "Cron":
        _normalize_cron(frame)
    elif cmd == "GetQueueLimits":
        frame.pop("maxJobs", None)
    elif cmd == "Heartbeat":
        if "workerId" not in frame and "id" in frame:  # bunqueue's worker names itself ``id``
            frame["workerId"] = frame.pop("id")
    elif cmd == "ChangePriority":
        if frame.pop("lifo", None):
            raise F.bad("lifo", "is not supported (see docs/compat.md)")
    for name in [k for k, v in frame.items() if v is None and k not in ("data", "result")]:
        del frame[name]  # sent as undefined: not given
    return frame


#: The fields of bunqueue's ``group`` pull options (its ``validateGroupPullOptions``).
_PULL_GROUP_FIELDS = ("affinity", "concurrency", "limit")


def _pull_group(frame: dict[str, Any], spec: dict[str, Any]) -> None:
    """bunqueue's pull options ``group: {affinity?, concurrency?, limit?}`` as Shoal's fields:
    ``affinity`` a group's name takes that group's jobs only (``group``), ``affinity: null``
    only jobs without a group (``ungrouped``). Its per-pull group concurrency and rate limit
    (WorkerPro's ``group`` option) are refused: Shoal keeps a group's limits with its queue."""
    for name in spec:
        if name not in _PULL_GROUP_FIELDS:
            raise F.bad(f"group.{name}", "unknown field of a pull's group options (affinity, concurrency, limit)")
    for name, option in (("concurrency", "groupConcurrency"), ("limit", "groupLimit")):
        if spec.get(name) is not None:
            raise F.bad(f"group.{name}", f"a pull's own group limits are not supported: set the queue option "
                                         f"{option} (see docs/compat.md)")
    if "affinity" in spec:
        affinity = spec["affinity"]
        if affinity is None:
            frame["ungrouped"] = True
        else:
            frame["group"] = affinity  # checked as a job's group is


def _alias(frame: dict[str, Any], cmd: str, alias: str) -> None:
    frame["cmd"] = alias
    if cmd == "ExtendLock":
        frame["ttr"] = frame.pop("duration", None)
    elif cmd == "RemoveDlqJob":
        frame["id"] = frame.pop("jobId", frame.get("id"))
        frame.pop("queue", None)
    elif cmd == "SetConcurrency":
        frame["options"] = {"concurrency": frame.pop("limit", None)}
        frame["create"] = True
    elif cmd == "ClearConcurrency":
        frame["options"] = {"concurrency": 0}
        frame["create"] = True
    elif cmd == "RateLimit":
        limit, duration = frame.pop("limit", None), frame.pop("duration", None)
        frame["options"] = {"limit": {"max": limit, "durationMs": duration or 1000}}
        frame["create"] = True
    elif cmd == "RateLimitClear":
        frame["options"] = {"limit": {"max": 0, "durationMs": 1000}}
        frame["create"] = True


#: bunqueue Cron fields Shoal accepts only unset (or false).
_CRON_OFF_ONLY = ("skipMissedOnRestart", "skipIfNoWorker", "preventOverlap", "uniqueKey", "dedup")


def _normalize_cron(frame: dict[str, Any]) -> None:
    limit = frame.pop("maxLimit", None)
    if limit is not None:
        frame.setdefault("limit", limit)
    tz = frame.pop("timezone", None)
    if tz is not None and tz not in ("UTC", "Etc/UTC"):
        raise F.bad("timezone", "schedules run in UTC here (see docs/compat.md)")
    for name in _CRON_OFF_ONLY:
        if frame.pop(name, None):
            raise F.bad(name, "is not supported (see docs/compat.md)")
    options = frame.pop("jobOptions", None)
    if options:
        if type(options) is not dict:
            raise F.bad("jobOptions", "must be a map")
        for key, value in options.items():
            if value is None:
                continue
            if key == "priority":
                frame.setdefault("priority", value)
            else:
                raise F.bad(f"jobOptions.{key}", "is not supported for scheduled jobs (see docs/compat.md)")


# --- bunqueue's legacy ``repeat`` -------------------------------------------------------------------
#
# ``add(name, data, {repeat: {every | pattern, limit}})`` runs the job now and again every
# ``every`` ms (or at each time of ``pattern``), ``limit`` more times (bunqueue's server runs
# ``limit + 1`` jobs in all), each once the one before completed (a failed one ends them).
# Here it is a job scheduler: a Cron of its own, named ``repeat:<random id>``, that makes its
# first job at once (``immediately``) and each next one at the first time of its schedule
# after the one before completed (``afterCompletion``); the add is answered with the first
# job's id. docs/compat.md lists what differs.

#: Fields of ``repeat`` that Shoal's schedules have no counterpart for: refused when set.
_REPEAT_UNSUPPORTED = {
    "startDate": "a repeating job starts when it is added",
    "endDate": "a repeating job ends after its limit, or when its scheduler is removed",
    "offset": "runs are not shifted",
    "prevMillis": "runs are counted by the scheduler",
}
#: Job fields (after :func:`_normalize_job`) a repeating add may carry: a schedule's jobs
#: carry a name, data and a priority.
_REPEAT_JOB_FIELDS = frozenset({"cmd", "queue", "data", "name", "priority", "reqId"})


def _whole_ms(where: str, v: Any) -> int:
    """A JavaScript number of milliseconds as an integer (an integral float is one)."""
    if type(v) is float and v.is_integer():
        return int(v)
    if type(v) is not int:
        raise F.bad(where, "must be a whole number of milliseconds")
    return v


def _repeat_as_cron(frame: dict[str, Any], repeat: Any) -> None:
    """Turn a PUSH with ``repeat`` into the Cron that makes its jobs (in place)."""
    if type(repeat) is not dict:
        raise F.bad("repeat", "must be a map {every | pattern, limit?}")
    spec = {k: v for k, v in repeat.items() if v is not None}
    for key in spec:
        if key in _REPEAT_UNSUPPORTED:
            raise F.bad(f"repeat.{key}", f"is not supported: {_REPEAT_UNSUPPORTED[key]} (see docs/compat.md)")
        if key not in ("every", "pattern", "limit", "count", "tz", "immediately", "jobId"):
            raise F.bad(f"repeat.{key}", "unknown repeat field")
    if "customId" in frame:
        raise F.bad("jobId", "a repeating job cannot take a jobId (repeat.jobId names it)")
    for key in frame:
        if key not in _REPEAT_JOB_FIELDS:
            raise F.bad(key, "is not supported with repeat: a repeating add is a job scheduler here, whose jobs "
                             "carry a name, data and a priority (see docs/compat.md)")
    tz = spec.get("tz")
    if tz is not None and tz not in ("UTC", "Etc/UTC"):
        raise F.bad("repeat.tz", "schedules run in UTC here (see docs/compat.md)")
    if "immediately" in spec:
        F.boolean("repeat.immediately", spec["immediately"])  # the first job runs at once anyway
    if "jobId" in spec:
        _key("repeat.jobId", spec["jobId"])  # kept by bunqueue with the job, used by nothing
    pattern = spec.get("pattern")
    if type(pattern) is str and not pattern.strip():
        pattern = None  # bunqueue's server reads a blank pattern as none
    if ("every" in spec) == (pattern is not None):
        raise F.bad("repeat", "give exactly one of every and pattern")
    cron: dict[str, Any] = {"cmd": "Cron", "queue": frame.get("queue"), "name": f"repeat:{uuid.uuid4().hex}",
                            "data": frame.get("data"), "immediately": True, "afterCompletion": True}
    if pattern is not None:
        cron["schedule"] = _seconds_last(pattern)
    else:
        cron["repeatEvery"] = _whole_ms("repeat.every", spec["every"])
    if "limit" in spec:
        limit = _whole_ms("repeat.limit", spec["limit"])
        count = _whole_ms("repeat.count", spec.get("count", 0))
        F.int_range(0, CRON_LIMIT_MAX - 1)("repeat.limit", limit)
        F.int_range(0, CRON_LIMIT_MAX - 1)("repeat.count", count)
        cron["limit"] = max(limit - count, 0) + 1  # the job added now, then ``limit - count`` more
    for key in ("priority", "reqId"):
        if key in frame:
            cron[key] = frame[key]
    if frame.get("name") is not None:
        cron["jobName"] = frame["name"]
    frame.clear()
    frame.update(cron)


def _seconds_last(pattern: Any) -> Any:
    """bunqueue's six-field pattern (seconds first) in croniter's order (seconds last)."""
    if type(pattern) is not str:
        return pattern  # the schema names what is wrong with it
    fields = pattern.split()
    return " ".join([*fields[1:], fields[0]]) if len(fields) == 6 else pattern
