"""Moving replicas (``shoal.node.moves``) on real Raft cores in memory: the order of the
single-server changes that walk a group to its target, which live voter takes the lead
when the leader itself leaves, and what the move service proposes, counts and reports.

The cores run on :mod:`raft.raft_network`'s in-memory network; the replica around a core
is reduced to what the move service calls (propose a change, transfer leadership, stream
progress), and its clock is the network's."""

from __future__ import annotations

from typing import Any

import pytest

from raft.raft_network import Cluster
from shoal.cluster.registry import LEAVING, NodeEntry, Registry
from shoal.cluster.topology import PartitionInfo, Topology
from shoal.node import moves as moves_module
from shoal.node.moves import MoveService
from shoal.node.raft.planning import DEAD_AFTER_S, HAND_OVER, PROMOTE_LAG_MAX, plan_change
from shoal.node.partition import Partition
from shoal.node.raft.core import LEADER, ProposalRefused
from shoal.node.raft.membership import ConfigChange

IDS = ["n1", "n2", "n3", "n4"]


def group(voters: list[str], ids: list[str] = IDS, leader: str = "n1") -> Cluster:
    """A settled group of ``voters`` led by ``leader`` (its first entry committed); the other
    ``ids`` run, outside the group."""
    cluster = Cluster(ids, voters=voters)
    cluster.on_output = lambda line: None
    cluster.campaign(leader)
    cluster.stabilize()
    cluster.tick(0.2)
    cluster.stabilize()
    assert cluster.nodes[leader].core.state == LEADER and cluster.nodes[leader].core.read_ready
    return cluster


def run(cluster: Cluster, seconds: float) -> None:
    """Heartbeats and their answers for ``seconds``."""
    for _ in range(round(seconds / 0.2)):
        cluster.tick(0.2)
        cluster.stabilize()


def apply(cluster: Cluster, change: Any, leader: str = "n1") -> None:
    assert isinstance(change, ConfigChange), change
    cluster.nodes[leader].core.propose_change(change, cluster.now)
    cluster.process(cluster.nodes[leader])
    cluster.stabilize()
    run(cluster, 0.4)


def plan(cluster: Cluster, target: list[str], leader: str = "n1") -> Any:
    return plan_change(cluster.nodes[leader].core, leader, target, cluster.now)


# --- plan_change: the order of the changes ----------------------------------------------------------


def test_a_group_on_its_target_needs_no_change() -> None:
    cluster = group(["n1", "n2", "n3"])
    assert plan(cluster, ["n1", "n2", "n3"]) is None
    assert plan(cluster, ["n3", "n2", "n1"]) is None  # the order names the preferred leader only


def test_a_new_member_joins_as_a_learner_and_is_promoted_once_caught_up() -> None:
    cluster = group(["n1", "n2", "n3"])
    for i in range(5):
        cluster.propose("n1", f"e{i}")
    cluster.stabilize()
    target = ["n1", "n2", "n4"]
    change = plan(cluster, target)
    assert change == ConfigChange("add_learner", "n4")
    cluster.nodes["n1"].core.propose_change(change, cluster.now)
    # Not committed yet: the next change waits.
    assert cluster.nodes["n1"].core.change_pending and plan(cluster, target) is None
    cluster.process(cluster.nodes["n1"])
    cluster.stabilize()
    run(cluster, 0.4)
    assert cluster.nodes["n1"].core.membership.learners == ("n4",)
    assert plan(cluster, target) == ConfigChange("promote", "n4")
    apply(cluster, ConfigChange("promote", "n4"))
    # Every target member votes and n3 answers: the voter the target lacks goes.
    assert plan(cluster, target) == ConfigChange("remove", "n3")
    apply(cluster, ConfigChange("remove", "n3"))
    assert set(cluster.nodes["n1"].core.membership.voters) == {"n1", "n2", "n4"}
    assert plan(cluster, target) is None


def test_a_learner_still_catching_up_is_not_promoted() -> None:
    cluster = group(["n1", "n2", "n3"])
    cluster.cut |= {("n1", "n4"), ("n4", "n1")}  # nothing reaches the new learner
    apply(cluster, ConfigChange("add_learner", "n4"))
    for i in range(PROMOTE_LAG_MAX + 5):
        cluster.propose("n1", f"e{i}")
    cluster.stabilize()
    assert plan(cluster, ["n1", "n2", "n4"]) is None
    cluster.cut.clear()
    run(cluster, 1.0)
    assert plan(cluster, ["n1", "n2", "n4"]) == ConfigChange("promote", "n4")


