"""bunqueue's commands that take more than a rename: flows given as a graph, and job events.

- ``PUSHF {jobs: [{id, queue, input: {name, data, ...options, parentId, dependsOn,
  childrenIds}}]}``: bunqueue's ``FlowProducer`` plans every job and its id itself and
  sends the graph at once. Each tree of it (a job without a parent, and everything
  under it) becomes one ``PushFlow`` whose jobs carry the planned ids as their custom
  ids, so the ids the client chose are the jobs' ids; the reply lists the jobs as
  bunqueue's ``{data: {jobs: [...]}}``.
- Job events for ``SubscribeEvents`` subscribers: the engine's state changes as
  bunqueue's ``{type: "event", event: {eventType, queue, jobId, timestamp, ...}}``,
  with the job's wire id, its result (``completed``) or error (``failed``).
- bunqueue's job envelope: an add (or a job scheduler) that names no job but whose data is a
  map with a string ``name`` (how bunqueue's Python SDK, and its clients before 2.8.56, send a
  job's name) is read as bunqueue's server reads it: ``name`` is the job's name and the rest of
  the map its data (:func:`open_envelope`, :func:`open_envelopes`). Only for a client that
  speaks bunqueue's dialect (``Replier.bunqueue_envelope``): Shoal's own clients' data is
  never looked into.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from shoal.cluster.codec import PlainPush, Raw, encode_body, item_fields
from shoal.cluster.commands import normalize, validate
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.flow import FLOW_JOBS_MAX

from .ports import DecodingReplier
from .state._decimal import decimal_run

if TYPE_CHECKING:
    from .ports import Replier
    from .state import Event

__all__ = ["push_flow_graph", "push_repeating", "events_of", "encode_event", "EventFrames", "EventJobs", "open_envelope",
           "open_envelopes"]

#: A child's failure policy from bunqueue's flags (the first flag set wins; default ``fail``).
_ON_FAILURE = (("ignoreDependencyOnFailure", "ignore"), ("continueParentOnFailure", "ignore"),
               ("removeDependencyOnFailure", "remove"), ("failParentOnFailure", "fail"))
#: Flow-graph fields of a PUSHF job's input: read here, not job options.
_GRAPH_FIELDS = ("parentId", "dependsOn", "childrenIds", *(flag for flag, _ in _ON_FAILURE))


def push_flow_graph(submit: Callable[[Any, dict[str, Any]], None], conn: "Replier", frame: dict[str, Any],
                    now_ms: int) -> None:
    """Answer a PUSHF: one PushFlow per tree of the graph (a lone job: a PUSH), each handed to
    ``submit(replier, frame)``, then bunqueue's reply with every job."""
    trees, records = _trees(frame.get("jobs"), now_ms)
    _submit_all(submit, conn, frame.get("reqId"), trees, lambda replies: {"data": {"jobs": records}})


def push_repeating(submit: Callable[[Any, dict[str, Any]], None], conn: "Replier", frame: dict[str, Any]) -> bool:
    """Answer a PUSHB some of whose jobs have bunqueue's ``repeat`` (its client sends even a
    lone ``add`` as a PUSHB) and return True; False, answering nothing, when none has.

    A repeating job is a job scheduler (:func:`~shoal.cluster.commands.normalize` turns its
    PUSH into a Cron that makes the first job at once); the others go as PUSHBs of the jobs
    between them. Every job is checked before any is submitted, each through
    ``submit(replier, frame)``; the reply is the PUSHB's ``{ids}``, in the jobs' order.
    """
    jobs = frame.get("jobs")
    if type(jobs) is not list or not _may_hold(jobs, "repeat") or not any(
            type(job) is dict and job.get("repeat") is not None for job in jobs):
        return False
    queue = frame.get("queue")
    parts: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for i, job in enumerate(jobs):
        if type(job) is not dict:
            raise CommandError(ErrorCode.INVALID, f"jobs[{i}]: must be a map")
        single = {**job, "cmd": "PUSH", "queue": queue}
        try:
            validate(normalize(single))
        except CommandError as exc:
            raise CommandError(exc.code, f"jobs[{i}].{exc}", **exc.extra) from None
        if single["cmd"] == "PUSH":
            del single["cmd"], single["queue"]
            run.append(single)
            continue
        if run:
            parts.append({"cmd": "PUSHB", "queue": queue, "jobs": run})
            run = []
        parts.append(single)  # the Cron of a repeating job
    if run:
        parts.append({"cmd": "PUSHB", "queue": queue, "jobs": run})

    def ids_of(replies: list[dict[str, Any]]) -> dict[str, Any]:
        ids: list[Any] = []
        deduped: list[int] = []
        for reply in replies:
            if "ids" in reply:
                deduped.extend(len(ids) + k for k in reply.get("deduped", ()))
                ids.extend(reply["ids"])
            else:
                ids.append(reply.get("id"))
        return {"ids": ids, "deduped": deduped} if deduped else {"ids": ids}

    _submit_all(submit, conn, frame.get("reqId"), parts, ids_of)
    return True


