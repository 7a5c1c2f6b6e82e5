"""The connector's options: Spark hands them over as strings; here they become small value objects.

Parsed once in the driver (when Spark asks the data source for its schema, reader or
writer), so a typo fails the query at planning time with the option's name in the
message, not in every task. The value objects are frozen, slotted and picklable:
they travel to the Python workers inside the readers and writers.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

from shoal.cluster import limits as L

__all__ = ["OptionError", "Connect", "WriteOptions", "ReadOptions", "StreamOptions", "Offsets", "parse_connect",
           "parse_write", "parse_read", "parse_stream", "parse_offsets", "DATA_FORMATS_IN", "DATA_FORMATS_OUT",
           "EARLIEST", "LATEST"]

#: How a ``dataColumn`` value becomes job data (write side).
DATA_FORMATS_IN = ("value", "json", "msgpack")
#: How job data becomes the ``data`` column (read side).
DATA_FORMATS_OUT = ("msgpack", "json", "string")
QUEUE_TYPES = ("jobs", "log")
DEDUPE_MODES = ("idempotencyKey", "customId")
#: The states a read can list; a waiting job with a priority is ``prioritized`` (as bunqueue names it).
STATES = ("waiting", "prioritized", "delayed", "active", "completed", "failed")

_BATCH_SIZE_DEFAULT = 2000
_IN_FLIGHT_DEFAULT = 8
_IN_FLIGHT_MAX = 64
_PAGE_SIZE_DEFAULT = 5000
_STREAM_BATCH_DEFAULT = 10_000
_STREAM_BATCH_MAX = 1_000_000
_LEASE_S_DEFAULT = 300.0
_COMMAND_TIMEOUT_S_DEFAULT = 30.0
_TASK_TIMEOUT_S_DEFAULT = 3600.0
_TRIGGER_DELAY_S_DEFAULT = 900.0  # Kafka's maxTriggerDelay default, 15 minutes
_QUEUES_MAX = 256

#: In a JSON offset, the Kafka source's markers for "the start of the log" and "its end now".
EARLIEST, LATEST = -2, -1
#: ``"earliest"``, ``"latest"``, or ``{queue: {shard: next sequence | EARLIEST | LATEST}}``
#: (a ``None`` queue key: the legacy single-queue form ``{"0": seq}``).
Offsets = Union[str, dict[Union[str, None], dict[str, int]]]


class OptionError(ValueError):
    """A connector option is missing or has a bad value (the message names the option)."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark passes a case-insensitive dict; plain dicts (tests, tools) may use any case.
    value = options.get(name)
    if value is None:
        lowered = {k.lower(): v for k, v in options.items()}
        value = lowered.get(name.lower())
    return None if value is None or str(value).strip() == "" else str(value).strip()


def _int(options: Mapping[str, str], name: str, default: int | None, low: int, high: int) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise OptionError(f"option {name}: expected an integer, got {raw!r}") from exc
    if not low <= value <= high:
        raise OptionError(f"option {name}: must be in {low}..{high}, got {value}")
    return value


