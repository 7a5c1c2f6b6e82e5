"""The nesting-depth bounds of requests (shoal.cluster._depth) and the codec's use of them."""

from __future__ import annotations

import asyncio
import json
import sys
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.cluster._depth import DEPTH_MAX, json_too_deep, msgpack_req_id, msgpack_too_deep
from shoal.cluster.codec import FrameDecoder, PlainBulk, check_depth
from shoal.cluster.errors import ErrorCode, ProtocolError


def nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((max(depth_of(k), depth_of(v)) for k, v in value.items()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=40)
    | st.binary(max_size=300),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=60)


@given(values, st.integers(1, 12))
def test_msgpack_depth_matches_a_naive_walk(value: Any, limit: int) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    # The cheap pre-checks only skip the walk when it could not exceed the limit.
    assert msgpack_too_deep(packed, limit) == (depth_of(value) > limit)


@pytest.mark.parametrize("depth", [DEPTH_MAX - 2, DEPTH_MAX - 1, DEPTH_MAX, DEPTH_MAX + 1, 100_000])
def test_frame_depth_limit_is_512_levels(depth: int) -> None:
    body = b"\x83\xa3cmd\xa4PUSH\xa5reqId\x07\xa4data" + b"\x91" * (depth - 1) + b"\x00"
    # The frame's map is level 1, so data nested depth - 1 arrays deep makes a frame of ``depth``.
    assert msgpack_too_deep(body) == (depth > DEPTH_MAX)
    assert msgpack_req_id(body) == 7
    out = FrameDecoder(raw_data=True, plain_push=True).drain(struct.pack(">I", len(body)) + body)
    if depth > DEPTH_MAX:
        assert type(out[0]) is ProtocolError and out[0].code is ErrorCode.INVALID and out[0].req_id == 7
        assert not out[0].fatal and "512" in str(out[0])
    else:
        assert type(out[0]) is not ProtocolError


def test_req_id_is_found_behind_a_small_value_not_behind_a_huge_one() -> None:
    body = b"\x83\xa3cmd\xa4PUSH\xa4data" + b"\x91" * 600 + b"\x00" + b"\xa5reqId\xa3abc"
    assert msgpack_req_id(body) == "abc"
    with pytest.raises(ProtocolError) as err:
        check_depth(body)
    assert err.value.req_id == "abc"
    huge = b"\x83\xa3cmd\xa4PUSH\xa4data" + b"\x91" * 1_000_000 + b"\x00" + b"\xa5reqId\xa3abc"
    assert msgpack_req_id(huge) is None  # bounded work: the reply then carries no reqId


def test_json_depth() -> None:
    for depth, deep in ((DEPTH_MAX, False), (DEPTH_MAX + 1, True)):
        text = json.dumps(nest(depth))
        assert json_too_deep(text, json.loads(text)) is deep
    flat = json.dumps([[] for _ in range(2000)])   # many brackets, depth 2
    assert not json_too_deep(flat, json.loads(flat))
    text = json.dumps({"s": "[" * 2000})           # brackets inside a string count for nothing
    assert not json_too_deep(text, json.loads(text))


def test_element_counts_cannot_outgrow_the_frame() -> None:
    # A header claiming 4 billion elements in a 6-byte frame is refused, not allocated.
    body = b"\x82\xa3cmd\xa4Ping\xa1x\xdd\xff\xff\xff\xff"
    out = FrameDecoder(raw_data=True, plain_push=True).drain(struct.pack(">I", len(body)) + body)
    assert type(out[0]) is ProtocolError and not out[0].fatal


