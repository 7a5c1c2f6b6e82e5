"""The payload of a data entry in the Raft log: a versioned MessagePack codec of command batches.

A data entry carries one batch: the leader's clock stamp and the commands it replicates
(validated command dicts and the typed forms of :mod:`shoal.node.state._commands`). Its
payload is::

    ENTRY_DATA (0x00) | format version (1 byte) | body

Format 1, the one written, has a MessagePack body ``[now_ms, [command, ...]]``: a command
dict is a map; a typed command is an array whose first element names it (1 ``PushRun``,
2 ``PushBatch``, 3 ``AckRun``, 4 ``SessionPull``) followed by its fields in order. Job data
stays the bytes the client sent. Three extension types carry what plain MessagePack cannot:
1 a :class:`~shoal.cluster.codec.Raw` (the MessagePack bytes verbatim), 2 an extension value
a client sent (its type code as one signed byte, then its data), 3 a MessagePack timestamp
a client sent (the timestamp's own 4, 8 or 12 bytes). A tuple is written as an array and read
back as a list; the engine treats them alike.

Version byte ``0x80`` is the first byte of a pickle (protocol 2 and later): entries the
release a0861d3 wrote. :func:`read_legacy_batch` reads the plain data they hold by walking the
pickle's opcodes (``pickletools.genops``, which runs nothing), refusing any opcode or class
outside what those entries use. Any other version, and a payload that does not decode, raises
:class:`LogFormatError` naming the entry and the version. ``docs/formats.md`` is the
reference, with the upgrade story.
"""

from __future__ import annotations

import pickletools
from collections.abc import Callable, Sequence
from typing import Any, Union

import msgpack
import msgspec

from shoal.cluster.codec import Raw

from ..raft.messages import ENTRY_DATA
from ..state import AckRun, Command, PushBatch, PushRun, SessionPull

__all__ = ["FORMAT_VERSION", "LEGACY_PICKLE", "VERSIONS_READ", "LogFormatError", "LegacyEntryError", "encode_batch",
           "decode_batch", "payload_version", "read_legacy_batch", "EXT_RAW", "EXT_FOREIGN", "EXT_TIMESTAMP"]

#: The format :func:`encode_batch` writes.
FORMAT_VERSION = 1
#: The version byte of a pickled entry (release a0861d3): read, never written.
LEGACY_PICKLE = 0x80
VERSIONS_READ = (FORMAT_VERSION, LEGACY_PICKLE)
#: Extension types of format 1.
EXT_RAW = 1
EXT_FOREIGN = 2
EXT_TIMESTAMP = 3
#: Tags of the typed commands in format 1.
TAG_PUSH_RUN = 1
TAG_PUSH_BATCH = 2
TAG_ACK_RUN = 3
TAG_SESSION_PULL = 4

_HEAD = bytes([ENTRY_DATA, FORMAT_VERSION])


class LogFormatError(ValueError):
    """A data entry's payload that cannot be read: unknown version or malformed content.

    ``index`` (the entry's log index, when the caller named it) and ``version`` (the payload's
    version byte, when it has one) are set for the log and for tests.
    """

    def __init__(self, problem: str, *, index: int | None = None, version: int | None = None) -> None:
        where = "data entry" if index is None else f"data entry {index}"
        what = "" if version is None else f" (format version {version:#04x})"
        super().__init__(f"{where}{what}: {problem}")
        self.index = index
        self.version = version


# --- format 1: the typed commands as tagged arrays -------------------------------------------------
#
# Each mirrors one typed command field for field (tests/unit/test_log_format.py checks they
# match). A field added to a typed command is added here at the end with a default, which
# keeps entries written without it readable.

class _PushRunRow(msgspec.Struct, array_like=True, tag=TAG_PUSH_RUN, frozen=True, gc=False):
    queue: str
    datas: list[Any]
    keys: Union[list[Any], None] = None
    names: Union[list[Any], None] = None

    def command(self) -> PushRun:
        return PushRun(self.queue, self.datas, self.keys, self.names)


class _PushBatchRow(msgspec.Struct, array_like=True, tag=TAG_PUSH_BATCH, frozen=True, gc=False):
    queue: str
    datas: list[Any]
    keys: Union[list[Any], None] = None
    names: Union[list[Any], None] = None

    def command(self) -> PushBatch:
        return PushBatch(self.queue, self.datas, self.keys, self.names)


class _AckRunRow(msgspec.Struct, array_like=True, tag=TAG_ACK_RUN, frozen=True, gc=False):
    first: int
    count: int
    lease: int = -1

    def command(self) -> AckRun:
        return AckRun(self.first, self.count, self.lease)


