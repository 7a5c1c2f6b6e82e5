"""``list_queues`` pages through every partition's ListQueues until none has more."""

from __future__ import annotations

import asyncio
from typing import Any

from shoal.client import AsyncClient
from shoal.node.state import PartitionEngine


def test_list_queues_merges_pages_of_every_partition() -> None:
    engines = [PartitionEngine(p) for p in range(3)]
    names = [f"q{i:02d}" for i in range(40)]
    for i, name in enumerate(names):  # uneven spread: partitions run out at different points
        engines[(i * i) % 3].apply({"cmd": "PUSH", "queue": name, "data": b"\x01"}, 1)
    client = AsyncClient(["127.0.0.1:1"])
    calls = []

    async def fan_out(frame: dict[str, Any]) -> dict[int, dict[str, Any]]:
        calls.append(frame)
        return {p: e.apply({**frame, "limit": 4}, 1).result for p, e in enumerate(engines)}  # pages of 4

    client.fan_out = fan_out  # type: ignore[method-assign]  # the engines answer in place of nodes
    assert asyncio.run(client.list_queues()) == names
    assert 3 < len(calls) < 40