def _submit_all(submit: Callable[[Any, dict[str, Any]], None], conn: "Replier", req_id: Any,
                frames: list[dict[str, Any]], answer: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
    """Hand each of ``frames`` to ``submit(replier, frame)``; once every one is answered, answer
    ``req_id`` with ``answer(their replies, in order)``, or with the first one's error."""
    results: list[Any] = [None] * len(frames)
    pending = [len(frames)]

    def taker(i: int) -> Callable[[Any], None]:
        def take(result: Any) -> None:
            results[i] = result
            pending[0] -= 1
            if pending[0]:
                return
            error = next((r for r in results if isinstance(r, CommandError)), None)
            if error is not None:
                conn.reply_error(req_id, error)
            else:
                conn.reply(req_id, answer(results))
        return take

    for i, part in enumerate(frames):
        replier = _Answer(conn, taker(i))
        try:
            submit(replier, part)
        except CommandError as exc:
            replier.reply_error(None, exc)


def _trees(jobs: Any, now_ms: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """PushFlow frames (a single job without children: a PushFlow of one) and the reply's job records."""
    if type(jobs) is not list or not jobs:
        raise CommandError(ErrorCode.INVALID, "jobs: must be a non-empty list of flow jobs")
    if len(jobs) > FLOW_JOBS_MAX:
        raise CommandError(ErrorCode.INVALID, f"jobs: a flow holds at most {FLOW_JOBS_MAX} jobs")
    nodes: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for i, job in enumerate(jobs):
        if type(job) is not dict or type(job.get("id")) is not str or type(job.get("queue")) is not str \
                or type(job.get("input")) is not dict:
            raise CommandError(ErrorCode.INVALID, f"jobs[{i}]: must be {{id, queue, input}}")
        if job["id"] in nodes:
            raise CommandError(ErrorCode.INVALID, f"jobs[{i}].id: {job['id']!r} appears twice")
        nodes[job["id"]] = job
        order.append(job["id"])
    children: dict[str, list[str]] = {}
    roots = []
    for job_id in order:
        parent = nodes[job_id]["input"].get("parentId")
        if parent is None:
            roots.append(job_id)
        elif parent not in nodes:
            raise CommandError(ErrorCode.INVALID, f"jobs: {job_id!r} names a parent {parent!r} not in the flow")
        else:
            children.setdefault(parent, []).append(job_id)
    if not roots:
        raise CommandError(ErrorCode.INVALID, "jobs: a flow needs a job without a parent")
    records: list[dict[str, Any]] = []

    def job_of(job_id: str, where: str, child: bool) -> dict[str, Any]:
        node = nodes[job_id]
        spec = dict(node["input"])
        on_failure = "fail"
        for flag, policy in _ON_FAILURE:
            if spec.get(flag):
                on_failure = policy
                break
        for name in _GRAPH_FIELDS:
            spec.pop(name, None)
        if spec.get("repeat") is not None:  # as bunqueue's server: a flow's jobs run once
            raise CommandError(ErrorCode.INVALID, f"jobs: {job_id!r} has repeat: a job of a flow runs once")
        spec["cmd"] = "PUSH"
        normalize(spec)  # bunqueue's option names, refusing what Shoal cannot honour
        spec.pop("cmd")
        spec["queue"] = node["queue"]
        spec["customId"] = job_id
        spec.setdefault("data", None)
        kids = [job_of(k, f"{where}.children", True) for k in children.get(job_id, [])]
        if kids:
            spec["children"] = kids
        if child and on_failure != "fail":
            spec["onFailure"] = on_failure
        records.append({"id": job_id, "queue": node["queue"], "name": spec.get("name", "default"),
                        "data": spec["data"], "priority": spec.get("priority", 0),
                        "state": "waiting-children" if kids else ("delayed" if spec.get("delay") else "waiting"),
                        "createdAt": float(now_ms), "attempts": 0,
                        "parentId": node["input"].get("parentId"), "childrenIds": children.get(job_id, [])})
        return spec

    trees = []
    for root in roots:
        parent = job_of(root, "jobs", False)
        kids = parent.pop("children", None)
        trees.append({"cmd": "PushFlow", "parent": parent, "children": kids} if kids
                     else {"cmd": "PushFlow", "parent": parent, "children": None})
    for tree in trees:
        if tree["children"] is None:
            tree.pop("children")
            tree["cmd"] = "PUSH"  # a lone job: a PushFlow needs children
            tree.update(tree.pop("parent"))
    return trees, records


class _Answer(DecodingReplier):
    """Takes one part's reply (its body, or its error) for :func:`_submit_all`; it is the
    client's connection in everything else (who it is, whether its commands are forwarded)."""

    __slots__ = ("_conn", "_done")

    def __init__(self, conn: "Replier", done: Callable[[Any], None]) -> None:
        self._conn = conn
        self._done = done

    conn_id = property(lambda self: self._conn.conn_id)
    peer_host = property(lambda self: self._conn.peer_host)
    session = property(lambda self: self._conn.session)
    authed = property(lambda self: self._conn.authed)
    closed = property(lambda self: self._conn.closed)
    protocol_version = property(lambda self: self._conn.protocol_version)
    subscriptions = property(lambda self: None)
    wants_forwarding = property(lambda self: self._conn.wants_forwarding)  # type: ignore[assignment]
    bunqueue_envelope = property(lambda self: self._conn.bunqueue_envelope)  # type: ignore[assignment]

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        self._done(body)

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self._done(exc)

    def reply_many(self, req_ids: list[Any], results: list[Any], cmd: str, seconds: float) -> None:
        for result in results:
            self._done(result)

    def send_frame(self, frame: dict[str, Any]) -> None:
        pass  # a tree of a graph has no events of its own

    def upgrade(self, version: int) -> None:
        pass


# --- bunqueue's job envelope ----------------------------------------------------------------------

#: The first byte of a MessagePack map (fixmap, map 16, map 32): the only data an envelope can be.
_MAP_HEADS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))


