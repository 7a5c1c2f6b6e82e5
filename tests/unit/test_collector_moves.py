"""The collector's MoveWatch: a partition's move is idle from the last scrape that saw it progress."""

from __future__ import annotations

from shoal.node.collector import MoveWatch


def test_idle_time_runs_from_the_last_change_and_restarts_on_progress() -> None:
    watch = MoveWatch()
    assert watch.idle_seconds({1: ("learner n4", 0)}, now=100.0) == {1: 0.0}
    assert watch.idle_seconds({1: ("learner n4", 0)}, now=160.0) == {1: 60.0}
    assert watch.idle_seconds({1: ("learner n4", 4096)}, now=170.0) == {1: 0.0}  # bytes acknowledged
    assert watch.idle_seconds({1: ("learner n4", 4096), 2: ("waiting",)}, now=200.0) == {1: 30.0, 2: 0.0}


def test_a_partition_whose_move_ended_is_forgotten() -> None:
    watch = MoveWatch()
    watch.idle_seconds({1: "a"}, now=0.0)
    assert watch.idle_seconds({}, now=50.0) == {}
    assert watch.idle_seconds({1: "a"}, now=60.0) == {1: 0.0}, "a new move of the partition starts afresh"
