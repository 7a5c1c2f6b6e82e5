"""``encode_replies``: the spliced reply of a plain push is byte for byte the generic encoding."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shoal.cluster.codec import FrameDecoder, encode_body
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.partition.pushes import encode_replies

req_ids = st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=40))
results = st.one_of(
    st.builds(lambda i: {"id": i}, st.text(max_size=300)),
    st.builds(lambda i: {"id": i, "duplicate": True}, st.text(max_size=20)),
    st.builds(lambda i: {"id": i}, st.integers(0, 10**6)),
    st.builds(lambda m: CommandError(ErrorCode.QUEUE_FULL, m), st.text(max_size=20)),
)


def _generic(req_id: Any, result: Any) -> bytes:
    frame = {"ok": True, **result} if type(result) is dict else result.to_reply()
    if req_id is not None:
        frame["reqId"] = req_id
    body = encode_body(frame)
    return len(body).to_bytes(4, "big") + body


@given(st.lists(st.tuples(req_ids, results), max_size=60))
def test_replies_match_the_generic_encoding(pairs: list[tuple[Any, Any]]) -> None:
    out: list[bytes] = []
    failed = encode_replies(out, [p[0] for p in pairs], [p[1] for p in pairs])
    assert failed == []
    assert b"".join(out) == b"".join(_generic(q, r) for q, r in pairs)


def test_replies_decode_as_frames_in_order() -> None:
    out: list[bytes] = []
    encode_replies(out, [1, "b", None], [{"id": "3-7"}, {"id": "3-8"}, {"id": "3-9"}])
    decoder = FrameDecoder(requests=False)
    decoder.feed(b"".join(out))
    assert list(decoder) == [{"ok": True, "id": "3-7", "reqId": 1}, {"ok": True, "id": "3-8", "reqId": "b"},
                             {"ok": True, "id": "3-9"}]


def test_an_unencodable_reply_is_handed_back() -> None:
    out: list[bytes] = []
    failed = encode_replies(out, [1, 2], [{"id": "3-1"}, {"id": "3-2", "extra": object()}])
    assert len(out) == 5 and [f["reqId"] for f in failed] == [2]
