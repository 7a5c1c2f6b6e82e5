"""PartitionEngine.snapshot_chunks: the snapshot in pieces, byte for byte the whole state packed at once."""

from __future__ import annotations

import msgpack

from shoal.cluster.codec import Raw
from shoal.node.partition.pushes import replicated_form
from shoal.node.state import PartitionEngine
from shoal.node.state._model import SNAPSHOT_VERSION as _SNAPSHOT_VERSION


def packed_whole(e: PartitionEngine) -> bytes:
    """The state packed in one go, as replicas and digests have always defined it."""
    state = (_SNAPSHOT_VERSION, e.partition, e.seq, e.lease_seq, e.now_ms,
             [j.to_tuple() for j in e._all_jobs()],
             [q.settings() for q in e.queues.values()],
             e.sessions.state(),
             *e.idempotency_state(),
             {n: dict(c) for n, c in e.crons.items()})
    return msgpack.packb(state, use_bin_type=True)


def test_chunks_equal_the_whole_state_with_segments_and_single_jobs() -> None:
    e = PartitionEngine(3)
    for k in range(12):
        cmd = {"cmd": "PUSHB", "queue": f"q{k % 3}", "jobs": [{"data": Raw(msgpack.packb(i))} for i in range(300)]}
        (replicated,), _ = replicated_form([cmd], 3)  # plain batches become segments, as on a replica
        e.apply(replicated, 1_000 + k)
        e.apply({"cmd": "PUSH", "queue": "q", "data": msgpack.packb(k), "priority": k % 4,
                 "idempotencyKey": f"k{k}"}, 1_000 + k)
    e.apply({"cmd": "PULLB", "queue": "q1", "count": 50, "leaseMs": 1_000}, 5_000)
    assert e.segments and e.jobs
    whole = packed_whole(e)
    for per_chunk in (1, 7, 10_000):
        assert b"".join(e.snapshot_chunks(per_chunk)) == whole
    assert e.snapshot() == whole
    restored = PartitionEngine.restore(whole)
    assert restored.snapshot() == packed_whole(restored) == whole
    assert restored.digest() == e.digest()


def test_empty_engine() -> None:
    e = PartitionEngine(0)
    assert e.snapshot() == packed_whole(e)
