"""Raft's safety and liveness properties over random runs of 3 and 5 cores (Raft paper §5.2-§5.4, Figure 3).

Hypothesis drives a :class:`raft_network.Cluster` through bounded runs of ticks,
proposals, message loss, duplication and reordering, crashes (of the leader too) and
restarts, partitions, forced campaigns, snapshots and leadership transfers; after
every step :class:`Checker` asserts what Raft promises:

- election safety: at most one leader per term;
- log matching: two logs holding an entry of the same index and term hold the same entry;
- state machine safety: every node applies the same payload at the same index, and an
  entry at or below a node's commit index never changes;
- leader completeness: a leader's log holds every entry committed in an earlier term;
- a core's commit and applied indexes never go backwards.

Then the network heals, every node starts again and, within a bounded number of
steps, a leader must be elected, commit what it holds, and commit a new proposal
on every member (liveness once the network behaves). A third run mixes in
single-server membership changes (thesis §4.1): two servers start outside the group
and random changes add, promote, demote and remove members.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raft_network import Cluster, SimNode

from shoal.node.raft.core import LEADER, NotLeader, ProposalRefused
from shoal.node.raft.membership import CHANGE_KINDS, ConfigChange
from shoal.node.raft.messages import AppendEntries, AppendResponse, InstallSnapshot, SnapshotChunkAck

#: A failing run is shrunk by Hypothesis for minutes: the test's own time limit must not cut it
#: short (a cut-short shrink is reported as a flaky test, not as the failure it found).
SHRINK_TIMEOUT_S = 1200
#: Steps of one random run, and of the healed run that follows it (0.05 s each).
STEPS_MAX = 300
HEALED_STEPS_MAX = 400
TICK_S = 0.05

#: Kinds of step, repeated by weight: time passes and messages arrive more often than faults strike.
KINDS = (["tick"] * 10 + ["deliver-all"] * 8 + ["deliver"] * 4 + ["propose"] * 5 + ["drop"] * 2
         + ["restart"] * 2 + ["heal"] * 2 + ["campaign"] * 2
         + ["duplicate", "crash", "crash-leader", "partition", "snapshot", "transfer"])
TICKS_S = (0.05, 0.1, 0.1, 0.2, 0.5, 1.0)
#: (kind, a, b): ``a`` and ``b`` pick a node, a message, a tick length or a partition's side.
ACTION = st.tuples(st.sampled_from(KINDS), st.integers(0, 63), st.integers(0, 63))
RUN = st.lists(ACTION, min_size=STEPS_MAX // 3, max_size=STEPS_MAX)
#: The same with membership changes proposed about as often as proposals.
CHANGING_RUN = st.lists(st.tuples(st.sampled_from(KINDS + ["change"] * 4), st.integers(0, 63), st.integers(0, 63)),
                        min_size=STEPS_MAX // 3, max_size=STEPS_MAX)


@dataclass
class Checker:
    """Raft's safety properties, checked against everything seen so far in one run."""

    cluster: Cluster
    #: term -> the node that led it.
    leaders: dict[int, str] = field(default_factory=dict)
    #: (index, term) -> payload, for every entry seen in any log.
    entries: dict[tuple[int, int], bytes] = field(default_factory=dict)
    #: index -> (term, payload, the highest term of any node when it was first seen committed:
    #: it was committed in that term or an earlier one).
    committed: dict[int, tuple[int, bytes, int]] = field(default_factory=dict)
    #: index -> payload, for every data entry any node applied.
    applied: dict[int, bytes] = field(default_factory=dict)
    #: (node, incarnation) -> (commit, applied) last seen.
    progress: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def check(self) -> None:
        for node in self.cluster.nodes.values():
            if node.up:
                self._check_node(node)

    def _check_node(self, node: SimNode) -> None:
        core = node.core
        log = core.log
        key = (node.id, node.incarnation)
        commit, applied = self.progress.get(key, (0, 0))
        assert core.commit >= commit, f"{node.id}: commit went back from {commit} to {core.commit}"
        assert core.applied >= applied, f"{node.id}: applied went back from {applied} to {core.applied}"
        assert core.applied <= core.commit, f"{node.id}: applied {core.applied} beyond commit {core.commit}"
        self.progress[key] = (core.commit, core.applied)

        if core.state == LEADER:
            leader = self.leaders.setdefault(core.term, node.id)
            assert leader == node.id, f"two leaders in term {core.term}: {leader} and {node.id}"

        held = log.entries(log.first_index, log.last_index + 1) if log.last_index >= log.first_index else []
        for payload, index, term in held:
            known = self.entries.setdefault((index, term), payload)
            assert known == payload, f"{node.id}: entry {index}/{term} differs from another log's"
        for payload, index, term in held:
            if index <= log.snap_index or index > core.commit:
                continue
            seen = self.committed.get(index)
            if seen is None:
                self.committed[index] = (term, payload, self._max_term())
            else:
                assert (seen[0], seen[1]) == (term, payload), \
                    f"{node.id}: committed entry {index} is {term}/{payload!r}, was {seen[0]}/{seen[1]!r}"

        for index, payload in node.applied:
            known = self.applied.setdefault(index, payload)
            assert known == payload, f"{node.id} applied {payload!r} at {index}, another node {known!r}"
        indexes = [i for i, _ in node.applied]
        assert indexes == sorted(set(indexes)), f"{node.id} applied out of order: {indexes}"

        if core.state == LEADER:
            self._check_complete(node)

    def _check_complete(self, node: SimNode) -> None:
        """Leader completeness (§5.4.3): the leader holds every entry committed in an earlier
        term. (An entry of a later term it may lack: a candidate can win with votes cast before
        its voters moved on to a newer term, and lead a stale term that commits nothing.)"""
        core = node.core
        for index, (term, payload, committed_in) in self.committed.items():
            if index <= core.log.snap_index or committed_in >= core.term:
                continue
            held = core.log.entries(index, index + 1) if index <= core.log.last_index else []
            assert held and held[0][2] == term and held[0][0] == payload, \
                f"leader {node.id} (term {core.term}) lacks committed entry {index}/{term}: {held}"

    def _max_term(self) -> int:
        return max(n.core.term for n in self.cluster.nodes.values())