def test_a_learner_the_target_does_not_name_is_removed_first() -> None:
    cluster = group(["n1", "n2", "n3"])
    apply(cluster, ConfigChange("add_learner", "n4"))
    assert plan(cluster, ["n1", "n2", "n3"]) == ConfigChange("remove", "n4")
    # before anything else the target wants (n4 out, n3 replaced: the learner still goes first)
    assert plan(cluster, ["n1", "n2"]) == ConfigChange("remove", "n4")


def test_a_dead_voter_leaving_the_target_is_removed_before_the_newcomer_is_promoted() -> None:
    cluster = group(["n1", "n2", "n3"])
    apply(cluster, ConfigChange("add_learner", "n4"))
    cluster.crash("n3")
    run(cluster, DEAD_AFTER_S + 0.6)
    # n4 is caught up, but n3 has been silent for longer than DEAD_AFTER_S: it goes first,
    # since n1 and n2 (a majority of the voters left) hold the log and answer.
    assert plan(cluster, ["n1", "n2", "n4"]) == ConfigChange("remove", "n3")


def test_a_voter_is_not_removed_when_the_group_left_could_elect_nobody() -> None:
    cluster = group(["n1", "n2", "n3"])
    cluster.crash("n2")
    cluster.crash("n3")
    # Before the quorum check deposes the leader: n2 silent, n3 leaving; removing n3 would
    # leave {n1, n2} with only n1 answering.
    cluster.tick(0.2)
    cluster.stabilize()
    now = cluster.now + DEAD_AFTER_S + 1
    assert plan_change(cluster.nodes["n1"].core, "n1", ["n1", "n2"], now) is None


def test_the_leader_leaving_its_target_hands_over_first() -> None:
    cluster = group(["n1", "n2", "n3"])
    assert plan(cluster, ["n2", "n3"]) == HAND_OVER
    assert plan(cluster, ["n2", "n3", "n4"]) == ConfigChange("add_learner", "n4")


# --- the move service ---------------------------------------------------------------------------------


class Replica:
    """What the move service calls on a partition's replica (as :class:`~shoal.node.raft.PartitionReplica`
    answers it); the core is real."""

    def __init__(self, cluster: Cluster, member: str) -> None:
        self.cluster = cluster
        self.member = member
        self.transfers: list[list[str]] = []
        self.refuse: Exception | None = None

    @property
    def core(self) -> Any:
        return self.cluster.nodes[self.member].core

    def is_leader(self) -> bool:
        return bool(self.core.is_leader)

    @property
    def membership(self) -> Any:
        return self.core.membership

    def commit_index(self) -> int:
        return int(self.core.commit)

    def match_index(self, member: str) -> int | None:
        pr = self.core.progress.get(member)
        return pr.match if pr is not None else None

    def plan_change(self, target: list[str], now: float) -> Any:
        return plan_change(self.core, self.member, target, now)

    def propose_change(self, change: ConfigChange) -> None:
        if self.refuse is not None:
            raise self.refuse
        apply(self.cluster, change, self.member)

    def transfer_leadership(self, among: list[str]) -> None:
        self.transfers.append(among)

    def status(self) -> dict[str, Any]:
        return {"snapshotBytesSent": 1000}

    def stream_progress(self) -> list[dict[str, Any]]:
        return []


class Map:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry


class Node:
    """The node as the move service reads it: its registry, replicas, targets and topology."""

    def __init__(self, replicas: dict[int, Replica], targets: dict[int, list[str]], registry: Registry) -> None:
        self.cluster_map = Map(registry)
        # The move service writes nothing through group commit: the partitions need none.
        self.partitions = {p: Partition(p, replica, None) for p, replica in replicas.items()}  # type: ignore[arg-type]
        self.targets = targets

    def target(self, p: int) -> list[str]:
        return self.targets[p]

    @property
    def topology(self) -> Topology:
        parts = []
        for p, part in sorted(self.partitions.items()):
            core = part.replica.core
            parts.append(PartitionInfo(p, tuple(core.membership.voters), core.leader or None, core.term))
        return Topology("c1", len(parts), {}, tuple(parts), 0)


def registry(rebalance_auto: bool = True, leaving: tuple[str, ...] = ()) -> Registry:
    reg = Registry("c1", 1, {})
    for k, n in enumerate(IDS):
        reg = reg.with_entry(NodeEntry(n, "127.0.0.1", 7000 + k, 8000 + k, 9000 + k, ordinal=k,
                                       state=LEAVING if n in leaving else "active"))
    return reg.with_settings(rebalance_auto=rebalance_auto, move_rate_bytes_per_s=4 * 1024 * 1024)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[Cluster]:
    """The move service reads the network's clock (set the cluster in the list)."""
    holder: list[Cluster] = []
    monkeypatch.setattr(moves_module.time, "monotonic", lambda: holder[0].now)
    return holder


