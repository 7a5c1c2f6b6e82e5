"""Parking and waking on one :class:`~shoal.node.partition.Partition`, with no loop, socket or node:
which parked commands a wake or a drain hands out, in what order, and each only once; and its
write policies (:meth:`~shoal.node.partition.Partition.propose`): an entry's durability class,
and new data refused in its place while space is low."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.node.partition import Parked, Partition
from shoal.node.partition import partition as partition_module

P = 3


class Link:
    """The connection a parked command answers on: parking reads only whether it closed."""

    def __init__(self) -> None:
        self.closed = False


class Timer:
    """A parked command's expiry, as the dispatcher sets it: cancelled once the command is claimed."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Unused:
    """Stands in for the replica and the group commit, which parking never touches."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"parking used {name}")


def partition() -> Partition:
    return Partition(P, Unused(), Unused())  # type: ignore[arg-type]


def pull(queue: str, n: int, link: Link | None = None, p: int = P) -> Parked[Link]:
    parked = Parked(link or Link(), {"cmd": "PULL", "queue": queue, "reqId": n}, p, queue, 10.0)
    parked.timer = Timer()  # type: ignore[assignment]
    return parked


def group_pull(queue: str, n: int, group: str | None) -> Parked[Link]:
    """A parked pull limited to ``group``'s jobs (None: to jobs without a group)."""
    only: dict[str, Any] = {"group": group} if group is not None else {"ungrouped": True}
    parked = Parked(Link(), {"cmd": "PULLB", "queue": queue, "count": 5, "reqId": n, **only}, P, queue, 10.0)
    parked.timer = Timer()  # type: ignore[assignment]
    return parked


def push(queue: str, n: int, link: Link | None = None) -> Parked[Link]:
    parked = Parked(link or Link(), {"cmd": "PUSH", "queue": queue, "reqId": n, "waitMs": 100}, P, queue, 10.0)
    parked.timer = Timer()  # type: ignore[assignment]
    return parked


def ids(parked: Any) -> list[int]:
    return [w.frame["reqId"] for w in parked]


def test_pulls_wake_oldest_first_on_the_queues_with_ready_jobs_and_once() -> None:
    part = partition()
    waiting = [pull("a", 1), pull("b", 2), pull("a", 3)]
    for parked in waiting:
        assert part.park_pull(parked)
    woken = list(part.wake_pulls(lambda queue: queue == "a"))
    assert ids(woken) == [1, 3]
    assert all(w.done and w.timer.cancelled for w in woken)  # type: ignore[union-attr]
    assert not waiting[1].done
    assert list(part.wake_pulls(lambda queue: queue == "a")) == []
    assert ids(part.wake_pulls(lambda queue: True)) == [2]


def test_answered_pulls_are_passed_over_and_their_line_goes() -> None:
    part = partition()
    expired, live = pull("a", 1), pull("a", 2)
    gone = pull("b", 3)
    closed_link = Link()
    left = pull("c", 4, closed_link)
    for parked in (expired, live, gone, left):
        part.park_pull(parked)
    expired.done = gone.done = True  # their timeouts answered them
    closed_link.closed = True
    asked: list[str] = []
    woken = list(part.wake_pulls(lambda queue: asked.append(queue) is None))
    assert ids(woken) == [2]
    assert asked == ["a", "c"]  # "b" held only answered pulls: nothing to ask
    assert not left.done  # its link closed: nobody to answer, so it is not handed out
    asked.clear()
    assert list(part.wake_pulls(lambda queue: asked.append(queue) is None)) == []
    assert asked == []  # every line is empty now


def test_a_round_wakes_a_bounded_number_of_pulls_per_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_module, "WAKE_PER_ROUND_MAX", 2)
    part = partition()
    for n in range(5):
        part.park_pull(pull("a", n))
    part.park_pull(pull("b", 9))
    assert ids(part.wake_pulls(lambda queue: True)) == [0, 1, 9]
    assert ids(part.wake_pulls(lambda queue: True)) == [2, 3]
    assert ids(part.wake_pulls(lambda queue: True)) == [4]


