"""Order of a loop iteration's output (node/writes.py, node/partition/group_commit.py): a lone replica's
batch is proposed before the iteration's replies are written, so its answers leave with them;
a take's answer leaves before the entry's sync, everything else after it."""

from __future__ import annotations

import asyncio
from typing import Any

from shoal.node.partition.group_commit import GroupCommit
from shoal.node.partition.pushes import session_pull
from shoal.node.writes import PendingWrites


class Clock:
    def now_ms(self) -> int:
        return 1_000


class Replica:
    """A leader that commits a proposal within the call (alone) or later (with peers)."""

    partition = 0

    def __init__(self, alone: bool, log: list[str]) -> None:
        self.alone, self.log = alone, log
        self.later: list[Any] = []

    def commits_alone(self) -> bool:
        return self.alone

    def is_leader(self) -> bool:
        return True

    def propose(self, now_ms: int, cmds: list[Any], callback: Any, early: Any = None) -> None:
        self.log.append("propose")
        if self.alone:  # as PartitionReplica: applied, early answers, sync, then the answers
            results = [{"ok": True}] * len(cmds)
            if early is not None:
                early(results)
            self.log.append("sync")
            callback(results, 0)
        else:
            self.later.append((callback, len(cmds)))


class Writer:
    """A connection's output: queued, then written by one ``_flush`` (it adds itself once)."""

    def __init__(self, log: list[str], writes: PendingWrites) -> None:
        self.log, self.writes = log, writes
        self.out: list[str] = []

    def send(self, what: str) -> None:
        if not self.out:
            self.writes.add(self)
        self.out.append(what)

    def _flush(self) -> None:
        self.log.append(f"write {'+'.join(self.out)}")
        self.out = []


def run_iteration(alone: bool, take: bool = False, session: str | None = "s") -> list[str]:
    loop = asyncio.new_event_loop()
    try:
        log: list[str] = []
        writes = PendingWrites(loop)
        replica = Replica(alone, log)
        writer = Writer(log, writes)
        gc = GroupCommit(replica, loop, Clock(), propose=replica.propose,  # type: ignore[arg-type]
                         after_answers=writes.write_now, before_output=writes.propose_first,
                         early_answers=writes.write_now)

        def frames() -> None:  # one read: a fast reply, then a write (and a take)
            writer.send("fast")
            gc.submit({"cmd": "ACK", "id": "0-1"}, lambda result: writer.send("answer"))
            if take:
                gc.submit(session_pull({"cmd": "PULLB", "queue": "q", "count": 10}, session, 1 << 20),
                          lambda result: writer.send("jobs"))

        loop.call_soon(frames)
        loop.run_until_complete(asyncio.sleep(0.01))
        for callback, n in replica.later:  # peers answered: the entry commits
            callback([{"ok": True}] * n, 0)
        return log
    finally:
        loop.close()


def test_a_lone_replicas_answer_leaves_with_the_replies_read_with_it() -> None:
    assert run_iteration(alone=True) == ["propose", "sync", "write fast+answer"]


def test_a_lone_replicas_take_leaves_before_the_sync_and_the_rest_after() -> None:
    assert run_iteration(alone=True, take=True) == ["propose", "write fast+jobs", "sync", "write answer"]


def test_a_replica_with_peers_writes_the_replies_before_it_proposes() -> None:
    log = run_iteration(alone=False)
    assert log[:2] == ["write fast", "propose"] and log[-1] == "write answer"


def test_a_detached_take_waits_for_the_sync() -> None:
    # its leases outlive the session, so nothing ends them when a power cut undoes the take
    assert run_iteration(alone=True, take=True, session=None) == ["propose", "sync", "write fast+answer+jobs"]
