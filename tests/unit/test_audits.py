"""Session audits (``shoal.node.audits``): which orphaned sessions a leader releases, adopts or keeps;
and what a node's session table answers and reports to the leaders that watch its sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from shoal.node.audits import SessionAudit
from shoal.node.sessions import KEPT_SESSION_PREFIX, SessionTable


def test_a_session_no_node_holds_is_released_once_every_node_answered() -> None:
    audit = SessionAudit(grace_ms=0)
    rnd = audit.begin(1_000, {3: ["gone", "held"], 5: ["gone"]}, ["n2", "n3"])
    assert rnd is not None and sorted(rnd.sessions) == ["gone", "held"]
    assert audit.answer("n2", rnd.aid, []) is False
    assert audit.answer("n3", rnd.aid, ["held"]) is True
    verdict = audit.finish(1_010)
    assert verdict.adopt == ((3, "held", "n3"),)
    assert sorted(verdict.release) == [(3, "gone"), (5, "gone")]
    assert verdict.silent == () and verdict.waiting == 0
    assert audit.round is None


def test_a_node_that_does_not_answer_keeps_every_session_until_a_complete_round() -> None:
    audit = SessionAudit(grace_ms=0)
    rnd = audit.begin(0, {1: ["a", "b"]}, ["n2", "n3"])
    assert rnd is not None
    audit.answer("n2", rnd.aid, ["b"])
    assert not audit.due(1_999, 2_000) and audit.due(2_000, 2_000)
    verdict = audit.finish(2_000)
    assert verdict.silent == ("n3",)
    assert verdict.release == ()
    assert verdict.adopt == ((1, "b", "n2"),)  # what a node that answered holds is adopted all the same
    rnd = audit.begin(3_000, {1: ["a"]}, ["n2", "n3"])
    assert rnd is not None
    audit.answer("n2", rnd.aid, [])
    audit.answer("n3", rnd.aid, [])
    assert audit.finish(3_000).release == ((1, "a"),)


def test_the_grace_runs_over_complete_rounds_and_a_session_taken_back_is_kept() -> None:
    audit = SessionAudit(grace_ms=5_000)

    def round_at(now_ms: int, held: list[str]) -> tuple:
        rnd = audit.begin(now_ms, {2: ["late", "back"]}, ["n2"])
        assert rnd is not None
        audit.answer("n2", rnd.aid, held)
        return audit.finish(now_ms)

    first = round_at(10_000, [])
    assert first.release == () and first.waiting == 2
    later = round_at(14_999, [])
    assert later.release == () and later.waiting == 2
    # "back" reconnected (Identify) to n2 within the grace: adopted, never released
    last = round_at(15_000, ["back"])
    assert last.release == ((2, "late"),)
    assert last.adopt == ((2, "back", "n2"),)


def test_answers_that_do_not_fit_the_round_are_ignored() -> None:
    audit = SessionAudit(grace_ms=0)
    rnd = audit.begin(0, {0: ["s"]}, ["n2"])
    assert rnd is not None
    assert audit.answer("n9", rnd.aid, ["s"]) is False      # a node not asked
    assert audit.answer("n2", rnd.aid + 1, ["s"]) is False  # another round's
    assert audit.answer("n2", rnd.aid, "s") is False        # not a list
    assert audit.answer("n2", rnd.aid, ["other", 7]) is True  # sessions not asked about count for nothing
    assert audit.answer("n2", rnd.aid, ["s"]) is False      # answered already
    verdict = audit.finish(0)
    assert verdict.adopt == () and verdict.release == ((0, "s"),)


def test_one_round_at_a_time_bounded_in_sessions() -> None:
    audit = SessionAudit(grace_ms=0, sessions_max=3)
    assert audit.begin(0, {}, ["n2"]) is None  # nothing to ask
    rnd = audit.begin(0, {0: ["a", "b"], 1: ["b", "c", "d", "e"]}, ["n2"])
    assert rnd is not None and sorted(rnd.sessions) == ["a", "b", "c"]
    assert rnd.partitions["b"] == (0, 1)
    assert audit.begin(0, {0: ["z"]}, ["n2"]) is None  # a round is under way
    # A node alone in its cluster: nobody to ask, the round is complete at once.
    alone = SessionAudit(grace_ms=0)
    rnd = alone.begin(0, {4: ["x"]}, [])
    assert rnd is not None and rnd.complete
    assert alone.finish(0).release == ((4, "x"),)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_table_answers_for_client_connections_and_reports_their_end(loop: asyncio.AbstractEventLoop) -> None:
    released: list[tuple[str, set[int]]] = []
    gone: list[tuple[str, set[str]]] = []
    table = SessionTable("n1", loop, 0, lambda s, ps: released.append((s, ps)),
                         lambda s, peers: gone.append((s, set(peers))))
    table.attach("client", 7)
    table.attach("forwarded", -1)  # a peer's session: that peer answers for it
    assert table.held_here("client") and not table.held_here("forwarded") and not table.held_here("none")
    assert table.watch("client", "n2") and table.watch("client", "n3")
    table.attach("client", 8)
    table.detach("client", 7)
    assert gone == []  # a client connection of the session is still here
    table.detach("client", 8)
    assert gone == [("client", {"n2", "n3"})]
    table.used_partition("forwarded", 2)
    assert table.accounts("forwarded", 2) and not table.accounts("forwarded", 3)
    table.detach("forwarded", -1)
    assert released == [("forwarded", {2})]
    # A lost peer watches nothing any more.
    table.attach("c2", 9)
    table.watch("c2", "n2")
    table.unwatch_peer("n2")
    table.detach("c2", 9)
    assert len(gone) == 1


def test_a_rest_session_is_marked_as_kept_to_its_ttr(loop: asyncio.AbstractEventLoop) -> None:
    table = SessionTable("n1", loop, 0, lambda s, ps: None)
    assert table.new_session_id(kept=True).startswith(KEPT_SESSION_PREFIX)
    assert not table.new_session_id().startswith(KEPT_SESSION_PREFIX)
