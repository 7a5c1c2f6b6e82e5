"""Sans-I/O wire codec: 4-byte big-endian length, then a MessagePack map.

Bytes in, frames out: feed a :class:`FrameDecoder` whatever arrived and iterate
the whole frames it holds; :func:`encode` turns a frame into bytes. The size
limit is checked from the 4-byte header alone, before any body is buffered.

Job ``data`` travels opaque. On the node, a request decoder built with
``raw_data=True`` hands ``data`` (top level, and inside ``jobs`` items) over as
:class:`Raw`, the exact MessagePack bytes the client sent; :func:`encode`
splices a :class:`Raw` back verbatim. The node therefore never decodes or
re-encodes a job's payload.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack
import msgspec

from ._depth import DEPTH_MAX, depth_message, msgpack_req_id, msgpack_too_deep
from ._fast_frames import PlainBulk, PlainPush, decode_job_frame, map_len, plain_decoder, plain_entries
from .errors import ErrorCode, ProtocolError

__all__ = [
    "FRAME_BYTES_MAX_DEFAULT",
    "HEADER_BYTES",
    "Raw",
    "Prepacked",
    "FrameDecoder",
    "PlainBulk",
    "PlainPush",
    "encode",
    "encode_body",
    "decode_request",
    "decode_forwarded",
    "decode_response",
    "ReceivedBytes",
    "RECEIVED_BYTES",
    "raw_of",
    "item_fields",
    "unraw",
    "new_unpacker",
    "check_depth",
    "DEPTH_MAX",
    "ext_hook",
    "UNDEFINED_EXT",
]

FRAME_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
HEADER_BYTES = 4
_HEADER = struct.Struct(">I")
_plain_decode = plain_decoder.decode
_RAW_FIELDS = frozenset({"data"})
#: First bytes of a map or an array (fixmap, fixarray, array16/32, map16/32).
_CONTAINER_FIRST = frozenset([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])  # kept raw at the top level and in each item of "jobs"
#: MessagePack extension type 0 is how bunqueue's client (msgpackr) writes JavaScript's
#: ``undefined``: a field sent as ``undefined`` was not given, exactly like ``null``.
UNDEFINED_EXT = 0


def ext_hook(code: int, data: bytes) -> Any:
    """Decode extension ``code``: ``undefined`` (type 0) is ``None``; others stay ``ExtType``."""
    if code == UNDEFINED_EXT:
        return None
    return msgpack.ExtType(code, data)


class Raw:
    """A value that is already MessagePack: encoded verbatim, never re-packed.

    A slotted wrapper (not a ``bytes`` subclass) so that packing one by
    accident fails loudly instead of double-encoding it.
    """

    __slots__ = ("packed",)

    def __init__(self, packed: bytes) -> None:
        self.packed = packed

    def __eq__(self, other: object) -> bool:
        if type(other) is msgspec.Raw:  # the engine's pull replies carry those
            return bytes(other) == self.packed
        return isinstance(other, Raw) and other.packed == self.packed

    def __hash__(self) -> int:
        return hash(self.packed)

    def __repr__(self) -> str:
        return f"Raw({self.packed!r})"

    def __len__(self) -> int:
        return len(self.packed)

    def __reduce__(self) -> tuple[type, tuple[bytes]]:
        return (Raw, (self.packed,))

    def decode(self) -> Any:
        """The Python value these bytes encode (off the hot path: HTTP, tools)."""
        return msgpack.unpackb(self.packed, raw=False, strict_map_key=False, ext_hook=ext_hook)


_DICT_ONLY = {dict}
_item_data = operator.itemgetter("data")
_packed = operator.attrgetter("packed")


def item_fields(jobs: list[Any]) -> set[str] | None:
    """Every key any item of ``jobs`` holds, when every item is a dict; else None. In C: a
    bulk add's hundred items are looked at without a Python loop."""
    types = set(map(type, jobs))
    if types and types != _DICT_ONLY:
        return None
    return set().union(*jobs)


class Prepacked:
    """A value that writes its own MessagePack bytes: :meth:`pack` is given the codec's
    encoding of the values inside it (a pull's reply jobs, ``shoal.node.state._pulled``)."""

    __slots__ = ()

    def pack(self, encode: Callable[[Any], bytes]) -> bytes:
        """The value's MessagePack bytes."""
        raise NotImplementedError


def raw_of(value: Any) -> Raw:
    """Pack a Python value once into a :class:`Raw` (used by tools and tests)."""
    return Raw(msgpack.packb(value, use_bin_type=True))


