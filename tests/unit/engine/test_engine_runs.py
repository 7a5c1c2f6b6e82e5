"""Segment jobs leased, acked and trimmed in runs behave exactly like jobs made one by one.

Bulk-pushed plain jobs stay in their segment through a batch pull (leased as a run with
one lease entry) and a batch ack (completed in place) until the history lets them go.
Two engines get the same commands, except that the reference's ``PUSHB`` items carry
``priority: 0`` and so take the per-job path: their snapshots must stay byte-equal
(``digest``) after every step, and both must agree with a plain model on what every
pull returns, what every ack accepts and the counts by state. Reads go to the engine
under test only (they materialize jobs, which must never show in a snapshot).
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shoal.cluster.codec import raw_of
from shoal.cluster.errors import CommandError
from shoal.node.state import AckRun, Command, PartitionEngine, SessionPull
from shoal.node.state._segments import ack_run_of, plain_ack

TTR_MS = 1_000
MAX_DELIVERIES = 2
HISTORY_MAX = 4
SESSIONS = [None, "s1", "s2"]


class Model:
    """Higher priority first, then FIFO; leases lapse after their deadline; a bounded history."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        self.history: list[int] = []
        self.now = 0

    def expire(self) -> None:
        for seq in sorted(self.jobs, key=lambda s: (self.jobs[s]["deadline"], s)):
            j = self.jobs[seq]
            if j["state"] == "active" and j["deadline"] <= self.now:
                j["state"] = "failed" if j["attempts"] >= MAX_DELIVERIES else "waiting"
                j["token"] = j["session"] = None

    def pull(self, count: int, session: str | None) -> list[int]:
        self.expire()
        out = []
        for _ in range(count):
            waiting = [s for s, j in self.jobs.items() if j["state"] == "waiting"]
            if not waiting:
                break
            seq = min(waiting, key=lambda s: (-self.jobs[s]["prio"], s))
            j = self.jobs[seq]
            j.update(state="active", attempts=j["attempts"] + 1, deadline=self.now + TTR_MS, session=session)
            out.append(seq)
        return out

    def trim(self) -> None:
        while self.history:
            seq = self.history[0]
            if seq not in self.jobs or self.jobs[seq]["state"] != "completed":
                self.history.pop(0)
                continue
            if len(self.history) > HISTORY_MAX:
                self.history.pop(0)
                del self.jobs[seq]
                continue
            break

    def counts(self) -> dict[str, int]:
        """As bunqueue counts: waiting jobs with a priority apart, as ``prioritized``."""
        out = {s: 0 for s in ("waiting", "delayed", "active", "completed", "failed", "waiting-children", "cancelled",
                              "prioritized", "paused")}
        for j in self.jobs.values():
            out["prioritized" if j["state"] == "waiting" and j["prio"] else j["state"]] += 1
        return out


