"""The push fast path, and the compact form every command is replicated in: one owner.

Pipelined producers send plain PUSHes (a queue, the data, maybe a reqId and an
idempotency key) back to back; this module decides, at every step, how they travel:

- the connection takes a run of plain PUSHes to one queue off its backlog as one
  block (:func:`take_block`) and answers the block's results with replies spliced
  from encoded values (:func:`encode_replies`);
- the dispatcher checks the block's fields and makes it one :class:`PushRun`
  (:func:`check_block`), one routing and one submit for the whole block;
- group commit turns a batch of commands into the commands of one Raft entry
  (:func:`replicated_form`): consecutive plain PUSH dicts to one queue become a
  :class:`PushRun`, a PUSHB of plain items a :class:`PushBatch`, an ACKB of one pull's
  consecutive jobs an :class:`AckRun`, and job data loses its ``Raw`` wrapper;
- the results come back per client command (:func:`fan_out`, :func:`each_result`).

The typed commands are defined with the engine (:mod:`shoal.node.state._commands`),
which applies them; nothing is added to a client's command on its way (but for the
idempotency key a forwarding node gives an add that has none, :mod:`.relay`).
"""

from __future__ import annotations

import struct
import operator
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from shoal.cluster import limits as L
from shoal.cluster.codec import PlainBulk, PlainPush, Raw, encode_body
from shoal.cluster.commands import COMMANDS
from shoal.cluster.errors import CommandError, ProtocolError

from ..state import AckRun, Command, PushBatch, PushRun, SessionPull
from ..state._segments import ack_run_of, plain_ack, split_plain

__all__ = ["take_block", "bulk_batch", "check_block", "each_result", "encode_replies", "replicated_form", "fan_out",
           "commands_in", "session_pull", "PushRun", "PushBatch", "AckRun", "SessionPull", "Command"]

#: Receives one command's result: the engine's reply dict or a CommandError.
ReplyCallback = Callable[[Any], None]

#: Fields a PUSH may carry and still ride in a :class:`PushRun` (``waitMs`` only matters to
#: the dispatcher, which parks a push refused with QUEUE_FULL; ``name`` is bunqueue's job name).
PLAIN_PUSH_FIELDS = frozenset({"cmd", "reqId", "queue", "data", "idempotencyKey", "waitMs", "name"})
#: The PUSH schema's own field checks, run on a block as ``validate`` runs them on a dict.
_check_queue = COMMANDS["PUSH"].checks["queue"]
_check_data = COMMANDS["PUSH"].checks["data"]
_check_key = COMMANDS["PUSH"].checks["idempotencyKey"]
_check_name = COMMANDS["PUSH"].checks["name"]
_data_of = operator.attrgetter("data")

_pack = msgspec.msgpack.Encoder().encode
_PUSH_REPLY_HEAD = b"\x83\xa2ok\xc3\xa2id"  # map of 3: "ok": true, "id": (the id follows)
_PUSH_REPLY_REQ = b"\xa5reqId"
_PUSH_REPLY_FIXED = len(_PUSH_REPLY_HEAD) + len(_PUSH_REPLY_REQ)
_PUSH_REPLY_SIZE = struct.Struct(">I").pack


# --- the connection ------------------------------------------------------------------------------

def take_block(first: PlainPush, backlog: deque[Any], room: int) -> list[PlainPush]:
    """``first`` and the plain PUSHes to its queue right behind it in ``backlog`` (taken off
    it), at most ``room`` more: one block for the dispatcher."""
    block = [first]
    queue = first.queue
    while room > 0 and backlog:
        nxt = backlog[0]
        if type(nxt) is not PlainPush or nxt.queue != queue:
            break
        block.append(backlog.popleft())
        room -= 1
    return block