def leader_of(cluster: Cluster) -> SimNode | None:
    """The leader of the highest term among the nodes that are up, if any."""
    leaders = [n for n in cluster.nodes.values() if n.up and n.core.state == LEADER]
    return max(leaders, key=lambda n: n.core.term) if leaders else None


def step(cluster: Cluster, action: tuple, counter: list[int]) -> None:
    ids = list(cluster.nodes)
    kind = action[0]
    if kind == "tick":
        cluster.tick(TICKS_S[action[1] % len(TICKS_S)])
    elif kind == "deliver" and cluster.in_flight:
        k = action[1] % len(cluster.in_flight)
        cluster.in_flight.insert(0, cluster.in_flight.pop(k))
        cluster.deliver(count=1)
    elif kind == "deliver-all":
        cluster.deliver(count=len(cluster.in_flight))
    elif kind == "drop" and cluster.in_flight:
        cluster.drop_at(action[1] % len(cluster.in_flight))
    elif kind == "duplicate" and cluster.in_flight:
        cluster.in_flight.append(cluster.in_flight[action[1] % len(cluster.in_flight)])
    elif kind == "propose":
        node = cluster.nodes[ids[action[1] % len(ids)]]
        if not (node.up and node.core.state == LEADER):
            node = leader_of(cluster)
        if node is not None:
            counter[0] += 1
            try:
                cluster.propose(node.id, f"p{counter[0]}")
            except (NotLeader, ProposalRefused):
                pass
    elif kind == "crash":
        node_id = ids[action[1] % len(ids)]
        if cluster.nodes[node_id].up:
            cluster.crash(node_id)
    elif kind == "crash-leader":
        leader = leader_of(cluster)
        if leader is not None:
            cluster.crash(leader.id)
    elif kind == "campaign":
        node = cluster.nodes[ids[action[1] % len(ids)]]
        if node.up:
            cluster.campaign(node.id)
    elif kind == "restart":
        down = [i for i in ids if not cluster.nodes[i].up]
        if down:
            cluster.restart(down[action[1] % len(down)])
    elif kind == "partition":
        side = {i for k, i in enumerate(ids) if (action[1] + 1) >> k & 1}
        cluster.cut = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
    elif kind == "heal":
        cluster.cut = set()
    elif kind == "snapshot":
        node = cluster.nodes[ids[action[1] % len(ids)]]
        if node.up and node.core.applied > node.core.log.snap_index:
            cluster.take_snapshot(node.id)
    elif kind == "change":
        node = leader_of(cluster)
        if node is not None:
            change = ConfigChange(CHANGE_KINDS[action[1] % len(CHANGE_KINDS)], ids[action[2] % len(ids)])
            try:
                node.core.propose_change(change, cluster.now)
            except (NotLeader, ProposalRefused):
                pass
            cluster.process(node)
    elif kind == "transfer":
        node = cluster.nodes[ids[action[1] % len(ids)]]
        target = ids[action[2] % len(ids)]
        if node.up and node.core.state == LEADER and target != node.id:
            try:
                node.core.transfer_leadership(target, cluster.now)
            except ProposalRefused:
                pass
            cluster.process(node)


