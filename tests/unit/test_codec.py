"""The sans-I/O wire codec: round trips, arbitrary chunking, the size limit, garbage."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _strategies import any_request, msgpack_values, request
from shoal.cluster.codec import (
    FRAME_BYTES_MAX_DEFAULT, FrameDecoder, Raw, decode_request, decode_response, encode, encode_body, raw_of, unraw,
)
from shoal.cluster.commands import COMMANDS, validate
from shoal.cluster.errors import ErrorCode, ProtocolError


def decode_all(stream: bytes, chunks: list[int] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Feed ``stream`` to a fresh decoder (cut at ``chunks`` offsets) and collect every frame."""
    decoder = FrameDecoder(**kw)
    cuts = [0, *(chunks or []), len(stream)]
    frames: list[dict[str, Any]] = []
    for a, b in zip(cuts, cuts[1:]):
        decoder.feed(stream[a:b])
        frames.extend(decoder)
    assert decoder.buffered_bytes == 0
    return frames


# --- round trips -------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(any_request)
def test_every_command_round_trips(frame: dict[str, Any]) -> None:
    internal = frame["cmd"].startswith("_")
    wire = encode(frame)
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    (plain,) = decode_all(wire)
    assert plain == frame
    (raw,) = decode_all(wire, raw_data=True)
    assert validate(raw, internal=internal) is raw  # validation works on Raw data too
    assert unraw(raw) == frame
    # The node relays Raw data verbatim: re-encoding it gives the client's value back.
    (again,) = decode_all(encode(raw))
    assert again == frame


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_each_command_round_trips(cmd: str, data: st.DataObject) -> None:
    frame = data.draw(request(cmd))
    assert decode_request(encode_body(frame)) == frame
    assert unraw(decode_request(encode_body(frame), raw_data=True)) == frame


def test_raw_data_is_the_clients_bytes() -> None:
    data = {"to": "a@example.com", "n": [1, 2.5, None]}
    body = msgpack.packb({"cmd": "PUSH", "queue": "q", "data": data, "reqId": 3})
    frame = decode_request(body, raw_data=True)
    assert frame["data"] == Raw(msgpack.packb(data))
    jobs = decode_request(msgpack.packb({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": data, "priority": 1}]}),
                          raw_data=True)
    assert jobs["jobs"][0] == {"data": Raw(msgpack.packb(data)), "priority": 1}
    # A Raw is spliced verbatim, never packed as bytes.
    assert encode_body({"data": raw_of([1, 2])}) == msgpack.packb({"data": [1, 2]})
    assert Raw(b"\x01").decode() == 1 and len(Raw(b"\x01")) == 1


def _map(*pairs: tuple[bytes, bytes]) -> bytes:
    """A map frame from already-packed keys and values (to write encodings msgpack would not)."""
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


@pytest.mark.parametrize("data", [
    b"\xca\x3f\xc0\x00\x00",               # float32 1.5: a C decode would give back a float64
    b"\xc5\x00\x03abc",                      # bin16 header for 3 bytes (not the minimal bin8)
    b"\xd9\x02hi",                            # str8 header for a 2-char string (not fixstr)
    b"\xd6\xff\x00\x00\x00\x01",              # timestamp ext
    b"\xc4\x03xyz",                           # the minimal encoding
])
def test_small_frames_keep_every_encoding_of_data_byte_for_byte(data: bytes) -> None:
    pk = msgpack.packb
    tag = "\u00a4data"  # its UTF-8 holds the bytes of the "data" key
    body = _map((pk("cmd"), pk("PUSH")), (pk("queue"), pk("q")), (pk("tag"), pk(tag)), (pk("data"), data),
                (pk("reqId"), pk(7)))
    frame = decode_request(body, raw_data=True)
    assert frame["data"] == Raw(data)
    assert frame["tag"] == tag and frame["reqId"] == 7
    big = _map((pk("cmd"), pk("PUSH")), (pk("queue"), pk("q")), (pk("pad"), pk("p" * 5000)), (pk("data"), data))
    assert decode_request(big, raw_data=True)["data"] == Raw(data)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6))
def test_responses_round_trip(reply: dict[str, Any]) -> None:
    (out,) = decode_all(encode(reply), requests=False)
    assert out == reply


# --- arbitrary chunking ------------------------------------------------------------------------

