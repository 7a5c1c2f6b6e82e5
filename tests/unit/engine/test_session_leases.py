"""The session index (``node/state/_session_leases.py``) names exactly the jobs each session
holds leased, whatever ends a lease: an ack of one job or of a run, a failure, a release, a
lapse, a removal, the job read (made an object) while leased, or the session released; and a
snapshot restores it as it was."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shoal.cluster.errors import CommandError
from shoal.node.state import MemorySpace, PartitionEngine, SessionPull
from shoal.node.state._transitions import ACTIVE

SESSIONS = ["a", "b", None]
TTR_MS = 5_000


def held_by_jobs(engine: PartitionEngine) -> dict[str, set[int]]:
    """What every job says of its lease: the sessions and the jobs they hold."""
    held: dict[str, set[int]] = {}
    for job in engine._all_jobs():
        if job.state == ACTIVE and job.session is not None:
            held.setdefault(job.session, set()).add(job.seq)
    return held


class SessionIndexMatchesTheJobs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(2, MemorySpace())
        self.now = 1_000
        self.tokens: dict[str, str] = {}  # job id -> token of its current lease
        self.apply({"cmd": "CreateQueue", "queue": "q", "options": {"ttr": TTR_MS, "maxDeliveries": 3,
                                                                    "backoff": 0, "historyMax": 5}})

    def apply(self, cmd: Any) -> Any:
        try:
            return self.engine.apply(cmd, self.now).result
        except CommandError:
            return None

    @rule(n=st.integers(1, 150), priority=st.booleans())
    def push(self, n: int, priority: bool) -> None:
        jobs: list[dict[str, Any]] = [{"data": msgpack.packb(i)} for i in range(n)]
        if priority:
            jobs[0]["priority"] = 2
        self.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs})

    @rule(count=st.integers(1, 90), session=st.sampled_from(SESSIONS))
    def pull(self, count: int, session: str | None) -> None:
        reply = self.apply(SessionPull({"cmd": "PULLB", "queue": "q", "count": count}, session))
        if reply:
            self.tokens.update(zip([job["id"] for job in reply["jobs"]], reply["tokens"]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def ack_some(self, data: st.DataObject) -> None:
        ids = sorted(self.tokens, key=lambda i: int(i.split("-")[1]))
        start = data.draw(st.integers(0, len(ids) - 1))
        picked = ids[start:start + data.draw(st.integers(1, 120))]
        self.apply({"cmd": "ACKB", "ids": picked, "tokens": [self.tokens[i] for i in picked]})
        for job_id in picked:
            self.tokens.pop(job_id, None)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), how=st.sampled_from(["ACK", "FAIL", "Release", "GetJob", "Touch"]))
    def one(self, data: st.DataObject, how: str) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.tokens)))
        if how == "GetJob":  # makes a leased slot a job object
            self.apply({"cmd": "GetJob", "id": job_id})
            return
        cmd: dict[str, Any] = {"cmd": how, "id": job_id, "token": self.tokens[job_id]}
        if how == "FAIL":
            cmd["error"] = "boom"
        if how == "Touch":
            cmd["ttr"] = TTR_MS
        self.apply(cmd)
        if how != "Touch":
            self.tokens.pop(job_id, None)

    @rule(session=st.sampled_from(["a", "b"]))
    def release_session(self, session: str) -> None:
        self.apply({"cmd": "ReleaseSession", "session": session})

    @rule(ms=st.sampled_from([1, 2_000, TTR_MS + 1]))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self.apply({"cmd": "GetJobCounts", "queue": "q"})  # a command runs the lapsed leases

    @rule(how=st.sampled_from(["Drain", "Obliterate"]))
    def remove(self, how: str) -> None:
        if self.apply({"cmd": how, "queue": "q"}) is not None and how == "Obliterate":
            self.tokens.clear()

    @invariant()
    def the_index_names_what_the_jobs_hold(self) -> None:
        sessions = self.engine.sessions
        truth = held_by_jobs(self.engine)
        assert set(sessions) == set(truth)
        for session, seqs in truth.items():
            listed = sessions.seqs(session)
            assert sorted(listed) == sorted(seqs) and len(listed) == len(set(listed))
            assert sessions.count(session) == len(seqs)
        assert sessions.drifts == 0

    @invariant()
    def a_restore_keeps_it(self) -> None:
        chunks = list(self.engine.snapshot_chunks(jobs_per_chunk=50))
        restored = PartitionEngine.restore_chunks(iter(chunks), MemorySpace())
        assert restored.sessions.state() == self.engine.sessions.state()
        assert list(restored.snapshot_chunks(jobs_per_chunk=50)) == chunks


SessionIndexMatchesTheJobs.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_session_index = SessionIndexMatchesTheJobs.TestCase