def bulk_frame(depth: int, jobs: int = 1_000) -> bytes:
    """A PUSHB of ``jobs`` jobs whose data are maps (thousands of container headers: the count
    does not clear it), one of them nested so that the frame is ``depth`` levels deep."""
    frame: dict[str, Any] = {"cmd": "PUSHB", "queue": "q", "reqId": 1,
                             "jobs": [{"name": "n", "data": {"to": "a@b.c", "n": i}} for i in range(jobs)]}
    # frame map, jobs array, job map: 3 levels above the data
    frame["jobs"][jobs // 2]["data"] = nest(depth - 3)
    return msgpack.packb(frame, use_bin_type=True)


def test_the_c_check_is_used_on_this_interpreter() -> None:
    from shoal.cluster import _depth
    assert _depth._C_CHECK
    assert _depth._decode_fits(bulk_frame(10), DEPTH_MAX)


@pytest.mark.parametrize("depth", [4, DEPTH_MAX - 17, DEPTH_MAX - 16, DEPTH_MAX - 1, DEPTH_MAX, DEPTH_MAX + 1,
                                   DEPTH_MAX + 40])
def test_a_bulk_add_of_maps_is_judged_exactly_and_the_recursion_limit_restored(depth: int) -> None:
    limit = sys.getrecursionlimit()
    body = bulk_frame(depth)
    assert msgpack_too_deep(body) == (depth > DEPTH_MAX)
    assert sys.getrecursionlimit() == limit


def test_the_verdict_is_the_same_from_a_generator_a_coroutine_and_a_deep_stack() -> None:
    cases = [(bulk_frame(d), d > DEPTH_MAX) for d in (DEPTH_MAX - 20, DEPTH_MAX, DEPTH_MAX + 1)]
    assert list(msgpack_too_deep(body) for body, _ in cases) == [deep for _, deep in cases]

    async def judge() -> list[bool]:
        return [msgpack_too_deep(body) for body, _ in cases]
    assert asyncio.run(judge()) == [deep for _, deep in cases]

    def down(n: int) -> list[bool]:
        return down(n - 1) if n else [msgpack_too_deep(body) for body, _ in cases]
    assert down(sys.getrecursionlimit() - 150) == [deep for _, deep in cases]


def test_garbage_and_small_limits_leave_the_answer_to_the_walk() -> None:
    limit = sys.getrecursionlimit()
    garbage = b"\x92" + b"\x91" * 10 + b"\xc1" + msgpack.packb([[1, 2]] * 600)
    assert msgpack_too_deep(garbage, 30) is False  # the walk stops at 0xc1: the decoder says what is wrong
    assert msgpack_too_deep(msgpack.packb([[[[1]]]] * 100), 3) is True
    assert msgpack_too_deep(msgpack.packb([[[1]]] * 100), 3) is False
    assert sys.getrecursionlimit() == limit


@pytest.mark.parametrize("depth", [DEPTH_MAX - 1, DEPTH_MAX, DEPTH_MAX + 1, DEPTH_MAX + 300])
@pytest.mark.parametrize("items", ["data only", "named", "with options"])
def test_a_bulk_add_whose_schema_fits_is_judged_by_its_data_alone(depth: int, items: str) -> None:
    """A PUSHB the job schema decodes nests only in its jobs' data: the frame is refused exactly
    when one job's data makes it deeper than the limit, with its reqId."""
    frame = msgpack.unpackb(bulk_frame(depth, jobs=600))
    if items == "data only":  # the bulk-ingest schema
        for job in frame["jobs"]:
            del job["name"]
    elif items == "with options":  # the general item schema
        frame["jobs"][0]["priority"] = 3
    frame["reqId"] = "r1"
    body = msgpack.packb(frame, use_bin_type=True)
    out = FrameDecoder(raw_data=True, plain_push=True).drain(struct.pack(">I", len(body)) + body)
    assert len(out) == 1
    if depth > DEPTH_MAX:
        assert type(out[0]) is ProtocolError and out[0].code is ErrorCode.INVALID and out[0].req_id == "r1"
    elif items == "data only":  # the node's plain bulk add: no dict per job
        assert type(out[0]) is PlainBulk and len(out[0].jobs) == 600
    else:
        assert type(out[0]) is dict and len(out[0]["jobs"]) == 600
    assert msgpack_too_deep(body) == (depth > DEPTH_MAX)