STREAM_FRAMES = [
    {"cmd": "PUSH", "queue": "emails", "data": {"to": "x@y.z", "body": "é" * 20}, "priority": 3, "reqId": 1},
    {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": [1, 2, 3]}, {"data": None, "delay": 5}], "reqId": 2},
    {"cmd": "Ping"},
    {"cmd": "ACKB", "ids": ["1-1", "1-2"], "results": [b"\x00\xff", {"k": 1.5}], "reqId": 4},
]


@pytest.mark.parametrize("raw_data", [False, True])
def test_stream_split_at_every_byte_position(raw_data: bool) -> None:
    stream = b"".join(encode(f) for f in STREAM_FRAMES)
    for cut in range(len(stream) + 1):
        frames = decode_all(stream, [cut], raw_data=raw_data)
        assert [unraw(f) for f in frames] == STREAM_FRAMES, cut
    one_byte_at_a_time = decode_all(stream, list(range(1, len(stream))), raw_data=raw_data)
    assert [unraw(f) for f in one_byte_at_a_time] == STREAM_FRAMES


@settings(max_examples=200, deadline=None)
@given(st.lists(any_request, min_size=1, max_size=6), st.data())
def test_random_frames_in_random_chunks(frames: list[dict[str, Any]], data: st.DataObject) -> None:
    stream = b"".join(encode(f) for f in frames)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=10)))
    assert decode_all(stream, cuts) == frames
    assert [unraw(f) for f in decode_all(stream, cuts, raw_data=True)] == frames


# --- the size limit ----------------------------------------------------------------------------

def _frame_of_body_size(size: int) -> bytes:
    """A valid request frame whose MessagePack body is exactly ``size`` bytes."""
    base = len(encode_body({"cmd": "PUSH", "queue": "q", "data": b""}))
    pad = size - base
    # bin8 holds up to 255 bytes, bin16 up to 65535: account for the longer header.
    if pad > 255:
        pad -= 1
    if pad > 65535 + 1:
        pad -= 2
    body = encode_body({"cmd": "PUSH", "queue": "q", "data": b"x" * pad})
    assert len(body) == size, (len(body), size)
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("raw_data", [False, True])
def test_frame_at_the_limit_is_accepted(raw_data: bool) -> None:
    limit = 1000
    (frame,) = decode_all(_frame_of_body_size(limit), frame_bytes_max=limit, raw_data=raw_data)
    assert frame["cmd"] == "PUSH"


def test_frame_one_past_the_limit_is_refused_from_the_header() -> None:
    limit = 1000
    wire = _frame_of_body_size(limit + 1)
    decoder = FrameDecoder(limit)
    decoder.feed(wire[:4])  # the header alone is enough to refuse it
    with pytest.raises(ProtocolError) as info:
        next(decoder)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE and info.value.fatal
    with pytest.raises(ProtocolError):
        decoder.feed(wire[4:])  # the stream cannot be resynchronised: no more input


def test_huge_header_with_no_body() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError) as info:
        list(decoder)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert str(FRAME_BYTES_MAX_DEFAULT) in str(info.value)
    just_over = FrameDecoder()
    just_over.feed((FRAME_BYTES_MAX_DEFAULT + 1).to_bytes(4, "big"))
    with pytest.raises(ProtocolError):
        list(just_over)
    at_limit = FrameDecoder()
    at_limit.feed(FRAME_BYTES_MAX_DEFAULT.to_bytes(4, "big") + b"\x80")
    assert list(at_limit) == []  # waits for the rest of a frame at the limit
    assert at_limit.buffered_bytes == 5


def test_encode_refuses_what_the_peer_would_refuse() -> None:
    with pytest.raises(ProtocolError) as info:
        encode({"cmd": "PUSH", "queue": "q", "data": b"x" * 2000}, frame_bytes_max=1000)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE and not info.value.fatal
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    for bad in (object(), 2**70, "\ud800", cyclic):
        with pytest.raises(ProtocolError):
            encode({"cmd": "PUSH", "data": bad})


def test_decoder_rejects_a_nonpositive_limit() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(0)


# --- malformed input ---------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb("PUSH"), msgpack.packb({"queue": "q"}),
    msgpack.packb({"cmd": 3}), msgpack.packb({"cmd": ""}), msgpack.packb({"cmd": "PUSH"}) + b"\x00",
    msgpack.packb({"cmd": "PUSH", "data": 1})[:-1], b"\x83\xa3cmd",
])
@pytest.mark.parametrize("raw_data", [False, True])
def test_malformed_bodies(body: bytes, raw_data: bool) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_request(body, raw_data=raw_data)
    assert not info.value.fatal


