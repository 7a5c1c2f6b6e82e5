"""A batched heartbeat that would only move fresh leases a little is answered from the state
(``PartitionEngine.fresh_heartbeat``): the same reply the command would give, and no change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.codec import raw_of
from shoal.node.state import PartitionEngine
from shoal.node.state._ack import HEARTBEAT_WRITE_MIN_MS

T0 = 1_000


def _pulled(segment: bool) -> tuple[PartitionEngine, list[str], list[str]]:
    """An engine with three jobs leased at ``T0`` (from a PUSHB's segment, or pushed one by one)."""
    e = PartitionEngine(0)
    if segment:
        e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(3)]}, T0)
    else:
        for i in range(3):
            e.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(i), "priority": i + 1}, T0)
    got = e.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0).result
    return e, [j["id"] for j in got["jobs"]], got["tokens"]


def test_right_after_the_pull_the_heartbeat_is_answered_without_a_write() -> None:
    for segment in (True, False):
        e, ids, tokens = _pulled(segment)
        cmd = {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens}
        assert e.fresh_heartbeat(cmd, T0 + 5) == {"count": 3, "data": {"ok": True, "count": 3}}
        assert e.fresh_heartbeat({"cmd": "JobHeartbeatB", "ids": ids}, T0 + 5) is not None  # no locks


def test_a_heartbeat_that_renews_goes_through_the_log() -> None:
    for segment in (True, False):
        e, ids, tokens = _pulled(segment)
        cmd = {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens}
        assert e.fresh_heartbeat(cmd, T0 + HEARTBEAT_WRITE_MIN_MS + 1) is None, "the lease would move: written"
        assert e.fresh_heartbeat({**cmd, "ttr": 600_000}, T0) is None, "a longer lease asked for"
        assert e.fresh_heartbeat({**cmd, "ttr": 2_000}, T0) is None, "a shorter lease asked for"
        assert e.fresh_heartbeat({**cmd, "ids": ["job-a", *ids[1:]]}, T0) is None, "a custom id: written"


def test_jobs_the_command_would_skip_are_left_out_of_the_count() -> None:
    for segment in (True, False):
        e, ids, tokens = _pulled(segment)
        cmd = {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens}
        e.apply({"cmd": "ACK", "id": ids[0]}, T0)  # acked while the heartbeat was on its way
        for skipped in ({"tokens": ["0.99", *tokens[1:]]}, {"ids": ["0-99", *ids[1:]]}, {"ids": ["1-1", *ids[1:]]}, {}):
            expect = e.apply({**cmd, **skipped}, T0).result
            assert e.fresh_heartbeat({**cmd, **skipped}, T0) == expect == {"count": 2, "data": {"ok": True, "count": 2}}


@settings(max_examples=60, deadline=None)
@given(segment=st.booleans(), later=st.integers(0, 3 * HEARTBEAT_WRITE_MIN_MS), ttr=st.sampled_from([None, 2_000, 30_000]),
       acked=st.booleans())
def test_a_fresh_answer_is_what_applying_would_answer(segment: bool, later: int, ttr: int | None, acked: bool) -> None:
    e, ids, tokens = _pulled(segment)
    if acked:
        e.apply({"cmd": "ACK", "id": ids[1]}, T0)
        if segment:
            ids[2] = "0-77"  # a job that does not exist: skipped
    cmd = {"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens, **({"ttr": ttr} if ttr else {})}
    digest = e.digest()
    fresh = e.fresh_heartbeat(cmd, T0 + later)
    assert e.digest() == digest, "answering from the state changed it"
    before = _deadlines(e, ids)
    applied = e.apply(cmd, T0 + later).result
    if fresh is not None:
        assert fresh == applied
        # and the leases the command renewed moved by no more than the margin
        moved = [abs(a - b) for a, b in zip(_deadlines(e, ids), before) if a is not None and b is not None]
        assert all(m <= HEARTBEAT_WRITE_MIN_MS for m in moved), moved


def _deadlines(e: PartitionEngine, ids: list[str]) -> list[float | None]:
    jobs = [e.apply({"cmd": "GetJob", "id": i}, T0).result["job"] for i in ids]
    return [j["leaseDeadline"] if j and j["state"] == "active" else None for j in jobs]


def test_jobs_of_two_pulls_are_fresh_only_while_both_leases_are() -> None:
    """A worker holding two pulls' jobs heartbeats them as one run of ids and tokens: the answer
    comes from the state only while the older lease is fresh too."""
    e = PartitionEngine(0)
    e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(6)]}, T0)
    first = e.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0).result
    gap = HEARTBEAT_WRITE_MIN_MS // 2
    second = e.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0 + gap).result
    cmd = {"cmd": "JobHeartbeatB", "ids": [j["id"] for j in first["jobs"] + second["jobs"]],
           "tokens": first["tokens"] + second["tokens"]}
    assert e.fresh_heartbeat(cmd, T0 + gap) == e.apply(cmd, T0 + gap).result == {"count": 6, "data": {"ok": True, "count": 6}}
    e2 = PartitionEngine(0)
    e2.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(6)]}, T0)
    e2.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0)
    e2.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0 + 2 * HEARTBEAT_WRITE_MIN_MS)
    assert e2.fresh_heartbeat(cmd, T0 + 2 * HEARTBEAT_WRITE_MIN_MS) is None, "the first pull's leases would move"


@settings(max_examples=80, deadline=None)
@given(kept=st.lists(st.booleans(), min_size=12, max_size=12), shuffle=st.randoms(use_true_random=False),
       in_order=st.booleans(), still_named=st.booleans(), later=st.integers(0, 2 * HEARTBEAT_WRITE_MIN_MS))
def test_a_worker_holding_what_is_left_of_several_pulls_gets_what_applying_would_answer(
        kept: list[bool], shuffle: object, in_order: bool, still_named: bool, later: int) -> None:
    """Jobs of four pulls over two PUSHBs' segments, some acked (and left out, or still named
    when the heartbeat crossed the acks): runs of ids and tokens with gaps, answered from the
    state exactly as applying the heartbeat would answer."""
    e = PartitionEngine(0)
    for size in (7, 5):
        e.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(size)]}, T0)
    ids: list[str] = []
    tokens: list[str] = []
    for n in range(4):
        got = e.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0 + n).result
        ids += [j["id"] for j in got["jobs"]]
        tokens += got["tokens"]
    for job_id, token, keep in zip(list(ids), list(tokens), kept):
        if not keep:
            e.apply({"cmd": "ACKB", "ids": [job_id], "tokens": [token]}, T0)  # as a worker acks
            if not still_named:
                ids.remove(job_id)
                tokens.remove(token)
    if not ids:
        return
    held = list(zip(ids, tokens))
    if not in_order:
        shuffle.shuffle(held)  # type: ignore[attr-defined]
    cmd = {"cmd": "JobHeartbeatB", "ids": [i for i, _ in held], "tokens": [t for _, t in held]}
    runs = e._fresh_runs(cmd["ids"], cmd["tokens"], None, T0 + later)
    fresh = e.fresh_heartbeat(cmd, T0 + later)
    if later <= HEARTBEAT_WRITE_MIN_MS - 3:
        assert fresh is not None, "every lease is fresh"
        if in_order:
            assert runs == sum(kept), "the runs of the pulls are checked as runs"
    applied = e.apply(cmd, T0 + later).result
    if fresh is not None:
        assert fresh == applied