def test_the_service_walks_a_partition_to_its_target_and_counts_the_move(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    replica = Replica(cluster, "n1")
    target = ["n1", "n2", "n4"]
    node = Node({0: replica}, {0: target}, registry())
    service = MoveService(node)
    assert service.rate.rate == 1024 * 1024  # its share of the cluster's move rate: 4 MiB/s over 4 nodes
    assert [m["state"] for m in service.moves()] == ["waiting"]
    for _ in range(10):
        if not service.step(0, replica, target, auto=True):
            break
        run(cluster, 0.4)
    assert set(replica.core.membership.voters) == set(target) and not replica.core.membership.learners
    assert (service.started, service.finished) == (1, 1)
    assert service.last_change[0][:2] == ("remove", "n3")
    assert service.moves() == []
    assert service.counters() == {"started": 1, "finished": 1, "snapshotBytesSent": 1000,
                                  "rateBytesPerS": 1024 * 1024}


def test_a_learner_catching_up_is_reported_with_its_progress(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    apply(cluster, ConfigChange("add_learner", "n4"))
    service = MoveService(Node({0: Replica(cluster, "n1")}, {0: ["n1", "n2", "n4"]}, registry()))
    (move,) = service.moves()
    assert move["partition"] == 0 and (move["from"], move["to"]) == ("n3", "n4")
    assert move["state"] == "catching up" and move["matchIndex"] == move["commitIndex"]


def test_with_automatic_rebalancing_off_only_a_leaving_node_moves(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    replica = Replica(cluster, "n1")
    node = Node({0: replica}, {0: ["n1", "n2", "n4"]}, registry(rebalance_auto=False))
    service = MoveService(node)
    assert service.step(0, replica, ["n1", "n2", "n4"], auto=service._auto()) is False
    assert [m["state"] for m in service.moves()] == ["pending rebalance"]
    assert replica.core.membership.learners == ()
    # n3 leaves the cluster: its replica moves even so.
    node.cluster_map.registry = registry(rebalance_auto=False, leaving=("n3",))
    assert service.step(0, replica, ["n1", "n2", "n4"], auto=service._auto()) is True
    assert replica.core.membership.learners == ("n4",)


def test_an_operators_rebalance_runs_until_the_cluster_is_on_target(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    replica = Replica(cluster, "n1")
    node = Node({0: replica}, {0: ["n1", "n2", "n4"]}, registry(rebalance_auto=False))
    service = MoveService(node)
    service.reconcile()  # the first look takes the registry's epoch as done
    assert replica.core.membership.learners == ()
    node.cluster_map.registry = node.cluster_map.registry.with_settings(rebalance_epoch=1)
    for _ in range(10):
        service.reconcile()
        run(cluster, 0.4)
    assert set(replica.core.membership.voters) == {"n1", "n2", "n4"}
    assert service._auto() is False  # done: the next target change waits for the next rebalance


def test_the_leader_leaving_hands_leadership_to_a_voter_of_the_target(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    replica = Replica(cluster, "n1")
    service = MoveService(Node({0: replica}, {0: ["n2", "n3", "n4"]}, registry()))
    apply(cluster, ConfigChange("add_learner", "n4"))
    apply(cluster, ConfigChange("promote", "n4"))
    assert service.step(0, replica, ["n2", "n3", "n4"], auto=True) is True
    assert replica.transfers == [["n2", "n3", "n4"]]
    assert (service.started, service.finished) == (0, 0)


def test_a_refused_change_is_tried_again_later(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    replica = Replica(cluster, "n1")
    replica.refuse = ProposalRefused("a transfer is under way")
    service = MoveService(Node({0: replica}, {0: ["n1", "n2", "n4"]}, registry()))
    assert service.step(0, replica, ["n1", "n2", "n4"], auto=True) is True
    assert service.started == 0 and 0 not in service.last_change


def test_a_follower_or_an_empty_target_moves_nothing(clock: list[Cluster]) -> None:
    cluster = group(["n1", "n2", "n3"])
    clock.append(cluster)
    service = MoveService(Node({}, {}, registry()))
    assert service.step(0, Replica(cluster, "n2"), ["n1", "n2", "n4"], auto=True) is False
    assert service.step(0, Replica(cluster, "n1"), [], auto=True) is False


def test_the_move_rate_share_follows_the_registry() -> None:
    node = Node({}, {}, registry())
    service = MoveService(node)
    node.cluster_map.registry = node.cluster_map.registry.with_settings(move_rate_bytes_per_s=8 * 1024 * 1024)
    service.registry_changed()
    assert service.rate.rate == 2 * 1024 * 1024
