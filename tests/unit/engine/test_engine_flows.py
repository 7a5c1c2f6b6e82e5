"""Flows in the engine: two partitions' engines, the child reports carried between them by
hand (what the node's forwarder does), in any order, repeated, across restarts."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.codec import Raw
from shoal.cluster.commands import validate
from shoal.cluster.errors import CommandError
from shoal.cluster.flow import FLOW_DEPTH_MAX, FLOW_JOBS_MAX, flatten, item_key
from shoal.node.state import PartitionEngine

NOW = 1_000


def packed(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def apply(engine: PartitionEngine, cmd: dict[str, Any], now: int = NOW) -> dict[str, Any]:
    validate(cmd, internal=True)
    return engine.apply(cmd, now).result


def make_flow(parent: PartitionEngine, child: PartitionEngine, policies: list[str]) -> tuple[str, list[str]]:
    [pid] = apply(parent, {"cmd": "_FlowPush", "queue": "p", "_items": [
        {"data": packed("parent"), "_expect": len(policies)}]})["ids"]
    ids = apply(child, {"cmd": "_FlowPush", "queue": "c", "_items": [
        {"data": packed(i), "_parent": pid, "_onFailure": policy} for i, policy in enumerate(policies)]})["ids"]
    return pid, ids


def deliver(parent: PartitionEngine, child: PartitionEngine) -> list[str]:
    """One forwarder round: send every outbox report, then acknowledge them."""
    # As the node's forwarder sends them: the child's id, and its key as bunqueue names it last.
    reports = [[r[0], f"{child.partition}-{seq}", *r[1:5], r[5]] for seq, r in child.flow_outbox.items()]
    if not reports:
        return []
    results = apply(parent, {"cmd": "_ChildDone", "partition": parent.partition, "_reports": reports})["results"]
    apply(child, {"cmd": "_FlowAcked", "partition": child.partition,
                  "_children": list(child.flow_outbox)})
    return results


def work(child: PartitionEngine, result: Any = None, error: str | None = None) -> str:
    reply = apply(child, {"cmd": "PULL", "queue": "c"})
    job = reply["job"]
    if error is None:
        apply(child, {"cmd": "ACK", "id": job["id"], "result": Raw(packed(result))})
    else:
        apply(child, {"cmd": "FAIL", "id": job["id"], "error": error})
    return job["id"]


def state(engine: PartitionEngine, job_id: str) -> str:
    return apply(engine, {"cmd": "GetState", "id": job_id})["state"]


def test_children_on_another_partition_release_their_parent() -> None:
    parent, child = PartitionEngine(0), PartitionEngine(1)
    pid, kids = make_flow(parent, child, ["fail", "fail"])
    assert state(parent, pid) == "waiting-children"
    assert apply(parent, {"cmd": "PULL", "queue": "p"})["job"] is None
    work(child, "a")
    assert deliver(parent, child) == ["ok"]
    assert state(parent, pid) == "waiting-children"
    work(child, "b")
    assert deliver(parent, child) == ["ok"]
    assert state(parent, pid) == "waiting"
    values = apply(parent, {"cmd": "GetChildrenValues", "id": pid})["values"]
    assert {k: msgpack.unpackb(v.packed) for k, v in values.items()} == dict(zip(kids, ["a", "b"]))
    keyed = apply(parent, {"cmd": "GetChildrenValues", "id": pid})["data"]["values"]
    assert {k: msgpack.unpackb(v.packed) for k, v in keyed.items()} == {f"c:{k}": v for k, v in zip(kids, "ab")}
    assert child.flow_outbox == {}


def test_a_retried_attempt_does_not_report_only_the_last_one() -> None:
    parent, child = PartitionEngine(0), PartitionEngine(1)
    apply(parent, {"cmd": "_FlowPush", "queue": "p", "_items": [{"data": packed(0), "_expect": 1}]})
    apply(child, {"cmd": "_FlowPush", "queue": "c", "_items": [
        {"data": packed(1), "_parent": "0-1", "_onFailure": "fail", "attempts": 2, "backoff": 0}]})
    work(child, error="first")
    assert child.flow_outbox == {}
    work(child, error="second")
    assert deliver(parent, child) == ["ok"]
    job = apply(parent, {"cmd": "GetJob", "id": "0-1"})["job"]
    assert job["state"] == "failed" and job["error"] == "child 1-1 failed: second"


def test_the_outbox_survives_a_restart_and_a_report_is_counted_once() -> None:
    parent, child = PartitionEngine(0), PartitionEngine(1)
    pid, _ = make_flow(parent, child, ["fail"])
    work(child, 7)
    child = PartitionEngine.restore(child.snapshot())  # a new leader: the same outbox
    reports = [[r[0], f"1-{seq}", *r[1:5], r[5]] for seq, r in child.flow_outbox.items()]
    assert len(reports) == 1
    for expected in ("ok", "dup"):  # the first leader's send landed, the new leader sends again
        assert apply(parent, {"cmd": "_ChildDone", "partition": 0, "_reports": reports})["results"] == [expected]
    assert apply(parent, {"cmd": "GetChildrenValues", "id": pid})["done"] == 1
    parent = PartitionEngine.restore(parent.snapshot())
    assert state(parent, pid) == "waiting"


def test_a_removed_parent_answers_gone_and_a_removed_child_reports() -> None:
    parent, child = PartitionEngine(0), PartitionEngine(1)
    pid, kids = make_flow(parent, child, ["ignore"])
    apply(parent, {"cmd": "Cancel", "id": pid})
    apply(child, {"cmd": "Cancel", "id": kids[0]})
    assert list(child.flow_outbox.values())[0][3] == "removed"
    assert deliver(parent, child) == ["gone"]
    assert parent.flow_parents == {} and child.flow_children == {}


@settings(max_examples=150, deadline=None)
@given(outcomes=st.lists(st.tuples(st.sampled_from(["done", "fail", "ignore", "remove"]), st.integers(0, 9)),
                         min_size=1, max_size=6),
       order=st.randoms(use_true_random=False), repeats=st.integers(0, 3), restart_at=st.integers(0, 8))
def test_any_delivery_order_gives_one_outcome(outcomes: list[tuple[str, int]], order: Any, repeats: int,
                                              restart_at: int) -> None:
    """However reports arrive (shuffled, repeated, across a restart), the parent ends as the
    reference says: failed if a ``fail`` child failed, else waiting with every completed
    child's result once; a follower twin applying the same commands holds the same state."""
    parent, twin = PartitionEngine(0), PartitionEngine(0)
    policies = ["fail" if kind in ("done", "fail") else kind for kind, _ in outcomes]
    [pid] = apply(parent, {"cmd": "_FlowPush", "queue": "p", "_items": [
        {"data": packed("p"), "_expect": len(outcomes)}]})["ids"]
    twin.apply({"cmd": "_FlowPush", "queue": "p", "_items": [{"data": packed("p"), "_expect": len(outcomes)}]},
               NOW, replies=False, events=False)
    reports = []
    for i, ((kind, value), policy) in enumerate(zip(outcomes, policies)):
        failed = kind != "done"
        reports.append([pid, f"1-{i + 1}", failed, None if failed else packed(value),
                        f"e{value}" if failed else None, policy])
    sends = reports + [order.choice(reports) for _ in range(repeats)]
    order.shuffle(sends)
    for n, report in enumerate(sends):
        if n == restart_at:
            parent = PartitionEngine.restore(parent.snapshot())
        cmd = {"cmd": "_ChildDone", "partition": 0, "_reports": [report]}
        apply(parent, cmd)
        twin.apply(cmd, NOW, replies=False, events=False)
    assert parent.digest() == twin.digest()
    any_fail = any(kind == "fail" for kind, _ in outcomes)
    assert state(parent, pid) == ("failed" if any_fail else "waiting")
    reply = apply(parent, {"cmd": "GetChildrenValues", "id": pid})
    assert reply["done"] == len(outcomes)
    expected = {f"1-{i + 1}": value for i, (kind, value) in enumerate(outcomes) if kind == "done"}
    assert {k: msgpack.unpackb(v.packed) for k, v in reply["values"].items()} == expected