def test_a_pull_parked_again_while_its_round_runs_waits_for_the_next_round() -> None:
    part = partition()
    first, second = pull("a", 1), pull("a", 2)
    part.park_pull(first)
    part.park_pull(second)
    handed: list[int] = []
    for parked in part.wake_pulls(lambda queue: True):
        handed.append(parked.frame["reqId"])
        if parked is first:  # someone else took the job first: the dispatcher parks it anew
            again = pull("a", 1)
            assert part.park_pull(again)
    assert handed == [1, 2]
    assert ids(part.wake_pulls(lambda queue: True)) == [1]


def test_a_full_line_refuses_one_more_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_module, "PARKED_PER_QUEUE_MAX", 2)
    part = partition()
    assert part.park_pull(pull("a", 1)) and part.park_pull(pull("a", 2))
    refused = pull("a", 3)
    assert not part.park_pull(refused)
    assert part.park_pull(pull("b", 4))  # the limit is per queue
    assert ids(part.wake_pulls(lambda queue: True)) == [1, 2, 4]
    assert not refused.done


def test_a_pull_limited_to_a_group_wakes_only_when_that_group_has_a_job() -> None:
    part = partition()
    for parked in (pull("a", 1), group_pull("a", 2, "g"), group_pull("a", 3, "h"), group_pull("a", 4, None),
                   group_pull("a", 5, "g")):
        assert part.park_pull(parked)
    asked: list[tuple[Any, ...]] = []

    def ready(queue: str, group: str | None = None, ungrouped: bool = False) -> bool:
        asked.append((queue, group, ungrouped))
        return group in (None, "g") and not ungrouped  # a job of g waits, and none without a group

    assert ids(part.wake_pulls(ready)) == [1, 2, 5]
    assert asked == [("a", None, False), ("a", "g", False), ("a", "h", False), ("a", None, True)]  # once per line
    asked.clear()
    assert list(part.wake_pulls(lambda queue, *only: False)) == []
    assert ids(part.wake_pulls(lambda queue, group=None, ungrouped=False: ungrouped or group is None)) == [4]
    assert ids(part.wake_pulls(lambda queue, group=None, ungrouped=False: True)) == [3]


def test_a_queue_with_nothing_ready_asks_none_of_its_group_lines() -> None:
    part = partition()
    for n, group in enumerate(("g", "h", None)):
        part.park_pull(group_pull("a", n, group))
    asked: list[tuple[Any, ...]] = []
    assert list(part.wake_pulls(lambda *line: asked.append(line) is not None)) == []
    assert asked == [("a",)]  # the queue's answer covers every line of it


def test_the_parked_limit_counts_every_line_of_a_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_module, "PARKED_PER_QUEUE_MAX", 2)
    part = partition()
    assert part.park_pull(pull("a", 1)) and part.park_pull(group_pull("a", 2, "g"))
    assert not part.park_pull(group_pull("a", 3, "h"))
    assert part.park_pull(group_pull("b", 4, "g"))
    assert ids(part.wake_pulls(lambda queue, group=None, ungrouped=False: group != "g" or queue == "b")) == [1, 4]
    assert part.park_pull(group_pull("a", 5, "h"))  # one left: room for one more
    assert not part.park_pull(group_pull("a", 6, "h"))
    assert ids(part.drain_parked()) == [2, 5]
    assert part.park_pull(pull("a", 7)) and part.park_pull(pull("a", 8))


def test_parked_pushes_all_wake_in_order_and_one_parked_meanwhile_waits() -> None:
    part = partition()
    expired = push("a", 2)
    for parked in (push("a", 1), expired, push("b", 3)):
        part.park_push(parked)
    expired.done = True
    handed = []
    for parked in part.wake_pushes():
        handed.append(parked.frame["reqId"])
        if parked.frame["reqId"] == 1:  # still full: the dispatcher parks it again
            part.park_push(push("a", 1))
    assert handed == [1, 3]
    assert ids(part.wake_pushes()) == [1]
    assert list(part.wake_pushes()) == []


