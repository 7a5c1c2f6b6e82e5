"""Field checkers for the command schema (private to :mod:`shoal.cluster.commands`).

A checker is ``check(field_name, value) -> None`` and raises ``INVALID`` with
a message that starts with the field's name. Checkers are built once at import;
the hot path (PUSH) calls three or four of them per frame, so each is a plain
closure with ``type(v) is …`` tests (bool is not accepted where an int is).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgpack

from . import limits as L
from .codec import Raw
from .errors import CommandError, ErrorCode
from .jobid import parse_job_id

Checker = Callable[[str, Any], None]

JOB_STATES = ("waiting", "delayed", "active", "completed", "failed", "waiting-children", "cancelled")
QUEUE_TYPES = ("standard", "fifo", "fifottl", "limfifottl", "utube", "utubettl", "log")

# A sharded queue's sub-queues are ``name#0`` .. ``name#1023``, so one
# ``#<shard>`` suffix is allowed after the base name.
_QUEUE_RE = re.compile(r"(?=.{1,%d}\Z)[A-Za-z0-9_.:\-]+(?:#(?:0|[1-9][0-9]{0,2}|10[01][0-9]|102[0-3]))?\Z" % L.queue_name_chars_max)
# Below this many characters a str's MessagePack encoding (≤ 4 bytes per char
# plus a 5-byte header) cannot reach the data limit, so no need to pack it.
_STR_CHARS_SAFE = (L.data_bytes_max - 5) // 4


def bad(field: str, reason: str) -> CommandError:
    """The ``INVALID`` error for ``field``."""
    return CommandError(ErrorCode.INVALID, f"{field}: {reason}")


def int_range(lo: int, hi: int) -> Checker:
    """An integer (not a bool) in ``lo..hi``."""
    def check(field: str, v: Any) -> None:
        if type(v) is not int:
            raise bad(field, "must be an integer")
        if not lo <= v <= hi:
            raise bad(field, f"must be between {lo} and {hi}")
    return check


def text(max_chars: int, *, empty: bool = False) -> Checker:
    """A string of at most ``max_chars`` characters (non-empty unless ``empty``)."""
    lo = 0 if empty else 1

    def check(field: str, v: Any) -> None:
        if type(v) is not str:
            raise bad(field, "must be a string")
        if not lo <= len(v) <= max_chars:
            raise bad(field, f"must be {lo}..{max_chars} characters")
    return check


def one_of(choices: tuple[str, ...]) -> Checker:
    """One of the given strings."""
    allowed = frozenset(choices)

    def check(field: str, v: Any) -> None:
        if type(v) is not str or v not in allowed:
            raise bad(field, f"must be one of {', '.join(choices)}")
    return check


# Names already seen valid: a set lookup is a fraction of a regex match, and a
# node sees the same few queue names again and again. Bounded; cleared when full.
_queues_ok: set[str] = set()
_QUEUES_OK_MAX = 4096


def queue(field: str, v: Any) -> None:
    """A queue name: 1..256 characters of ``[A-Za-z0-9_.:-]``, optionally ``#<shard>``."""
    if type(v) is not str:
        raise bad(field, "must be a string")
    if v in _queues_ok:
        return
    if _QUEUE_RE.match(v) is None:
        raise bad(field, f"must be 1..{L.queue_name_chars_max} characters of A-Z a-z 0-9 _ . : - "
                  "(a shard suffix #0..#1023 allowed)")
    if len(_queues_ok) >= _QUEUES_OK_MAX:
        _queues_ok.clear()
    _queues_ok.add(v)


