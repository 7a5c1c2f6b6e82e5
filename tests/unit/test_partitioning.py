"""Stable queue→partition hashing, job ids, and replica placement on the uhashring ring."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.jobid import format_job_id, parse_job_id, partition_of_job
from shoal.cluster.partitioning import (
    default_rf, leaders_per_node, partition_for, place_replicas, shard_queue_name, stable_hash,
)

node_sets = st.sets(st.text("abcdefgh0123456789-", min_size=1, max_size=8), min_size=1, max_size=7)


def test_stable_hash_is_fixed_forever() -> None:
    # Golden values: changing the hash would move every existing queue to another partition.
    assert stable_hash("emails") == 17289046547346009835
    assert stable_hash("") == 16476032584258269876
    assert partition_for("emails", 8) == 3
    assert partition_for("orders", 64) == 13


def test_stable_hash_ignores_pythonhashseed() -> None:
    code = "from shoal.cluster.partitioning import partition_for; print(partition_for('emails:eu', 1024))"
    outs = {subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": seed}, capture_output=True,
                           text=True, check=True).stdout for seed in ("1", "2")}
    assert outs == {f"{partition_for('emails:eu', 1024)}\n"}


@given(st.text(max_size=50), st.integers(1, 1024))
def test_partition_in_range(queue: str, partitions: int) -> None:
    assert 0 <= partition_for(queue, partitions) < partitions


def test_queues_spread_over_partitions() -> None:
    counts = [0] * 8
    for i in range(8000):
        counts[partition_for(f"queue-{i}", 8)] += 1
    assert min(counts) > 800 and max(counts) < 1200, counts


def test_shard_names_cannot_collide_with_queue_names() -> None:
    assert shard_queue_name("q", 3) == "q#3"  # '#' is not allowed in a client's queue name


@given(st.integers(0, 1023), st.integers(0, 2**63))
def test_job_id_round_trip(partition: int, seq: int) -> None:
    job_id = format_job_id(partition, seq)
    assert parse_job_id(job_id) == (partition, seq)
    assert partition_of_job(job_id) == partition


@pytest.mark.parametrize("bad", ["", "3", "3-", "-3", "a-3", "3-b", "3-4-5", 7, None, "1-" + "9" * 40])
def test_bad_job_ids(bad: object) -> None:
    with pytest.raises(CommandError) as info:
        parse_job_id(bad)
    assert info.value.code is ErrorCode.INVALID and str(info.value).startswith("id: ")


# --- placement ---------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(node_sets, st.integers(1, 64), st.integers(1, 5), st.randoms())
def test_placement_rf_distinct_and_order_independent(nodes: set[str], partitions: int, rf: int,
                                                     rnd: object) -> None:
    placement = place_replicas(nodes, partitions, rf)
    shuffled = sorted(nodes)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert place_replicas(shuffled + shuffled[:1], partitions, rf) == placement  # same set, same answer
    assert sorted(placement) == list(range(partitions))
    for replicas in placement.values():
        assert len(replicas) == min(rf, len(nodes))
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= nodes


def test_placement_is_identical_in_another_process() -> None:
    code = ("from shoal.cluster.partitioning import place_replicas; "
            "print(place_replicas(['n3', 'n1', 'n2', 'n4'], 16, 3))")
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": "7"}, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == str(place_replicas(["n1", "n2", "n3", "n4"], 16, 3))


def test_preferred_leaders_spread() -> None:
    leaders = leaders_per_node(place_replicas(["n1", "n2", "n3"], 64, 3))
    print(f"preferred leaders per node, P=64, 3 nodes: {leaders}")
    assert set(leaders) == {"n1", "n2", "n3"}
    assert max(leaders.values()) <= 2 * min(leaders.values())


def test_a_joining_node_moves_few_partitions() -> None:
    partitions, rf = 64, 3
    before = place_replicas(["n1", "n2", "n3"], partitions, rf)
    after = place_replicas(["n1", "n2", "n3", "n4"], partitions, rf)
    changed = sum(before[p] != after[p] for p in range(partitions))
    slots_moved = sum(len(set(after[p]) - set(before[p])) for p in range(partitions))
    leaders_moved = sum(before[p][0] != after[p][0] for p in range(partitions))
    # The least any placement can do: n4 takes its fair share, rf/4 of all replica slots.
    ideal_slots = partitions * rf // 4
    print(f"\n4th node joins a 3-node ring, P={partitions}, RF={rf}: {slots_moved} of {partitions * rf} replica "
          f"slots moved (ideal {ideal_slots}), {changed} partitions changed replicas, {leaders_moved} preferred "
          f"leaders moved (ideal {partitions // 4})")
    # Consistent hashing: n4 only slots into existing lists; old nodes never trade places among themselves.
    for p in range(partitions):
        assert [n for n in after[p] if n != "n4"] == before[p][:len([n for n in after[p] if n != "n4"])]
    assert slots_moved <= 1.5 * ideal_slots            # a full reshuffle would move ~3/4 of all slots...
    assert leaders_moved <= 2 * (partitions // 4)      # ...and ~3/4 of the leaders
    one = place_replicas(["n1", "n2", "n3"], partitions, 1)
    one_after = place_replicas(["n1", "n2", "n3", "n4"], partitions, 1)
    moved_rf1 = sum(one[p] != one_after[p] for p in range(partitions))
    print(f"with RF=1: {moved_rf1} of {partitions} partitions moved (ideal {partitions // 4})")
    assert moved_rf1 <= partitions // 2


@settings(max_examples=50, deadline=None)
@given(node_sets, st.text("xyz", min_size=1, max_size=4))
def test_joining_node_only_inserts_itself(nodes: set[str], new: str) -> None:
    if new in nodes:
        return
    before = place_replicas(nodes, 32, 3)
    after = place_replicas(nodes | {new}, 32, 3)
    for p in range(32):
        rest = [n for n in after[p] if n != new]
        assert rest == before[p][:len(rest)]


def test_placement_edges() -> None:
    assert place_replicas(["solo"], 4, 3) == {p: ["solo"] for p in range(4)}
    assert default_rf(1) == 1 and default_rf(2) == 2 and default_rf(5) == 3
    with pytest.raises(ValueError):
        place_replicas([], 4, 3)
