"""Hypothesis strategies for valid requests of every command (shared by the codec and command tests).

Values are drawn per wire field name; a field name means the same thing in
every command that has it, which ``test_every_generated_frame_validates``
checks against the schema itself.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from shoal.cluster import limits as L
from shoal.cluster._fields import is_shoal_id
from shoal.cluster.commands import COMMANDS, JOB_STATES, QUEUE_TYPES

QUEUE_ALPHABET = "abcXYZ019_.:-"

queue_names = st.text(QUEUE_ALPHABET, min_size=1, max_size=40)
keys = st.text(min_size=1, max_size=40)
job_ids = st.builds(lambda p, s: f"{p}-{s}", st.integers(0, 1023), st.integers(0, 2**53))
lease_tokens = st.one_of(st.text(min_size=1, max_size=32), st.integers(0, 2**63 - 1))

# Any MessagePack value that round-trips to an equal Python value (no NaN, no tuples).
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False), st.text(max_size=30), st.binary(max_size=30),
)
msgpack_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)

_JOB_OPTIONS = {
    "priority": st.integers(L.priority_min, L.priority_max),
    "delay": st.integers(0, L.delay_ms_max),
    "customId": keys.filter(lambda k: not is_shoal_id(k)), "idempotencyKey": keys, "group": keys, "tag": keys,
    "name": keys, "backoffType": st.sampled_from(["fixed", "exponential"]),
    "removeOnComplete": st.booleans(), "removeOnFail": st.booleans(),
    "stackTraceLimit": st.integers(0, L.stack_lines_max), "keepLogs": st.integers(0, L.log_lines_max),
    "traceContext": st.dictionaries(st.sampled_from(["traceparent", "tracestate", "baggage"]), st.text(max_size=60),
                                    min_size=1, max_size=3),
    "ttl": st.integers(0, L.ttl_ms_max),
    "ttr": st.integers(L.ttr_ms_min, L.ttr_ms_max),
    "attempts": st.integers(L.attempts_min, L.attempts_max),
    "backoff": st.integers(0, L.backoff_ms_max),
    "dedupe": st.fixed_dictionaries({"id": keys, "ttlMs": st.integers(1, L.ttl_ms_max)},
                                    optional={"extend": st.booleans(), "replace": st.booleans()}),
    "debounce": st.fixed_dictionaries({"id": keys, "delayMs": st.integers(1, L.delay_ms_max)},
                                      optional={"maxWaitMs": st.integers(1, L.delay_ms_max)}),
}


@st.composite
def _optional_map(draw: Any, options: dict[str, st.SearchStrategy[Any]], base: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for name, strategy in options.items():
        if draw(st.booleans()):
            out[name] = draw(strategy)
    return out


jobs_items = st.lists(_optional_map(_JOB_OPTIONS, {}).flatmap(
    lambda opts: msgpack_values.map(lambda d: {"data": d, **opts})), min_size=1, max_size=4)

_QUEUE_OPTIONS = {
    "ttr": _JOB_OPTIONS["ttr"], "ttl": _JOB_OPTIONS["ttl"], "capacity": st.integers(1, 2**40),
    "discard": st.just("reject"), "maxDeliveries": st.integers(1, 1_000_000),
    "attempts": _JOB_OPTIONS["attempts"], "backoff": _JOB_OPTIONS["backoff"],
    "historyMax": st.integers(0, 10_000_000), "historyAgeMs": st.integers(0, L.ttl_ms_max),
    "shards": st.integers(1, 1024),
    "limit": st.fixed_dictionaries({"max": st.integers(0, L.rate_max), "durationMs": st.integers(1, L.ttl_ms_max)}),
    "concurrency": st.integers(0, L.concurrency_max),
}

FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    **_JOB_OPTIONS,
    "queue": queue_names,
    "after": queue_names,
    "data": msgpack_values,
    "result": msgpack_values,
    "timeout": st.integers(0, L.timeout_ms_max),
    "waitMs": st.integers(0, L.timeout_ms_max),
    "jobs": jobs_items,
    "owner": keys, "jobName": keys, "create": st.booleans(), "asc": st.booleans(),
    "groupMaxSize": st.integers(1, 2**53 - 1),
    "immediately": st.booleans(), "afterCompletion": st.booleans(),
    "start": st.integers(0, 2**62), "end": st.integers(0, 2**62),
    "stack": st.lists(st.text(max_size=20), max_size=5), "unrecoverable": st.booleans(),
    "filter": st.fixed_dictionaries({}, optional={"reason": st.just("stalled"), "limit": st.integers(0, 9)}),
    "count": st.integers(1, L.pull_count_max),
    "id": job_ids,
    "token": lease_tokens,
    "error": st.text(max_size=50),
    "message": st.text(max_size=50),
    "type": st.sampled_from(QUEUE_TYPES),
    "options": _optional_map(_QUEUE_OPTIONS, {}),
    "fromSeq": st.integers(0, 2**62), "beforeSeq": st.integers(0, 2**62), "afterSeq": st.integers(0, 2**62),
    "limit": st.integers(1, L.page_limit_max),
    "offset": st.integers(0, 2**62),
    "state": st.sampled_from(JOB_STATES),
    "grace": st.integers(0, L.ttl_ms_max),
    "progress": st.integers(0, 100),
    "partition": st.integers(0, L.partition_max),
    "name": keys, "workerId": keys, "session": keys, "by": keys,
    "schedule": st.sampled_from(["* * * * *", "*/5 * * * *", "0 3 * * 1-5"]),
    "repeatEvery": st.integers(1, L.delay_ms_max),
    "local": st.booleans(),
    "detach": st.booleans(), "ungrouped": st.booleans(),
    "queues": st.lists(keys, max_size=5),
    "capabilities": st.lists(st.sampled_from(["pipelining", "events"]), max_size=2),
    "events": st.lists(st.sampled_from(["job:*", "queue:*", "stats:snapshot"]), max_size=3),
    "hostname": keys, "pid": st.integers(0, 2**31), "startedAt": st.integers(0, 2**53),
    "concurrency": st.integers(0, L.concurrency_max),
    "activeJobs": st.integers(0, 2**53), "processed": st.integers(0, 2**53), "failed": st.integers(0, 2**53),
    "protocolVersion": st.integers(1, 2),
}
# PushFlow: a parent and a small tree of children (cluster/flow.py)
_flow_job = st.fixed_dictionaries({"queue": queue_names, "data": msgpack_values},
                                  optional={"priority": _JOB_OPTIONS["priority"], "tag": keys})
FIELD_VALUES["parent"] = _flow_job
FIELD_VALUES["children"] = st.lists(
    st.builds(lambda job, policy, subs: {**job, **({"onFailure": policy} if policy else {}),
                                         **({"children": subs} if subs else {})},
              _flow_job, st.sampled_from([None, "fail", "ignore", "remove"]),
              st.lists(_flow_job, max_size=2)), min_size=1, max_size=3)


@st.composite
def _ackb(draw: Any, frame: dict[str, Any]) -> dict[str, Any]:
    """ACKB: ids of one partition; results/tokens one per id."""
    p = draw(st.integers(0, 1023))
    seqs = draw(st.lists(st.integers(0, 2**40), min_size=1, max_size=5))
    frame["ids"] = [f"{p}-{s}" for s in seqs]
    if draw(st.booleans()):
        frame["results"] = draw(st.lists(msgpack_values, min_size=len(seqs), max_size=len(seqs)))
    if draw(st.booleans()):
        frame["tokens"] = draw(st.lists(st.one_of(st.none(), lease_tokens), min_size=len(seqs), max_size=len(seqs)))
    return frame


@st.composite
def request(draw: Any, cmd: str, *, req_id: bool | None = None) -> dict[str, Any]:
    """A valid request of ``cmd``."""
    spec = COMMANDS[cmd]
    frame: dict[str, Any] = {"cmd": cmd}
    if req_id or (req_id is None and draw(st.booleans())):
        frame["reqId"] = draw(st.integers(0, 2**32))
    if cmd in ("ACKB", "JobHeartbeatB"):
        frame = draw(_ackb(frame))
        if cmd == "JobHeartbeatB":
            frame.pop("results", None)
        elif draw(st.booleans()):
            frame["removeOnCompletes"] = [draw(st.booleans()) for _ in frame["ids"]]
        return frame
    for name, field in spec.fields.items():
        if field.required or draw(st.booleans()):
            frame[name] = draw(FIELD_VALUES[name])
    if cmd == "Cron":  # exactly one of schedule / repeatEvery
        frame.pop("schedule" if "repeatEvery" in frame and draw(st.booleans()) else "repeatEvery", None)
        if "schedule" not in frame and "repeatEvery" not in frame:
            frame["repeatEvery"] = 1000
    if cmd == "Auth":
        frame["token"] = draw(st.text(min_size=1, max_size=64))
    if frame.get("ungrouped") and "group" in frame:  # a pull is limited to one group, or to jobs without one
        del frame["group"]
    return frame


PUBLIC_COMMANDS = sorted(name for name in COMMANDS if not name.startswith("_"))
any_request = st.sampled_from(sorted(COMMANDS)).flatmap(request)