def encoded_size(v: Any) -> int:
    """Bytes of ``v``'s MessagePack encoding (a :class:`Raw` is already encoded)."""
    if type(v) is Raw:
        return len(v.packed)
    try:
        return len(msgpack.packb(v, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(str(exc)) from exc


def data(field: str, v: Any) -> None:
    """Any MessagePack value whose encoding is at most ``data_bytes_max`` bytes."""
    kind = type(v)
    if kind is Raw:
        size = len(v.packed)
    elif v is None or kind is float or kind is bool or (kind is int and -(1 << 63) <= v < (1 << 64)):
        return
    elif kind is str and len(v) <= _STR_CHARS_SAFE:
        return
    else:
        try:
            size = encoded_size(v)
        except ValueError as exc:
            raise bad(field, f"is not a MessagePack value ({exc})") from None
    if size > L.data_bytes_max:
        raise bad(field, f"is {size} bytes encoded; the maximum is {L.data_bytes_max}")


def job_id(field: str, v: Any) -> None:
    """A job id: Shoal's own ``"{partition}-{seq}"``, or the job's custom id (bunqueue's
    ``jobId``, a flow's client-made ids): 1..256 characters."""
    if type(v) is not str or not 0 < len(v) <= L.key_chars_max:
        raise bad(field, f"{v!r} is not a job id (like '3-17', or a custom id of 1..{L.key_chars_max} characters)")


def is_shoal_id(v: str) -> bool:
    """True for an id of Shoal's own form ``"{partition}-{seq}"`` (routable without a lookup)."""
    try:
        parse_job_id(v)
    except CommandError:
        return False
    return True


def lease_token(field: str, v: Any) -> None:
    """A lease token as the node issued it: a short string or a non-negative integer."""
    kind = type(v)
    if kind is str:
        if 0 < len(v) <= L.token_chars_max:
            return
    elif kind is int and v >= 0:
        return
    raise bad(field, f"must be a lease token (1..{L.token_chars_max} characters, or an integer ≥ 0)")


def boolean(field: str, v: Any) -> None:
    """``true`` or ``false``."""
    if type(v) is not bool:
        raise bad(field, "must be true or false")


def str_list(max_items: int, max_chars: int) -> Checker:
    """A list of at most ``max_items`` strings of 1..``max_chars`` characters."""
    def check(field: str, v: Any) -> None:
        if type(v) is not list or len(v) > max_items:
            raise bad(field, f"must be a list of at most {max_items} strings")
        for i, x in enumerate(v):
            if type(x) is not str or not 0 < len(x) <= max_chars:
                raise bad(f"{field}[{i}]", f"must be a string of 1..{max_chars} characters")
    return check


# Ids joined by newlines, every one "{partition}-{seq}" in ASCII digits, each part at most 19 digits
# (so at most 39 characters), all with the first id's partition written the same way.
_IDS_OF_ONE_PARTITION = re.compile(r"([0-9]{1,19})-[0-9]{1,19}(?:\n\1-[0-9]{1,19})*")


def _ids_of_one_partition(v: list[Any]) -> bool:
    """True when every id is well-formed and of one partition, checked in one regex pass.

    False proves nothing: the per-id check then finds the fault (or accepts, for example,
    ids that spell one partition in two ways, such as ``1-5`` and ``01-6``).
    """
    try:
        joined = "\n".join(v)
    except TypeError:
        return False
    # The count of newlines: an id with a newline inside would otherwise pass as two ids.
    return joined.count("\n") == len(v) - 1 and _IDS_OF_ONE_PARTITION.fullmatch(joined) is not None


def ids(field: str, v: Any) -> None:
    """A non-empty batch of job ids; those of Shoal's own form all of one partition (a batch
    goes to one leader). Custom ids are found by the node (their queue's partition)."""
    if type(v) is not list or not v:
        raise bad(field, "must be a non-empty list of job ids")
    if len(v) > L.batch_jobs_max:
        raise bad(field, f"at most {L.batch_jobs_max} ids per batch")
    if _ids_of_one_partition(v):
        return
    first = None
    for i, x in enumerate(v):
        job_id(f"{field}[{i}]", x)
        try:
            p = parse_job_id(x)[0]
        except CommandError:
            continue  # a custom id: its partition is its queue's
        if first is None:
            first = p
        elif p != first:
            raise bad(field, f"all ids of one batch must belong to one partition: {field}[0] is on "
                             f"partition {first}, {field}[{i}] on partition {p} (split the batch by partition)")


def tokens(field: str, v: Any) -> None:
    """A list of lease tokens (``null`` where a job has none)."""
    if type(v) is not list:
        raise bad(field, "must be a list of lease tokens")
    try:
        "".join(v)  # the usual batch, all strings: checked by C loops, not one call per token
    except TypeError:
        pass
    else:
        if not v or (min(map(len, v)) > 0 and max(map(len, v)) <= L.token_chars_max):
            return
    for i, x in enumerate(v):
        if x is not None:
            lease_token(f"{field}[{i}]", x)


def results(field: str, v: Any) -> None:
    """A list of job results, together within the data limit."""
    if type(v) is not list:
        raise bad(field, "must be a list")
    data(field, v)


def fields_map(field: str, v: Any, checks: dict[str, Checker], what: str,
               required: tuple[str, ...] = ()) -> None:
    """A map whose keys are all in ``checks`` (``null`` = not given)."""
    if type(v) is not dict:
        raise bad(field, "must be a map")
    for key in required:
        if key not in v:
            raise bad(f"{field}.{key}", "required")
    for key, value in v.items():
        check = checks.get(key) if type(key) is str else None
        if check is None:
            raise bad(f"{field}.{key}", f"unknown {what}")
        if value is not None or key in required:
            check(f"{field}.{key}", value)


def cron_schedule(field: str, v: Any) -> None:
    """A cron expression croniter accepts."""
    text(256)(field, v)
    from croniter import croniter  # deferred: only Cron needs it, and it is slow to import
    if not croniter.is_valid(v):
        raise bad(field, f"{v!r} is not a valid cron expression")
