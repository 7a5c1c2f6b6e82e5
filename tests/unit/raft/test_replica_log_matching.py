"""Raft's log-matching rule (paper §5.3) on a real PartitionReplica, follower side.

The replica is built as the node builds it (its own journal in a temp dir, the node's
RaftNetwork and TickScheduler, not started); AppendEntries messages are handed to it
as the network would, and its answers are read from what it sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.node.raft import RaftNetwork, TickScheduler
from shoal.node.raft.replica import PartitionReplica

NOOP = b"\x01"  # pysyncobj's no-op entry: applying it touches no engine state


class Follower:
    """A PartitionReplica of node ``a`` with peers ``b`` (the leader here) and ``c``."""

    def __init__(self, data_dir: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.network = RaftNetwork(self.loop, "a", "test", b"k", ("127.0.0.1", 0),
                                   {"b": ("127.0.0.1", 1), "c": ("127.0.0.1", 2)}, set())
        self.scheduler = TickScheduler(self.loop)
        self.replica = PartitionReplica(0, self.network, ["b", "c"], data_dir=data_dir, loop=self.loop,
                                        scheduler=self.scheduler)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        transport = self.replica._raft.transport  # type: ignore[union-attr]
        transport.send = lambda node, message: self.sent.append((node.id, message)) or True
        self.leader = self.network.node_of("b")

    def append(self, term: int, prev: tuple[int, int], entries: list[tuple[int, int]], commit: int,
               **extra: Any) -> dict[str, Any]:
        """Deliver AppendEntries(prevLogIdx, prevLogTerm, entries as (index, term), leaderCommit); the answer."""
        self.sent.clear()
        message = {"type": "append_entries", "term": term, "commit_index": commit,
                   "entries": [[NOOP, i, t] for i, t in entries], "prevLogIdx": prev[0], "prevLogTerm": prev[1],
                   **extra}
        self.replica.handle_message(self.leader, message)
        answers = [m for node, m in self.sent if m.get("type") == "next_node_idx"]
        assert len(answers) == 1, self.sent
        return answers[0]

    def log(self) -> list[tuple[int, int]]:
        return [(e[1], e[2]) for e in self.replica.journal.entries(1, 10**9)]

    def commit(self) -> int:
        return self.replica.commit_index()

    def close(self) -> None:
        self.replica.close()
        self.scheduler.close()
        self.loop.close()


@pytest.fixture
def follower(tmp_path) -> Iterator[Follower]:
    f = Follower(str(tmp_path))
    try:
        yield f
    finally:
        f.close()


def committed_1_to_4(f: Follower) -> None:
    answer = f.append(1, (1, 0), [(2, 1), (3, 1), (4, 1)], commit=4)
    assert answer["success"] and answer["next_node_idx"] == 5
    assert f.log() == [(1, 0), (2, 1), (3, 1), (4, 1)] and f.commit() == 4


def test_the_issue_scenario_stale_same_term_heartbeat_keeps_committed_entries(follower: Follower) -> None:
    committed_1_to_4(follower)
    answer = follower.append(1, (2, 1), [], commit=2)
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert follower.commit() == 4
    # The answer vouches only for what the message proved matching.
    assert answer["success"] and answer["next_node_idx"] == 3


def test_duplicated_append_entries_leaves_the_log_unchanged(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
    for _ in range(2):
        answer = follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
        assert answer["success"] and answer["next_node_idx"] == 7
    assert follower.log()[-2:] == [(5, 1), (6, 1)] and len(follower.log()) == 6


def test_reordered_older_append_entries_keeps_later_entries(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1), (7, 1)], commit=4)
    answer = follower.append(1, (4, 1), [(5, 1)], commit=4)  # sent before the one above, arrives after
    assert answer["success"] and answer["next_node_idx"] == 6
    assert follower.log()[4:] == [(5, 1), (6, 1), (7, 1)]
    assert follower.commit() == 4


def test_conflict_deletes_from_the_first_conflicting_term_only(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(1, (4, 1), [(5, 1), (6, 1)], commit=4)
    # A new leader (term 2) holds 5 from term 1 but not 6; its entry 6 is from term 2.
    answer = follower.append(2, (4, 1), [(5, 1), (6, 2)], commit=4)
    assert answer["success"] and answer["next_node_idx"] == 7
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)]


def test_conflict_at_or_below_the_commit_index_is_refused_and_changes_nothing(follower: Follower) -> None:
    committed_1_to_4(follower)
    answer = follower.append(2, (2, 1), [(3, 2)], commit=4)
    assert not answer["success"] and answer["reset"]
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)] and follower.commit() == 4


def test_missing_previous_entry_is_refused_with_the_log_end(follower: Follower) -> None:
    committed_1_to_4(follower)
    answer = follower.append(1, (9, 1), [(10, 1)], commit=4)
    assert not answer["success"] and answer["next_node_idx"] == 5
    assert len(follower.log()) == 4


def test_commit_index_never_passes_what_the_message_proved(follower: Follower) -> None:
    follower.append(1, (1, 0), [(2, 1), (3, 1)], commit=1)
    follower.append(1, (1, 0), [(2, 1)], commit=3)  # leader commit 3, but this message vouches for 2
    assert follower.commit() == 2


def test_stale_term_append_entries_is_ignored(follower: Follower) -> None:
    committed_1_to_4(follower)
    follower.append(3, (4, 1), [], commit=4)  # term 3 seen
    follower.sent.clear()
    follower.replica.handle_message(follower.leader, {
        "type": "append_entries", "term": 2, "commit_index": 4, "entries": [[NOOP, 3, 2]],
        "prevLogIdx": 2, "prevLogTerm": 1})
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert not follower.sent


def test_restart_reads_the_log_and_term_back(tmp_path) -> None:
    f = Follower(str(tmp_path))
    try:
        committed_1_to_4(f)
        f.append(2, (4, 1), [(5, 2)], commit=5)
        assert f.replica.term() == 2
    finally:
        f.close()
    g = Follower(str(tmp_path))
    try:
        assert g.log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 2)]
        assert g.replica.term() == 2
        assert g.replica.journal.meta.state.term == 2
    finally:
        g.close()


def test_memory_does_not_grow_with_the_journal(follower: Follower) -> None:
    big = b"\x01" + b"p" * 20_000  # a no-op entry padded: applying it touches no engine state
    index = 1
    for _ in range(100):
        entries = [[big, index + k, 1] for k in range(1, 51)]
        follower.replica.handle_message(follower.leader, {
            "type": "append_entries", "term": 1, "commit_index": 1, "entries": entries,
            "prevLogIdx": index, "prevLogTerm": 0 if index == 1 else 1})
        index += 50
    journal = follower.replica.journal
    assert journal.last_index == 5001
    # 100 MB of entries on disk; in memory only offsets, term runs and the bounded tail cache.
    assert journal.memory_bytes() < 5 * 1024 * 1024
    assert len(follower.replica._raft.get_entries(2, 5000)) <= 1024  # reads are bounded as well


def test_term_and_vote_are_on_disk_before_the_vote_leaves(follower: Follower, tmp_path) -> None:
    from shoal.node.raft._io import RealIO
    from shoal.node.raft.meta import RaftMeta

    on_disk_when_sent: list[tuple[int, str | None]] = []
    meta_path = follower.replica.journal.meta.path

    def send(node, message):
        if message.get("type") == "response_vote":
            state = RaftMeta(RealIO(disk_free_min_bytes=0), meta_path).state
            on_disk_when_sent.append((state.term, state.voted_for))
        return True

    follower.replica._raft.transport.send = send  # type: ignore[union-attr]
    candidate = follower.network.node_of("c")
    follower.replica.handle_message(candidate, {"type": "request_vote", "term": 5, "last_log_index": 1,
                                                "last_log_term": 0})
    assert on_disk_when_sent == [(5, "c")]


def test_an_entry_sent_in_pieces_is_appended_under_the_same_rule(follower: Follower) -> None:
    import pickle

    committed_1_to_4(follower)
    data = pickle.dumps((b"\x01" + b"z" * 3000, 5, 1))
    pieces = [data[:1000], data[1000:2000], data[2000:]]
    answers = []
    for kind, piece in zip(("start", "process", "finish"), pieces):
        follower.sent.clear()
        follower.replica.handle_message(follower.leader, {
            "type": "append_entries", "term": 1, "commit_index": 4, "transmission": kind, "data": piece,
            "prevLogIdx": 4, "prevLogTerm": 1})
        answers += [m for _, m in follower.sent if m.get("type") == "next_node_idx"]
    assert [a["success"] for a in answers] == [False, False, True] and answers[-1]["next_node_idx"] == 6
    assert follower.log()[-1] == (5, 1) and follower.commit() == 4
    # The same entry in pieces again (a resend) changes nothing, and never deletes committed entries.
    for kind, piece in zip(("start", "process", "finish"), pieces):
        follower.replica.handle_message(follower.leader, {
            "type": "append_entries", "term": 1, "commit_index": 4, "transmission": kind, "data": piece,
            "prevLogIdx": 2, "prevLogTerm": 1})
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]


def test_a_candidate_stores_its_term_and_vote_before_asking_for_votes(follower: Follower) -> None:
    from shoal.node.raft._io import RealIO
    from shoal.node.raft.meta import RaftMeta

    asked: list[tuple[int, int, str | None]] = []
    meta_path = follower.replica.journal.meta.path

    def send(node, message):
        if message.get("type") == "request_vote":
            state = RaftMeta(RealIO(disk_free_min_bytes=0), meta_path).state
            asked.append((message["term"], state.term, state.voted_for))
        return True

    raft = follower.replica._raft
    raft.transport.send = send  # type: ignore[union-attr]
    follower.replica._raft.transport.peer_connected(follower.network.node_of("b"))  # type: ignore[union-attr]
    raft.election_deadline = 0.0  # type: ignore[union-attr]
    follower.replica.raft_tick()
    assert asked and all(a == (1, 1, "a") for a in asked), asked
