"""Cost of one Raft message on the node's link, sans I/O: encode + seal, and open + decode.

Measures, per message, what ``node/raft/transport.py`` and ``node/raft/_frames.py`` spend
on an AppendEntries carrying one group-committed entry and on its acknowledgement, with
the frame MAC Shoal uses (keyed BLAKE2b, 128 bits) and, for comparison, with HMAC-SHA256
(OpenSSL through ``hmac``), the other MAC a link could use. Also prints one MAC alone.

    python bench/bench_raft_frames.py [--rounds 20000] [--entry-bytes 3900]

Hot loops: every figure here is with warm caches. A node between two messages of a lone
PUSH runs with cold ones, where OpenSSL's HMAC costs several times more (see
docs/benchmarks.md); the ranking does not change.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import timeit

import msgspec

from shoal.node.raft._frames import MAC_BYTES, FrameOpener, FrameSealer, array_header

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class HmacSealer:
    """Frames as ``FrameSealer`` makes them, with an HMAC-SHA256 (truncated) instead."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._counter = 0

    def seal(self, parts: list[bytes]) -> bytes:
        body = b"".join(parts)
        mac = hmac.digest(self._key, self._counter.to_bytes(8, "big") + body, "sha256")[:MAC_BYTES]
        self._counter += 1
        return b"".join(((len(body) + MAC_BYTES).to_bytes(4, "big"), mac, body))


class HmacOpener:
    """Opens what :class:`HmacSealer` seals (one whole frame per call)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._counter = 0

    def feed(self, data: bytes) -> list[object]:
        payload = memoryview(data)[4 + MAC_BYTES:]
        mac = hmac.digest(self._key, self._counter.to_bytes(8, "big") + payload, "sha256")[:MAC_BYTES]
        if not hmac.compare_digest(mac, data[4:4 + MAC_BYTES]):
            raise ValueError("bad MAC")
        self._counter += 1
        return [_decode(payload)]


def per_message_us(rounds: int, message: dict[str, object], sealer: object, opener: object) -> tuple[float, float]:
    """Microseconds to encode + seal one message, and to open + decode it."""
    frames: list[bytes] = []

    def send() -> None:
        frames.append(sealer.seal([array_header(1), _encode((3, message))]))  # type: ignore[attr-defined]

    send_s = timeit.timeit(send, number=rounds)
    it = iter(frames)
    recv_s = timeit.timeit(lambda: opener.feed(next(it)), number=rounds)  # type: ignore[attr-defined]
    return send_s / rounds * 1e6, recv_s / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--entry-bytes", type=int, default=3_900, help="size of the entry an AppendEntries carries")
    args = parser.parse_args()
    key = os.urandom(32)
    append = {"type": "append_entries", "term": 3, "commit_index": 1_000, "prevLogIdx": 1_000, "prevLogTerm": 3,
              "entries": [(os.urandom(args.entry_bytes), 1_001, 3)]}
    ack = {"type": "next_node_idx", "next_node_idx": 1_002, "success": True, "reset": False}
    print(f"per message, {args.rounds:,} rounds each (send = encode + seal, receive = open + decode)")
    for name, message in ((f"AppendEntries, one {args.entry_bytes:,}-byte entry", append), ("acknowledgement", ack)):
        blake = per_message_us(args.rounds, message, FrameSealer(key), FrameOpener(key, 1 << 26, _decode))
        sha = per_message_us(args.rounds, message, HmacSealer(key), HmacOpener(key))
        print(f"  {name:<36} keyed BLAKE2b {blake[0]:5.2f} / {blake[1]:5.2f} us   "
              f"HMAC-SHA256 {sha[0]:5.2f} / {sha[1]:5.2f} us")
    data = os.urandom(300)
    base = hashlib.blake2b(key=key, digest_size=MAC_BYTES)

    def blake_mac() -> bytes:
        mac = base.copy()
        mac.update(data)
        return mac.digest()

    n = args.rounds * 5
    blake_us = timeit.timeit(blake_mac, number=n) / n * 1e6
    sha_us = timeit.timeit(lambda: hmac.digest(key, data, "sha256"), number=n) / n * 1e6
    print(f"one MAC over 300 bytes: keyed BLAKE2b {blake_us:.2f} us, HMAC-SHA256 {sha_us:.2f} us")


if __name__ == "__main__":
    main()
