"""Authenticated frames of an established Raft link."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.raft._frames import BLAKE2B_BYTES_MAX, FrameError, FrameOpener, FrameSealer, array_header

KEY = b"k" * 32
decode = msgspec.msgpack.Decoder().decode
encode = msgspec.msgpack.Encoder().encode


def frame(sealer: FrameSealer, items: list[object]) -> bytes:
    parts = [encode(i) for i in items]
    return b"".join(sealer.seal([array_header(len(parts)), *parts]))


@given(st.lists(st.lists(st.integers(-2**63, 2**63 - 1), max_size=40), min_size=1, max_size=5), st.integers(1, 50))
def test_round_trip_any_split(batches: list[list[int]], chunk: int) -> None:
    sealer, opener = FrameSealer(KEY), FrameOpener(KEY, 1 << 20, decode)
    wire = b"".join(frame(sealer, batch) for batch in batches)
    got: list[object] = []
    for pos in range(0, len(wire), chunk):
        got += opener.feed(wire[pos:pos + chunk])
    assert got == batches and opener.buffered == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([10, BLAKE2B_BYTES_MAX - 30, BLAKE2B_BYTES_MAX + 30, 200_000]), min_size=1, max_size=4),
       st.integers(997, 300_000))
def test_small_and_large_frames_interleaved(sizes: list[int], chunk: int) -> None:
    """Payloads on both sides of the MAC switch, fed in pieces of any size, whole frames or many per read."""
    sealer, opener = FrameSealer(KEY), FrameOpener(KEY, 1 << 20, decode)
    blobs = [bytes([k]) * n for k, n in enumerate(sizes)]
    wire = b"".join(frame(sealer, [blob]) for blob in blobs)
    got: list[object] = []
    for pos in range(0, len(wire), chunk):
        got += opener.feed(wire[pos:pos + chunk])
    assert got == [[blob] for blob in blobs] and opener.buffered == 0


def test_replayed_frame_fails() -> None:
    sealer, opener = FrameSealer(KEY), FrameOpener(KEY, 1 << 20, decode)
    first = frame(sealer, [1])
    assert opener.feed(first) == [[1]]
    with pytest.raises(FrameError):
        opener.feed(first)


def test_reordered_frames_fail() -> None:
    sealer, opener = FrameSealer(KEY), FrameOpener(KEY, 1 << 20, decode)
    a, b = frame(sealer, [1]), frame(sealer, [2])
    with pytest.raises(FrameError):
        opener.feed(b + a)


def test_flipped_bit_and_wrong_key_fail() -> None:
    data = bytearray(frame(FrameSealer(KEY), [1, 2, 3]))
    data[-1] ^= 1
    with pytest.raises(FrameError):
        FrameOpener(KEY, 1 << 20, decode).feed(bytes(data))
    with pytest.raises(FrameError):
        FrameOpener(b"x" * 32, 1 << 20, decode).feed(frame(FrameSealer(KEY), [1]))


def test_oversized_frame_fails_from_its_header() -> None:
    opener = FrameOpener(KEY, 1024, decode)
    with pytest.raises(FrameError):
        opener.feed((2048).to_bytes(4, "big") + b"\0" * 16)


def test_undecodable_payload_fails_only_after_authentication() -> None:
    seen: list[bytes] = []

    def strict(view: memoryview) -> object:
        seen.append(bytes(view))
        raise ValueError("nope")

    sealer = FrameSealer(KEY)
    good = b"".join(sealer.seal([b"\xc1"]))
    with pytest.raises(FrameError):
        FrameOpener(b"other" * 8, 1 << 20, strict).feed(good)
    assert seen == []  # a frame that fails its MAC never reaches the decoder
    with pytest.raises(FrameError):
        FrameOpener(KEY, 1 << 20, strict).feed(good)
    assert seen == [b"\xc1"]
