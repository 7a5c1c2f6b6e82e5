"""Sessions own leases (``shoal.node.sessions``): a session ends when its last connection has
been gone for the grace without coming back, and only then are its leases released, on the
partitions it pulled from; peers watching a session hear when it has no client here."""

from __future__ import annotations

import pytest

from shoal.node import sessions as sessions_module
from shoal.node.sessions import KEPT_SESSION_PREFIX, SessionTable

from manual_clock import ManualLoop


class Table:
    """A session table on a manual clock, recording what it releases and whom it tells."""

    def __init__(self, grace_ms: int = 5_000) -> None:
        self.loop = ManualLoop()
        self.released: list[tuple[str, set[int]]] = []
        self.gone: list[tuple[str, set[str]]] = []
        self.table = SessionTable("n1", self.loop, grace_ms,  # type: ignore[arg-type]
                                  lambda s, ps: self.released.append((s, set(ps))),
                                  lambda s, peers: self.gone.append((s, set(peers))))


def test_session_ids_are_random_and_kept_ones_are_marked() -> None:
    t = Table().table
    ids = {t.new_session_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 32 and not i.startswith(KEPT_SESSION_PREFIX) for i in ids)
    assert t.new_session_id(kept=True).startswith(KEPT_SESSION_PREFIX)


def test_the_last_connection_gone_releases_the_leases_after_the_grace() -> None:
    h = Table(grace_ms=5_000)
    t = h.table
    t.attach("s", 1)
    t.attach("s", 2)
    t.used_partition("s", 3)
    t.used_partition("s", 7)
    assert t.active == 1 and t.accounts("s", 3) and not t.accounts("s", 4)
    t.detach("s", 1)
    h.loop.advance(60)
    assert h.released == []  # another connection still holds it
    t.detach("s", 2)
    assert t.active == 0
    h.loop.advance(4.9)
    assert h.released == []
    h.loop.advance(0.2)
    assert h.released == [("s", {3, 7})]
    assert not t.accounts("s", 3)
    h.loop.advance(60)
    assert h.released == [("s", {3, 7})]  # once


def test_a_connection_back_within_the_grace_keeps_the_session() -> None:
    h = Table(grace_ms=5_000)
    t = h.table
    t.attach("s", 1)
    t.used_partition("s", 0)
    t.detach("s", 1)
    h.loop.advance(3)
    t.attach("s", 9)  # Identify takes it back
    h.loop.advance(60)
    assert h.released == [] and t.accounts("s", 0)
    t.detach("s", 9)
    h.loop.advance(5.1)
    assert h.released == [("s", {0})]


def test_without_a_grace_a_session_ends_when_its_last_connection_closes() -> None:
    h = Table(grace_ms=0)
    h.table.attach("s", 1)
    h.table.used_partition("s", 2)
    h.table.detach("s", 1)
    assert h.released == [("s", {2})] and h.loop.pending() == 0


def test_a_session_that_took_no_lease_ends_without_a_release() -> None:
    h = Table()
    h.table.attach("s", 1)
    h.table.detach("s", 1)
    h.table.detach("s", 1)  # twice, or an unknown session: nothing
    h.table.detach("unknown", 5)
    h.loop.advance(60)
    assert h.released == [] and h.loop.pending() == 0


def test_forget_drops_a_connection_and_keeps_the_leases_to_their_ttr() -> None:
    h = Table(grace_ms=0)
    t = h.table
    t.attach("kept.x", 1)
    t.used_partition("kept.x", 4)
    t.forget("kept.x", 1)
    h.loop.advance(60)
    assert h.released == [] and t.active == 0 and not t.accounts("kept.x", 4)


def test_end_now_releases_at_once_whatever_the_grace() -> None:
    h = Table(grace_ms=60_000)
    t = h.table
    t.attach("s", 1)
    t.used_partition("s", 1)
    t.end_now("s", 1)
    assert h.released == [("s", {1})]
    # A session with another connection still attached is not ended by one stream's end.
    t.attach("s2", 1)
    t.attach("s2", 2)
    t.used_partition("s2", 5)
    t.end_now("s2", 1)
    assert h.released == [("s", {1})] and t.accounts("s2", 5)


def test_release_asks_for_the_given_partitions_now() -> None:
    h = Table()
    h.table.release("orphan", {2, 3})
    assert h.released == [("orphan", {2, 3})]


def test_held_here_counts_client_connections_only() -> None:
    t = Table().table
    t.attach("s", -1)  # a peer's forwarded session: that peer answers for it
    assert not t.held_here("s")
    t.attach("s", 4)
    assert t.held_here("s") and not t.held_here("other")


def test_watching_peers_hear_once_when_the_last_client_connection_goes() -> None:
    h = Table()
    t = h.table
    t.attach("s", 1)
    t.attach("s", 2)
    t.attach("s", -3)  # a forwarded one: not a client connection here
    assert t.watch("s", "n2") and t.watch("s", "n3")
    t.detach("s", 1)
    assert h.gone == []
    t.detach("s", 2)
    assert h.gone == [("s", {"n2", "n3"})]
    t.detach("s", -3)
    assert h.gone == [("s", {"n2", "n3"})]
    # forget and end_now tell the watchers too
    for end in (t.forget, t.end_now):
        h.gone.clear()
        t.attach("w", 1)
        t.watch("w", "n2")
        end("w", 1)
        assert h.gone == [("w", {"n2"})]


def test_a_lost_peer_stops_watching() -> None:
    h = Table()
    t = h.table
    t.attach("s", 1)
    t.watch("s", "n2")
    t.watch("s", "n3")
    t.unwatch_peer("n2")
    t.unwatch_peer("n3")
    t.detach("s", 1)
    assert h.gone == []


def test_the_table_of_watched_sessions_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions_module, "WATCHED_MAX", 2)
    t = Table().table
    assert t.watch("a", "n2") and t.watch("b", "n2")
    assert t.watch("a", "n3")  # a session watched already takes another peer
    assert not t.watch("c", "n2")