def raw_bytes(value: Raw | msgspec.Raw) -> bytes:
    """The MessagePack bytes of a :class:`Raw` (or the engine's ``Stored``) or of the
    ``msgspec.Raw`` a pull's reply carries for a run of jobs."""
    return bytes(value) if type(value) is msgspec.Raw else value.packed


def unraw(value: Any) -> Any:
    """Replace every :class:`Raw` (or ``msgspec.Raw``) inside ``value`` by the value it encodes."""
    if isinstance(value, Raw):
        return value.decode()
    if type(value) is msgspec.Raw:
        return Raw(bytes(value)).decode()
    if isinstance(value, dict):
        return {k: unraw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, Prepacked)):
        return [unraw(v) for v in value]
    return value


def _encode_hook(obj: Any) -> Any:
    """msgspec's fallback for what it does not know: a Raw is spliced verbatim."""
    if type(obj) is Raw:
        return msgspec.Raw(obj.packed)
    if isinstance(obj, Raw):  # a subclass whose bytes are read now (the engine's Stored)
        try:
            return msgspec.Raw(obj.packed)
        except OSError as exc:  # a payload file that cannot be read: this reply fails, clearly
            raise ProtocolError(f"job data could not be read: {exc}", ErrorCode.INTERNAL) from exc
    if isinstance(obj, Prepacked):
        return msgspec.Raw(obj.pack(_inner_encoder.encode))
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"cannot encode a {type(obj).__name__}")


# msgspec encodes a whole frame in C, splicing each Raw's bytes through the hook: a PULLB reply
# of 100 jobs costs ~0.9 µs a job, where splicing the job maps in Python would cost ~3.7 µs.
_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_hook)
# A Prepacked value encodes what it holds with its own encoder: the hook runs inside _encoder's call.
_inner_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_hook)


def encode_body(frame: Mapping[str, Any]) -> bytes:
    """The MessagePack body of ``frame`` (no length prefix)."""
    try:
        return _encoder.encode(frame if type(frame) is dict else dict(frame))
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise ProtocolError(f"cannot encode frame: {exc}") from exc


def encode(frame: Mapping[str, Any], *, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> bytes:
    """Length-prefixed frame bytes for ``frame``.

    A body over ``frame_bytes_max`` raises a non-fatal ``FRAME_TOO_LARGE``
    :class:`ProtocolError` here, because the peer would refuse it and close
    the connection with every other command on it.
    """
    body = encode_body(frame)
    if len(body) > frame_bytes_max:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the maximum of {frame_bytes_max}",
                            ErrorCode.FRAME_TOO_LARGE)
    return len(body).to_bytes(4, "big") + body


def _read_raw(unpacker: msgpack.Unpacker, payload: bytes, base: int) -> Raw:
    start = unpacker.tell()
    unpacker.skip()
    return Raw(payload[start - base:unpacker.tell() - base])


def _decoded_span(unpacker: msgpack.Unpacker, payload: bytes, base: int) -> Any:
    """Skip one value and return it decoded (used to let validation report a wrong type)."""
    start = unpacker.tell()
    unpacker.skip()
    return msgpack.unpackb(payload[start - base:unpacker.tell() - base], raw=False, strict_map_key=False,
                          ext_hook=ext_hook)


def _read_job_item(unpacker: msgpack.Unpacker, payload: bytes, base: int) -> Any:
    """One item of a PUSHB ``jobs`` list: a map whose ``data`` stays raw."""
    try:
        size = unpacker.read_map_header()
    except msgpack.UnpackValueError:
        return _decoded_span(unpacker, payload, base)
    item: dict[Any, Any] = {}
    for _ in range(size):
        key = unpacker.unpack()
        item[key] = _read_raw(unpacker, payload, base) if key in _RAW_FIELDS else unpacker.unpack()
    return item


def decode_request(payload: bytes, *, raw_data: bool = False,
                   unpacker: msgpack.Unpacker | None = None) -> dict[str, Any]:
    """Decode one request body: a map with a string ``cmd``.

    With ``raw_data``, ``data`` and ``jobs[i].data`` are returned as :class:`Raw`.
    ``unpacker`` is a reusable streaming unpacker (creating one per frame costs
    more than decoding a small frame); it must be discarded after an error.
    Raises :class:`ProtocolError` for anything else; ``req_id`` is set on the
    error when the map carried one, so the reply can be matched.
    """
    try:
        if raw_data:
            frame = _decode_raw_map(payload, unpacker)
        else:
            frame = msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext_hook)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable MessagePack frame: {type(exc).__name__}") from exc
    if type(frame) is not dict:
        raise ProtocolError(f"frame must be a map, got {type(frame).__name__}")
    cmd = frame.get("cmd")
    if type(cmd) is not str or not cmd:
        req_id = frame.get("reqId")
        raise ProtocolError("cmd: missing or not a string" if cmd is None else "cmd: must be a non-empty string",
                            req_id=req_id if _plain_req_id(req_id) else None)
    return frame


