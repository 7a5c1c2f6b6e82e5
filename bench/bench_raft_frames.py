"""Cost of one Raft message on the node's link, sans I/O: encode + seal, and open + decode.

Measures, per message, what ``node/raft/transport.py`` and ``node/raft/_frames.py`` spend
on an acknowledgement and on AppendEntries carrying one entry of a few sizes (the Raft
message structs of ``node/raft/messages.py``, decoded as the link does: ``decode_frame``), with the
link's frame MAC (keyed BLAKE2b up to ``BLAKE2B_BYTES_MAX`` of payload, HMAC-SHA256
above) and, for comparison, with HMAC-SHA256 on every frame. Then one MAC alone, of
either algorithm, over a small and a large payload; and the decode alone, the link's typed one
against a plain MessagePack decode converted to the struct afterwards.

    python bench/bench_raft_frames.py [--rounds 20000]

Hot loops: every figure here is with warm caches. A node between two messages of a lone
PUSH runs with cold ones, where OpenSSL's HMAC call costs several times more
(``bench/profile_lone_push.py`` shows it inside the nodes).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import timeit

import msgspec

from shoal.node.raft._frames import BLAKE2B_BYTES_MAX, MAC_BYTES, FrameOpener, FrameSealer, array_header
from shoal.node.raft.messages import AppendEntries, AppendResponse, Message
from shoal.node.raft.transport import decode_frame

_encode = msgspec.msgpack.Encoder().encode


class HmacSealer:
    """Frames as ``FrameSealer`` makes them, with an HMAC-SHA256 (truncated) instead."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._counter = 0

    def seal(self, parts: list[bytes]) -> list[bytes]:
        body = b"".join(parts)
        mac = hmac.digest(self._key, self._counter.to_bytes(8, "big") + body, "sha256")[:MAC_BYTES]
        self._counter += 1
        return [b"".join(((len(body) + MAC_BYTES).to_bytes(4, "big"), mac, body))]


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
        return [decode_frame(payload)]


def per_message_us(rounds: int, message: Message, sealer: object, opener: object) -> tuple[float, float]:
    """Microseconds to encode + seal one message, and to open + decode it."""
    sealed: list[list[bytes]] = []

    def send() -> None:
        sealed.append(sealer.seal([array_header(1), _encode((3, message))]))  # type: ignore[attr-defined]

    send_s = timeit.timeit(send, number=rounds)
    it = iter([b"".join(pieces) for pieces in sealed])  # as the peer reads it
    recv_s = timeit.timeit(lambda: opener.feed(next(it)), number=rounds)  # type: ignore[attr-defined]
    return send_s / rounds * 1e6, recv_s / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    key = os.urandom(32)
    print(f"per message, {args.rounds:,} rounds each (send = encode + seal, receive = open + decode);"
          f" the link MACs payloads up to {BLAKE2B_BYTES_MAX:,} bytes with BLAKE2b")
    messages: list[tuple[str, Message]] = [("acknowledgement", AppendResponse(3, 1_002))]
    for size in (300, 3_900, 100_000):
        messages.append((f"AppendEntries, one {size:,}-byte entry",
                         AppendEntries(3, 1_000, 3, 1_000, [(os.urandom(size), 1_001, 3)])))
    for name, message in messages:
        rounds = args.rounds if len(_encode(message)) < 50_000 else max(1, args.rounds // 20)
        link = per_message_us(rounds, message, FrameSealer(key), FrameOpener(key, 1 << 26, decode_frame))
        sha = per_message_us(rounds, message, HmacSealer(key), HmacOpener(key))
        print(f"  {name:<38} link {link[0]:7.2f} / {link[1]:7.2f} us   "
              f"HMAC-SHA256 always {sha[0]:7.2f} / {sha[1]:7.2f} us")
    base = hashlib.blake2b(key=key, digest_size=MAC_BYTES)
    for size in (300, 1 << 20):
        data = os.urandom(size)

        def blake_mac() -> bytes:
            mac = base.copy()
            mac.update(data)
            return mac.digest()

        n = args.rounds * 5 if size < 50_000 else 200
        blake_us = timeit.timeit(blake_mac, number=n) / n * 1e6
        sha_us = timeit.timeit(lambda: hmac.digest(key, data, "sha256"), number=n) / n * 1e6
        print(f"one MAC over {size:,} bytes: keyed BLAKE2b {blake_us:.2f} us, HMAC-SHA256 {sha_us:.2f} us")
    plain = msgspec.msgpack.Decoder().decode
    for name, message in messages[:2]:
        payload = _encode([(3, message)])
        typed_us = timeit.timeit(lambda: decode_frame(payload), number=args.rounds) / args.rounds * 1e6
        convert_us = timeit.timeit(lambda: [msgspec.convert(m, Message) for _, m in plain(payload)],
                                   number=args.rounds) / args.rounds * 1e6
        print(f"decoding the frame of one {name}: the link's typed decode {typed_us:.2f} us, "
              f"a plain decode then msgspec.convert to the struct {convert_us:.2f} us")


if __name__ == "__main__":
    main()