class _Named(msgspec.Struct):
    """A map's ``name`` field, the rest skipped unread (the cheap first look at data)."""

    name: Any = None


_named_of = msgspec.msgpack.Decoder(_Named).decode
_fields_of = msgspec.msgpack.Decoder(dict[str, msgspec.Raw]).decode
_pack = msgspec.msgpack.Encoder().encode


_first_byte = itemgetter(0)
_data_attr = attrgetter("data")
_data_item = itemgetter("data")
_packed_attr = attrgetter("packed")


def _may_hold(jobs: list[Any], key: str) -> bool:
    """False only when no job of ``jobs`` is a map holding ``key``; the look runs in C (one set
    of every job's keys), since a PUSHB's jobs are about never bunqueue's repeating ones."""
    fields = item_fields(jobs)
    return fields is None or key in fields  # None: a job that is not a map, which the caller's own look names


def _no_map_among(first_bytes: Iterator[int]) -> bool:
    """True only when none of ``first_bytes`` (the first byte of each job's data, drawn lazily)
    starts a MessagePack map, so no job is an envelope; the look runs in C, since plain jobs'
    data are about never bunqueue's envelopes. False when a job has no raw data to look at:
    the caller's own look says what it is."""
    try:
        return _MAP_HEADS.isdisjoint(first_bytes)
    except (TypeError, KeyError, AttributeError, IndexError):
        return False


def _unwrap(packed: bytes | msgspec.Raw) -> tuple[str, bytes] | None:
    """``(name, the data without it)`` when ``packed`` (one MessagePack value, so not empty) is
    a map with a string ``name``, else None."""
    if memoryview(packed)[0] not in _MAP_HEADS:
        return None
    try:
        name = _named_of(packed).name
        if type(name) is not str:
            return None
        fields = _fields_of(packed)
    except msgspec.DecodeError:  # a key that is not a string: not bunqueue's envelope
        return None
    del fields["name"]
    return name, _pack(fields)


def open_envelope(frame: dict[str, Any]) -> None:
    """A PUSH, PUSHB or Cron (a decoded frame) as bunqueue's server reads it: each job without a
    name (a Cron: whose jobs have none) whose data is an envelope gets its name from it (in place)."""
    cmd = frame.get("cmd")
    jobs = frame.get("jobs") if cmd == "PUSHB" else (frame,)
    if type(jobs) is not list and type(jobs) is not tuple:
        return  # the schema names what is wrong with it
    key = "jobName" if cmd == "Cron" else "name"
    if cmd == "PUSHB" and _no_map_among(map(_first_byte, map(_packed_attr, map(_data_item, jobs)))):
        return
    for job in jobs:
        if type(job) is dict and job.get(key) is None and type(job.get("data")) is Raw:
            opened = _unwrap(job["data"].packed)
            if opened is not None:
                job[key], job["data"] = opened[0], Raw(opened[1])


