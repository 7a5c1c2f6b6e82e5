"""The leader's record of disk-class entries stays cheap while a follower is down.

The record tells which AppendEntries may go out marked lazy (followers answer without a
sync). A stopped follower's match never moves: a trim bounded only by the lowest match would
keep every entry and pass over the whole record on every entry, quadratic in the entries a
disk-class partition takes while one follower is down.
"""

from __future__ import annotations

from raft_network import Cluster

from shoal.node.raft.core import LAZY_TRIM_MIN, LEADER

ENTRIES = 6 * LAZY_TRIM_MIN
SNAPSHOT_EVERY = 1_000


def leader_with_a_follower_down() -> tuple[Cluster, str]:
    cluster = Cluster(["n1", "n2", "n3"])
    cluster.campaign("n1")
    cluster.stabilize()
    assert cluster.nodes["n1"].core.state == LEADER
    cluster.crash("n3")
    return cluster, "n1"


def test_the_record_is_trimmed_rarely_and_never_holds_what_the_log_no_longer_holds() -> None:
    cluster, leader = leader_with_a_follower_down()
    core = cluster.nodes[leader].core
    rebuilds, record = 0, core._lazy_indexes  # noqa: SLF001 (the record is what the test is about)
    for k in range(ENTRIES):
        core.propose(b"\0" + str(k).encode(), cluster.now, lazy=True)
        cluster.process(cluster.nodes[leader])
        cluster.stabilize()
        if core._lazy_indexes is not record:  # noqa: SLF001
            rebuilds += 1
            record = core._lazy_indexes  # noqa: SLF001
            assert min(record, default=core.log.first_index) >= core.log.first_index
        if core.applied % SNAPSHOT_EVERY == 0:
            cluster.take_snapshot(leader)
            cluster.take_snapshot("n2")
    assert core.commit >= ENTRIES
    # Amortized: a trim only once the record doubled (a handful over the run), not once per entry.
    assert 0 < rebuilds <= 8
    assert len(core._lazy_indexes) <= 2 * max(LAZY_TRIM_MIN, SNAPSHOT_EVERY)  # noqa: SLF001


def test_a_follower_that_comes_back_is_sent_the_entries_it_missed_as_lazy() -> None:
    cluster, leader = leader_with_a_follower_down()
    core = cluster.nodes[leader].core
    for k in range(LAZY_TRIM_MIN + 10):  # past the first trim while n3 is down
        core.propose(b"\0" + str(k).encode(), cluster.now, lazy=True)
        cluster.process(cluster.nodes[leader])
        cluster.stabilize()
    missed = range(core.log.first_index + 2, core.log.last_index + 1)
    assert all(i in core._lazy_indexes for i in missed)  # noqa: SLF001 (kept for n3)
    sent: list[bool] = []
    cluster.on_output = lambda line: sent.append(" lazy" in line) if line.startswith(f"{leader}->n3 AppendEntries") \
        and "[]" not in line else None
    cluster.restart("n3")
    for _ in range(200):
        cluster.tick(0.05)
        cluster.stabilize()
        if cluster.nodes["n3"].core.commit >= core.commit:
            break
    assert cluster.nodes["n3"].core.commit == core.commit
    assert sent and all(sent)  # every batch of missed entries went out lazy