def settle(cluster: Cluster, checker: Checker, done: object, what: str) -> None:
    """Tick and deliver in small steps until ``done()`` holds (bounded); safety is checked after
    every step of time (the random run before checks it after every delivery)."""
    for _ in range(HEALED_STEPS_MAX):
        if done():  # type: ignore[operator]
            return
        cluster.tick(TICK_S)
        for _ in range(100):
            if not cluster.in_flight:
                break
            cluster.deliver(count=len(cluster.in_flight))
        checker.check()
    status = "\n".join(f"  {n.core.status()}" for n in cluster.nodes.values())
    raise AssertionError(f"no {what} within {HEALED_STEPS_MAX} steps of {TICK_S} s after healing:\n{status}")


def members(cluster: Cluster) -> list[SimNode]:
    """The nodes the leader counts as members (all of them while there is no leader)."""
    leader = leader_of(cluster)
    if leader is None:
        return list(cluster.nodes.values())
    return [n for n in cluster.nodes.values() if n.id in leader.core.membership.members]


def converged(cluster: Cluster) -> bool:
    """One leader that every member follows, whose whole log every member has committed and
    applied (and no leadership transfer or membership change under way)."""
    leader = leader_of(cluster)
    if leader is None or leader.core.commit != leader.core.last_index or leader.core.lead_transferee is not None \
            or leader.core.change_pending:
        return False
    return all(n.core.term == leader.core.term and n.core.commit == leader.core.commit
               and n.core.applied == n.core.commit for n in members(cluster))


def run(ids: list[str], seed: int, actions: list[tuple], voters: list[str] | None = None) -> None:
    cluster = Cluster(ids, voters=voters, seed=seed)
    cluster.on_output = lambda line: None
    checker = Checker(cluster)
    counter = [0]
    for action in actions:
        step(cluster, action, counter)
        checker.check()

    cluster.cut = set()
    for node_id, node in cluster.nodes.items():
        if not node.up:
            cluster.restart(node_id)
    settle(cluster, checker, lambda: converged(cluster), "leader with every entry committed everywhere")
    leader = leader_of(cluster)
    assert leader is not None
    index = cluster.propose(leader.id, "after healing")
    entry = (index, b"\0after healing")
    settle(cluster, checker, lambda: all(entry in n.applied for n in members(cluster)),
           f"commit of a new proposal at {index} on every member")
    assert len({tuple(n.applied) for n in members(cluster)}) == 1, "members applied different entries"


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**16), RUN)
def test_three_cores_stay_safe_and_recover(seed: int, actions: list[tuple]) -> None:
    run(["1", "2", "3"], seed, actions)


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**16), RUN)
def test_five_cores_stay_safe_and_recover(seed: int, actions: list[tuple]) -> None:
    run(["1", "2", "3", "4", "5"], seed, actions)