class RunsVsPerJob(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(0)
        self.reference = PartitionEngine(0)
        self.model = Model()
        self.tokens: dict[int, str] = {}       # current token per active job
        self.stale: list[tuple[int, str]] = []  # tokens of leases that ended
        self.both({"cmd": "CreateQueue", "queue": "q", "options": {
            "ttr": TTR_MS, "maxDeliveries": MAX_DELIVERIES, "backoff": 0, "historyMax": HISTORY_MAX}})

    def both(self, cmd: Command, reference: Command | None = None) -> dict[str, Any]:
        """Apply to both engines: the same reply or the same refusal, and equal snapshots."""
        now = self.model.now
        try:
            reply = self.engine.apply(cmd, now).result
        except CommandError as exc:
            try:
                self.reference.apply(reference or cmd, now)
            except CommandError as ref_exc:
                assert (ref_exc.code, str(ref_exc)) == (exc.code, str(exc))
            else:
                raise AssertionError(f"only the engine under test refused {cmd!r}: {exc}")
            raise
        ref_reply = self.reference.apply(reference or cmd, now).result
        assert reply == ref_reply, f"{cmd['cmd']}: {reply} != {ref_reply}"
        assert self.engine.digest() == self.reference.digest(), f"snapshots differ after {cmd!r}"
        assert self.engine.sessions.drifts == self.reference.sessions.drifts == 0  # digests look the index over
        return reply

    def _settled(self, seq: int) -> None:
        self.stale.append((seq, self.tokens.pop(seq)))

    def _lapsed(self) -> None:
        """Forget the tokens of leases the model has seen lapse."""
        for seq in [s for s in self.tokens if self.model.jobs.get(s, {}).get("state") != "active"]:
            self._settled(seq)

    @rule(n=st.integers(1, 7), prio=st.sampled_from([None, None, -1, 1]))
    def push_batch(self, n: int, prio: int | None) -> None:
        items = [{"data": raw_of(i)} for i in range(n)]
        if prio is not None:
            items[0]["priority"] = prio  # a batch the per-job path takes on both engines
        plain = [dict(item, priority=item.get("priority", 0)) for item in items]
        ids = self.both({"cmd": "PUSHB", "queue": "q", "jobs": items},
                        {"cmd": "PUSHB", "queue": "q", "jobs": plain})["ids"]
        for item, job_id in zip(items, ids):
            self.model.jobs[int(job_id.split("-")[1])] = {
                "prio": item.get("priority", 0), "state": "waiting", "attempts": 0, "deadline": 0,
                "token": None, "session": None}

    @rule(count=st.integers(1, 9), session=st.sampled_from(SESSIONS), budget=st.sampled_from([0, 0, 1700, 3000]))
    def pull_batch(self, count: int, session: str | None, budget: int) -> None:
        cmd: dict[str, Any] = {"cmd": "PULLB", "queue": "q", "count": count}
        if count == 1:
            r = self.both(SessionPull({**cmd, "cmd": "PULL"}, session))
            got = [int(r["job"]["id"].split("-")[1])] if r["job"] else []
            assert got == self.model.pull(1, session)
            self._lapsed()
            if got:
                self.tokens[got[0]] = r["token"]
            return
        # budget: a reply budget of one to three jobs, a shorter pull
        r = self.both(SessionPull(cmd, session, budget))
        got = [int(j["id"].split("-")[1]) for j in r["jobs"]]
        expected = self.model.pull(len(got) if budget and got else count, session)
        assert got == expected
        self._lapsed()
        for seq, token, job in zip(got, r["tokens"], r["jobs"]):
            assert job["state"] == "active" and job["attempts"] == self.model.jobs[seq]["attempts"] - 1
            self.tokens[seq] = token

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), with_tokens=st.booleans(), with_result=st.booleans(), stale=st.booleans())
    def ack_batch(self, data: st.DataObject, with_tokens: bool, with_result: bool, stale: bool) -> None:
        self.model.expire()
        live = sorted(self.tokens)
        start = data.draw(st.integers(0, len(live) - 1))
        seqs = live[start:start + data.draw(st.integers(1, len(live) - start))]  # often one run
        if data.draw(st.booleans()):
            seqs = data.draw(st.permutations(seqs))
        tokens = [self.tokens[s] for s in seqs]
        if stale and self.stale:
            seq, token = data.draw(st.sampled_from(self.stale))
            seqs, tokens = seqs + [seq], tokens + [token]
        self._ack(seqs, tokens if with_tokens else None, [raw_of(s) if s % 2 else None for s in seqs]
                  if with_result else None)

    @rule(count=st.integers(2, 9), with_tokens=st.booleans(), session=st.sampled_from(SESSIONS))
    def consume(self, count: int, with_tokens: bool, session: str | None) -> None:
        """What a consumer does: pull a batch, ack it whole, in order (runs on both paths)."""
        r = self.both(SessionPull({"cmd": "PULLB", "queue": "q", "count": count}, session))
        got = [int(j["id"].split("-")[1]) for j in r["jobs"]]
        assert got == self.model.pull(count, session)
        self.tokens.update(zip(got, r["tokens"]))
        if got:
            self._ack(got, r["tokens"] if with_tokens else None, None)

    def _ack(self, seqs: list[int], tokens: list[str] | None, results: list[Any] | None) -> None:
        """ACKB ``seqs``: accepted exactly when the model has every one active under its token."""
        cmd: dict[str, Any] = {"cmd": "ACKB", "ids": [f"0-{s}" for s in seqs]}
        if tokens is not None:
            cmd["tokens"] = tokens
        if results is not None:
            cmd["results"] = results
        # The engine under test gets what a leader replicates (node.partition.pushes.replicated_form): a
        # consecutive batch as its compact run; the reference gets the batch as sent.
        run = ack_run_of(0, cmd["ids"], tokens) if plain_ack(cmd) else None
        sent: Command = AckRun(*run) if run is not None else cmd
        jobs = self.model.jobs
        ok = len(set(seqs)) == len(seqs) and all(
            s in jobs and jobs[s]["state"] == "active" and (tokens is None or self.tokens.get(s) == t)
            for s, t in zip(seqs, tokens or seqs))
        try:
            self.both(sent, cmd)
            accepted = True
        except CommandError:
            accepted = False
        assert accepted == ok, f"ACKB accepted={accepted}, model says {ok}"
        self._lapsed()
        if accepted:
            for s in seqs:
                jobs[s].update(state="completed", token=None, session=None)
                self.model.history.append(s)
                if s in self.tokens:
                    self._settled(s)
            if len(self.model.history) > HISTORY_MAX:
                self.model.trim()

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), action=st.sampled_from(["ACK", "FAIL", "Release", "Touch"]))
    def settle_one(self, data: st.DataObject, action: str) -> None:
        self.model.expire()
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        job = self.model.jobs[seq]
        cmd: dict[str, Any] = {"cmd": action, "id": f"0-{seq}", "token": self.tokens[seq]}
        if action == "Touch":
            cmd["ttr"] = data.draw(st.sampled_from([TTR_MS // 2, TTR_MS * 2]))
        try:
            self.both(cmd)
            accepted = True
        except CommandError as exc:
            accepted = False
            assert exc.code.value == "LEASE_MISMATCH"
        assert accepted == (job["state"] == "active")
        if not accepted:
            self._lapsed()
            return
        if action == "Touch":
            job["deadline"] = self.model.now + cmd["ttr"]
            return
        self._settled(seq)
        job["token"] = job["session"] = None
        if action == "ACK":
            job["state"] = "completed"
            self.model.history.append(seq)
            if len(self.model.history) > HISTORY_MAX:
                self.model.trim()
        elif action == "FAIL":
            job["state"] = "waiting" if job["attempts"] < 1 else "failed"
        else:
            job["state"] = "waiting"

    @rule(session=st.sampled_from(["s1", "s2"]))
    def release_session(self, session: str) -> None:
        self.both({"cmd": "ReleaseSession", "session": session})
        for job in self.model.jobs.values():
            if job["state"] == "active" and job["session"] == session:
                job.update(state="waiting", token=None, session=None)
        self._lapsed()

    @rule()
    def release_all(self) -> None:
        self.both({"cmd": "ReleaseAll", "queue": "q"})
        self.model.expire()
        for job in self.model.jobs.values():
            if job["state"] == "active":
                job.update(state="waiting", token=None, session=None)
        self._lapsed()

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def read_one(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.model.jobs)))
        job = self.engine.apply({"cmd": "GetJob", "id": f"0-{seq}"}, self.model.now).result["job"]
        assert job is not None and job["id"] == f"0-{seq}"
        assert self.engine.digest() == self.reference.digest(), "a read changed the snapshot"

    @rule()
    def clean_completed(self) -> None:
        count = self.both({"cmd": "Clean", "queue": "q", "state": "completed", "grace": 0})["count"]
        done = [s for s, j in self.model.jobs.items() if j["state"] == "completed"]
        assert count == len(done)
        for s in done:
            del self.model.jobs[s]

    @rule(dt=st.sampled_from([300, 600, 1100, 2500]))
    def advance(self, dt: int) -> None:
        self.model.now += dt
        self.both({"cmd": "_Tick"})
        self.model.expire()
        self.model.trim()
        self._lapsed()

    @invariant()
    def counts_agree(self) -> None:
        got = self.engine.apply({"cmd": "GetJobCounts", "queue": "q"}, self.model.now).result["counts"]
        assert got == self.model.counts()

    @invariant()
    def restore_keeps_the_snapshot(self) -> None:
        digest = self.engine.digest()
        assert PartitionEngine.restore(self.engine.snapshot()).digest() == digest


TestRunsVsPerJob = RunsVsPerJob.TestCase
TestRunsVsPerJob.settings = settings(max_examples=150, stateful_step_count=70, deadline=None)
