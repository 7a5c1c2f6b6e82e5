"""The node's copy of the registry (``shoal.node.cluster_map``), with in-memory files and an
in-memory Raft link: what a node starts from, what it persists, how updates and versions
travel between peers, and who may link."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.registry import ACTIVE, LEAVING, REMOVED, NodeEntry, Registry, RegistryError
from shoal.node.cluster_map import CHANNEL, REGISTRY_FILE, ClusterMap, bootstrap_registry
from shoal.node.raft._io import SimIO

DATA = "/data"
PATH = f"{DATA}/{REGISTRY_FILE}"


def config(*ids: str, replication: int = 3, partitions: int = 4) -> ClusterConfig:
    nodes = tuple(NodeSpec(n, "127.0.0.1", 7000 + k, 8000 + k, 9000 + k) for k, n in enumerate(ids))
    return ClusterConfig(nodes=nodes, cluster_id="c1", partitions=partitions, replication=replication)


class Link:
    """The narrow part of ``RaftNetwork`` the map uses, kept in memory."""

    def __init__(self, incarnations: dict[str, str] | None = None) -> None:
        self.channels: dict[str, Callable[[str, Any], None]] = {}
        self.on_peer_up: list[Callable[[str], None]] = []
        self.policy: Callable[[str, str], str | None] | None = None
        self.incarnations = incarnations or {}
        self.connected: list[str] = []
        self.sent: list[tuple[str, str, Any]] = []

    def register_channel(self, name: str, handler: Callable[[str, Any], None]) -> None:
        self.channels[name] = handler

    def set_peer_policy(self, policy: Callable[[str, str], str | None]) -> None:
        self.policy = policy

    def connected_peers(self) -> list[str]:
        return list(self.connected)

    def send_channel(self, peer: str, channel: str, message: Any) -> None:
        self.sent.append((peer, channel, message))

    def peer_incarnation(self, peer: str) -> str | None:
        return self.incarnations.get(peer)

    def up(self, peer: str) -> None:
        self.connected.append(peer)
        for listener in self.on_peer_up:
            listener(peer)


def stored(io: SimIO) -> Registry:
    return Registry.from_wire(json.loads(io.read_all(PATH)))


def test_a_first_start_builds_the_registry_from_the_cluster_file_and_persists_it() -> None:
    io = SimIO()
    cfg = config("n1", "n2", "n3")
    cm = ClusterMap(io, DATA, cfg, "n1", "inc-1")
    assert cm.fresh
    reg = cm.registry
    assert reg == bootstrap_registry(cfg)
    assert [n.id for n in reg.active()] == ["n1", "n2", "n3"] and reg.bootstrap == ("n1", "n2", "n3")
    assert [n.ordinal for n in reg.live()] == [0, 1, 2] and not any(n.incarnation for n in reg.live())
    assert stored(io) == reg
    # No incarnation of this node is known yet: it hosts no replica until its first link says.
    assert cm.self_member() is None
    assert cm.peer_addresses() == {"n2": ("127.0.0.1", 9001), "n3": ("127.0.0.1", 9002)}
    assert cm.dials() == set()  # the first node dials nobody; later ordinals dial it
    assert ClusterMap(SimIO(), DATA, cfg, "n3", "inc-3").dials() == {"n1", "n2"}


def test_a_restart_keeps_what_the_node_learned_and_adds_only_new_nodes_of_the_file() -> None:
    io = SimIO()
    cm = ClusterMap(io, DATA, config("n1", "n2", "n3"), "n1", "inc-1")
    cm.set_state("n3", LEAVING)
    again = ClusterMap(io, DATA, config("n1", "n2", "n3", "n4"), "n1", "inc-1")
    assert not again.fresh
    assert again.registry.nodes["n3"].state == LEAVING  # the file does not undo what was learned
    n4 = again.registry.nodes["n4"]
    assert n4.state == ACTIVE and n4.ordinal == 3
    assert again.registry.bootstrap == ("n1", "n2", "n3")  # the nodes it was created with stay


def test_a_damaged_or_oversized_registry_file_is_refused_naming_it() -> None:
    io = SimIO()
    io.write_atomic(PATH, [b"{not json"])
    with pytest.raises(RegistryError, match=REGISTRY_FILE):
        ClusterMap(io, DATA, config("n1", "n2"), "n1", "inc-1")
    io.write_atomic(PATH, [b" " * (4 * 1024 * 1024 + 1)])
    with pytest.raises(RegistryError, match="more than"):
        ClusterMap(io, DATA, config("n1", "n2"), "n1", "inc-1")


def test_a_cluster_of_one_records_its_own_incarnation() -> None:
    cm = ClusterMap(SimIO(), DATA, config("solo", replication=1), "solo", "inc-s")
    entry = cm.registry.nodes["solo"]
    assert (entry.incarnation, entry.original) == ("inc-s", "inc-s")
    assert cm.self_member() == "solo"


def test_an_update_persists_tells_the_listeners_and_goes_to_every_linked_peer() -> None:
    io = SimIO()
    cm = ClusterMap(io, DATA, config("n1", "n2", "n3"), "n1", "inc-1")
    link = Link()
    cm.attach(link)
    link.connected = ["n2", "n3"]
    seen: list[tuple[Registry, Registry]] = []
    cm.listeners.append(lambda old, new: seen.append((old, new)))
    cm.listeners.insert(0, lambda old, new: 1 / 0)  # one failing listener does not stop the others
    before = cm.registry
    after = cm.set_state("n3", LEAVING)
    assert after.nodes["n3"].state == LEAVING and after.nodes["n3"].version == before.nodes["n3"].version + 1
    assert seen == [(before, after)]
    assert stored(io) == after
    assert link.sent == [("n2", CHANNEL, after.to_wire()), ("n3", CHANNEL, after.to_wire())]
    # The same state again changes nothing: no version, no message, no listener call.
    link.sent.clear()
    assert cm.set_state("n3", LEAVING) == after
    assert cm.update(after) is False
    assert link.sent == [] and len(seen) == 1


def test_adding_a_node_gives_it_the_next_ordinal_and_refuses_a_live_id() -> None:
    cm = ClusterMap(SimIO(), DATA, config("n1", "n2", "n3"), "n1", "inc-1")
    new = NodeEntry("n4", "127.0.0.1", 7100, 8100, 9100, incarnation="inc-4")
    reg = cm.add_node(new)
    n4 = reg.nodes["n4"]
    assert (n4.ordinal, n4.state, n4.version, n4.incarnation, n4.original) == (3, ACTIVE, 1, "inc-4", "inc-4")
    with pytest.raises(RegistryError, match="already a active node"):
        cm.add_node(new)
    # A removed node's id may come back, its version above the removed entry's.
    cm.set_state("n4", REMOVED)
    removed_version = cm.registry.nodes["n4"].version
    back = cm.add_node(new).nodes["n4"]
    assert back.state == ACTIVE and back.version == removed_version + 1 and back.ordinal == 4
    with pytest.raises(RegistryError, match="no node"):
        cm.set_state("n9", LEAVING)


def test_replacing_an_incarnation_makes_the_new_one_a_new_member() -> None:
    cm = ClusterMap(SimIO(), DATA, config("n1", "n2", "n3"), "n1", "inc-1")
    link = Link({"n2": "old-2"})
    cm.attach(link)
    link.up("n2")  # first seen: its incarnation is recorded as current and original
    assert cm.member_of("n2", "old-2") == "n2"
    assert cm.check_peer("n2", "old-2") is None
    assert "wiped or restored" in (cm.check_peer("n2", "new-2") or "")
    assert link.policy is not None and link.policy("n2", "new-2") == cm.check_peer("n2", "new-2")
    reg = cm.replace_incarnation("n2", "new-2")
    assert reg.nodes["n2"].incarnation == "new-2" and reg.nodes["n2"].original == "old-2"
    assert cm.member_of("n2", "new-2") == "n2/new-2"  # the plain id keeps naming the old one
    assert cm.check_peer("n2", "new-2") is None and cm.check_peer("n2", "old-2") is not None
    assert "n2/new-2" in {m for members in cm.placement().values() for m in members}
    for bad in ("", "x" * 65):
        with pytest.raises(RegistryError, match="1 to 64"):
            cm.replace_incarnation("n2", bad)
    with pytest.raises(RegistryError, match="no live node"):
        cm.replace_incarnation("n9", "i")
    assert cm.check_peer("n9", "i") is not None  # not a node of the cluster: may not link


def test_a_peer_coming_up_gets_the_registry_and_its_first_incarnation_is_recorded_once() -> None:
    cm = ClusterMap(SimIO(), DATA, config("n1", "n2", "n3"), "n1", "inc-1")
    link = Link({"n2": "inc-2", "n3": "inc-3"})
    cm.attach(link)
    link.up("n2")
    entry = cm.registry.nodes["n2"]
    assert (entry.incarnation, entry.original, entry.version) == ("inc-2", "inc-2", 2)
    # the change went to every linked peer, then the newcomer got the registry
    assert link.sent[-1] == ("n2", CHANNEL, cm.registry.to_wire())
    link.sent.clear()
    link.incarnations["n2"] = "other"
    link.up("n2")  # known already: nothing recorded, the registry sent again
    assert cm.registry.nodes["n2"].incarnation == "inc-2"
    assert link.sent == [("n2", CHANNEL, cm.registry.to_wire())]


def test_gossip_merges_the_newer_entry_and_answers_only_when_the_peer_lacks_something() -> None:
    io = SimIO()
    cfg = config("n1", "n2", "n3")
    mine = ClusterMap(io, DATA, cfg, "n1", "inc-1")
    theirs = ClusterMap(SimIO(), DATA, cfg, "n2", "inc-2")
    link = Link()
    mine.attach(link)
    # Theirs is newer on n3: adopted and persisted, nothing to answer (they know all of it).
    newer = theirs.set_state("n3", LEAVING)
    link.channels[CHANNEL]("n2", newer.to_wire())
    assert mine.registry == newer and stored(io) == newer and link.sent == []
    # Mine is newer on n1 and theirs on n2: both sides converge on the merge.
    mine.update(mine.registry.bumped("n1", host="10.0.0.1"))
    assert theirs.update(newer.bumped("n2", host="10.0.0.2"))
    theirs_now = theirs.registry
    link.channels[CHANNEL]("n2", theirs_now.to_wire())
    assert mine.registry.nodes["n1"].host == "10.0.0.1" and mine.registry.nodes["n2"].host == "10.0.0.2"
    assert link.sent == [("n2", CHANNEL, mine.registry.to_wire())]
    # An older copy changes nothing here and gets the newer one back.
    link.sent.clear()
    current = mine.registry
    link.channels[CHANNEL]("n2", newer.to_wire())
    assert mine.registry == current and link.sent == [("n2", CHANNEL, current.to_wire())]


def test_gossip_from_another_cluster_or_malformed_is_refused_and_changes_nothing() -> None:
    io = SimIO()
    cm = ClusterMap(io, DATA, config("n1", "n2"), "n1", "inc-1")
    link = Link()
    cm.attach(link)
    before = cm.registry
    foreign = Registry("other", 4, {"n1": NodeEntry("n1", "h", 1, 2, 3, version=9)})
    link.channels[CHANNEL]("n2", foreign.to_wire())
    link.channels[CHANNEL]("n2", {"nodes": "not a list"})
    link.channels[CHANNEL]("n2", [1, 2, 3])
    assert cm.registry == before and stored(io) == before and link.sent == []


def test_the_placement_is_computed_once_per_registry() -> None:
    cm = ClusterMap(SimIO(), DATA, config("n1", "n2", "n3", replication=2, partitions=6), "n1", "inc-1")
    first = cm.placement()
    assert cm.placement() is first
    assert all(len(members) == 2 for members in first.values()) and len(first) == 6
    cm.set_state("n3", LEAVING)
    moved = cm.placement()
    assert moved is not first and all("n3" not in members for members in moved.values())


def test_without_a_link_a_change_is_kept_locally() -> None:
    io = SimIO()
    cm = ClusterMap(io, DATA, config("n1", "n2"), "n1", "inc-1")
    cm.broadcast()  # no network attached: nothing to send, no error
    assert cm.set_state("n2", LEAVING).nodes["n2"].state == LEAVING and stored(io) == cm.registry