# --- the wire tree ---------------------------------------------------------------------------------

def push_flow(parent: Any, children: Any, **extra: Any) -> dict[str, Any]:
    return validate({"cmd": "PushFlow", "parent": parent, "children": children, **extra})


def test_flatten_is_depth_first_and_keys_name_the_path() -> None:
    frame = push_flow({"queue": "p", "data": 0}, [
        {"queue": "a", "data": 1, "children": [{"queue": "b", "data": 2}]}, {"queue": "c", "data": 3}])
    nodes = flatten(frame["parent"], frame["children"])
    assert [(n.job["queue"], n.parent, n.depth, n.children) for n in nodes] == [
        ("p", None, 0, 2), ("a", 0, 1, 1), ("b", 1, 2, 0), ("c", 0, 1, 0)]
    assert [item_key("k", n) for n in nodes] == ["k/0", "k/0.0", "k/0.0.0", "k/0.1"]
    assert item_key(None, nodes[0]) is None


@pytest.mark.parametrize("parent, children, field", [
    ({"queue": "p", "data": 1}, [], "children"),
    ({"queue": "p", "data": 1, "delay": 5}, [{"queue": "c", "data": 1}], "parent.delay"),
    ({"queue": "p"}, [{"queue": "c", "data": 1}], "parent.data"),
    ({"queue": "p", "data": 1}, [{"queue": "c", "data": 1, "onFailure": "explode"}], "children[0].onFailure"),
    ({"queue": "p", "data": 1}, [{"queue": "bad name", "data": 1}], "children[0].queue"),
    ({"queue": "p", "data": 1}, [{"queue": "c", "data": 1, "color": 2}], "children[0].color"),
    ({"queue": "p", "data": 1}, [{"queue": "c", "data": 1}] * (FLOW_JOBS_MAX + 1), "children"),
])
def test_bad_trees_name_the_field(parent: Any, children: Any, field: str) -> None:
    with pytest.raises(CommandError) as exc:
        push_flow(parent, children)
    assert str(exc.value).startswith(field), str(exc.value)


def test_a_tree_deeper_than_the_limit_is_refused() -> None:
    tree: list[dict[str, Any]] = [{"queue": "leaf", "data": 0}]  # level 1 below the parent
    for _ in range(FLOW_DEPTH_MAX - 1):
        tree = [{"queue": "c", "data": 0, "children": tree}]
    push_flow({"queue": "p", "data": 0}, tree)
    with pytest.raises(CommandError, match="levels deep"):
        push_flow({"queue": "p", "data": 0}, [{"queue": "c", "data": 0, "children": tree}])
