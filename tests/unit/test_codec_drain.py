"""``FrameDecoder.drain``, the node's receive path, agrees with frame-by-frame iteration.

Whatever the chunking, a drained stream yields the same frames and the same errors in the
same order as ``feed`` + iteration; plain PUSHes and PUSHBs come out as :class:`PlainPush` and
:class:`PlainBulk` structs that stand for exactly the dict the general decoder gives.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from _strategies import any_request, msgpack_values
from shoal.cluster.codec import (RECEIVED_BYTES, FrameDecoder, PlainBulk, PlainPush, Raw, ReceivedBytes, decode_request,
                                 encode, unraw)
from shoal.cluster.errors import ErrorCode, ProtocolError

LIMIT = 1 << 16


def _iterated(stream: bytes, cuts: list[int]) -> list[Any]:
    """Frames and errors of ``stream`` through ``feed`` and iteration (the reference)."""
    decoder = FrameDecoder(LIMIT, requests=True, raw_data=True)
    out: list[Any] = []
    bounds = [0, *cuts, len(stream)]
    for a, b in zip(bounds, bounds[1:]):
        try:
            decoder.feed(stream[a:b])
        except ProtocolError:
            break
        while True:
            try:
                frame = next(decoder, None)
            except ProtocolError as exc:
                out.append(("error", exc.code, exc.fatal, exc.req_id))
                if exc.fatal:
                    return out
                continue
            if frame is None:
                break
            out.append(frame)
    return out


def _drained(stream: bytes, cuts: list[int]) -> list[Any]:
    decoder = FrameDecoder(LIMIT, requests=True, raw_data=True, plain_push=True)
    out: list[Any] = []
    bounds = [0, *cuts, len(stream)]
    for a, b in zip(bounds, bounds[1:]):
        try:
            items = decoder.drain(stream[a:b])
        except ProtocolError:
            break
        for item in items:
            if type(item) is ProtocolError:
                out.append(("error", item.code, item.fatal, item.req_id))
            elif type(item) is PlainPush:
                out.append(item.to_frame(Raw))
            elif type(item) is PlainBulk:
                frame = item.to_frame(Raw)
                # what a forwarding node sends on: the client's bytes of this very frame
                assert unraw(decode_request(item.body, raw_data=True)) == unraw(frame)
                out.append(frame)
            else:
                received = item.pop(RECEIVED_BYTES, None)
                # what a forwarding node sends on: the client's bytes of this very frame
                assert type(received) is ReceivedBytes, item
                assert unraw(decode_request(received.body, raw_data=True)) == unraw(item)
                out.append(item)
    return out


def _body(frame: dict[str, Any]) -> bytes:
    body = msgpack.packb(frame, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


plain_pushes = st.builds(
    lambda queue, data, req_id, key: {"cmd": "PUSH", "queue": queue, "data": data,
                                      **({"reqId": req_id} if req_id is not None else {}),
                                      **({"idempotencyKey": key} if key is not None else {})},
    st.text(min_size=0, max_size=10), msgpack_values,
    st.one_of(st.none(), st.integers(0, 2**40), st.text(max_size=6)),
    st.one_of(st.none(), st.text(max_size=8)))

plain_bulks = st.builds(
    lambda queue, items, req_id: {"cmd": "PUSHB", "queue": queue, "jobs": items,
                                  **({"reqId": req_id} if req_id is not None else {})},
    st.text(min_size=0, max_size=10),
    st.lists(st.builds(lambda data, key: {"data": data, **({"idempotencyKey": key} if key is not None else {})},
                       msgpack_values, st.one_of(st.none(), st.text(max_size=8))), min_size=0, max_size=5),
    st.one_of(st.none(), st.integers(0, 2**40), st.text(max_size=6)))

#: frames the plain path must refuse and hand to the general decoder (which names the problem)
near_misses = st.sampled_from([
    b"\x83\xa5queue\xa1q\xa4data\x01\xa5reqId\x07",                     # no cmd
    b"\x84\xa3cmd\xa4PUSH\xa5queue\xa1q\xa5queue\xa1r\xa4data\x01",    # a repeated key
    b"\x84\xa3cmd\xa4PUSH\xa5queue\xa1q\xa4data\x01\xa5reqId\xc0",     # reqId nil
    b"\x84\xa3cmd\xa4PUSH\xa5queue\xa1q\xa4data\x01\xa8priority\x05",  # a job option
    b"\x83\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x90",                  # another command
    b"\x83\xa3cmd\xa4PUSH\xa5queue\x05\xa4data\x01",                   # queue not a string
    b"\x83\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x91\x81\xa4name\xa1n",  # an item without data
    b"\x83\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x91\x82\xa4data\x01\xa4name\xa1n",  # a named item
    b"\x83\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x91\x82\xa4data\x01\xaeidempotencyKey\xc0",  # key nil
    b"\x84\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x91\x81\xa4data\x01\xa4body\xc4\x01b",  # a client's body
    b"\x84\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x91\x81\xa4data\x01\xa4jobs\x90",  # a repeated key
    b"\x84\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x91\x81\xa4data\x01\xa5reqId\xc0",  # reqId nil
    b"\xde\x00\x03\xa3cmd\xa4PUSH\xa5queue\xa1q\xa4data\x01",          # map16 header, still plain
    b"\xc1",                                                           # garbage
    b"",                                                               # empty body
]).map(lambda body: len(body).to_bytes(4, "big") + body)

wire_frames = st.one_of(plain_pushes.map(_body), plain_bulks.map(_body), any_request.map(encode), near_misses)


@settings(max_examples=300, deadline=None)
@given(st.lists(wire_frames, min_size=1, max_size=8), st.booleans(), st.data())
def test_drain_matches_iteration(frames: list[bytes], too_large_tail: bool, data: st.DataObject) -> None:
    stream = b"".join(frames)
    if too_large_tail:
        stream += (LIMIT + 1).to_bytes(4, "big") + b"\x80"
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=8)))
    expected = _iterated(stream, cuts)
    got = _drained(stream, cuts)
    assert [unraw(f) if isinstance(f, dict) else f for f in got] == \
           [unraw(f) if isinstance(f, dict) else f for f in expected]
    # Raw data stays the client's exact bytes on both paths.
    assert [f["data"].packed for f in got if isinstance(f, dict) and type(f.get("data")) is Raw] == \
           [f["data"].packed for f in expected if isinstance(f, dict) and type(f.get("data")) is Raw]


def test_plain_push_is_a_struct_with_the_clients_bytes() -> None:
    data = msgpack.packb({"to": "x", "n": [1, 2.5]})
    body = b"\x84\xa3cmd\xa4PUSH\xa5queue\xa1q\xa4data" + data + b"\xa5reqId\x07"
    (push,) = FrameDecoder(plain_push=True, raw_data=True).drain(len(body).to_bytes(4, "big") + body)
    assert type(push) is PlainPush
    assert (push.queue, bytes(push.data), push.reqId, push.idempotencyKey) == ("q", data, 7, None)


def test_plain_bulk_is_a_struct_with_the_clients_bytes() -> None:
    data = msgpack.packb({"to": "x", "n": [1, 2.5]})
    body = (b"\x83\xa3cmd\xa5PUSHB\xa5queue\xa1q\xa4jobs\x92\x81\xa4data" + data
            + b"\x82\xa4data\x01\xaeidempotencyKey\xa1k")
    (bulk,) = FrameDecoder(plain_push=True, raw_data=True).drain(len(body).to_bytes(4, "big") + body)
    assert type(bulk) is PlainBulk
    assert (bulk.queue, bulk.datas(), bulk.keys(), bulk.reqId) == ("q", [data, b"\x01"], [None, "k"], None)
    assert bulk.body == body
    # a PUSHB frame any other decoder takes keeps its dict form
    (frame,) = FrameDecoder(raw_data=True).drain(len(body).to_bytes(4, "big") + body)
    assert unraw(frame) == unraw(bulk.to_frame(Raw))


def test_drain_one_byte_at_a_time_then_a_fatal_header() -> None:
    stream = _body({"cmd": "PUSH", "queue": "q", "data": 1, "reqId": 1}) + _body({"cmd": "Ping", "reqId": 2})
    decoder = FrameDecoder(LIMIT, raw_data=True, plain_push=True)
    got: list[Any] = []
    for i in range(len(stream)):
        got += decoder.drain(stream[i:i + 1])
    assert [type(x) for x in got] == [PlainPush, dict]
    assert decoder.buffered_bytes == 0
    (err,) = decoder.drain((LIMIT + 1).to_bytes(4, "big"))
    assert err.code is ErrorCode.FRAME_TOO_LARGE and err.fatal
    try:
        decoder.drain(b"\x00")
    except ProtocolError as exc:
        assert exc.fatal
    else:
        raise AssertionError("a broken decoder must refuse more input")