def test_bad_frame_keeps_the_stream_in_sync() -> None:
    good = encode({"cmd": "Ping", "reqId": 1})
    bad = len(b"\xc1").to_bytes(4, "big") + b"\xc1"
    no_cmd = encode({"reqId": 7})
    for raw_data in (False, True):
        decoder = FrameDecoder(raw_data=raw_data)
        decoder.feed(good + bad + no_cmd + good)
        assert next(decoder)["reqId"] == 1
        with pytest.raises(ProtocolError):
            next(decoder)
        with pytest.raises(ProtocolError) as info:
            next(decoder)
        assert info.value.req_id == 7  # so the error reply can be matched
        assert next(decoder)["reqId"] == 1


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.booleans(), st.booleans())
def test_garbage_stream_raises_only_protocol_error(garbage: bytes, raw_data: bool, requests: bool) -> None:
    decoder = FrameDecoder(256, raw_data=raw_data, requests=requests)
    decoder.feed(garbage)
    for _ in range(len(garbage) + 1):
        try:
            if next(decoder, None) is None:
                break
        except ProtocolError as exc:
            if exc.fatal:
                break


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.binary(max_size=120),
                 any_request.map(lambda f: encode_body(f)).flatmap(
                     lambda b: st.tuples(st.integers(0, len(b)), st.binary(max_size=3)).map(
                         lambda t: b[:t[0]] + t[1] + b[t[0] + len(t[1]):]))))
def test_garbage_body_raises_only_protocol_error(body: bytes) -> None:
    """Random bytes, and valid frames with a few bytes overwritten."""
    for raw_data in (False, True):
        try:
            frame = decode_request(body, raw_data=raw_data)
        except ProtocolError:
            continue
        assert type(frame) is dict and type(frame["cmd"]) is str
    try:
        decode_response(body)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.one_of(msgpack_values, msgpack_values.map(raw_of)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10,
).flatmap(lambda v: st.just({"ok": True, "reqId": 1, "job": {"data": v, "nested": [v, {"deep": v}]}})))
def test_raw_anywhere_in_a_reply_is_spliced(reply: dict[str, Any]) -> None:
    """Replies carry stored Raw data inside jobs and lists; every Raw goes out verbatim."""
    assert decode_response(encode_body(reply)) == unraw(reply)


def test_mapping_and_tuple_values_encode() -> None:
    from collections import OrderedDict
    from types import MappingProxyType
    frame = {"a": OrderedDict(x=raw_of(1)), "b": MappingProxyType({"y": (1, raw_of("z"))}), "c": (1, 2)}
    assert decode_response(encode_body(frame)) == {"a": {"x": 1}, "b": {"y": [1, "z"]}, "c": [1, 2]}


_item_options = st.fixed_dictionaries({}, optional={
    "priority": st.integers(-5, 5), "delay": st.integers(0, 10), "name": st.text(max_size=4),
    "idempotencyKey": st.text(max_size=4), "removeOnComplete": st.booleans(), "unknownField": st.integers(-9, 9)})


@given(st.lists(st.tuples(msgpack_values, _item_options, st.booleans()), max_size=6),
       st.fixed_dictionaries({}, optional={"reqId": st.integers(0, 9), "extra": st.integers(-9, 9), "data": st.integers(-9, 9)}))
@example(items=[(None, {"name": "", "removeOnComplete": False}, True)], top={})  # an addBulk item
def test_fast_job_frame_decode_equals_the_exact_walk(items: list[tuple[Any, dict[str, Any], bool]],
                                                     top: dict[str, Any]) -> None:
    """Bulk frames of data-only items take a decoder of their own: it gives what the exact walk
    gives for every frame it accepts, and leaves every other frame to the general decoders."""
    from shoal.cluster import codec

    jobs = [({"data": data} if has_data else {}) | options for data, options, has_data in items]
    payload = msgpack.packb({"cmd": "PUSHB", "queue": "q", "jobs": jobs, **top})
    fast = codec.decode_job_frame(payload, Raw)
    if fast is None:
        return  # walked exactly by the caller
    unpacker = codec.new_unpacker(len(payload))
    original = codec.decode_job_frame
    try:
        codec.decode_job_frame = lambda payload, raw: None  # force the exact walk
        exact = codec._decode_raw_map(payload, unpacker)
    finally:
        codec.decode_job_frame = original
    assert fast == _false_removes_dropped(exact)


_ADD_BULK_KEYS = frozenset({"data", "name", "removeOnComplete", "removeOnFail", "idempotencyKey"})


def _false_removes_dropped(frame: dict[str, Any]) -> dict[str, Any]:
    """``frame`` as the fast decoder gives it: an item of bunqueue's ``addBulk`` (data, a name,
    maybe a key) loses its remove flags when they are false, the default, so it stays plain."""
    jobs = frame.get("jobs")
    if not isinstance(jobs, list):
        return frame
    out = []
    for job in jobs:
        if ("data" in job and "name" in job and job.keys() <= _ADD_BULK_KEYS
                and job.get("removeOnComplete", False) is False and job.get("removeOnFail", False) is False):
            job = {k: v for k, v in job.items() if k not in ("removeOnComplete", "removeOnFail")}
        out.append(job)
    return {**frame, "jobs": out}