def test_a_drain_hands_out_every_live_parked_command_once_pushes_first() -> None:
    part = partition()
    part.park_pull(pull("a", 1))
    part.park_push(push("a", 2))
    part.park_pull(pull("b", 3))
    expired = pull("b", 4)
    part.park_pull(expired)
    expired.done = True
    drained = part.drain_parked()
    assert ids(drained) == [2, 1, 3]
    assert all(w.done for w in drained)
    assert part.drain_parked() == []
    assert list(part.wake_pulls(lambda queue: True)) == [] and list(part.wake_pushes()) == []


def test_only_this_partitions_unanswered_commands_park_here() -> None:
    part = partition()
    with pytest.raises(AssertionError, match="partition 4"):
        part.park_pull(pull("a", 1, p=P + 1))
    answered = push("a", 2)
    answered.done = True
    with pytest.raises(AssertionError, match="answered"):
        part.park_push(answered)


def test_a_new_partition_owes_nothing_and_has_not_ticked() -> None:
    part = partition()
    assert part.id == P
    assert not part.applied_pending and not part.tick_inflight and part.last_tick_ms == 0


# --- the write policies (Partition.propose) ---------------------------------------------------------


class Storage:
    def __init__(self, low: bool) -> None:
        self.low = low
        self.no_space: dict[int, str] = {}

    def space_low(self) -> bool:
        return self.low


class Machine:
    """Disk class: commands of the queue "lazy"; new data: PUSHes."""

    def disk_class(self, commands: list[Any]) -> bool:
        return all(c.get("queue") == "lazy" for c in commands)

    def takes_space(self, command: Any) -> bool:
        return command["cmd"] == "PUSH"


class CallSoon:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, args))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for fn, args in calls:
            fn(*args)


class Replica:
    """Records what it is asked to replicate; its applied state is current unless told."""

    def __init__(self, low: bool = False, current: bool = True) -> None:
        self.storage = Storage(low)
        self.application = Machine()
        self.loop = CallSoon()
        self.current = current
        self.proposed: list[tuple[list[Any], bool, Any]] = []

    def state_current(self) -> bool:
        return self.current

    def propose(self, now_ms: int, commands: list[Any], callback: Any, early: Any = None, *, lazy: bool) -> None:
        self.proposed.append((commands, lazy, callback))


def test_an_entry_is_disk_class_only_when_every_command_is_and_the_state_is_current() -> None:
    replica = Replica()
    part = Partition(P, replica)  # type: ignore[arg-type]
    part.propose(1, [{"cmd": "PUSH", "queue": "lazy"}, {"cmd": "ACK", "queue": "lazy"}], print)
    part.propose(1, [{"cmd": "PUSH", "queue": "lazy"}, {"cmd": "PUSH", "queue": "safe"}], print)
    replica.current = False  # a new leader before its first commit: fsync class whatever the state says
    part.propose(1, [{"cmd": "PUSH", "queue": "lazy"}], print)
    assert [lazy for _, lazy, _ in replica.proposed] == [True, False, False]


def test_while_space_is_low_new_data_is_refused_in_its_place_and_the_rest_goes_on() -> None:
    replica = Replica(low=True)
    part = Partition(P, replica)  # type: ignore[arg-type]
    answers: list[Any] = []
    batch = [{"cmd": "PUSH", "queue": "q"}, {"cmd": "ACK", "queue": "q"}, {"cmd": "PUSH", "queue": "q"}]
    part.propose(1, batch, lambda results, reason: answers.append((results, reason)))
    [(commands, _, callback)] = replica.proposed
    assert commands == [{"cmd": "ACK", "queue": "q"}] and list(replica.storage.no_space) == [P]
    callback([{"ok": 1}], 0)
    [(results, reason)] = answers
    assert reason == 0 and results[1] == {"ok": 1}
    assert [r.code.value for r in (results[0], results[2])] == ["NO_SPACE", "NO_SPACE"]
    # Only new data: nothing is proposed, every command is answered NO_SPACE.
    part.propose(1, [{"cmd": "PUSH", "queue": "q"}], lambda results, reason: answers.append((results, reason)))
    assert len(replica.proposed) == 1
    replica.loop.run()
    assert [r.code.value for r in answers[-1][0]] == ["NO_SPACE"]
    # Space back: the partition is no longer reported short of it.
    replica.storage.low = False
    part.propose(1, [{"cmd": "PUSH", "queue": "q"}], print)
    assert replica.storage.no_space == {} and len(replica.proposed) == 2