def encode_replies(out: list[bytes], req_ids: list[Any], results: list[Any]) -> list[dict[str, Any]]:
    """Append the length-prefixed replies to ``out`` (pieces to join); per command a reply dict
    or a CommandError. Returns the reply frames that could not be encoded.
    """
    add = out.append
    failed: list[dict[str, Any]] = []
    for req_id, result in zip(req_ids, results):
        job_id = result.get("id") if type(result) is dict and len(result) == 1 else None
        if type(job_id) is str and (type(req_id) is int or type(req_id) is str):
            # A plain push's reply, {"ok": true, "id": ..., "reqId": ...}, spliced from its two
            # encoded values: half the cost of building and encoding a dict per reply.
            packed_id = _pack(job_id)
            packed_req = _pack(req_id)
            add(_PUSH_REPLY_SIZE(_PUSH_REPLY_FIXED + len(packed_id) + len(packed_req)))
            add(_PUSH_REPLY_HEAD)
            add(packed_id)
            add(_PUSH_REPLY_REQ)
            add(packed_req)
            continue
        frame = {"ok": True, **result} if type(result) is dict else result.to_reply()
        if req_id is not None:
            frame["reqId"] = req_id
        try:
            body = encode_body(frame)  # a short reply: well under any frame limit
        except ProtocolError:
            failed.append(frame)
            continue
        add(len(body).to_bytes(4, "big") + body)
    return failed


# --- the dispatcher ------------------------------------------------------------------------------

def check_queue(queue: str) -> None:
    """Raise the PUSH schema's error for a bad queue name."""
    _check_queue("queue", queue)


def bulk_batch(bulk: PlainBulk) -> PushBatch | None:
    """A plain PUSHB as replicated: the :class:`PushBatch` :func:`_compact` makes of its dict;
    None when it fails a check of the PUSHB schema (a bad queue name, no jobs or more than
    ``batch_jobs_max``, a job's data over ``data_bytes_max``, an empty or long key), whose
    general path names what is wrong. Looked at as a whole: no call per job in Python."""
    jobs = bulk.jobs
    if not 0 < len(jobs) <= L.batch_jobs_max:
        return None
    try:
        _check_queue("queue", bulk.queue)
    except CommandError:
        return None
    if max(map(len, map(_data_of, jobs))) > L.data_bytes_max:
        return None
    keys = bulk.keys()
    if keys is not None:
        lengths = [len(key) for key in keys if key is not None] if None in keys else list(map(len, keys))
        if min(lengths) == 0 or max(lengths) > L.key_chars_max:
            return None
    return PushBatch(bulk.queue, bulk.datas(), keys, None)


def check_block(frames: list[PlainPush],
                refuse: Callable[[Any, CommandError], None]) -> tuple[list[Any], PushRun | None]:
    """The block's valid pushes as one :class:`PushRun` and their reqIds; each invalid push
    (data over the limit, a bad key) is answered through ``refuse(reqId, error)``."""
    req_ids: list[Any] = []
    datas: list[bytes] = []
    keys: list[str | None] | None = None
    names: list[str | None] | None = None
    data_max = L.data_bytes_max
    for frame in frames:
        data = bytes(frame.data)
        key = frame.idempotencyKey
        name = frame.name
        try:
            if len(data) > data_max:
                _check_data("data", Raw(data))
            if key is not None:
                _check_key("idempotencyKey", key)
            if name is not None:
                _check_name("name", name)
        except CommandError as exc:
            refuse(frame.reqId, exc)
            continue
        if key is not None and keys is None:
            keys = [None] * len(datas)
        if name is not None and names is None:
            names = [None] * len(datas)
        req_ids.append(frame.reqId)
        datas.append(data)
        if keys is not None:
            keys.append(key)
        if names is not None:
            names.append(name)
    if not req_ids:
        return req_ids, None
    return req_ids, PushRun(frames[0].queue, datas, keys, names)


def each_result(result: Any, n: int) -> list[Any]:
    """Per push of a :class:`PushRun` of ``n``: its outcome, from the run's reply or its one error."""
    return result["results"] if type(result) is dict else [result] * n


def session_pull(frame: dict[str, Any], session: str | None, bytes_max: int) -> Command:
    """A PULL/PULLB as replicated: with the session its leases belong to (None: detached, they
    outlive the connection) and, for PULLB, the reply's byte bound (the frame limit)."""
    if session is None and not bytes_max:
        return frame
    return SessionPull(frame, session, bytes_max)


