"""Codec benchmark: encode and decode of 100-byte PUSH frames, and the cost of validate().

    python bench/bench_codec.py [--frames 100000] [--repeat 5]

Prints frames/s for

- ``encode`` of a PUSH whose data is a Python value (what a client does),
- ``encode`` of the same PUSH with ``Raw`` data (what a node does when it relays data),
- ``FrameDecoder(raw_data=True)`` over a buffer of back-to-back frames fed in 64 KiB
  chunks (what a node does; the data stays raw bytes),
- ``FrameDecoder(raw_data=False)`` (what a client does with replies),
- ``FrameDecoder.drain`` with ``plain_push`` over the same chunks of plain PUSHes (queue, data,
  reqId), the node's receive path (each frame becomes a ``PlainPush`` struct),
- ``encode_replies`` of push replies in blocks of 50 (a node answering a block of pushes),

and µs per ``validate()`` of the decoded PUSH. Every loop is bounded by
``--frames`` × ``--repeat``; the best repeat is reported.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import msgpack

from shoal.cluster.codec import FrameDecoder, Raw, encode
from shoal.cluster.commands import validate
from shoal.node.partition.pushes import encode_replies

FRAME_BYTES = 100
CHUNK_BYTES = 64 * 1024


def push_frame(frame_bytes: int = FRAME_BYTES) -> dict[str, object]:
    """A PUSH with three fields (queue, data, priority) plus reqId, ``frame_bytes`` long on the wire."""
    frame: dict[str, object] = {"cmd": "PUSH", "queue": "emails", "data": {"to": ""}, "priority": 5,
                                "reqId": 123456}
    pad = frame_bytes - len(encode(frame))
    frame["data"] = {"to": "x" * pad}
    if len(encode(frame)) > frame_bytes:  # past 31 characters the string header grows by a byte
        frame["data"] = {"to": "x" * (pad - 1)}
    assert len(encode(frame)) == frame_bytes, len(encode(frame))
    return frame


def best_rate(run: Callable[[], int], repeat: int) -> float:
    """Best items/s over ``repeat`` runs of ``run`` (which returns how many items it did)."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = run()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100_000, help="frames per run (default 100000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement; the best is kept")
    args = parser.parse_args(argv)
    n, repeat = max(1, args.frames), max(1, args.repeat)

    frame = push_frame()
    raw_frame = {**frame, "data": Raw(msgpack.packb(frame["data"]))}
    wire = encode(frame)
    stream = wire * n
    chunks = [stream[i:i + CHUNK_BYTES] for i in range(0, len(stream), CHUNK_BYTES)]

    def encode_value() -> int:
        for _ in range(n):
            encode(frame)
        return n

    def encode_raw() -> int:
        for _ in range(n):
            encode(raw_frame)
        return n

    def decoder(raw_data: bool) -> Callable[[], int]:
        def run() -> int:
            dec = FrameDecoder(raw_data=raw_data)
            count = 0
            for chunk in chunks:
                dec.feed(chunk)
                for _ in dec:
                    count += 1
            assert count == n
            return count
        return run

    # The node's receive path: FrameDecoder.drain over the same chunks, for plain PUSHes
    # (queue, data, reqId: no priority), which come out as PlainPush structs.
    plain = {k: v for k, v in frame.items() if k != "priority"}
    plain_stream = encode(plain) * n
    plain_chunks = [plain_stream[i:i + CHUNK_BYTES] for i in range(0, len(plain_stream), CHUNK_BYTES)]

    def drain_plain() -> int:
        dec = FrameDecoder(raw_data=True, plain_push=True)
        count = 0
        for chunk in plain_chunks:
            count += len(dec.drain(chunk))
        assert count == n
        return count

    # The node's answers to a block of 50 plain pushes: {"ok", "id", "reqId"} each.
    block = 50
    reply_results = [{"id": f"3-{1_000_000 + i}"} for i in range(block)]
    reply_req_ids = list(range(block))

    def push_replies() -> int:
        blocks = max(1, n // block)
        for _ in range(blocks):
            encode_replies([], reply_req_ids, reply_results)
        return blocks * block

    decoded = next(iter(_decode_one(wire)))

    def validate_run() -> int:
        for _ in range(n):
            validate(decoded)
        return n

    results = [
        ("encode (data as a Python value)", best_rate(encode_value, repeat)),
        ("encode (data as Raw)", best_rate(encode_raw, repeat)),
        ("decode, FrameDecoder(raw_data=True)", best_rate(decoder(True), repeat)),
        ("decode, FrameDecoder(raw_data=False)", best_rate(decoder(False), repeat)),
        ("decode, FrameDecoder.drain, plain PUSH", best_rate(drain_plain, repeat)),
        ("encode_replies, push replies (blocks of 50)", best_rate(push_replies, repeat)),
    ]
    validate_us = 1e6 / best_rate(validate_run, repeat)
    print(f"shoal codec benchmark: {len(wire)}-byte PUSH frames, {n} frames x {repeat} runs (best), "
          f"Python {platform.python_version()}, msgpack {msgpack.version}")
    for label, rate in results:
        print(f"  {label:<44} {rate:>12,.0f} frames/s")
    print(f"  {'validate(PUSH, 3 fields + reqId)':<44} {validate_us:>12.2f} µs/frame")
    return 0


def _decode_one(wire: bytes) -> FrameDecoder:
    dec = FrameDecoder(raw_data=True)
    dec.feed(wire)
    return dec


if __name__ == "__main__":
    sys.exit(main())