def open_envelopes(frames: Sequence[PlainPush]) -> None:
    """:func:`open_envelope` for a block of plain PUSHes (in place)."""
    if _no_map_among(map(_first_byte, map(memoryview, map(_data_attr, frames)))):
        return
    heads = _MAP_HEADS
    for frame in frames:
        if frame.name is None and memoryview(frame.data)[0] in heads:  # the cheap look first
            opened = _unwrap(frame.data)
            if opened is not None:
                frame.name, frame.data = opened[0], msgspec.Raw(opened[1])


# --- events --------------------------------------------------------------------------------------

def events_of(ev: Mapping[str, Any], view: "EventJobs | None", now_ms: int) -> list[dict[str, Any]]:
    """bunqueue's event frames for one of the node's job events (none for moves it does not name)."""
    job_id = ev.get("id")
    partition = ev.get("partition")
    if type(job_id) is not str or type(partition) is not int:
        return []
    state, prev = ev.get("state"), ev.get("prev")
    if state == "removed" and prev in _ENDED:
        # A finished job leaving the history (trimmed, cleaned, removeOnComplete): bunqueue's
        # server names only the removal of a job that had not run to its end.
        return []
    wire_id, result, error = job_id, None, None
    if state in _NEEDS_JOB or prev == "active":
        # Only these frames carry a result or an error; the id is already the wire id.
        info = view.event_job(job_id) if view is not None else None
        if info is not None:
            wire_id, result, error = info
    base = {"queue": ev.get("queue"), "jobId": wire_id, "timestamp": float(now_ms)}
    if ev.get("event") == "progress":
        progress = ev.get("progress")
        return [_frame({**base, "eventType": "progress", "progress": progress,
                        "data": {"progress": progress, "message": None}})]
    if prev is None:  # a new job
        kind = "delayed" if state == "delayed" else "waiting-children" if state == "waiting-children" else "pushed"
        return [_frame({**base, "eventType": kind})]
    if state == "active":
        return [_frame({**base, "eventType": "pulled"})]
    if state == "completed":
        return [_frame({**base, "eventType": "completed", "data": Raw(result) if result is not None else None})]
    if state == "failed":
        return [_frame({**base, "eventType": "failed", "error": error or "failed", "terminal": True})]
    if state == "cancelled":
        return [_frame({**base, "eventType": "failed", "error": error or "cancelled", "terminal": True})]
    if state == "removed":
        return [_frame({**base, "eventType": "removed", "prev": prev})]
    if prev == "active" and state in ("waiting", "delayed"):
        if error is None:
            return [_frame({**base, "eventType": "stalled"})]
        return [_frame({**base, "eventType": "failed", "error": error, "terminal": False}),
                _frame({**base, "eventType": "retried", "prev": "failed"})]
    return []


#: Job states whose event frame carries the job's result or error.
_NEEDS_JOB = frozenset({"completed", "failed", "cancelled"})
#: States of a job that ran to its end; its later removal sends bunqueue's subscribers nothing.
_ENDED = _NEEDS_JOB


def _frame(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "event", "event": event}


def encode_event(frame: dict[str, Any]) -> bytes:
    """The length-prefixed bytes of one event frame (encoded once for every subscriber)."""
    body = encode_body(frame)
    return len(body).to_bytes(4, "big") + body


class EventJobs(Protocol):
    """What an event frame needs of a partition's applied state (``PartitionView``'s methods)."""

    def event_job(self, job_id: str) -> tuple[str, Any, Any] | None: ...

    def event_job_at(self, seq: int) -> tuple[str, Any, Any] | None: ...

    def event_jobs_plain(self, first: int, count: int) -> bool: ...

    def event_dicts(self, partition: int, events: Sequence[Event]) -> list[dict[str, Any]]: ...


