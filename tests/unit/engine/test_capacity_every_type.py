"""``capacity`` (with ``discard: reject``) refuses pushes past it on every queue type."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.cluster.codec import raw_of
from shoal.cluster.errors import CommandError
from shoal.node.state import QUEUE_PRESETS, Command, PartitionEngine, PushRun, SessionPull


def run(engine: PartitionEngine, cmd: Command, now: int = 1_000) -> dict[str, Any]:
    return engine.apply(cmd, now).result


@pytest.mark.parametrize("qtype", sorted(QUEUE_PRESETS))
def test_capacity_rejects_on_every_queue_type(qtype: str) -> None:
    e = PartitionEngine(0)
    run(e, {"cmd": "CreateQueue", "queue": "q", "type": qtype, "options": {"capacity": 2, "discard": "reject"}})
    run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1)})
    with pytest.raises(CommandError) as full_batch:  # the batch would pass it: refused whole
        run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(2)}, {"data": raw_of(3)}]})
    assert full_batch.value.code.value == "QUEUE_FULL"
    many = run(e, PushRun("q", [raw_of(i).packed for i in range(2)]))["results"]
    assert "id" in many[0] and isinstance(many[1], CommandError) and many[1].code.value == "QUEUE_FULL"
    with pytest.raises(CommandError) as full:
        run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(4)})
    assert full.value.code.value == "QUEUE_FULL"
    if qtype != "log":  # a finished job makes room again
        job = run(e, SessionPull({"cmd": "PULL", "queue": "q"}, "s"))
        run(e, {"cmd": "ACK", "id": job["job"]["id"], "token": job["token"]})
        assert "id" in run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(5)})
