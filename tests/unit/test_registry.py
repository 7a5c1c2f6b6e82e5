"""The node registry: merge converges whatever order updates arrive in; member ids and placement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.registry import (ACTIVE, LEAVING, REMOVED, NodeEntry, Registry, RegistryError, Settings,
                                    member_id, node_of_member)


def entry(node: str, **kw: object) -> NodeEntry:
    k = int(node[1:])
    base = dict(host="127.0.0.1", port=6000 + k, http_port=7000 + k, raft_port=8000 + k, incarnation=f"i{k}",
                original=f"i{k}")
    base.update(kw)
    return NodeEntry(node, **base)  # type: ignore[arg-type]


def three() -> Registry:
    r = Registry("c1", 8)
    for k in (1, 2, 3):
        r = r.with_entry(entry(f"n{k}"))
    return r


entries = st.builds(
    lambda k, v, state, inc: entry(f"n{k}", version=v, state=state, incarnation=inc),
    st.integers(1, 4), st.integers(1, 5), st.sampled_from([ACTIVE, LEAVING, REMOVED]), st.sampled_from(["a", "b", "c"]))
settings_st = st.builds(lambda v, rf, auto: Settings(replication=rf, rebalance_auto=auto, version=v),
                        st.integers(1, 4), st.integers(1, 5), st.booleans())


def registry_of(items: list[NodeEntry], s: Settings) -> Registry:
    r = Registry("c1", 8, {}, s)
    for e in items:
        r = r.merge(Registry("c1", 8, {e.id: e}, s))
    return r


@settings(max_examples=200, deadline=None)
@given(st.lists(entries, max_size=8), st.lists(entries, max_size=8), st.lists(entries, max_size=8),
       settings_st, settings_st, settings_st)
def test_merge_is_commutative_associative_and_idempotent(a, b, c, sa, sb, sc) -> None:
    ra, rb, rc = registry_of(a, sa), registry_of(b, sb), registry_of(c, sc)
    assert ra.merge(rb) == rb.merge(ra)
    assert ra.merge(rb).merge(rc) == ra.merge(rb.merge(rc))
    assert ra.merge(ra) == ra


def test_a_newer_entry_wins_and_an_older_one_changes_nothing() -> None:
    r = three()
    newer = r.bumped("n2", state=LEAVING)
    assert r.merge(newer).nodes["n2"].state == LEAVING
    assert newer.merge(r) == newer


def test_member_ids_name_incarnations_after_the_original() -> None:
    assert member_id("n1", "i1", "i1") == "n1"
    assert member_id("n1", "x9", "i1") == "n1/x9"
    assert node_of_member("n1/x9") == "n1"
    r = three().bumped("n1", incarnation="x9")
    assert r.nodes["n1"].member() == "n1/x9"
    assert r.entry_of_member("n1") is None  # the old incarnation is no node now
    assert r.entry_of_member("n1/x9") is r.nodes["n1"]


def test_placement_uses_active_nodes_and_current_member_ids() -> None:
    r = three()
    assert all(len(v) == 3 for v in r.placement().values())
    r4 = r.with_entry(entry("n4"))
    held = sum("n4" in v for v in r4.placement().values())
    assert held >= 4  # a fourth node takes replicas of at least half the partitions
    leaving = r4.bumped("n1", state=LEAVING)
    assert not any("n1" in v for v in leaving.placement().values())
    assert all(len(v) == 3 for v in leaving.placement().values())


def test_the_link_refuses_removed_nodes_other_incarnations_and_strangers() -> None:
    r = three()
    assert r.accepts("n1", "i1") is None
    why = r.accepts("n1", "zz")
    assert why and "zz" in why and "i1" in why
    assert "not a node" in (r.accepts("n9", "i9") or "")
    assert "removed" in (r.bumped("n2", state=REMOVED).accepts("n2", "i2") or "")


def test_wire_round_trip_and_bad_documents() -> None:
    r = three().with_settings(replication=5)
    assert Registry.from_wire(r.to_wire()) == r
    with pytest.raises(RegistryError):
        Registry.from_wire({"clusterId": "c", "partitions": 8, "nodes": [{"id": "n/1"}]})
    with pytest.raises(RegistryError):
        three().with_settings(replication=0)
    with pytest.raises(RegistryError):
        three().merge(Registry("other", 8))