class EventFrames:
    """The length-prefixed bytes of bunqueue's event frames for the job events one partition's
    engine recorded in a batch, all stamped ``now_ms``: what :func:`events_of` and
    :func:`encode_event` give for each event as the node publishes it.

    A worker's drain makes two frames a job, a pull and a completion without a result, which
    differ only by queue, kind and job id: those are made straight from the engine's event
    tuple, as the batch's encoded template for the queue and kind, up to the job id (which the
    template puts last), and the encoded id. Any other event goes through :func:`events_of`.
    A pull or an ack of consecutive plain jobs records a run of such events, whose frames
    :meth:`chunks` makes in a few C calls: the template joined with the run's ids.
    """

    __slots__ = ("_view", "_partition", "_now_ms", "_heads")

    def __init__(self, view: EventJobs, partition: int, now_ms: int) -> None:
        self._view = view
        self._partition = partition
        self._now_ms = now_ms
        self._heads: dict[tuple[Any, str, int], bytes] = {}

    def of(self, ev: Event) -> list[bytes]:
        """The frames of one of the engine's job events (none for moves bunqueue does not name)."""
        queue, seq, state, prev = ev
        if prev is not None:
            if state == "removed" and prev in _ENDED:
                return []  # the history trimmed (as events_of says), the common case first
            if state == "active" or state == "completed":
                info = self._view.event_job_at(seq)
                if info is None:  # a segment's plain job: Shoal's own id, no result
                    return [self._templated(queue, "pulled" if state == "active" else "completed",
                                            f"{self._partition}-{seq}")]
                if state == "active":
                    return [self._templated(queue, "pulled", info[0])]
                if info[1] is None:
                    return [self._templated(queue, "completed", info[0])]
        as_published = self._view.event_dicts(self._partition, [ev])[0]
        return [encode_event(frame) for frame in events_of(as_published, self._view, self._now_ms)]

    def chunks(self, events: Sequence[Event], wanted: Callable[[Any], bool]) -> Iterator[tuple[Any, bytes]]:
        """The frames of a batch's events, in order, as ``(queue, frames)``: a run of one move
        on consecutive plain jobs of one queue in one piece, any other event's frames in one;
        nothing for the events of a queue not ``wanted``, or of moves bunqueue does not name."""
        i, n = 0, len(events)
        while i < n:
            queue, seq, state, prev = events[i]
            j = i + 1
            if prev is not None:
                while j < n:
                    nxt = events[j]
                    if nxt[1] != seq + j - i or nxt[2] != state or nxt[3] != prev or nxt[0] != queue:
                        break
                    j += 1
            if not wanted(queue):
                i = j
                continue
            if j - i > 1:
                data = self._run(queue, seq, j - i, state, prev)
                if data is not None:
                    if data:
                        yield queue, data
                    i = j
                    continue
            for k in range(i, j):
                bodies = self.of(events[k])
                if bodies:
                    yield queue, b"".join(bodies)
            i = j

    def _run(self, queue: Any, first: int, count: int, state: str, prev: str) -> bytes | None:
        """The frames of ``count`` like events of jobs ``first``, ``first + 1``, ...: what :meth:`of`
        makes of each, or None when this does not know (a job held as an object)."""
        if state == "removed" and prev in _ENDED:
            return b""
        kind = "pulled" if state == "active" else "completed" if state == "completed" else None
        if kind is None or not self._view.event_jobs_plain(first, count):
            return None
        prefix = f"{self._partition}-"
        pieces: list[bytes] = []
        seq, left = first, count
        while left:  # one piece per length of the ids (a run may cross 999 -> 1000)
            digits = len(str(seq))
            take = min(left, 10 ** digits - seq)
            size = len(prefix) + digits
            if size > _FIXSTR_MAX:
                return None
            # each frame: the template's head, then the id as a MessagePack fixstr (marker, text)
            sep = self._head(queue, kind, 1 + size) + bytes((_FIXSTR | size,))
            pieces.append(sep + "\n".join(decimal_run(prefix, seq, take)).encode().replace(b"\n", sep))
            seq += take
            left -= take
        return b"".join(pieces)

    def _templated(self, queue: Any, kind: str, wire_id: str) -> bytes:
        packed_id = _encode_str(wire_id)
        return self._head(queue, kind, len(packed_id)) + packed_id

    def _head(self, queue: Any, kind: str, packed_len: int) -> bytes:
        """A frame's bytes up to its job id, for an id encoded in ``packed_len`` bytes (the length
        prefix depends on that alone: one head per length seen)."""
        key = (queue, kind, packed_len)
        head = self._heads.get(key)
        if head is None:
            event: dict[str, Any] = {"queue": queue, "timestamp": float(self._now_ms), "eventType": kind}
            if kind == "completed":
                event["data"] = None
            event["jobId"] = ""
            body = encode_body(_frame(event))[:-len(_EMPTY_STR)]
            head = self._heads[key] = (len(body) + packed_len).to_bytes(4, "big") + body
        return head


_encode_str = msgspec.msgpack.Encoder().encode
#: The encoded empty string that ends an event template (the job id's place).
_EMPTY_STR = _encode_str("")
#: MessagePack's fixstr marker, and the longest text it holds.
_FIXSTR = 0xA0
_FIXSTR_MAX = 31
