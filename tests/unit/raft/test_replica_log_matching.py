"""Raft's log-matching rule (paper §5.3) and durable votes (§5.1) on a real PartitionReplica.

The replica is built as the node builds it (its own journal in a temp dir, the node's
RaftNetwork and TickScheduler, not started). Messages reach it through ``_deliver`` in the
form the network hands over (a MessagePack-decoded array), and its answers are read from
what it sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from shoal.node.partition import PartitionMachine
from shoal.node.raft import RaftNetwork, TickScheduler
from shoal.node.raft._io import RealIO
from shoal.node.raft.messages import (NOOP_PAYLOAD, AppendEntries, AppendResponse, HeartbeatResponse, Message,
                                      RequestVote, VoteResponse, encode_message)
from shoal.node.raft.meta import RaftMeta
from shoal.node.raft.replica import PartitionReplica
from shoal.node.raft.transport import decode_frame


def wire(message: Message) -> Message:
    """``message`` as the link hands it to the replica: encoded, then decoded as a frame item is."""
    return decode_frame(msgspec.msgpack.encode([(0, msgspec.Raw(encode_message(message)))]))[0][1]


def on_disk(meta_path: str) -> tuple[int, str | None]:
    """Term and vote as a restarted replica would read them."""
    state = RaftMeta(RealIO(disk_free_min_bytes=0), meta_path).state
    return state.term, state.voted_for


class Follower:
    """A PartitionReplica of node ``a`` with peers ``b`` (the leader here) and ``c``."""

    def __init__(self, data_dir: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.network = RaftNetwork(self.loop, "a", "test", b"k", ("127.0.0.1", 0),
                                   {"b": ("127.0.0.1", 1), "c": ("127.0.0.1", 2)}, set())
        self.scheduler = TickScheduler(self.loop)
        self.replica = PartitionReplica(0, self.network, ["b", "c"], application=PartitionMachine(0),
                                        data_dir=data_dir, loop=self.loop, scheduler=self.scheduler)
        self.sent: list[tuple[str, Message]] = []
        self.on_send = lambda peer, message: None
        self.replica._transport.send = self._send  # type: ignore[method-assign]

    def _send(self, peer: str, message: Message) -> bool:
        self.on_send(peer, message)
        self.sent.append((peer, message))
        return True

    def deliver(self, peer: str, message: Message) -> list[Message]:
        """Hand ``message`` from ``peer`` to the replica; what it sent in answer."""
        self.sent.clear()
        self.replica._deliver(peer, wire(message))
        return [m for _, m in self.sent]

    def append(self, term: int, prev: tuple[int, int], entries: list[tuple[int, int]], commit: int,
               payload: bytes = NOOP_PAYLOAD, durable: int | None = None) -> AppendResponse:
        """Deliver AppendEntries from ``b`` (entries as (index, term)); its one answer. The
        leader's durable index is its commit index unless given (the fsync class)."""
        answers = self.deliver("b", AppendEntries(term, prev[0], prev[1], commit,
                                                  [(payload, i, t) for i, t in entries],
                                                  durable=commit if durable is None else durable))
        assert len(answers) == 1 and isinstance(answers[0], AppendResponse), answers
        return answers[0]

    def log(self) -> list[tuple[int, int]]:
        journal = self.replica.journal
        return [(e[1], e[2]) for e in journal.entries(journal.first_index, journal.last_index + 1)]

    def commit(self) -> int:
        return self.replica.commit_index()

    def close(self) -> None:
        self.replica.close()
        self.scheduler.close()
        self.loop.close()


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[Follower]:
    f = Follower(str(tmp_path))
    try:
        yield f
    finally:
        f.close()


def committed_1_to_4(f: Follower) -> None:
    answer = f.append(1, (0, 0), [(1, 1), (2, 1), (3, 1), (4, 1)], commit=4)
    assert not answer.reject and answer.index == 4 and answer.term == 1
    assert f.log() == [(1, 1), (2, 1), (3, 1), (4, 1)] and f.commit() == 4


def test_a_stale_same_term_append_keeps_committed_entries(follower: Follower) -> None:
    committed_1_to_4(follower)
    answer = follower.append(1, (2, 1), [], commit=2)
    assert follower.log() == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert follower.commit() == 4
    # The answer vouches for the commit index: committed entries are in every leader's log.
    assert not answer.reject and answer.index == 4


def test_duplicated_append_entries_leaves_the_log_unchanged(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
    for _ in range(2):
        answer = follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
        assert not answer.reject and answer.index == 6
    assert follower.log()[-2:] == [(5, 1), (6, 1)] and len(follower.log()) == 6


def test_reordered_older_append_entries_keeps_later_entries(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1), (7, 1)], commit=4)
    answer = follower.append(1, (4, 1), [(5, 1)], commit=4)  # sent before the one above, arrives after
    assert not answer.reject and answer.index == 5  # what this message proved, no more
    assert follower.log()[4:] == [(5, 1), (6, 1), (7, 1)]
    assert follower.commit() == 4


