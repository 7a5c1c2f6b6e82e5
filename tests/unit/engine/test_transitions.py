"""The one transition table: what it allows, and that the engine refuses any other move loudly."""

from __future__ import annotations

import pytest

from shoal.cluster.codec import raw_of
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.state import STATES, TARANTOOL_CODES, TRANSITIONS, PartitionEngine
from shoal.node.state._transitions import ACTIVE, COMPLETED, NEW, REMOVED, WAITING, check_transition


def test_every_state_has_a_code_and_a_way_in_and_out() -> None:
    assert set(TARANTOOL_CODES) == set(STATES)
    for state in STATES:
        assert any(new == state for _, new in TRANSITIONS), f"nothing leads to {state}"
        assert (state, REMOVED) in TRANSITIONS
    assert all(prev in (*STATES, NEW) and new in (*STATES, REMOVED) for prev, new in TRANSITIONS)


@pytest.mark.parametrize("move", [(COMPLETED, ACTIVE), (NEW, ACTIVE), (REMOVED, WAITING), (WAITING, COMPLETED)])
def test_a_move_the_table_lacks_is_an_internal_error(move: tuple[str, str]) -> None:
    with pytest.raises(CommandError) as exc:
        check_transition(*move)
    assert exc.value.code is ErrorCode.INTERNAL


def test_the_engine_refuses_an_illegal_move_before_changing_anything() -> None:
    e = PartitionEngine(0)
    e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(1)}, 1_000)
    job_id = e.apply({"cmd": "PULL", "queue": "q"}, 1_000).result["job"]["id"]
    e.apply({"cmd": "ACK", "id": job_id}, 1_000)
    digest = e.digest()
    job, q = e.jobs[1], e.queues["q"]
    with pytest.raises(CommandError) as exc:
        e._set_state(q, job, ACTIVE)  # completed -> active is no move of the diagram
    assert exc.value.code is ErrorCode.INTERNAL
    with pytest.raises(CommandError):
        e._complete(q, job)  # the ack path's own move, from completed
    assert e.digest() == digest


def test_segment_slots_move_through_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's slots are pushed, leased and acked as runs; each run's move is checked by the table."""
    seen: list[tuple[str, str]] = []
    import shoal.node.state._ack as ack
    import shoal.node.state._pull as pull
    import shoal.node.state._push as push

    def record(prev: str, new: str) -> None:
        seen.append((prev, new))
        check_transition(prev, new)

    for module in (ack, pull, push):
        monkeypatch.setattr(module, "check_transition", record)
    e = PartitionEngine(0)
    e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(5)]}, 1_000)
    got = e.apply({"cmd": "PULLB", "queue": "q", "count": 5}, 1_000).result
    e.apply({"cmd": "ACKB", "ids": [j["id"] for j in got["jobs"]], "tokens": got["tokens"]}, 1_000)
    assert set(seen) == {(NEW, WAITING), (WAITING, ACTIVE), (ACTIVE, COMPLETED)}
    assert len(seen) <= 4  # once per command or run, not once per job