def check_depth(payload: bytes | memoryview) -> None:
    """Raise a non-fatal ``INVALID`` :class:`ProtocolError` when ``payload`` nests deeper than
    :data:`DEPTH_MAX` (with the request's ``reqId`` when one can be found)."""
    if len(payload) > DEPTH_MAX and msgpack_too_deep(payload):
        raise _too_deep(msgpack_req_id(payload))


def _too_deep(req_id: Any) -> ProtocolError:
    """The refusal of a frame nested deeper than :data:`DEPTH_MAX`, answered to ``req_id`` if plain."""
    return ProtocolError(depth_message(), ErrorCode.INVALID, req_id=req_id if _plain_req_id(req_id) else None)


class ReceivedBytes:
    """A request's body as its client sent it, kept by the node's decoder in the decoded frame
    (under :data:`RECEIVED_BYTES`) so that a node forwarding it sends those bytes on unchanged.
    Its own type, which no decoder makes, tells it from a client's field of that name."""

    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body


#: Where the node's decoder (``plain_push``) keeps a request frame's :class:`ReceivedBytes`;
#: the dispatcher takes it out before anything reads the frame's fields.
RECEIVED_BYTES = "\x00received"


def decode_forwarded(payload: bytes) -> dict[str, Any]:
    """A request body a peer forwarded (checked for depth where the client sent it), decoded with
    its job data raw: the schema's fast decode when it fits, else :func:`decode_request`."""
    frame = _schema_job_frame(payload)
    return frame if frame is not None else decode_request(payload, raw_data=True)


def _schema_job_frame(payload: bytes) -> dict[str, Any] | None:
    """A job-carrying frame the job schema fits, decoded in C with its data raw; None for any
    other frame (the exact walk decodes it and says what is wrong)."""
    if b"\xa4data" in payload or b"\xa4jobs" in payload:
        frame = decode_job_frame(payload, Raw)
        if frame is not None and type(frame.get("cmd")) is str and frame["cmd"]:
            return frame
    return None


def _job_data_too_deep(frame: dict[str, Any]) -> bool:
    """Does a job frame decoded by its schema nest deeper than :data:`DEPTH_MAX`? Its own map is
    level 1, a ``PUSHB``'s items level 3, so ``data`` may nest ``DEPTH_MAX - 1`` levels at the
    top and ``DEPTH_MAX - 3`` in an item. Data shorter than that cannot nest so deep (a level
    takes a byte), and is not looked at."""
    data = frame.get("data")
    if data is not None and len(data) > DEPTH_MAX - 1 and msgpack_too_deep(data.packed, DEPTH_MAX - 1):
        return True
    jobs = frame.get("jobs")
    if jobs:
        limit = DEPTH_MAX - 3
        try:  # every item's data a Raw (what the schema's decode gives): their lengths in C
            if max(map(len, map(_packed, map(_item_data, jobs)))) <= limit:
                return False  # none long enough to nest so deep
        except (KeyError, AttributeError, TypeError):
            pass  # looked at one by one
        for job in jobs:
            data = job.get("data")
            if data is not None and len(data) > limit and msgpack_too_deep(data.packed, limit):
                return True
    return False


def _span_too_deep(data: msgspec.Raw, limit: int) -> bool:
    """Does ``data``, a value's span of a frame, nest deeper than ``limit`` levels? Only a map or
    an array longer than ``limit`` bytes can: scalar data (bytes, text) costs no walk."""
    return len(data) > limit and memoryview(data)[0] in _CONTAINER_FIRST and msgpack_too_deep(bytes(data), limit)


def _bulk_too_deep(bulk: PlainBulk) -> bool:
    """Does an item's data of ``bulk`` nest deeper than an item's data may (see
    :func:`_job_data_too_deep`)? Only data longer than that many bytes is looked at."""
    limit = DEPTH_MAX - 3
    if max(map(len, map(_bulk_item_data, bulk.jobs))) <= limit:
        return False
    return any(_span_too_deep(data, limit) for data in map(_bulk_item_data, bulk.jobs))


_bulk_item_data = operator.attrgetter("data")