class _SessionPullRow(msgspec.Struct, array_like=True, tag=TAG_SESSION_PULL, frozen=True, gc=False):
    cmd: dict[Any, Any]
    session: Union[str, None] = None
    bytes_max: int = 0

    def command(self) -> SessionPull:
        return SessionPull(self.cmd, self.session, self.bytes_max)


#: Each typed command's row class, for the field check in the tests.
ROWS: dict[type, type[msgspec.Struct]] = {PushRun: _PushRunRow, PushBatch: _PushBatchRow, AckRun: _AckRunRow,
                                          SessionPull: _SessionPullRow}

_Body = tuple[int, list[Union[dict[Any, Any], _PushRunRow, _PushBatchRow, _AckRunRow, _SessionPullRow]]]


# --- writing ------------------------------------------------------------------------------------------

class _Foreign:
    """A client's extension value (``msgpack.ExtType``) on its way to the encoder: ``ExtType`` is a
    named tuple, which msgspec would write as an array."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        self.code = code
        self.data = data

    def __hash__(self) -> int:
        return hash((self.code, self.data))

    def __eq__(self, other: object) -> bool:
        return type(other) is _Foreign and other.code == self.code and other.data == self.data


_SCALARS = frozenset({str, bytes, int, float, bool, type(None), Raw, msgpack.Timestamp})


def _has_ext(value: Any) -> bool:
    """True when ``value`` holds a ``msgpack.ExtType`` anywhere (key or value); iterative, as
    deep as a client may nest (``DEPTH_MAX``) and deeper."""
    todo = [value]
    pop, push = todo.pop, todo.append
    while todo:
        item = pop()
        kind = type(item)
        if kind is dict:
            for k, v in item.items():
                if type(k) not in _SCALARS:
                    push(k)
                if type(v) not in _SCALARS:
                    push(v)
        elif kind is list or kind is tuple:
            for v in item:
                if type(v) not in _SCALARS:
                    push(v)
        elif kind is msgpack.ExtType:
            return True
    return False


def _wrap_ext(value: Any) -> Any:
    """A copy of ``value`` with every ``msgpack.ExtType`` wrapped (the caller's value is untouched).
    One frame per level of nesting: a client's ``DEPTH_MAX`` levels fit the recursion limit."""
    kind = type(value)
    if kind is msgpack.ExtType:
        return _Foreign(value.code, value.data)
    if kind is dict:
        out = {}
        for k, v in value.items():
            out[_wrap_ext(k) if type(k) not in _SCALARS else k] = _wrap_ext(v) if type(v) not in _SCALARS else v
        return out
    if kind is list or kind is tuple:
        items = []
        for v in value:
            items.append(_wrap_ext(v) if type(v) not in _SCALARS else v)
        return items
    return value


def _enc_hook(value: Any) -> Any:
    kind = type(value)
    if kind is Raw or isinstance(value, Raw):  # or the engine's Stored, read now
        return msgspec.msgpack.Ext(EXT_RAW, value.packed)
    if kind is msgpack.Timestamp:
        return msgspec.msgpack.Ext(EXT_TIMESTAMP, value.to_bytes())
    if kind is _Foreign:
        return msgspec.msgpack.Ext(EXT_FOREIGN, value.code.to_bytes(1, "big", signed=True) + value.data)
    raise TypeError(f"a {kind.__name__} cannot be written in a log entry")


_encode = msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode


def _plain(cmd: dict[Any, Any]) -> dict[Any, Any]:
    return _wrap_ext(cmd) if _has_ext(cmd) else cmd


def _is_list(value: Any) -> bool:
    return type(value) is list or type(value) is tuple


def _row(cmd: Any) -> Any:
    """``cmd`` as format 1 writes it; :class:`LogFormatError` for what could not be read back."""
    kind = type(cmd)
    if kind is dict:
        return _plain(cmd)
    if kind is PushRun or kind is PushBatch:
        if type(cmd.queue) is str and _is_list(cmd.datas) and (cmd.keys is None or _is_list(cmd.keys)) \
                and (cmd.names is None or _is_list(cmd.names)):
            datas = cmd.datas
            if not set(map(type, datas)) <= _SCALARS:  # job data is bytes; anything else is checked
                datas = _wrap_ext(datas)
            return (TAG_PUSH_RUN if kind is PushRun else TAG_PUSH_BATCH, cmd.queue, datas, cmd.keys, cmd.names)
    elif kind is AckRun:
        if type(cmd.first) is int and type(cmd.count) is int and type(cmd.lease) is int:
            return (TAG_ACK_RUN, cmd.first, cmd.count, cmd.lease)
    elif kind is SessionPull:
        if type(cmd.cmd) is dict and (cmd.session is None or type(cmd.session) is str) \
                and type(cmd.bytes_max) is int:
            return (TAG_SESSION_PULL, _plain(cmd.cmd), cmd.session, cmd.bytes_max)
    else:
        raise LogFormatError(f"a {kind.__name__} is not a command", version=FORMAT_VERSION)
    raise LogFormatError(f"{kind.__name__} with fields of the wrong types: {cmd!r}", version=FORMAT_VERSION)


def encode_batch(now_ms: int, commands: Sequence[Command]) -> bytes:
    """The payload of a data entry holding ``commands`` stamped ``now_ms``, in format 1.

    Raises :class:`LogFormatError` for a value format 1 cannot carry (every payload it
    returns decodes back)."""
    if type(now_ms) is not int:
        raise LogFormatError(f"clock stamp {now_ms!r} is not an integer", version=FORMAT_VERSION)
    try:
        rows = [cmd if type(cmd) is dict and not _has_ext(cmd) else _row(cmd) for cmd in commands]
        return _HEAD + _encode((now_ms, rows))
    except LogFormatError:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise LogFormatError(f"cannot write the batch: {exc}", version=FORMAT_VERSION) from None


# --- reading ------------------------------------------------------------------------------------------

def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_RAW:
        return Raw(bytes(data))
    if code == EXT_FOREIGN:
        if len(data) < 1:
            raise ValueError("empty foreign extension value")
        return msgpack.ExtType(int.from_bytes(data[:1], "big", signed=True), bytes(data[1:]))
    if code == EXT_TIMESTAMP:
        return msgpack.Timestamp.from_bytes(bytes(data))
    raise ValueError(f"unknown extension type {code}")


_decode_v1 = msgspec.msgpack.Decoder(_Body, ext_hook=_ext_hook).decode


def payload_version(payload: bytes | memoryview) -> int:
    """The format version byte of a data entry's payload; :class:`LogFormatError` if it has none."""
    if len(payload) < 2 or payload[0] != ENTRY_DATA:
        raise LogFormatError("not a data entry payload (kind byte or version byte missing)")
    return payload[1]


def decode_batch(payload: bytes | memoryview, index: int | None = None) -> tuple[int, list[Command]]:
    """``(now_ms, commands)`` of a data entry's payload, of any version read (:data:`VERSIONS_READ`).

    ``index`` is the entry's log index, named in the error. Raises :class:`LogFormatError`
    for an unknown version or a payload that does not decode; nothing in the payload is run."""
    if len(payload) < 2 or payload[0] != ENTRY_DATA:
        raise LogFormatError("not a data entry payload (kind byte or version byte missing)", index=index)
    version = payload[1]
    if version == FORMAT_VERSION:
        try:
            now_ms, rows = _decode_v1(memoryview(payload)[2:])
            commands: list[Command] = [row if type(row) is dict else row.command() for row in rows]
        except (msgspec.DecodeError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise LogFormatError(f"malformed payload: {exc}", index=index, version=version) from None
        return now_ms, commands
    if version == LEGACY_PICKLE:
        try:
            return read_legacy_batch(bytes(memoryview(payload)[1:]))
        except LegacyEntryError as exc:
            raise LogFormatError(str(exc), index=index, version=version) from None
    raise LogFormatError(f"unknown format version (this release reads {', '.join(f'{v:#04x}' for v in VERSIONS_READ)})",
                         index=index, version=version)


# --- reading release a0861d3's pickled entries -------------------------------------------------------
#
# Those entries are ``pickle.dumps((now_ms, commands), protocol=5)``: containers, scalars, the
# typed commands (msgspec structs, pickled as their class and a tuple of fields), ``Raw``,
# and a client's ``msgpack.ExtType`` and ``msgpack.Timestamp``. The walk below builds exactly
# those from the opcode stream; it never imports or calls what a pickle names.

class LegacyEntryError(ValueError):
    """A pickled entry holding something outside what release a0861d3 wrote (or not a pickle)."""


class _Global:
    """A class a legacy entry may name, and how it is built from what the pickle gives it."""

    __slots__ = ("name", "reduce", "newobj")

    def __init__(self, name: str, *, reduce: Callable[[tuple[Any, ...]], Any] | None = None,
                 newobj: Callable[[tuple[Any, ...]], Any] | None = None) -> None:
        self.name = name
        self.reduce = reduce
        self.newobj = newobj


class _PendingTimestamp:
    """A ``msgpack.Timestamp`` between its NEWOBJ and the BUILD that gives it its fields."""

    __slots__ = ()


def _typed(row: type[msgspec.Struct]) -> Callable[[tuple[Any, ...]], Any]:
    def build(args: tuple[Any, ...]) -> Any:
        fields = row.__struct_fields__
        if len(args) > len(fields):
            raise LegacyEntryError(f"{row.__name__}: {len(args)} fields, expected at most {len(fields)}")
        try:
            return msgspec.convert([row.__struct_config__.tag, *args], row).command()  # type: ignore[attr-defined]
        except msgspec.ValidationError as exc:
            raise LegacyEntryError(f"{row.__name__[1:-3]}: {exc}") from None
    return build


def _raw(args: tuple[Any, ...]) -> Raw:
    if len(args) != 1 or type(args[0]) is not bytes:
        raise LegacyEntryError("Raw takes one bytes value")
    return Raw(args[0])


def _ext_type(args: tuple[Any, ...]) -> msgpack.ExtType:
    if len(args) != 2 or type(args[0]) is not int or type(args[1]) is not bytes:
        raise LegacyEntryError("ExtType takes a code and bytes")
    try:
        return msgpack.ExtType(*args)
    except (TypeError, ValueError) as exc:
        raise LegacyEntryError(f"ExtType: {exc}") from None


def _timestamp(args: tuple[Any, ...]) -> _PendingTimestamp:
    if args:
        raise LegacyEntryError("Timestamp is built from its state, not arguments")
    return _PendingTimestamp()


_GLOBALS: dict[tuple[str, str], _Global] = {
    ("shoal.node.state._commands", "PushRun"): _Global("PushRun", reduce=_typed(_PushRunRow)),
    ("shoal.node.state._commands", "PushBatch"): _Global("PushBatch", reduce=_typed(_PushBatchRow)),
    ("shoal.node.state._commands", "AckRun"): _Global("AckRun", reduce=_typed(_AckRunRow)),
    ("shoal.node.state._commands", "SessionPull"): _Global("SessionPull", reduce=_typed(_SessionPullRow)),
    ("shoal.cluster.codec", "Raw"): _Global("Raw", reduce=_raw),
    ("msgpack.ext", "ExtType"): _Global("ExtType", newobj=_ext_type),
    ("msgpack.ext", "Timestamp"): _Global("Timestamp", newobj=_timestamp),
}

_NOTHING = object()
#: Opcodes pushing their argument as it is (genops has decoded it already).
_VALUE_OPS = frozenset({"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT", "SHORT_BINUNICODE",
                        "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"})
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_MEMO_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_IGNORED = frozenset({"PROTO", "FRAME"})


def _hashable(key: Any, where: int) -> Any:
    try:
        hash(key)
    except TypeError:
        raise LegacyEntryError(f"unhashable dict key {type(key).__name__} at byte {where}") from None
    return key


def read_legacy_batch(pickled: bytes) -> tuple[int, list[Command]]:
    """``(now_ms, commands)`` of a pickled entry body (the payload after its kind byte), built by
    walking its opcodes; :class:`LegacyEntryError` names the opcode or class it refuses."""
    stack: list[Any] = []
    marks: list[list[Any]] = []
    memo: dict[int, Any] = {}

    def pop_mark() -> list[Any]:
        nonlocal stack
        if not marks:
            raise LegacyEntryError("MARK missing")
        items = stack
        stack = marks.pop()
        return items

    def pop() -> Any:
        if not stack:
            raise LegacyEntryError("a value missing on the stack")
        return stack.pop()

    result: Any = _NOTHING
    try:
        for op, arg, pos in pickletools.genops(pickled):
            name = op.name
            where = pos if pos is not None else -1
            if name in _VALUE_OPS:
                stack.append(arg)
            elif name in _CONSTANTS:
                stack.append(_CONSTANTS[name])
            elif name == "MEMOIZE":
                if not stack:
                    raise LegacyEntryError("MEMOIZE on an empty stack")
                memo[len(memo)] = stack[-1]
            elif name in _MEMO_PUT:
                if not stack:
                    raise LegacyEntryError(f"{name} on an empty stack")
                memo[arg] = stack[-1]
            elif name in _MEMO_GET:
                if arg not in memo:
                    raise LegacyEntryError(f"{name} {arg} names nothing memoized")
                stack.append(memo[arg])
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise LegacyEntryError(f"{name} on a stack of {len(stack)}")
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(items)
            elif name == "TUPLE":
                items = pop_mark()  # first: it replaces ``stack``
                stack.append(tuple(items))
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "LIST":
                items = pop_mark()
                stack.append(items)
            elif name == "APPEND":
                value = pop()
                target = stack[-1] if stack else None
                if type(target) is not list:
                    raise LegacyEntryError(f"APPEND to a {type(target).__name__} at byte {where}")
                target.append(value)
            elif name == "APPENDS":
                items = pop_mark()
                target = stack[-1] if stack else None
                if type(target) is not list:
                    raise LegacyEntryError(f"APPENDS to a {type(target).__name__} at byte {where}")
                target.extend(items)
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "DICT":
                items = pop_mark()
                if len(items) % 2:
                    raise LegacyEntryError(f"DICT of an odd number of items at byte {where}")
                stack.append({_hashable(items[i], where): items[i + 1] for i in range(0, len(items), 2)})
            elif name in ("SETITEM", "SETITEMS"):
                items = [pop(), pop()][::-1] if name == "SETITEM" else pop_mark()
                target = stack[-1] if stack else None
                if type(target) is not dict or len(items) % 2:
                    raise LegacyEntryError(f"{name} on a {type(target).__name__} at byte {where}")
                for i in range(0, len(items), 2):
                    target[_hashable(items[i], where)] = items[i + 1]
            elif name == "STACK_GLOBAL":
                qualname, module = pop(), pop()
                found = _GLOBALS.get((module, qualname)) if type(module) is str and type(qualname) is str else None
                if found is None:
                    raise LegacyEntryError(f"refused class {module}.{qualname} at byte {where}")
                stack.append(found)
            elif name == "REDUCE":
                args, func = pop(), pop()
                if type(func) is not _Global or func.reduce is None or type(args) is not tuple:
                    raise LegacyEntryError(f"refused call at byte {where}")
                stack.append(func.reduce(args))
            elif name == "NEWOBJ":
                args, cls = pop(), pop()
                if type(cls) is not _Global or cls.newobj is None or type(args) is not tuple:
                    raise LegacyEntryError(f"refused object at byte {where}")
                stack.append(cls.newobj(args))
            elif name == "BUILD":
                state, target = pop(), pop()
                if type(target) is not _PendingTimestamp:
                    raise LegacyEntryError(f"refused BUILD at byte {where}")
                fields = state[1] if type(state) is tuple and len(state) == 2 and state[0] is None else None
                if type(fields) is not dict or set(fields) != {"seconds", "nanoseconds"} \
                        or type(fields["seconds"]) is not int or type(fields["nanoseconds"]) is not int:
                    raise LegacyEntryError(f"Timestamp with state {state!r} at byte {where}")
                try:
                    built = msgpack.Timestamp(fields["seconds"], fields["nanoseconds"])
                except (TypeError, ValueError) as exc:
                    raise LegacyEntryError(f"Timestamp: {exc}") from None
                for key, value in memo.items():  # the memo may hold it already (MEMOIZE after NEWOBJ)
                    if value is target:
                        memo[key] = built
                stack.append(built)
            elif name == "POP":
                pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "STOP":
                if len(stack) != 1 or marks:
                    raise LegacyEntryError(f"STOP with {len(stack)} values on the stack")
                result = stack[0]
            elif name in _IGNORED:
                pass
            else:
                raise LegacyEntryError(f"refused opcode {name} at byte {where}")
    except ValueError as exc:
        if isinstance(exc, LegacyEntryError):
            raise
        raise LegacyEntryError(f"not a readable pickle: {exc}") from None
    if result is _NOTHING:
        raise LegacyEntryError("no STOP opcode")
    if type(result) is not tuple or len(result) != 2 or type(result[0]) is not int or type(result[1]) is not list:
        raise LegacyEntryError(f"expected (now_ms, [commands]), got {type(result).__name__}")
    now_ms, commands = result
    for cmd in commands:
        if type(cmd) is not dict and type(cmd) not in ROWS:
            raise LegacyEntryError(f"a {type(cmd).__name__} is not a command")
        if _pending(cmd):
            raise LegacyEntryError("a Timestamp without its state")
    return now_ms, commands


def _pending(value: Any) -> bool:
    kind = type(value)
    if kind is _PendingTimestamp:
        return True
    if kind is dict:
        return any(_pending(k) or _pending(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return any(_pending(v) for v in value)
    if kind is SessionPull:
        return _pending(value.cmd)
    return False
