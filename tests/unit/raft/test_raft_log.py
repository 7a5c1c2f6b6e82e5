"""The Raft core's view of its log over the real journal."""

from __future__ import annotations

from shoal.node.raft._io import SimIO
from shoal.node.raft.journal import Journal
from shoal.node.raft.raft_log import RaftLog


def test_an_emptied_journal_holds_nothing_past_the_snapshot() -> None:
    # A follower installs a snapshot at 3 while its journal held entries 1..5 (the last ones
    # conflicting): the replica empties the journal, which still names 5 as its end.
    journal = Journal(SimIO(), "/d/p0.raft")
    for index in range(1, 6):
        journal.append(index, 1, b"x", check_space=False)
    journal.clear()
    assert journal.first_index > journal.last_index
    log = RaftLog(journal, 3, 2)
    assert log.last_index == 3 and log.last_term == 2
    assert log.term(4) is None and log.term(3) == 2
    log.append([(b"y", 4, 2)])
    assert log.entries(4, 5) == [(b"y", 4, 2)]
