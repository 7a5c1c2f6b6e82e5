"""A node of release 794f12b, the last on this Raft link version whose followers take no files
beside a snapshot, rejoins a group led by this release: its leader's snapshot refers to payload
files, so it is sent one that carries the data instead, and its replica agrees with the others."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port

from conftest import replica_views
from rawproto import Router
from releases import release_tree
from waiting import eventually

RELEASE = "794f12b"
QUEUE = "mixed"
#: A snapshot every 20 entries: the journal soon lacks what the stopped node needs.
SNAPSHOT_ENV = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "20", "SHOAL_SNAPSHOT_INTERVAL_S": "3600"}
pytestmark = pytest.mark.timeout(300)


def push(router: Router, first: int, count: int) -> None:
    for i in range(first, first + count):
        reply = router.call({"cmd": "PUSH", "queue": QUEUE, "data": {"i": i, "pad": "x" * 600}}, timeout_s=20)
        assert reply["ok"], reply


def test_a_node_of_the_previous_release_is_sent_a_snapshot_that_carries_the_data(tmp_path: Path) -> None:
    release = release_tree(tmp_path / "release", RELEASE)
    with LocalCluster(nodes=3, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(3, 1),
                      extra_env=dict(SNAPSHOT_ENV)) as cluster:
        cluster.wait_balanced()
        leader = cluster.leader_of(0)
        assert leader is not None
        old = next(n for n in cluster.node_ids if n != leader)
        cluster.stop_node(old)
        router = Router([cluster.address_of(n) for n in cluster.node_ids if n != old])
        try:
            push(router, 0, 150)
            eventually(lambda: list(cluster.config.node_data_dir(leader).glob("**/p0.snap.files.*/*.pay")),
                       "a snapshot of the leader that refers to its payload files")
            cluster.extra_env = {**SNAPSHOT_ENV, "PYTHONPATH": str(release)}
            cluster.start_node(old)  # the release's node: needs a snapshot, takes no files
            cluster.wait_ready()
            push(router, 150, 20)
        finally:
            router.close()
        views = replica_views(cluster, QUEUE, 60)
        assert len({v["digest"] for v in views}) == 1, views
        sent = cluster.log_file(leader).read_text()
        assert f"{old} takes no snapshot files" in sent, sent
        assert re.search(rf"sending snapshot \d+ \(\d+ bytes, 0 files beside it\) to {old}", sent), sent
        assert "loaded snapshot" in cluster.log_file(old).read_text()
