"""The queue option ``durable`` (seed 004): validated, stored, shown as the durability class."""

from __future__ import annotations

import pytest

from shoal.cluster.commands import validate
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.state import PartitionEngine


def test_queues_are_fsync_class_by_default_and_disk_class_with_durable_false() -> None:
    engine = PartitionEngine(0)
    engine.apply({"cmd": "CreateQueue", "queue": "slow", "options": {"durable": False}}, 1_000)
    engine.apply({"cmd": "PUSH", "queue": "auto", "data": b"\x01"}, 1_000)
    assert engine.apply({"cmd": "Metrics", "queue": "slow"}, 1_000).result["metrics"]["durability"] == "disk"
    assert engine.apply({"cmd": "Metrics", "queue": "auto"}, 1_000).result["metrics"]["durability"] == "fsync"
    stats = engine.apply({"cmd": "Stats"}, 1_000).result["stats"]["queues"]
    assert (stats["slow"]["durability"], stats["auto"]["durability"]) == ("disk", "fsync")
    engine.apply({"cmd": "CreateQueue", "queue": "slow", "options": {"durable": True}}, 1_000)
    assert engine.apply({"cmd": "Metrics", "queue": "slow"}, 1_000).result["metrics"]["durability"] == "fsync"
    restored = PartitionEngine.restore(engine.snapshot())
    assert restored.digest() == engine.digest()


@pytest.mark.parametrize("value", ["yes", 1, 0.5])
def test_durable_must_be_a_boolean(value: object) -> None:
    with pytest.raises(CommandError) as exc:
        validate({"cmd": "CreateQueue", "queue": "q", "options": {"durable": value}})
    assert exc.value.code == ErrorCode.INVALID and "durable" in str(exc.value)


def test_durable_false_validates() -> None:
    frame = {"cmd": "CreateQueue", "queue": "q", "options": {"durable": False}}
    assert validate(frame) is frame
