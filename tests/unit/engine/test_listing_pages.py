"""Listings come in bounded pages: ListQueues (after, limit) and CronList (limit)."""

from __future__ import annotations

from shoal.cluster.codec import raw_of
from shoal.cluster.commands import validate
from shoal.node.state import PartitionEngine


def test_list_queues_pages_in_name_order() -> None:
    e = PartitionEngine(0)
    names = [f"q{i:03d}" for i in range(25)]
    for name in reversed(names):
        e.apply({"cmd": "PUSH", "queue": name, "data": raw_of(1)}, 1_000)
    seen: list[str] = []
    after = None
    for _ in range(10):
        cmd = {"cmd": "ListQueues", "limit": 10, **({"after": after} if after else {})}
        validate(cmd)
        page = e.apply(cmd, 1_000).result
        seen += page["queues"]
        if not page["more"]:
            break
        after = page["queues"][-1]
    assert seen == names
    assert e.apply({"cmd": "ListQueues"}, 1_000).result == {"queues": names, "more": False}


def test_cron_list_is_bounded() -> None:
    e = PartitionEngine(0)
    for i in range(5):
        e.apply({"cmd": "Cron", "name": f"c{i}", "queue": "q", "repeatEvery": 60_000}, 1_000)
    page = e.apply({"cmd": "CronList", "limit": 2}, 1_000).result
    assert len(page["crons"]) == 2 and page["more"] is True
    assert len(e.apply({"cmd": "CronList"}, 1_000).result["crons"]) == 5
