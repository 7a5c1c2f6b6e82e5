"""The topology model: wire form, leader updates by term, merging views."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.codec import decode_response, encode
from shoal.cluster.errors import ProtocolError
from shoal.cluster.topology import NodeAddress, PartitionInfo, Topology

NODES = {n: NodeAddress(n, "127.0.0.1", 6789 + i, 6790 + i) for i, n in enumerate(["n1", "n2", "n3"])}


def topo(leaders: list[tuple[str | None, int]], epoch: int = 0) -> Topology:
    parts = tuple(PartitionInfo(p, ("n1", "n2", "n3"), leader, term) for p, (leader, term) in enumerate(leaders))
    return Topology("c1", len(parts), dict(NODES), parts, epoch)


partition_views = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(sorted(NODES))), st.integers(0, 50)),
                           min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(partition_views, st.integers(0, 1000))
def test_wire_round_trip_through_the_codec(leaders: list[tuple[str | None, int]], epoch: int) -> None:
    t = topo(leaders, epoch)
    reply = decode_response(encode({"ok": True, "topology": t.to_wire()})[4:])
    assert Topology.from_wire(reply["topology"]) == t


def test_leader_of_and_routing() -> None:
    t = topo([("n2", 3), (None, 0)])
    assert t.leader_of(0) == NODES["n2"]
    assert t.leader_of(1) is None
    assert 0 <= t.partition_of_queue("emails") < 2
    assert t.partition_of_job("1-99") == 1


def test_with_leader_ignores_older_terms() -> None:
    t = topo([("n1", 5)])
    assert t.with_leader(0, "n2", 4) is t
    assert t.with_leader(0, "n1", 5) is t
    newer = t.with_leader(0, "n2", 6)
    assert newer.partition_map[0].leader == "n2" and newer.partition_map[0].term == 6
    assert newer.epoch == t.epoch + 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(sorted(NODES))), st.integers(0, 9)),
             min_size=n, max_size=n),
    st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(sorted(NODES))), st.integers(0, 9)),
             min_size=n, max_size=n))))
def test_merge_prefers_a_named_leader_then_the_highest_term(views: tuple[list, list]) -> None:
    a, b = topo(views[0]), topo(views[1])
    merged = a.merge(b)
    for p, (mine, theirs) in enumerate(zip(a.partition_map, b.partition_map)):
        got = merged.partition_map[p]
        if (mine.leader is None) != (theirs.leader is None):
            # A campaigning node (no leader, maybe a higher term: an isolated node keeps
            # voting for itself) never hides the leader another view names.
            assert got == (mine if mine.leader is not None else theirs)
        elif mine.term != theirs.term:
            assert got == (mine if mine.term > theirs.term else theirs)
        else:
            assert got.term == mine.term
    assert merged.merge(b).partition_map == merged.partition_map  # merging again changes nothing


@pytest.mark.parametrize("bad", [
    None, {}, {"nodes": [], "partitionMap": [], "partitions": "x"},
    {"nodes": [{"id": "n1"}], "partitionMap": [], "partitions": 0},
    {"nodes": [], "partitionMap": [{"id": 1, "replicas": []}], "partitions": 1},
    {"nodes": [], "partitionMap": [], "partitions": 2},
])
def test_malformed_topology(bad: object) -> None:
    with pytest.raises(ProtocolError):
        Topology.from_wire(bad)
