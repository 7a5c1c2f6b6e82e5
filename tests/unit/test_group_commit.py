"""The replicated form of a group-commit batch (node/partition/pushes.py; pure: no Raft, no loop)."""

from __future__ import annotations

from typing import Any

from shoal.cluster.codec import PlainPush, Raw
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.partition.pushes import (AckRun, PushBatch, PushRun, SessionPull, check_block, commands_in,
                                         fan_out, replicated_form, session_pull)


def push(queue: str, n: int, **extra: object) -> dict[str, object]:
    return {"cmd": "PUSH", "queue": queue, "data": Raw(bytes([n])), "reqId": n, **extra}


def test_runs_of_plain_pushes_to_one_queue_merge_and_order_is_kept() -> None:
    cmds = [push("a", 1), push("a", 2, idempotencyKey="k"), push("b", 3), push("b", 4, waitMs=50),
            {"cmd": "ACK", "id": "0-1"}, push("a", 5), push("a", 6, priority=3), push("a", 7), push("a", 8)]
    out, sizes = replicated_form(cmds, 0)  # type: ignore[arg-type]
    assert sizes == [2, 2, 0, 0, 0, 2]
    assert out[0] == PushRun("a", [b"\x01", b"\x02"], [None, "k"])
    assert out[1] == PushRun("b", [b"\x03", b"\x04"])
    assert out[2]["cmd"] == "ACK" and out[3]["reqId"] == 5 and out[4]["priority"] == 3  # type: ignore[index]
    assert out[3]["data"] == b"\x05"  # type: ignore[index]  # a lone push's data as bytes, not Raw
    assert out[5] == PushRun("a", [b"\x07", b"\x08"])
    assert sum(max(n, 1) for n in sizes) == len(cmds)


def test_nothing_to_merge_keeps_the_batch_as_it_is() -> None:
    cmds: list[Any] = [push("a", 1), push("b", 2), {"cmd": "PULL", "queue": "a"}]
    out, sizes = replicated_form(cmds, 0)
    assert out == cmds and sizes is None


def test_plain_batches_and_consecutive_acks_take_their_compact_forms() -> None:
    plain = {"cmd": "PUSHB", "queue": "q", "reqId": 7,
             "jobs": [{"data": Raw(b"\x01")}, {"data": Raw(b"\x02"), "idempotencyKey": "k"}]}
    mixed = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": Raw(b"\x01"), "priority": 2}]}
    run = {"cmd": "ACKB", "ids": ["4-10", "4-11", "4-12"], "tokens": ["4.3", "4.4", "4.5"]}
    scattered = {"cmd": "ACKB", "ids": ["4-10", "4-12"]}
    with_results = {"cmd": "ACKB", "ids": ["4-10", "4-11"], "results": [Raw(b"\x01"), None]}
    # bunqueue's worker sends a null result per job whose processor returned nothing
    null_results = {"cmd": "ACKB", "ids": ["4-20", "4-21"], "tokens": ["4.7", "4.8"], "results": [None, None]}
    removing = {"cmd": "ACKB", "ids": ["4-30", "4-31"], "removeOnCompletes": [True, False]}
    out, sizes = replicated_form([plain, mixed, run, scattered, with_results, null_results, removing], 4)
    assert sizes is None
    assert out[0] == PushBatch("q", [b"\x01", b"\x02"], [None, "k"])
    assert out[1] is mixed and mixed["jobs"][0]["data"] == b"\x01"  # type: ignore[index]
    assert out[2] == AckRun(10, 3, 3)
    assert out[3] is scattered and out[4] is with_results
    assert out[5] == AckRun(20, 2, 7)
    assert out[6] is removing  # its removeOnComplete is kept


def test_results_fan_back_out_to_every_submitted_command() -> None:
    got: list[Any] = []
    cbs = [lambda r, i=i: got.append((i, r)) for i in range(5)]
    error = CommandError(ErrorCode.NOT_LEADER, "no")
    # entry: a run of 2, one command, a run of 2 that failed as a whole
    fan_out(cbs, [{"results": [{"id": "0-1"}, {"id": "0-2"}]}, {"id": "0-3"}, error], [2, 0, 2])
    assert got == [(0, {"id": "0-1"}), (1, {"id": "0-2"}), (2, {"id": "0-3"}), (3, error), (4, error)]
    assert commands_in(PushRun("q", [b"a", b"b", b"c"])) == 3 and commands_in({"cmd": "PUSH"}) == 1


def test_a_block_keeps_its_valid_pushes_and_refuses_the_others() -> None:
    frames = [PlainPush("q", b"\x01", 1), PlainPush("q", b"\x02", 2, "x" * 10_000), PlainPush("q", b"\x03", 3, "k")]
    refused: list[Any] = []
    req_ids, run = check_block(frames, lambda req_id, exc: refused.append((req_id, exc.code)))
    assert req_ids == [1, 3] and run == PushRun("q", [b"\x01", b"\x03"], [None, "k"])
    assert refused == [(2, ErrorCode.INVALID)]


def test_a_pull_carries_its_session_and_bound_only_when_it_has_them() -> None:
    frame = {"cmd": "PULLB", "queue": "q", "count": 5}
    assert session_pull(frame, None, 0) is frame
    assert session_pull(frame, "s", 1024) == SessionPull(frame, "s", 1024)
