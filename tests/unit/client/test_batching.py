"""The batch worker's rules without I/O: options, when a batch is ready, what is pulled next, how a
batch settles, and the ACKB/JobHeartbeatB frames."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.client import AsyncClient, Batch, BatchOptions, BatchWorker, Job, Retry
from shoal.client._batching import (BATCH_SIZE_MAX, BatchCollector, Pull, ack_frames, error_text,
                                    heartbeat_frames, settle_plan)
from shoal.cluster import limits as L
from shoal.cluster.commands import validate


def jobs(n: int, *, start: int = 1, queue: str = "q", group: str | None = None, token: bool = True) -> list[Job]:
    return [Job(id=f"3-{i}", queue=queue, data=i, group=group, token=f"3.{i}" if token else None)
            for i in range(start, start + n)]


# --- options -----------------------------------------------------------------------------------

def test_default_options() -> None:
    o = BatchOptions()
    assert (o.size, o.min_size, o.timeout, o.group_affinity) == (100, 1, None, False)


@pytest.mark.parametrize("kwargs", [{"size": 0}, {"size": BATCH_SIZE_MAX + 1}, {"size": 2.5}, {"size": True},
                                    {"min_size": 0}, {"size": 5, "min_size": 6}, {"timeout": -0.1},
                                    {"timeout": 86_401}])
def test_bad_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        BatchOptions(**kwargs)


def test_the_size_limit_is_the_wires() -> None:
    assert BATCH_SIZE_MAX == min(L.pull_count_max, L.batch_jobs_max) == 10_000


# --- collecting ----------------------------------------------------------------------------------

def test_an_empty_collector_long_polls_for_a_whole_batch() -> None:
    c = BatchCollector(BatchOptions(size=10), poll_s=1.0)
    assert c.next_pull(0.0) == Pull(10, 1.0)


def test_with_min_size_one_whatever_came_is_a_batch() -> None:
    c = BatchCollector(BatchOptions(size=10), poll_s=1.0)
    c.add(jobs(3), 0.0)
    assert c.next_pull(0.0) is None
    assert [j.data for j in c.take(0.0)] == [1, 2, 3]
    assert len(c) == 0 and c.next_pull(0.0) == Pull(10, 1.0)


def test_min_size_holds_the_batch_back_until_its_timeout() -> None:
    c = BatchCollector(BatchOptions(size=10, min_size=5, timeout=0.25), poll_s=1.0)
    c.add(jobs(2), 100.0)
    assert c.deadline_s() == 100.25
    assert c.next_pull(100.1) == Pull(8, pytest.approx(0.15))  # only the rest, only until the deadline
    c.add(jobs(1, start=3), 100.2)
    assert c.next_pull(100.2) == Pull(7, pytest.approx(0.05))
    assert c.next_pull(100.25) is None  # the deadline: run with what came
    assert len(c.take(100.25)) == 3


def test_min_size_reached_makes_a_batch_at_once() -> None:
    c = BatchCollector(BatchOptions(size=10, min_size=4, timeout=5.0), poll_s=1.0)
    c.add(jobs(2), 0.0)
    c.add(jobs(2, start=3), 0.1)
    assert c.next_pull(0.1) is None and len(c.take(0.1)) == 4


def test_no_timeout_waits_for_min_size_poll_by_poll() -> None:
    c = BatchCollector(BatchOptions(size=10, min_size=4), poll_s=0.5)
    c.add(jobs(3), 0.0)
    assert c.deadline_s() is None
    assert c.next_pull(1_000_000.0) == Pull(7, 0.5)


def test_a_zero_timeout_runs_what_came() -> None:
    c = BatchCollector(BatchOptions(size=10, min_size=4, timeout=0), poll_s=0.5)
    c.add(jobs(1), 7.0)
    assert c.next_pull(7.0) is None


def test_group_affinity_keeps_one_group_per_batch_and_holds_the_others() -> None:
    c = BatchCollector(BatchOptions(size=6, min_size=2, group_affinity=True), poll_s=1.0)
    held = jobs(2, group="a") + jobs(1, start=3, group="b") + jobs(1, start=4, group="a")
    c.add(held, 0.0)
    assert [j.data for j in c.take(0.0)] == [1, 2, 4]
    assert [j.data for j in c.held] == [3]
    assert c.next_pull(1.0) == Pull(5, 1.0, "b")  # "b" waits for a second job of its own
    c.add(jobs(1, start=5), 1.0)  # no group: a group of its own
    c.add(jobs(1, start=6, group="b"), 1.0)
    assert [j.data for j in c.take(1.0)] == [3, 6]
    assert [j.data for j in c.held] == [5]


def test_group_affinity_pulls_one_job_then_only_its_groups() -> None:
    c = BatchCollector(BatchOptions(size=10, group_affinity=True), poll_s=1.0)
    assert c.next_pull(0.0) == Pull(1, 1.0)  # the batch's first job, of whichever group's turn it is
    c.add(jobs(1, group="a"), 0.0)
    assert c.next_pull(0.0) == Pull(9, 0.0, "a")  # min_size is met: what of "a" waits, without waiting
    c.add([], 0.0)
    assert c.next_pull(0.0) is None and [j.data for j in c.take(0.0)] == [1]
    c.add(jobs(1, start=2), 1.0)  # no group: the rest of the batch has none either
    assert c.next_pull(1.0) == Pull(9, 0.0, ungrouped=True)
    c.add(jobs(3, start=3), 1.0)
    assert [j.data for j in c.take(1.0)] == [2, 3, 4, 5]


def test_group_affinity_waits_for_min_size_with_pulls_of_the_group() -> None:
    c = BatchCollector(BatchOptions(size=10, min_size=4, timeout=0.5, group_affinity=True), poll_s=1.0)
    c.add(jobs(1, group="a"), 10.0)
    assert c.next_pull(10.1) == Pull(9, pytest.approx(0.4), "a")
    c.add(jobs(1, start=2, group="a"), 10.2)
    assert c.next_pull(10.5) is None  # the timeout: run with what came
    assert [j.data for j in c.take(10.5)] == [1, 2]
    c.add(jobs(1, start=3, group="b"), 11.0)
    assert c.next_pull(11.6) == Pull(9, 0.0, "b")  # past its timeout, a batch still takes what of b waits
    c.add([], 11.6)
    assert c.next_pull(11.6) is None


def test_a_full_collector_makes_a_batch_below_min_size() -> None:
    """Held jobs of other groups fill it: nothing more can be pulled, so a batch goes."""
    c = BatchCollector(BatchOptions(size=3, min_size=3, group_affinity=True), poll_s=1.0)
    c.add(jobs(1, group="a") + jobs(1, start=2, group="b") + jobs(1, start=3, group="c"), 0.0)
    assert c.next_pull(0.0) is None
    assert [j.data for j in c.take(0.0)] == [1]


def test_held_jobs_restart_the_wait_when_a_batch_is_taken() -> None:
    c = BatchCollector(BatchOptions(size=4, min_size=2, timeout=1.0, group_affinity=True), poll_s=5.0)
    c.add(jobs(2, group="a") + jobs(1, start=3, group="b"), 0.0)
    c.take(3.0)
    assert c.deadline_s() == 4.0


def test_pulling_more_than_asked_is_a_bug() -> None:
    c = BatchCollector(BatchOptions(size=2), poll_s=1.0)
    with pytest.raises(AssertionError):
        c.add(jobs(3), 0.0)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 8), min_size=st.integers(1, 8), timeout=st.sampled_from([None, 0.0, 0.3, 2.0]),
       affinity=st.booleans(), groups=st.lists(st.sampled_from([None, "a", "b"]), max_size=60),
       pull_sizes=st.lists(st.integers(0, 9), max_size=30))
def test_every_job_is_batched_once_within_the_limits(size: int, min_size: int, timeout: float | None,
                                                     affinity: bool, groups: list[str | None],
                                                     pull_sizes: list[int]) -> None:
    """A slot's loop over pulls that find ``pull_sizes`` jobs (then all there are; a pull limited
    to a group, the oldest of that group, as the node answers it): batches never exceed ``size``;
    below ``min_size`` only at the deadline or when full; one group each with affinity, and
    never a job of another group held; each job is handed over once; what is left held is too
    few to make a batch."""
    min_size = min(min_size, size)
    c = BatchCollector(BatchOptions(size=size, min_size=min_size, timeout=timeout, group_affinity=affinity),
                       poll_s=0.5)
    stream = [Job(id=f"1-{i}", queue="q", data=i, group=g) for i, g in enumerate(groups)]
    now, handed = 0.0, []
    pulled_again = False  # the last pull found nothing and asked for no more than a wait
    for _ in range(2_000):
        pull = c.next_pull(now)
        if pull is None:
            by_count = len(c) >= size or len(c._eligible()) >= min_size
            deadline = c.deadline_s()
            batch = c.take(now)
            assert 1 <= len(batch) <= size
            assert by_count or (deadline is not None and now >= deadline)
            if affinity:
                assert len({j.group for j in batch}) == 1
            handed += batch
            continue
        assert 1 <= pull.count <= size - len(c) and 0 <= pull.wait_s <= 0.5
        assert (pull.group is not None or pull.ungrouped) == (affinity and len(c) > 0)
        limited = pull.group is not None or pull.ungrouped
        matching = [j for j in stream if not limited or j.group == pull.group]
        if not matching and (timeout is None or len(c) == 0) and pulled_again:
            break  # nothing more will come: the collector waits for min_size (or for work)
        n = min(pull.count, pull_sizes.pop(0) if pull_sizes else len(matching), len(matching))
        got = matching[:n]
        stream = [j for j in stream if j not in got]
        pulled_again = not got
        now += 0.01 if got else pull.wait_s
        c.add(got, now)
        if affinity:
            assert len({j.group for j in c.held}) <= 1  # no other group's job is held
    else:
        raise AssertionError("the loop did not settle")
    assert affinity or [j.data for j in handed] == sorted(j.data for j in handed)  # oldest first
    assert sorted(j.data for j in handed + c.held + stream) == list(range(len(groups)))
    assert len(c._eligible()) < min_size and len(c) < size
    # Jobs left unpulled belong to other groups than the one the collector waits for (nobody's
    # lease holds them: another slot or worker takes them).
    assert all(affinity and c.held and j.group != c.held[0].group for j in stream)


# --- settling ----------------------------------------------------------------------------------

def test_returning_acks_every_job_with_the_value() -> None:
    batch = Batch(jobs(3))
    plan = settle_plan(batch, result={"n": 3})
    assert [(j.data, r) for j, r in plan.acks] == [(1, {"n": 3}), (2, {"n": 3}), (3, {"n": 3})]
    assert plan.fails == plan.releases == plan.cancelled == []


def test_a_list_of_one_result_per_job_gives_each_its_own() -> None:
    batch = Batch(jobs(3))
    assert [r for _, r in settle_plan(batch, result=[10, 20, 30]).acks] == [10, 20, 30]
    assert [r for _, r in settle_plan(batch, result=(1, 2)).acks] == [(1, 2)] * 3  # not one per job


def test_one_job_fails_alone_while_the_rest_complete() -> None:
    batch = Batch(jobs(4))
    batch.fail(batch[1], ValueError("bad row"))
    batch.retry(batch[2], 1.5)
    plan = settle_plan(batch, result=[1, 2, 3, 4])
    assert [(j.data, r) for j, r in plan.acks] == [(1, 1), (4, 4)]
    assert [(j.data, e, d) for j, e, d in plan.fails] == [(2, "ValueError: bad row", None)]
    assert [(j.data, d) for j, d in plan.releases] == [(3, 1.5)]
    assert batch.marked(batch[1]) and not batch.marked(batch[0])


def test_a_raising_handler_fails_every_job_not_settled_alone() -> None:
    batch = Batch(jobs(3))
    batch.fail(batch[0], "own reason", delay=2.0)
    plan = settle_plan(batch, error=RuntimeError("db down"))
    assert [(j.data, e, d) for j, e, d in plan.fails] == [(1, "own reason", 2.0), (2, "RuntimeError: db down", None),
                                                          (3, "RuntimeError: db down", None)]
    assert plan.acks == []


def test_retry_puts_back_every_job_not_settled_alone() -> None:
    batch = Batch(jobs(2))
    batch.fail(batch[1], "no")
    plan = settle_plan(batch, retry_delay=Retry(0.5).delay)
    assert [(j.data, d) for j, d in plan.releases] == [(1, 0.5)]
    assert [j.data for j, _, _ in plan.fails] == [2]


def test_a_cancelled_job_is_neither_acked_nor_failed() -> None:
    batch = Batch(jobs(3))
    batch[1].cancelled = True
    plan = settle_plan(batch, error=ValueError("x"))
    assert [j.data for j in plan.cancelled] == [2] and [j.data for j, _, _ in plan.fails] == [1, 3]


def test_marks_name_jobs_of_the_batch_only() -> None:
    batch = Batch(jobs(2))
    with pytest.raises(ValueError):
        batch.fail(jobs(1, start=9)[0])
    with pytest.raises(ValueError):
        batch.retry(batch[0], -1)
    with pytest.raises(ValueError):
        Batch(jobs(1) + jobs(1))


def test_error_texts_are_cut_to_the_wire_limit() -> None:
    assert len(error_text(ValueError("x" * (L.error_chars_max + 10)))) == L.error_chars_max
    batch = Batch(jobs(1))
    batch.fail(batch[0], "y" * (L.error_chars_max + 1))
    assert len(settle_plan(batch).fails[0][1]) == L.error_chars_max


def test_a_batch_is_a_read_only_sequence() -> None:
    batch = Batch(jobs(3))
    assert len(batch) == 3 and [j.data for j in batch] == [1, 2, 3] and batch[-1].data == 3
    assert [j.data for j in batch[:2]] == [1, 2] and batch.jobs == tuple(batch)


# --- frames ------------------------------------------------------------------------------------

def test_acks_go_in_one_valid_ackb_per_queue_routed_by_a_job_id() -> None:
    custom = Job(id="order-7", queue="q", data=0, token="3.99")
    other = jobs(2, queue="q#1", start=50)
    frames = ack_frames([(custom, None)] + [(j, None) for j in jobs(2)] + [(j, {"r": 1}) for j in other])
    assert len(frames) == 2
    (first_jobs, first), (second_jobs, second) = frames
    assert first == {"cmd": "ACKB", "ids": ["3-1", "3-2", "order-7"], "tokens": ["3.1", "3.2", "3.99"]}
    assert [j.id for j in first_jobs] == first["ids"]
    assert second["results"] == [{"r": 1}, {"r": 1}] and second_jobs == other
    for _, frame in frames:
        validate(frame)


def test_jobs_without_tokens_are_acked_without_them() -> None:
    [(_, frame)] = ack_frames([(j, None) for j in jobs(2, token=False)])
    assert frame == {"cmd": "ACKB", "ids": ["3-1", "3-2"]}


def test_heartbeats_extend_every_held_job_per_queue() -> None:
    frames = heartbeat_frames(jobs(2) + jobs(1, start=7, queue="r"), 30_000)
    assert [f for _, f in frames] == [
        {"cmd": "JobHeartbeatB", "ids": ["3-1", "3-2"], "ttr": 30_000, "tokens": ["3.1", "3.2"]},
        {"cmd": "JobHeartbeatB", "ids": ["3-7"], "ttr": 30_000, "tokens": ["3.7"]}]
    for _, frame in frames:
        validate(frame)


def test_frames_split_at_the_wire_batch_limit() -> None:
    many = jobs(L.batch_jobs_max + 5, token=False)
    frames = heartbeat_frames(many, 1000)
    assert [len(f["ids"]) for _, f in frames] == [L.batch_jobs_max, 5]


def test_a_batch_worker_takes_batch_options_only() -> None:
    client = AsyncClient(["127.0.0.1:1"])  # never connected: the constructor does no I/O

    async def handler(batch: Batch) -> None:
        return None

    worker = BatchWorker(client, "q", handler, batch=BatchOptions(size=5, min_size=2), concurrency=3)
    assert (worker.batch.size, worker.concurrency, worker.held, worker.batches) == (5, 3, 0, 0)
    assert "size=5" in repr(worker)
    with pytest.raises(TypeError):
        BatchWorker(client, "q", handler, batch={"size": 5})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BatchWorker(client, "q", handler, concurrency=0)