@pytest.mark.timeout(SHRINK_TIMEOUT_S)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**16), CHANGING_RUN)
def test_cores_changing_membership_stay_safe_and_recover(seed: int, actions: list[tuple]) -> None:
    run(["1", "2", "3", "4", "5"], seed, actions, voters=["1", "2", "3"])


# --- table tests of single rules --------------------------------------------------------------


def elected(ids: list[str], leader: str = "1") -> Cluster:
    """A settled group led by ``leader`` (its no-op committed everywhere)."""
    cluster = Cluster(ids)
    cluster.on_output = lambda line: None
    cluster.campaign(leader)
    cluster.stabilize()
    cluster.tick(0.2)
    cluster.stabilize()
    assert cluster.nodes[leader].core.state == LEADER
    return cluster


def test_an_append_lost_to_a_replicating_follower_is_sent_again_after_a_heartbeat() -> None:
    """The leader pipelines to a follower it knows matches (replicate); when the last message is
    lost, nothing newer reveals the gap, so the heartbeat's answer must (§5.3: the leader retries)."""
    cluster = elected(["1", "2", "3"])
    cluster.crash("3")
    index = cluster.propose("1", "x")
    cluster.drop(to="2")
    assert cluster.nodes["1"].core.progress["2"].state == "replicate"
    for _ in range(10):  # 2 s of heartbeats
        cluster.tick(0.2)
        cluster.stabilize()
    assert cluster.nodes["2"].core.log.last_index == index
    assert cluster.nodes["1"].core.commit == index


def behind_a_snapshot() -> Cluster:
    """Leader 1 has compacted its log past what follower 3 holds; 3 is up again and its
    InstallSnapshot is the only message in flight."""
    cluster = elected(["1", "2", "3"])
    cluster.crash("3")
    for k in range(3):
        cluster.propose("1", f"x{k}")
    cluster.stabilize()
    cluster.take_snapshot("1")
    cluster.restart("3")  # the leader's link to 3 comes up: it probes 3
    for _ in range(10):
        if any(isinstance(m, InstallSnapshot) for _, _, m in cluster.in_flight):
            cluster.in_flight = [m for m in cluster.in_flight if isinstance(m[2], InstallSnapshot)]
            return cluster
        cluster.deliver(count=len(cluster.in_flight))
        cluster.tick(0.2)
    raise AssertionError("the leader did not send a snapshot")


def deliver_only(cluster: Cluster, kind: type) -> None:
    """Deliver the messages of ``kind`` in flight, leaving the others in flight in order."""
    keep = [m for m in cluster.in_flight if not isinstance(m[2], kind)]
    cluster.in_flight = [m for m in cluster.in_flight if isinstance(m[2], kind)]
    cluster.deliver(count=len(cluster.in_flight))
    cluster.in_flight = keep + cluster.in_flight


def heartbeats(cluster: Cluster, seconds: float) -> None:
    for _ in range(round(seconds / 0.2)):
        cluster.tick(0.2)
        cluster.stabilize()


def test_a_snapshot_delivered_whose_answer_is_lost_ends_the_snapshot_state() -> None:
    """The stream's completion alone moves the follower out of the snapshot state (§7): the
    follower's AppendResponse may be lost, and a follower left in that state never gets an
    entry again."""
    cluster = behind_a_snapshot()
    deliver_only(cluster, InstallSnapshot)
    cluster.in_flight = [m for m in cluster.in_flight if not isinstance(m[2], AppendResponse)]
    heartbeats(cluster, 1.0)
    index = cluster.propose("1", "after")
    heartbeats(cluster, 1.0)
    assert cluster.nodes["1"].core.progress["3"].state == "replicate"
    assert cluster.nodes["3"].core.commit == index


