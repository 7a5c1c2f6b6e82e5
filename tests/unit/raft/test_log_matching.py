"""Raft's log-matching rule, follower side (Raft paper §5.3 and Figure 2, AppendEntries receiver rules 2-5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.raft._io import SimIO
from shoal.node.raft.journal import Journal
from shoal.node.raft.log_matching import Accept, Reject, match_append_entries


@dataclass
class ListLog:
    """A follower log as a list of terms (index i+first holds terms[i]) plus its commit index."""

    terms: list[int]
    commit: int = 0
    first_index: int = 1
    data: list[bytes] = field(default_factory=list)

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.terms) - 1

    def term_at(self, index: int) -> int | None:
        if self.first_index <= index <= self.last_index:
            return self.terms[index - self.first_index]
        return None

    def receive(self, prev: int, prev_term: int, entries: list, leader_commit: int) -> Accept | Reject:
        d = match_append_entries(self, self.commit, prev, prev_term, entries, leader_commit)
        if isinstance(d, Accept):
            if d.delete_from is not None:
                assert d.delete_from > self.commit
                del self.terms[d.delete_from - self.first_index :]
            self.terms.extend(e[2] for e in d.append)
            assert d.commit_index >= self.commit
            self.commit = d.commit_index
        return d


def ents(first: int, terms: list[int]) -> list[tuple[bytes, int, int]]:
    return [(b"c%d" % (first + k), first + k, t) for k, t in enumerate(terms)]


def test_the_reported_bug_stale_same_term_heartbeat_keeps_committed_entries() -> None:
    """Log 1-4 committed; a stale heartbeat (prevLogIdx=2, no entries) must leave 1-4 and commit 4.

    pysyncobj's follower deleted every entry after prevLogIdx here (log 1-2, commit 2).
    """
    io = SimIO()
    j = Journal(io, "/j")
    for i in range(1, 5):
        j.append(i, 1, b"e%d" % i)
    d = match_append_entries(j, 4, 2, 1, [], leader_commit=2)
    assert d == Accept(delete_from=None, append=(), match_index=2, commit_index=4)
    assert j.last_index == 4


def test_stale_heartbeat_with_entries_it_already_holds_deletes_nothing() -> None:
    log = ListLog([1, 1, 1, 1, 2, 2], commit=4)
    d = log.receive(2, 1, ents(3, [1, 1]), leader_commit=3)
    assert d == Accept(None, (), 4, 4)
    assert log.terms == [1, 1, 1, 1, 2, 2]  # entries 5-6 after the message's end are kept (§5.3)


def test_missing_prev_entry_is_rejected_with_the_log_end_as_hint() -> None:
    """Figure 2 rule 2: reply false if the log has no entry at prevLogIndex."""
    log = ListLog([1, 1, 1])
    assert log.receive(5, 1, ents(6, [1]), 0) == Reject(4, "no entry at prevLogIndex 5 (log ends at 3)")
    assert log.terms == [1, 1, 1]


def test_prev_term_mismatch_is_rejected_and_nothing_changes() -> None:
    """Figure 2 rule 2: … or whose term does not match prevLogTerm."""
    log = ListLog([1, 1, 2, 2], commit=2)
    d = log.receive(4, 3, ents(5, [3]), 5)
    assert isinstance(d, Reject) and d.next_index == 4
    assert log.terms == [1, 1, 2, 2] and log.commit == 2


def test_conflict_deletes_from_the_first_conflicting_entry_only() -> None:
    """Figure 2 rule 3: delete the existing entry that conflicts and all that follow it."""
    log = ListLog([1, 1, 2, 2, 2], commit=2)
    d = log.receive(2, 1, ents(3, [2, 3, 3]), 4)
    assert isinstance(d, Accept) and d.delete_from == 4
    assert log.terms == [1, 1, 2, 3, 3] and log.commit == 4


def test_new_entries_are_appended_and_commit_follows_the_leader_up_to_the_last_new_entry() -> None:
    """Figure 2 rules 4 and 5: commitIndex = min(leaderCommit, index of last new entry)."""
    log = ListLog([1, 1])
    log.receive(2, 1, ents(3, [1, 1]), leader_commit=10)
    assert log.terms == [1, 1, 1, 1] and log.commit == 4
    log2 = ListLog([1, 1, 1, 1, 1, 1])  # holds more than the message vouches for
    log2.receive(2, 1, [], leader_commit=6)
    assert log2.commit == 2  # only what the message proved matching


def test_conflict_at_or_below_the_commit_index_is_refused() -> None:
    log = ListLog([1, 1, 1, 1], commit=3)
    d = log.receive(1, 1, ents(2, [1, 2, 2]), 4)
    assert isinstance(d, Reject) and "commit index" in d.reason
    assert log.terms == [1, 1, 1, 1] and log.commit == 3


def test_entries_below_a_snapshot_are_treated_as_matching() -> None:
    log = ListLog([3, 3], commit=11, first_index=10)  # 1-9 compacted
    d = log.receive(5, 2, ents(6, [2, 2, 2, 2, 3, 3, 4]), 13)
    assert isinstance(d, Accept) and d.delete_from is None
    assert log.terms == [3, 3, 4] and log.commit == 12


def test_malformed_entry_indexes_are_refused() -> None:
    log = ListLog([1])
    d = log.receive(1, 1, [(b"x", 3, 1)], 1)
    assert isinstance(d, Reject) and "expected 2" in d.reason


# -- properties ----------------------------------------------------------------


@st.composite
def scenario(draw):
    """A leader log, a follower that shares a prefix and then diverges with lower terms, and messages."""
    leader = draw(st.lists(st.integers(0, 2), min_size=1, max_size=15))
    terms = []
    t = 1
    for step in leader:
        t += step
        terms.append(t)
    shared = draw(st.integers(1, len(terms)))
    follower = terms[:shared]
    tail_len = draw(st.integers(0, 5))
    for _ in range(tail_len):  # uncommitted entries of an older leader
        follower.append(max(follower[-1], 1))
    # the divergent tail must really differ from the leader where they overlap
    for k in range(shared, len(follower)):
        if k < len(terms) and follower[k] == terms[k]:
            follower[k] = max(terms[shared - 1], 1)
            if follower[k] == terms[k]:
                del follower[k:]
                break
    commit = draw(st.integers(0, shared))
    messages = []
    for _ in range(draw(st.integers(1, 8))):
        prev = draw(st.integers(0, len(terms)))
        count = draw(st.integers(0, len(terms) - prev))
        prev_term = terms[prev - 1] if prev else 0
        messages.append((prev, prev_term, ents(prev + 1, terms[prev : prev + count]), draw(st.integers(0, len(terms)))))
    return terms, follower, commit, messages


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_any_order_of_leader_messages_keeps_committed_entries_and_converges(sc) -> None:
    """Messages of one leader delivered stale, duplicated or reordered (§5.3)."""
    terms, follower, commit, messages = sc
    log = ListLog(list(follower), commit=commit)
    for prev, prev_term, entries, leader_commit in messages + messages[::-1]:
        before = list(log.terms)
        committed = before[: log.commit]
        d = log.receive(prev, prev_term, entries, min(leader_commit, len(terms)))
        assert log.terms[: len(committed)] == committed
        if isinstance(d, Accept):
            assert log.terms[: d.match_index] == terms[: d.match_index]
            assert log.commit <= max(d.match_index, len(committed))
            if d.delete_from is None:
                assert log.terms[: len(before)] == before  # nothing of what it held was touched
            again = log.receive(prev, prev_term, entries, leader_commit)  # a duplicate changes nothing
            assert isinstance(again, Accept) and again.delete_from is None and again.append == ()
        else:
            assert log.terms == before
    # the full log, sent once from the start, always brings the follower level with the leader
    log.receive(0, 0, ents(1, terms), len(terms))
    assert log.terms[: len(terms)] == terms