def test_conflict_deletes_from_the_first_conflicting_entry_only(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
    # A new leader (term 2) holds 5 from term 1 but not 6; its entry 6 is from term 2.
    answer = follower.append(2, (4, 1), [(5, 1), (6, 2)], commit=4)
    assert not answer.reject and answer.index == 6 and answer.term == 2
    assert follower.log() == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)]


def test_an_append_contradicting_committed_entries_changes_nothing(follower: Follower) -> None:
    committed_1_to_4(follower)
    # Impossible from a real leader (it holds every committed entry): entries at or below the
    # commit index are not even compared, so nothing committed is ever cut.
    answer = follower.append(2, (2, 1), [(3, 2)], commit=4)
    assert not answer.reject and answer.index == 4
    assert follower.log() == [(1, 1), (2, 1), (3, 1), (4, 1)] and follower.commit() == 4


def test_missing_previous_entry_is_refused_with_the_log_end_as_hint(follower: Follower) -> None:
    committed_1_to_4(follower)
    answer = follower.append(1, (9, 1), [(10, 1)], commit=4)
    assert answer.reject and answer.index == 9 and (answer.hint_index, answer.hint_term) == (4, 1)
    assert len(follower.log()) == 4


def test_a_conflicting_previous_entry_is_refused_with_a_hint_before_its_term(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
    answer = follower.append(3, (6, 2), [(7, 3)], commit=4)  # the leader's 6 is of term 2
    assert answer.reject and (answer.hint_index, answer.hint_term) == (6, 1)
    assert len(follower.log()) == 6


def test_commit_index_never_passes_what_the_message_proved(follower: Follower) -> None:
    follower.append(1, (0, 0), [(1, 1), (2, 1), (3, 1)], commit=1)
    follower.append(1, (0, 0), [(1, 1), (2, 1)], commit=3)  # leader commit 3, but this message vouches for 2
    assert follower.commit() == 2


def test_an_append_of_an_older_term_is_answered_with_the_newer_term_and_not_taken(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(3, (4, 1), [], commit=4)  # term 3 seen
    answers = follower.deliver("b", AppendEntries(2, 2, 1, 4, [(NOOP_PAYLOAD, 3, 2)]))
    assert follower.log() == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert answers == [HeartbeatResponse(3)]  # the deposed leader learns the term that deposes it


def test_restart_reads_the_log_and_term_back(tmp_path: Path) -> None:
    f = Follower(str(tmp_path))
    try:
        committed_1_to_4(f)
        f.append(2, (4, 1), [(5, 2)], commit=5)
        assert f.replica.term() == 2
    finally:
        f.close()
    g = Follower(str(tmp_path))
    try:
        assert g.log() == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2)]
        assert g.replica.term() == 2
        assert g.replica.journal.meta.state.term == 2
        assert g.replica.core.log.last_index == 5 and g.replica.core.log.last_term == 2
    finally:
        g.close()


def test_memory_does_not_grow_with_the_journal(follower: Follower) -> None:
    big = NOOP_PAYLOAD + b"p" * 20_000  # a no-op entry padded: applying it touches no engine state
    index = 0
    for _ in range(100):
        follower.append(1, (index, 1 if index else 0), [(index + k, 1) for k in range(1, 51)], commit=1,
                        payload=big)
        index += 50
    journal = follower.replica.journal
    assert journal.last_index == 5000
    # 100 MB of entries on disk; in memory only offsets, term runs and the bounded tail cache.
    assert journal.memory_bytes() < 5 * 1024 * 1024
    core = follower.replica.core
    read = core.log.entries(2, 5001, core.params.message_bytes_max)  # what one AppendEntries carries
    assert sum(len(e[0]) for e in read) <= core.params.message_bytes_max + len(big)


def test_term_and_vote_are_on_disk_before_the_vote_leaves(follower: Follower) -> None:
    meta_path = follower.replica.journal.meta.path
    seen: list[tuple[bool, int, str | None]] = []
    follower.on_send = lambda peer, m: seen.append((m.granted, *on_disk(meta_path))) \
        if isinstance(m, VoteResponse) else None
    follower.deliver("c", RequestVote(5, 0, 0))
    assert seen == [(True, 5, "c")]


def test_a_candidate_stores_its_term_and_vote_before_asking_for_votes(follower: Follower) -> None:
    meta_path = follower.replica.journal.meta.path
    asked: list[tuple[int, bool, int, str | None]] = []
    follower.on_send = lambda peer, m: asked.append((m.term, m.pre, *on_disk(meta_path))) \
        if isinstance(m, RequestVote) else None
    replica = follower.replica
    replica.core.schedule_election(0.0)
    replica.on_timer()  # the election timeout passed: a pre-vote first, which stores nothing
    assert asked and all(a == (1, True, 0, None) for a in asked), asked
    asked.clear()
    follower.deliver("b", VoteResponse(1, True, pre=True))  # a majority of pre-votes: the real campaign
    assert asked and all(a == (1, False, 1, "a") for a in asked), asked