def _plain_req_id(req_id: object) -> bool:
    return isinstance(req_id, (int, str)) and not isinstance(req_id, bool)


def new_unpacker(frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> msgpack.Unpacker:
    """A streaming unpacker suitable for :func:`decode_request`'s ``unpacker``."""
    return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(frame_bytes_max, 1),
                            ext_hook=ext_hook)


def _decode_raw_map(payload: bytes, unpacker: msgpack.Unpacker | None) -> Any:
    if b"data" not in payload and b"jobs" not in payload:
        # No key can be "data" or "jobs" (their UTF-8 bytes would appear): one C-level decode.
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext_hook)
    frame = decode_job_frame(payload, Raw)  # a plain PUSH/PUSHB in C; None: walk it exactly
    if frame is not None:
        return frame
    if unpacker is None:
        unpacker = new_unpacker(len(payload))
    base = unpacker.tell()
    unpacker.feed(payload)
    try:
        size = unpacker.read_map_header()
    except msgpack.UnpackValueError:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext_hook)
    unpack, tell, skip = unpacker.unpack, unpacker.tell, unpacker.skip
    frame: dict[Any, Any] = {}
    for _ in range(size):
        key = unpack()
        if key == "data":
            start = tell()
            skip()
            frame[key] = Raw(payload[start - base:tell() - base])
        elif key == "jobs":
            try:
                count = unpacker.read_array_header()
            except msgpack.UnpackValueError:
                frame[key] = _decoded_span(unpacker, payload, base)
                continue
            frame[key] = [_read_job_item(unpacker, payload, base) for _ in range(count)]
        else:
            frame[key] = unpack()
    if tell() - base != len(payload):
        raise ProtocolError("trailing bytes after the frame's map")
    return frame


def decode_response(payload: bytes) -> dict[str, Any]:
    """Decode one response or event body (a map; no ``cmd`` required)."""
    try:
        frame = msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext_hook)
    except Exception as exc:
        raise ProtocolError(f"undecodable MessagePack frame: {type(exc).__name__}") from exc
    if type(frame) is not dict:
        raise ProtocolError(f"frame must be a map, got {type(frame).__name__}")
    return frame