def _float(options: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise OptionError(f"option {name}: expected a number of seconds, got {raw!r}") from exc
    if not low <= value <= high:
        raise OptionError(f"option {name}: must be in {low}..{high}, got {value}")
    return value


def _choice(options: Mapping[str, str], name: str, default: str | None, choices: tuple[str, ...]) -> str | None:
    raw = _get(options, name)
    if raw is None:
        return default
    for choice in choices:
        if raw.lower() == choice.lower():
            return choice
    raise OptionError(f"option {name}: one of {', '.join(choices)}, got {raw!r}")


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: true or false, got {raw!r}")


@dataclass(frozen=True, slots=True)
class Connect:
    """Where the cluster is and which queues: options ``seeds``, ``queue`` / ``queues`` /
    ``queuePattern``, ``token``, ``shards``, ``commandTimeout`` (seconds).

    ``queue`` is the first named queue (the only one for a write); a read resolves
    ``queues`` and ``queue_pattern`` against the cluster's queues when it is planned.
    """

    seeds: tuple[str, ...]
    queue: str
    token: str | None = None
    shards: int | None = None
    command_timeout_s: float = _COMMAND_TIMEOUT_S_DEFAULT
    queues: tuple[str, ...] = ()
    queue_pattern: str | None = None

    def queue_names(self, shards: int | None = None) -> list[str]:
        """The wire names of the (sub-)queues: ``q`` or ``q#0 .. q#k-1``."""
        k = self.shards if shards is None else shards
        return [f"{self.queue}#{i}" for i in range(k)] if k else [self.queue]


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """How rows become jobs (see ``docs/spark.md`` for the table of options)."""

    connect: Connect
    write_id: str
    data_column: str | None = None
    data_format: str = "value"
    priority_column: str | None = None
    delay_column: str | None = None
    group_column: str | None = None
    custom_id_column: str | None = None
    tag_column: str | None = None
    dedupe: str = "idempotencyKey"
    batch_size: int = _BATCH_SIZE_DEFAULT
    max_in_flight: int = _IN_FLIGHT_DEFAULT
    task_timeout_s: float = _TASK_TIMEOUT_S_DEFAULT
    #: Test hook ``"<partitionId>:<rows>"``: the first attempt of that task raises after pushing that many rows.
    fail_first_attempt: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What a batch read lists: ``queueType``, ``state``, ``dataFormat``, ``pageSize``; for logs
    ``startingOffsets``/``endingOffsets`` and ``failOnDataLoss``."""

    connect: Connect
    queue_type: str = "jobs"
    states: tuple[str, ...] = ()
    data_format: str = "msgpack"
    page_size: int = _PAGE_SIZE_DEFAULT
    starting: Offsets = "earliest"  # logs: where each shard's read starts
    ending: Offsets = "latest"      # logs: where it stops (exclusive)
    fail_on_data_loss: bool = True


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """How a stream reads: ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` + ``maxTriggerDelay``,
    ``startingOffsets``, ``failOnDataLoss``, ``leaseSeconds`` (Kafka source names and meanings)."""

    connect: Connect
    queue_type: str = "log"
    data_format: str = "msgpack"
    max_per_batch: int = _STREAM_BATCH_DEFAULT
    lease_s: float = _LEASE_S_DEFAULT
    starting: Offsets = "earliest"
    page_size: int = _PAGE_SIZE_DEFAULT
    min_per_trigger: int | None = None
    max_trigger_delay_s: float = _TRIGGER_DELAY_S_DEFAULT
    fail_on_data_loss: bool = True


def _queue_name(name: str, option: str) -> str:
    if "#" in name or len(name) > L.queue_name_chars_max:
        raise OptionError(f"option {option}: {name!r} is not a queue name (give shards=k for a sharded queue)")
    return name


def parse_connect(options: Mapping[str, str], *, many: bool = False) -> Connect:
    """``seeds``, ``queue``, ``token``, ``shards``, ``commandTimeout``; with ``many`` (reads) also
    ``queues`` (comma-separated) and ``queuePattern`` (a regular expression over queue names)."""
    seeds_raw = _get(options, "seeds")
    if seeds_raw is None:
        raise OptionError("option seeds: required, e.g. .option('seeds', '10.0.0.1:6789,10.0.0.2:6789')")
    seeds = tuple(s.strip() for s in seeds_raw.split(",") if s.strip())
    for seed in seeds:
        host, _, port = seed.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option seeds: {seed!r} is not host:port")
    queue = _get(options, "queue")
    listed = _get(options, "queues")
    pattern = _get(options, "queuePattern")
    if not many and (listed is not None or pattern is not None):
        raise OptionError("options queues/queuePattern: a write goes to one queue (option queue)")
    given = sum(x is not None for x in (queue, listed, pattern))
    if given == 0:
        raise OptionError("option queue: required (or queues / queuePattern for a read)")
    if given > 1:
        raise OptionError("options queue, queues and queuePattern: give exactly one")
    queues: tuple[str, ...] = ()
    if listed is not None:
        queues = tuple(dict.fromkeys(_queue_name(q.strip(), "queues") for q in listed.split(",") if q.strip()))
        if not queues or len(queues) > _QUEUES_MAX:
            raise OptionError(f"option queues: 1..{_QUEUES_MAX} comma-separated queue names")
    elif queue is not None:
        queues = (_queue_name(queue, "queue"),)
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option queuePattern: not a regular expression ({exc})") from exc
    return Connect(seeds=seeds, queue=queues[0] if queues else "", token=_get(options, "token"),
                   shards=_int(options, "shards", None, 1, 1024),
                   command_timeout_s=_float(options, "commandTimeout", _COMMAND_TIMEOUT_S_DEFAULT, 0.1, 3600.0),
                   queues=queues, queue_pattern=pattern)


def _fail_hook(options: Mapping[str, str]) -> tuple[int, int] | None:
    raw = _get(options, "testFailFirstAttempt")
    if raw is None:
        return None
    partition, _, rows = raw.partition(":")
    if not partition.isdigit() or not rows.isdigit():
        raise OptionError(f"option testFailFirstAttempt: '<partitionId>:<rows>', got {raw!r}")
    return int(partition), int(rows)


def parse_write(options: Mapping[str, str], write_id: str) -> WriteOptions:
    """The write options; ``write_id`` is used unless the ``writeId`` option fixes one."""
    wid = _get(options, "writeId") or write_id
    if len(wid) > 64 or ":" in wid:
        raise OptionError("option writeId: at most 64 characters, no ':'")
    return WriteOptions(
        connect=parse_connect(options), write_id=wid,
        data_column=_get(options, "dataColumn"),
        data_format=_choice(options, "dataFormat", "value", DATA_FORMATS_IN) or "value",
        priority_column=_get(options, "priorityColumn"), delay_column=_get(options, "delayColumn"),
        group_column=_get(options, "groupColumn"), custom_id_column=_get(options, "customIdColumn"),
        tag_column=_get(options, "tagColumn"),
        dedupe=_choice(options, "dedupe", "idempotencyKey", DEDUPE_MODES) or "idempotencyKey",
        batch_size=_int(options, "batchSize", _BATCH_SIZE_DEFAULT, 1, L.batch_jobs_max) or _BATCH_SIZE_DEFAULT,
        max_in_flight=_int(options, "maxInFlight", _IN_FLIGHT_DEFAULT, 1, _IN_FLIGHT_MAX) or _IN_FLIGHT_DEFAULT,
        task_timeout_s=_float(options, "taskTimeout", _TASK_TIMEOUT_S_DEFAULT, 1.0, 7 * 24 * 3600.0),
        fail_first_attempt=_fail_hook(options))


def _states(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(options, "state")
    if raw is None:
        return ()
    states = tuple(dict.fromkeys(s.strip().lower() for s in raw.split(",") if s.strip()))
    bad = [s for s in states if s not in STATES]
    if bad:
        raise OptionError(f"option state: {bad[0]!r} is not one of {', '.join(STATES)}")
    return states


def _deprecated(options: Mapping[str, str], old: str, new: str) -> str | None:
    """The value of ``new``, or of its old name ``old`` (with a warning: old names go after one release)."""
    value = _get(options, new)
    if value is None and _get(options, old) is not None:
        warnings.warn(f"shoal source: option {old} is deprecated, use {new} (the Kafka source's name)",
                      FutureWarning, stacklevel=3)
        return old
    return new


def parse_offsets(raw: str | None, name: str, default: str, *, allow: tuple[str, ...]) -> Offsets:
    """``earliest``/``latest`` (those in ``allow``) or JSON ``{"queue": {"shard": seq}}`` where a sequence is
    the next record to read (>= 1), or -2 (earliest) / -1 (latest) as in the Kafka source."""
    if raw is None:
        return default
    if raw.lower() in allow:
        return raw.lower()
    shape = f"option {name}: {' or '.join(allow)} or JSON like {{\"queue\": {{\"0\": 42}}}}"
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise OptionError(shape) from exc
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(shape)

    def seq(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not (value >= 1 or value in (EARLIEST, LATEST)):
            raise OptionError(f"{shape}: a sequence number is >= 1, or -2 (earliest) / -1 (latest)")
        return value

    def shards(value: object) -> dict[str, int]:
        if not isinstance(value, dict) or not all(isinstance(k, str) and k.isdigit() for k in value):
            raise OptionError(f"{shape}: each queue maps shard numbers to sequence numbers")
        return {k: seq(v) for k, v in value.items()}

    if all(not isinstance(v, dict) for v in parsed.values()):
        warnings.warn(f"shoal source: option {name} as {{shard: seq}} is deprecated, key it by queue: "
                      "{\"queue\": {\"0\": seq}}", FutureWarning, stacklevel=3)
        return {None: shards(parsed)}
    out: dict[str | None, dict[str, int]] = {}
    for queue, value in parsed.items():
        out[_queue_name(queue, name)] = shards(value)
    return out


def parse_read(options: Mapping[str, str], queue_type: str) -> ReadOptions:
    """The batch-read options (``queue_type`` as detected or given by ``queueType``)."""
    return ReadOptions(connect=parse_connect(options, many=True), queue_type=queue_type, states=_states(options),
                       data_format=_choice(options, "dataFormat", "msgpack", DATA_FORMATS_OUT) or "msgpack",
                       page_size=_int(options, "pageSize", _PAGE_SIZE_DEFAULT, 1, L.page_limit_max)
                       or _PAGE_SIZE_DEFAULT,
                       starting=parse_offsets(_get(options, "startingOffsets"), "startingOffsets", "earliest",
                                              allow=("earliest",)),
                       ending=parse_offsets(_get(options, "endingOffsets"), "endingOffsets", "latest",
                                            allow=("latest",)),
                       fail_on_data_loss=_bool(options, "failOnDataLoss", True))


def parse_stream(options: Mapping[str, str], queue_type: str) -> StreamOptions:
    """The streaming options (Kafka source names; ``maxRecordsPerBatch``/``maxJobsPerBatch`` are the
    deprecated names of ``maxOffsetsPerTrigger``)."""
    old = "maxRecordsPerBatch" if queue_type == "log" else "maxJobsPerBatch"
    name = _deprecated(options, old, "maxOffsetsPerTrigger") or "maxOffsetsPerTrigger"
    if name == "maxOffsetsPerTrigger" and _get(options, old) is not None:
        raise OptionError(f"options {old} and maxOffsetsPerTrigger: give one ({old} is the deprecated name)")
    min_rows = _int(options, "minOffsetsPerTrigger", None, 1, _STREAM_BATCH_MAX)
    delay = _get(options, "maxTriggerDelay")
    if delay is not None and min_rows is None:
        raise OptionError("option maxTriggerDelay: only with minOffsetsPerTrigger")
    return StreamOptions(connect=parse_connect(options, many=True), queue_type=queue_type,
                         data_format=_choice(options, "dataFormat", "msgpack", DATA_FORMATS_OUT) or "msgpack",
                         max_per_batch=_int(options, name, _STREAM_BATCH_DEFAULT, 1, _STREAM_BATCH_MAX)
                         or _STREAM_BATCH_DEFAULT,
                         lease_s=_float(options, "leaseSeconds", _LEASE_S_DEFAULT, 1.0, L.ttr_ms_max / 1000),
                         starting=parse_offsets(_get(options, "startingOffsets"), "startingOffsets", "earliest",
                                                allow=("earliest", "latest")),
                         page_size=_int(options, "pageSize", _PAGE_SIZE_DEFAULT, 1, L.page_limit_max)
                         or _PAGE_SIZE_DEFAULT,
                         min_per_trigger=min_rows,
                         max_trigger_delay_s=_duration(options, "maxTriggerDelay", _TRIGGER_DELAY_S_DEFAULT),
                         fail_on_data_loss=_bool(options, "failOnDataLoss", True))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, None: 1.0}


def _duration(options: Mapping[str, str], name: str, default: float) -> float:
    """A duration like ``15m``, ``30s``, ``500ms`` or a number of seconds."""
    raw = _get(options, name)
    if raw is None:
        return default
    match = _DURATION.match(raw)
    if match is None:
        raise OptionError(f"option {name}: a duration like 15m, 30s or 500ms, got {raw!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return float(match.group(1)) * _UNIT_S[unit]


def queue_type_option(options: Mapping[str, str]) -> str | None:
    """The ``queueType`` option (``jobs`` or ``log``), or ``None`` to detect it."""
    return _choice(options, "queueType", None, QUEUE_TYPES)


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean option."""
    return _bool(options, name, default)
