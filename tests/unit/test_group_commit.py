"""Group commit's coalescing of plain PUSHes (pure: no Raft, no loop)."""

from __future__ import annotations

from shoal.cluster.codec import Raw
from shoal.node.group_commit import coalesce_pushes


def push(queue: str, n: int, **extra: object) -> dict[str, object]:
    return {"cmd": "PUSH", "queue": queue, "data": Raw(bytes([n])), "reqId": n, **extra}


def test_runs_of_plain_pushes_to_one_queue_merge_and_order_is_kept() -> None:
    cmds = [push("a", 1), push("a", 2, idempotencyKey="k"), push("b", 3), push("b", 4, timeout=50),
            {"cmd": "ACK", "id": "0-1"}, push("a", 5), push("a", 6, priority=3), push("a", 7), push("a", 8)]
    out, sizes = coalesce_pushes(cmds)
    assert sizes == [2, 2, 0, 0, 0, 2]
    assert out[0] == {"cmd": "_PushMany", "queue": "a", "_datas": [b"\x01", b"\x02"], "_keys": [None, "k"]}
    assert out[1] == {"cmd": "_PushMany", "queue": "b", "_datas": [b"\x03", b"\x04"]}
    assert out[2]["cmd"] == "ACK" and out[3]["reqId"] == 5 and out[4]["priority"] == 3
    assert out[5]["_datas"] == [b"\x07", b"\x08"]
    assert sum(max(n, 1) for n in sizes) == len(cmds)


def test_nothing_to_merge_keeps_the_batch_as_it_is() -> None:
    cmds = [push("a", 1), push("b", 2), {"cmd": "PULL", "queue": "a"}]
    out, sizes = coalesce_pushes(cmds)
    assert out == cmds and sizes is None