def test_a_snapshot_the_follower_already_holds_does_not_loop() -> None:
    """The follower installed the snapshot, but its ack and its answer were both lost: the
    leader's stream times out and it sends the snapshot again, which the follower no longer
    wants. The leader must learn where the follower is rather than ask again for ever."""
    cluster = behind_a_snapshot()
    deliver_only(cluster, InstallSnapshot)
    cluster.in_flight = [m for m in cluster.in_flight if not isinstance(m[2], (AppendResponse, SnapshotChunkAck))]
    cluster.nodes["1"].core.snapshot_done("3", False, cluster.now)  # the stream timed out
    heartbeats(cluster, 1.0)
    index = cluster.propose("1", "after")
    heartbeats(cluster, 1.0)
    assert cluster.nodes["1"].core.progress["3"].state == "replicate"
    assert cluster.nodes["3"].core.commit == index


def test_a_voter_holding_its_own_uncommitted_removal_is_elected_and_hands_over() -> None:
    """Voters 1 2 3 4; 1 proposes removing 2, and only 2 receives the entry before 1 is cut off.
    2's newest configuration (1 3 4) leaves it out, but 3 and 4 lack the entry and 2's log is
    ahead of theirs: only 2 can be elected. It still campaigns (its removal is not committed),
    leads outside its configuration (thesis §4.2.2), commits its removal with 3 and 4 (a majority
    of 1 3 4), and hands leadership to one of them."""
    cluster = elected(["1", "2", "3", "4"])
    leader = cluster.nodes["1"]
    leader.core.propose_change(ConfigChange("remove", "2"), cluster.now)
    cluster.process(leader)
    cluster.deliver(only_to="2")
    cluster.drop()  # the acknowledgement and the copies for 3 and 4 are lost: not committed
    cluster.cut = {(a, b) for a in "1234" for b in "1234" if a != b and "1" in (a, b)}
    assert cluster.nodes["2"].core.membership.voters == ("1", "3", "4")
    for other in ("3", "4"):
        cluster.nodes[other].core.schedule_election(cluster.now + 60)  # only 2 campaigns
    cluster.tick(1.1)
    cluster.campaign("2")
    for _ in range(40):  # 2 leads term 2, commits its own removal and hands leadership over
        cluster.tick(0.05)
        cluster.stabilize()
    leader_now = leader_of(cluster)
    assert leader_now is not None and leader_now.id in ("3", "4") and leader_now.core.term == 3
    assert not cluster.nodes["2"].core.membership.is_voter("2")
    index = cluster.propose(leader_now.id, "after")
    cluster.cut = set()
    heartbeats(cluster, 0.4)
    assert leader_now.core.commit >= index
    assert leader_now.core.membership.voters == ("1", "3", "4")


def test_a_configuration_is_in_effect_as_soon_as_it_is_in_the_log() -> None:
    """Voters 1 and 2; 2 removes 1. The new configuration (2 alone) counts from the entry's
    append (thesis §4.1): the removal commits on 2 alone, with 1 cut off. 1, which received it
    but not its commit, pre-campaigns now and then (its removal may not have committed), but no
    term moves: 2 refuses it as no voter of 2's configuration."""
    cluster = elected(["1", "2"], leader="2")
    two = cluster.nodes["2"]
    index = two.core.propose_change(ConfigChange("remove", "1"), cluster.now)
    cluster.process(two)
    cluster.deliver(only_to="1")
    cluster.drop()  # 1's acknowledgement is lost
    cluster.cut = {("1", "2"), ("2", "1")}
    assert two.core.commit >= index and two.core.membership.voters == ("2",)
    one = cluster.nodes["1"]
    assert one.core.membership.voters == ("2",)
    cluster.cut = set()
    for _ in range(60):  # 6 s: check quorum never deposes 2, and 1 never gets a term going
        cluster.tick(0.1)
        cluster.stabilize()
        assert two.core.state == LEADER and one.core.state != LEADER and one.core.term == two.core.term == 1
    after = cluster.propose("2", "after")
    assert two.core.commit >= after


