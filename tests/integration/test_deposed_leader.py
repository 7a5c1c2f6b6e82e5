"""A leader cut off from its followers answers the writes it holds once it learns it was deposed.

Real nodes behind the chaos harness's proxies: the partition's leader keeps its client link
but loses every Raft link, takes a PUSH it cannot commit, and the other two elect a new leader.
After the heal the old leader steps down; the push it held must be answered at once
(``TIMEOUT``: the outcome is unknown), not when later entries happen to overwrite its log index.
Retrying with the same idempotency key then leaves exactly one job.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rawproto import RawConn, Router, leader_seen_by
from waiting import eventually

from shoal.chaos.proxied_cluster import ProxiedCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

QUEUE = "deposed"
ANSWER_AFTER_HEAL_MAX_S = 3.0  # the 100 ms topology poll or the step-down callback, with margin


def test_isolated_leader_answers_its_pending_push_soon_after_the_heal(tmp_path: Path) -> None:
    with ProxiedCluster(tmp_path / "cluster", nodes=3, partitions=1) as cluster:
        old = cluster.leader_of(0)
        addresses = dict(zip(cluster.node_ids, cluster.addresses))
        with RawConn(addresses[old]) as conn:
            assert conn.call({"cmd": "PUSH", "queue": QUEUE, "data": "first", "idempotencyKey": "k0"})["ok"]
            cluster.isolate(old)
            pending = conn.send({"cmd": "PUSH", "queue": QUEUE, "data": "second", "idempotencyKey": "k1"})
            others = [n for n in cluster.node_ids if n != old]

            def elected() -> str | None:
                seen = leader_seen_by(addresses[others[0]])
                return seen if seen in others else None

            new = eventually(elected, "a leader elected by the connected majority", 15)
            cluster.heal()
            healed = time.monotonic()
            reply = conn.wait_reply(pending, timeout_s=10)
            waited = time.monotonic() - healed
        print(f"old leader {old}, new {new}: answered {waited:.2f} s after the heal: {reply}")
        assert waited < ANSWER_AFTER_HEAL_MAX_S
        assert reply["ok"] or reply["code"] in ("TIMEOUT", "NOT_LEADER", "NO_LEADER")

        router = Router(cluster.addresses)
        try:
            again = router.call({"cmd": "PUSH", "queue": QUEUE, "data": "second", "idempotencyKey": "k1"})
            assert again["ok"]
            pulled = router.call({"cmd": "PULLB", "queue": QUEUE, "count": 10})
            assert sorted(j["data"] for j in pulled["jobs"]) == ["first", "second"]
        finally:
            router.close()