# --- what an applied entry owes (Partition.applied, answered, settle) --------------------------------


class Loop:
    """Holds what the partition schedules for the end of the loop iteration, run by :meth:`run`."""

    def __init__(self) -> None:
        self.soon: list[Any] = []

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.soon.append((fn, args))

    def run(self) -> None:
        soon, self.soon = self.soon, []
        for fn, args in soon:
            fn(*args)


class EventMachine:
    """The replica's application as settling reads it: the job events its applies recorded."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.record_events = True
        self.view = "view"

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events


class EventReplica:
    def __init__(self, leads: bool) -> None:
        self.leads = leads
        self.application = EventMachine()
        self.on_applied: Any = None

    def is_leader(self) -> bool:
        return self.leads


class Writes:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def write_now(self) -> None:
        self.log.append("write")

    def propose_first(self, flush: Any) -> None:
        raise AssertionError("no group commit runs in these tests")


class Serving:
    """The dispatcher as the partition's wake-ups see it, logging each call."""

    def __init__(self, log: list[str], wants: bool = True) -> None:
        self.log = log
        self.wants = wants
        self.writes = Writes(log)

    def wants_events(self) -> bool:
        return self.wants

    def publish(self, partition: int, events: list[str], view: Any) -> None:
        self.log.append(f"publish {partition} {'+'.join(events)} {view}")

    def wake(self, part: Partition) -> None:
        self.log.append(f"wake {part.id}")


def hosted(leads: bool = True, wants: bool = True) -> tuple[Partition, EventReplica, Loop, list[str]]:
    log: list[str] = []
    loop = Loop()
    replica = EventReplica(leads)
    part = Partition.hosted(P, replica, loop, None, serving=Serving(log, wants))  # type: ignore[arg-type]
    return part, replica, loop, log


def test_an_applied_entry_is_settled_once_right_after_its_answers_are_written() -> None:
    part, replica, loop, log = hosted()
    assert replica.on_applied == part.applied  # the replica tells the partition of every apply
    replica.application.events = ["added", "added"]
    part.applied()
    part.applied()  # a second entry applied in the same call: still one settling
    assert part.applied_pending and len(loop.soon) == 1 and log == []
    part.answered()
    assert log == ["write", f"publish {P} added+added view", f"wake {P}", "write"]
    assert not part.applied_pending
    loop.run()  # the settling scheduled for the iteration's end has nothing left to do
    assert log == ["write", f"publish {P} added+added view", f"wake {P}", "write"]


def test_an_entry_nobody_here_waited_on_is_settled_at_the_end_of_the_iteration() -> None:
    part, replica, loop, log = hosted()
    part.applied()
    part.answered()  # another entry's answers, before this one applied: written, nothing owed yet
    assert log == ["write", f"wake {P}", "write"]
    part.applied()
    loop.run()
    assert log == ["write", f"wake {P}", "write", f"wake {P}"]


def test_a_follower_publishes_nothing_wakes_nothing_and_stops_recording_events() -> None:
    part, replica, loop, log = hosted(leads=False)
    replica.application.events = ["added"]
    part.applied()
    loop.run()
    assert log == [] and replica.application.events == []  # taken and dropped
    assert not replica.application.record_events


def test_a_leader_nobody_takes_events_from_stops_recording_them_and_still_wakes() -> None:
    part, replica, loop, log = hosted(wants=False)
    replica.application.events = ["added"]
    part.applied()
    loop.run()
    assert log == [f"wake {P}"] and not replica.application.record_events


def test_a_retired_partition_settles_nothing_left_scheduled() -> None:
    part, replica, loop, log = hosted()
    part.applied()
    part.retired = True  # the node stopped hosting it before the iteration ended
    loop.run()
    part.answered()  # a late answer of its group commit is still written
    assert log == ["write"] and part.applied_pending