class FrameDecoder:
    """Incremental frame splitter: ``feed(bytes)``, then iterate decoded frames.

    ``requests=True`` validates request frames (``cmd`` present) and, with
    ``raw_data``, keeps job data raw; ``requests=False`` decodes responses.

    A malformed body raises :class:`ProtocolError` for that frame only (the
    stream stays in sync, iterate again for the next); a length over
    ``frame_bytes_max`` raises a *fatal* ``FRAME_TOO_LARGE`` and the decoder
    refuses further input.

    ``plain_push=True`` (the node) lets :meth:`drain` return a plain PUSH as a
    :class:`PlainPush` struct instead of a dict.
    """

    __slots__ = ("_buf", "_pos", "_max", "_requests", "_raw", "_broken", "_unpacker", "_plain")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT, *, requests: bool = True,
                 raw_data: bool = False, plain_push: bool = False) -> None:
        if frame_bytes_max < 1:
            raise ValueError("frame_bytes_max must be positive")
        self._buf = bytearray()
        self._pos = 0
        self._max = frame_bytes_max
        self._requests = requests
        self._raw = raw_data
        self._broken = False
        self._unpacker: msgpack.Unpacker | None = new_unpacker(frame_bytes_max) if raw_data else None
        self._plain = plain_push and requests and raw_data

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        if self._broken:
            raise ProtocolError("decoder closed after a fatal error", ErrorCode.PROTOCOL_ERROR, fatal=True)
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_payload(self) -> bytes | None:
        """The next whole frame body, or ``None`` when more bytes are needed."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_BYTES:
            return None
        length = int.from_bytes(buf[pos:pos + HEADER_BYTES], "big")
        if length > self._max:
            self._broken = True
            raise ProtocolError(f"frame of {length} bytes exceeds the maximum of {self._max}",
                                ErrorCode.FRAME_TOO_LARGE, fatal=True)
        end = pos + HEADER_BYTES + length
        if len(buf) < end:
            return None
        payload = bytes(buf[pos + HEADER_BYTES:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > 1 << 20:
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return payload

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def drain(self, data: bytes) -> list[Any]:
        """Feed ``data`` and return every whole frame now buffered, in order.

        Each item is a decoded frame (a :class:`PlainPush` when built with
        ``plain_push``) or the :class:`ProtocolError` of a malformed one; a fatal
        error is the last item and closes the decoder. The node's receive path:
        one tight loop over a burst of pipelined frames, with no per-frame
        generator step or copy into the buffer when no partial frame was pending.
        """
        if self._broken:
            raise ProtocolError("decoder closed after a fatal error", ErrorCode.PROTOCOL_ERROR, fatal=True)
        buf = self._buf
        if self._pos == len(buf):
            src: bytes = data  # nothing pending: parse the received bytes in place
            if buf:
                buf.clear()
                self._pos = 0
        else:
            buf += data
            pending = len(buf) - self._pos
            if pending < HEADER_BYTES:
                return []
            length = int.from_bytes(buf[self._pos:self._pos + HEADER_BYTES], "big")
            if pending < HEADER_BYTES + length and length <= self._max:
                return []  # still inside one frame: no copy of what is buffered
            src = bytes(buf[self._pos:])
            buf.clear()
            self._pos = 0
        out: list[Any] = []
        view = memoryview(src)
        size, pos, limit = len(src), 0, self._max
        plain, header = self._plain, _HEADER.unpack_from
        while size - pos >= HEADER_BYTES:
            (length,) = header(src, pos)
            if length > limit:
                self._broken = True
                out.append(ProtocolError(f"frame of {length} bytes exceeds the maximum of {limit}",
                                         ErrorCode.FRAME_TOO_LARGE, fatal=True))
                return out
            start = pos + HEADER_BYTES
            pos = start + length
            if pos > size:
                pos = start - HEADER_BYTES
                break
            if plain and length:
                try:
                    push = _plain_decode(view[start:pos])
                except (msgspec.MsgspecError, RecursionError):
                    pass  # (too deep for msgspec: the check below says so)
                else:
                    first = src[start]  # a fixmap's count is read inline: this runs once per PUSH
                    entries = first & 0x0F if 0x80 <= first <= 0x8F else map_len(view[start:pos])
                    if type(push) is PlainPush:
                        if entries == plain_entries(push):
                            too_deep = length > DEPTH_MAX and _span_too_deep(push.data, DEPTH_MAX - 1)
                            out.append(_too_deep(push.reqId) if too_deep else push)
                            continue
                    elif entries == plain_entries(push) and push.jobs:
                        push.body = src[start:pos]
                        out.append(_too_deep(push.reqId) if _bulk_too_deep(push) else push)
                        continue
            if length > DEPTH_MAX and self._raw and self._requests:
                # A job frame the schema fits nests only inside its data (every other field is
                # a scalar): its data spans are checked, not the whole frame.
                frame = self._job_frame(src[start:pos])
                if frame is not None:
                    out.append(_too_deep(frame.get("reqId")) if _job_data_too_deep(frame) else frame)
                    continue
            if length > DEPTH_MAX and msgpack_too_deep(src[start:pos]):
                # Refused before any decoder recurses into it (msgspec gives up near 1,000 levels).
                out.append(_too_deep(msgpack_req_id(src[start:pos])))
                continue
            try:
                out.append(self._decode(src[start:pos]))
            except ProtocolError as exc:
                out.append(exc)
        if pos < size:
            buf += view[pos:]
        return out

    def _job_frame(self, payload: bytes) -> dict[str, Any] | None:
        """:func:`_schema_job_frame`, with its bytes for the node's decoder (:meth:`_received`)."""
        frame = _schema_job_frame(payload)
        if frame is not None and self._plain:
            self._received(frame, payload)
        return frame

    @staticmethod
    def _received(frame: dict[str, Any], payload: bytes) -> None:
        """The node's decoder (``plain_push``) keeps a request's bytes in it
        (:class:`ReceivedBytes`), for a node that sends it on to another as it came; a client's
        own field of that name is left for the schema to refuse."""
        if RECEIVED_BYTES not in frame:
            frame[RECEIVED_BYTES] = ReceivedBytes(payload)

    def _decode(self, payload: bytes) -> dict[str, Any]:
        if self._requests:
            if self._raw:
                frame = self._job_frame(payload)
                if frame is not None:
                    return frame
            try:
                frame = decode_request(payload, raw_data=self._raw, unpacker=self._unpacker)
            except ProtocolError:
                if self._raw:  # a failed parse can leave bytes buffered: start the next frame clean
                    self._unpacker = new_unpacker(self._max)
                raise
            if self._plain:
                self._received(frame, payload)
            return frame
        return decode_response(payload)

    def __next__(self) -> dict[str, Any]:
        payload = self.next_payload()
        if payload is None:
            raise StopIteration
        if self._requests:
            check_depth(payload)
        return self._decode(payload)