def test_a_follower_that_lost_what_it_acknowledged_is_probed_back_to_its_log_end() -> None:
    """A follower may hold less than it acknowledged: a replica that discarded a damaged log, or
    one whose unsynced disk-class entries a crash lost. Its rejection hints where its log ends,
    below the leader's match index for it: the leader must probe from there (and count it for
    no more than it holds), not stop at its old match index for ever."""
    cluster = elected(["1", "2", "3"])
    for k in range(4):
        cluster.propose("1", f"x{k}")
    heartbeats(cluster, 0.4)
    last = cluster.nodes["1"].core.last_index
    assert cluster.nodes["1"].core.progress["3"].match == last
    cluster.crash("3")
    cluster.restart("3", lose_log=True)
    heartbeats(cluster, 1.0)
    assert cluster.nodes["3"].core.log.last_index == last
    assert cluster.nodes["3"].core.commit == last and not cluster.nodes["3"].core.recovering


def test_a_replica_that_lost_its_log_votes_only_once_it_holds_what_was_committed() -> None:
    """A replica that discarded a damaged log (recovering) may have acknowledged entries it no
    longer holds, so it neither votes nor campaigns until it holds them again (the vote's log
    check, §5.4.1, relies on voters keeping what they acknowledged). 3 helped commit x2..x5,
    which 2 lacks; 3 loses its log and gets only the first append back before the leader
    crashes: it must refuse 2, which would otherwise lead without x2..x5."""
    cluster = elected(["1", "2", "3"])
    payload = "x" * 40  # one entry per append after the no-op (64 bytes at most)
    cluster.propose("1", f"1{payload}")
    heartbeats(cluster, 0.4)
    cluster.cut = {("1", "2"), ("2", "1"), ("2", "3"), ("3", "2")}
    for k in range(2, 6):
        cluster.propose("1", f"{k}{payload}")
    heartbeats(cluster, 0.4)
    committed = cluster.nodes["1"].core.commit
    assert committed == 6 and cluster.nodes["2"].core.log.last_index == 2
    cluster.crash("3")
    cluster.restart("3", lose_log=True)
    for _ in range(10):  # until the first append reaches 3; the rest is lost
        cluster.tick(0.2)
        cluster.deliver(count=len(cluster.in_flight))
        if cluster.nodes["3"].core.log.last_index > 0:
            break
    cluster.drop()
    assert cluster.nodes["3"].core.log.last_index == 2  # 3's log is now as good as 2's
    cluster.crash("1")
    cluster.cut = set()
    heartbeats(cluster, 6.0)
    two = cluster.nodes["2"].core
    assert two.state != LEADER and two.commit <= 2, "2 led without the entries 3 had helped commit"
    cluster.restart("1")
    heartbeats(cluster, 6.0)
    leader = leader_of(cluster)
    assert leader is not None and leader.core.log.entries(3, 4)[0][0] == f"\0{2}{payload}".encode()
    assert not cluster.nodes["3"].core.recovering and cluster.nodes["3"].core.commit >= committed


def test_a_replica_that_lost_its_log_is_still_recovering_after_an_older_snapshot() -> None:
    """As above, but 3 gets the leader's snapshot first, which ends before x3..x5: installing it
    does not make 3 a voter again, only holding what the leader says is committed does."""
    cluster = elected(["1", "2", "3"])
    cluster.propose("1", "x1")
    cluster.propose("1", "x2")
    heartbeats(cluster, 0.4)
    cluster.take_snapshot("1")  # ends at x2, which 2 holds too
    cluster.cut = {("1", "2"), ("2", "1"), ("2", "3"), ("3", "2")}
    for k in range(3, 6):
        cluster.propose("1", f"x{k}")
    heartbeats(cluster, 0.4)
    assert cluster.nodes["1"].core.commit == 6 and cluster.nodes["2"].core.log.last_index == 3
    cluster.crash("3")
    cluster.restart("3", lose_log=True)
    cluster.hold(lambda m: m[0] == "1" and m[1] == "3" and isinstance(m[2], AppendEntries) and bool(m[2].entries))
    heartbeats(cluster, 1.0)  # the snapshot arrives; the appends after it do not
    three = cluster.nodes["3"].core
    assert three.log.snap_index == 3 and three.log.last_index == 3
    assert three.recovering
    cluster.release(lose=True)
    cluster.crash("1")
    cluster.cut = set()
    heartbeats(cluster, 6.0)
    assert cluster.nodes["2"].core.state != LEADER and cluster.nodes["2"].core.commit <= 3