# --- group commit --------------------------------------------------------------------------------

def commands_in(cmd: Command) -> int:
    """How many client commands ``cmd`` answers (a block of pushes counts each)."""
    return len(cmd.datas) if type(cmd) is PushRun else 1


def replicated_form(cmds: list[Command], partition: int) -> tuple[list[Command], list[int] | None]:
    """The commands of one Raft entry for the batch ``cmds`` of ``partition``.

    Each run of 2+ consecutive plain PUSH dicts to one queue becomes one :class:`PushRun`
    (one list of data bytes to encode and one segment for the engines to store, instead of
    a dict and a job object per push on every replica); every other command takes its
    compact form (:func:`_compact`). Returns the commands and, when pushes were merged,
    how many submitted commands each stands for (0: one, kept as its own); None when none were.
    """
    out: list[Command] = []
    sizes: list[int] = []
    merged = False
    i, n = 0, len(cmds)
    while i < n:
        cmd = cmds[i]
        j = i + 1
        if type(cmd) is dict and cmd["cmd"] == "PUSH" and cmd.keys() <= PLAIN_PUSH_FIELDS:
            queue = cmd["queue"]
            while j < n:
                nxt = cmds[j]
                if type(nxt) is not dict or nxt["cmd"] != "PUSH" or nxt["queue"] != queue \
                        or not nxt.keys() <= PLAIN_PUSH_FIELDS:
                    break
                j += 1
        if j - i < 2:
            out.append(_compact(cmd, partition))
            sizes.append(0)
            i += 1
            continue
        run = cmds[i:j]
        datas = [d.packed if type(d) is Raw else d for d in [c["data"] for c in run]]  # type: ignore[index]
        keys = [c.get("idempotencyKey") for c in run]  # type: ignore[union-attr]
        names = [c.get("name") for c in run]  # type: ignore[union-attr]
        out.append(PushRun(queue, datas, keys if any(k is not None for k in keys) else None,
                           names if any(n is not None for n in names) else None))
        sizes.append(j - i)
        merged = True
        i = j
    return out, (sizes if merged else None)


def _compact(cmd: Command, partition: int) -> Command:
    """``cmd`` as replicated: a plain PUSHB as a :class:`PushBatch`, an ACKB of one pull's
    consecutive jobs as an :class:`AckRun`, job data as bytes rather than ``Raw``.

    Plain bytes cost the log's encoder and decoder no Python object per job (a ``Raw`` is an
    extension value around them), and the engine stores the packed bytes either way. The ACKB run is checked once here instead of on every replica; the engine
    still checks the jobs' states and leases when it applies it.
    """
    if type(cmd) is not dict:
        return cmd
    name = cmd["cmd"]
    if name == "PUSH":
        data = cmd.get("data")
        if type(data) is Raw:
            cmd["data"] = data.packed
    elif name == "PUSHB":
        items = cmd["jobs"]
        plain = split_plain(items)
        if plain is not None:
            return PushBatch(cmd["queue"], plain[0], plain[1], plain[2])
        for item in items:
            data = item.get("data")
            if type(data) is Raw:
                item["data"] = data.packed
    elif name == "ACKB" and plain_ack(cmd):
        run = ack_run_of(partition, cmd["ids"], cmd.get("tokens"))
        if run is not None:
            return AckRun(*run)
    return cmd


def fan_out(cbs: list[ReplyCallback], results: list[Any], sizes: list[int] | None) -> None:
    """Answer each submitted command of an entry made by :func:`replicated_form` from ``results``."""
    if sizes is None:
        for cb, res in zip(cbs, results):
            cb(res)
        return
    k = 0
    for res, n in zip(results, sizes):
        if n == 0:
            cbs[k](res)
            k += 1
            continue
        for cb, r in zip(cbs[k:k + n], each_result(res, n)):
            cb(r)
        k += n
