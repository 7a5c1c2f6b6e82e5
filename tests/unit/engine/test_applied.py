"""``apply`` answers plain data: the reply and the command's events, with per-call options only."""

from __future__ import annotations

from shoal.cluster.codec import raw_of
from shoal.node.state import Applied, PartitionEngine, event_dicts


def test_apply_returns_the_reply_and_the_events_of_that_command_only() -> None:
    e = PartitionEngine(3)
    pushed = e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(3)]}, 1_000)
    assert isinstance(pushed, Applied)
    assert pushed.result == {"ids": ["3-1", "3-2", "3-3"]}
    assert pushed.events == [("q", s, "waiting", None) for s in (1, 2, 3)]
    pulled = e.apply({"cmd": "PULL", "queue": "q"}, 1_000)
    assert pulled.events == [("q", 1, "active", "waiting")]
    e.apply({"cmd": "Progress", "id": "3-1", "progress": 40}, 1_000)
    acked = e.apply({"cmd": "ACK", "id": "3-1"}, 1_000)
    assert event_dicts(3, acked.events) == [
        {"event": "job", "queue": "q", "id": "3-1", "state": "completed", "prev": "active", "partition": 3}]
    assert event_dicts(3, [("q", 1, "progress", 40)]) == [
        {"event": "progress", "queue": "q", "id": "3-1", "progress": 40, "partition": 3}]
    assert e.apply({"cmd": "GetState", "id": "3-1"}, 1_000).events == []


def test_a_follower_call_builds_no_reply_and_no_events_and_reaches_the_same_state() -> None:
    leader, follower = PartitionEngine(0), PartitionEngine(0)
    commands = [
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(5)]},
        {"cmd": "PUSH", "queue": "q", "data": raw_of(9), "priority": -1, "group": "g"},
        {"cmd": "PULLB", "queue": "q", "count": 4},
        {"cmd": "ACKB", "ids": ["0-1", "0-2"]},
        {"cmd": "_Tick"},
    ]
    for cmd in commands:
        full = leader.apply(dict(cmd), 2_000)
        bare = follower.apply(dict(cmd), 2_000, replies=False, events=False)
        assert not bare.events and (full.events or cmd["cmd"] == "_Tick")
    assert follower.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(1)}]}, 2_000,
                          replies=False).result == {"ids": []}
    leader.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(1)}]}, 2_000)
    assert leader.digest() == follower.digest()


def test_no_mode_is_set_from_outside() -> None:
    e = PartitionEngine(0)
    for old in ("replies", "record_events", "events", "drain_events"):
        assert not hasattr(e, old)
