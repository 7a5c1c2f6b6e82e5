"""The engine against an obviously-correct reference model (hypothesis stateful testing).

The model keeps a plain dict per job and recomputes everything by scanning; the
engine must give the same answers: which job a pull returns, what ACK/FAIL/
Release accept, and the counts by state, while time advances and ticks expire
delays and leases.

Batches of plain jobs (``PUSHB`` items with only data and maybe an idempotency
key) are stored as segments and materialized job by job; reads (``GetJob``)
materialize on the engine under test only, so a twin engine that applies the
same writes and no reads must keep the same digest, and so must a restore.

Cancel of an active job and the CANCELLED answers to its holder are in the first model;
``LimitsVsModel`` checks rate limits and concurrency (per queue and per group) against
windows recomputed from the whole lease history, and the fair, weighted turns between groups
against tags kept per group and a scan for the least; ``DedupeVsModel`` checks dedupe and
debounce entries.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shoal.cluster.codec import raw_of
from shoal.cluster.errors import CommandError
from shoal.node.state import PartitionEngine
from shoal.node.state._ready import FAIR_STRIDE

from fair_model import fair_pull

TTR_MS = 1_000
MAX_DELIVERIES = 3


class Model:
    """Reference semantics: higher priority first, then FIFO; leases lapse after ttr."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        self.keys: dict[str, tuple[int, int]] = {}  # idempotency key -> (seq, expires)
        self.now = 0

    def expire(self) -> None:
        for j in self.jobs.values():
            if j["state"] == "delayed" and j["run_at"] <= self.now:
                j["state"] = "waiting"
        for j in sorted(self.jobs.values(), key=lambda j: j["deadline"]):
            if j["state"] == "active" and j["deadline"] <= self.now:
                j["token"] = None
                j["state"] = "failed" if j["attempts"] >= MAX_DELIVERIES else "waiting"

    def pull(self) -> int | None:
        self.expire()
        waiting = [s for s, j in self.jobs.items() if j["state"] == "waiting"]
        if not waiting:
            return None
        seq = min(waiting, key=lambda s: (-self.jobs[s]["prio"], s))
        j = self.jobs[seq]
        j["state"], j["attempts"], j["deadline"] = "active", j["attempts"] + 1, self.now + TTR_MS
        return seq

    def counts(self) -> dict[str, int]:
        """As bunqueue counts: waiting jobs with a priority apart, as ``prioritized``."""
        out = {s: 0 for s in ("waiting", "delayed", "active", "completed", "failed", "waiting-children", "cancelled",
                              "prioritized", "paused")}
        for j in self.jobs.values():
            out["prioritized" if j["state"] == "waiting" and j["prio"] else j["state"]] += 1
        return out


class EngineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(0)
        self.twin = PartitionEngine(0)  # same writes, never a read
        create = {"cmd": "CreateQueue", "queue": "q",
                  "options": {"ttr": TTR_MS, "maxDeliveries": MAX_DELIVERIES, "backoff": 0}}
        self.engine.apply(create, 0)
        self.twin.apply(create, 0)
        self.model = Model()
        self.tokens: dict[int, str] = {}       # current token per active job (from the engine)
        self.stale: list[tuple[int, str]] = []  # tokens of leases that ended
        self.cancelled: dict[int, str] = {}     # the last token of each job cancelled while active

    def apply(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.engine.apply(cmd, self.model.now).result
        finally:
            if cmd["cmd"] not in ("GetJob", "GetJobCounts"):
                try:
                    self.twin.apply(cmd, self.model.now)
                except CommandError:
                    pass

    def _add(self, seq: int, prio: int, delay: int, attempts: int) -> None:
        self.model.jobs[seq] = {"prio": prio, "state": "delayed" if delay else "waiting",
                                "run_at": self.model.now + delay, "attempts": 0, "max": attempts,
                                "deadline": 0, "token": None}

    @rule(prio=st.integers(-3, 3), delay=st.sampled_from([0, 0, 500, 1500]), attempts=st.integers(1, 3))
    def push(self, prio: int, delay: int, attempts: int) -> None:
        r = self.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(prio), "priority": prio, "delay": delay,
                        "attempts": attempts})
        self._add(int(r["id"].split("-")[1]), prio, delay, attempts)

    @rule(keys=st.lists(st.sampled_from([None, None, "k1", "k2", "k3"]), min_size=1, max_size=6))
    def push_batch(self, keys: list[str | None]) -> None:
        items = [{"data": raw_of(i)} if k is None else {"data": raw_of(i), "idempotencyKey": k}
                 for i, k in enumerate(keys)]
        ids = self.apply({"cmd": "PUSHB", "queue": "q", "jobs": items})["ids"]
        assert len(ids) == len(keys)
        m = self.model
        for key, job_id in zip(keys, ids):
            seq = int(job_id.split("-")[1])
            known = m.keys.get(key) if key is not None else None
            if known is not None and known[1] > m.now:
                assert seq == known[0], "a key seen within the window must answer the original id"
                continue
            assert seq not in m.jobs
            self._add(seq, 0, 0, 1)
            if key is not None:
                m.keys[key] = (seq, m.now + 120_000)

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def get_job(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.model.jobs)))
        job = self.apply({"cmd": "GetJob", "id": f"0-{seq}"})["job"]
        self.model.expire()
        state = self.model.jobs[seq]["state"]
        if state == "waiting" and self.model.jobs[seq]["prio"]:
            state = "prioritized"  # bunqueue's name for a waiting job with a priority
        if state not in ("delayed", "active"):  # those two may have lapsed in the engine only lazily
            assert job["state"] == state

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.apply({"cmd": "_Tick"})
        self.model.expire()
        seq = data.draw(st.sampled_from(sorted(self.model.jobs)))
        job = self.model.jobs[seq]
        if job["state"] == "cancelled":
            return
        r = self.apply({"cmd": "Cancel", "id": f"0-{seq}", "by": "model"})
        if job["state"] == "active":
            assert r == {"state": "cancelled"}
            job["state"] = "cancelled"
            self.cancelled[seq] = self.tokens.pop(seq)
            return
        del self.model.jobs[seq]
        self.tokens.pop(seq, None)

    @precondition(lambda self: self.cancelled)
    @rule(data=st.data(), action=st.sampled_from(["ACK", "FAIL", "JobHeartbeat", "Release"]))
    def cancelled_holder_learns(self, data: st.DataObject, action: str) -> None:
        seq, token = data.draw(st.sampled_from(sorted(self.cancelled.items())))
        if seq not in self.model.jobs:
            return
        before = self.engine.digest()
        try:
            self.apply({"cmd": action, "id": f"0-{seq}", "token": token})
            raise AssertionError("a cancelled job's holder settled it")
        except CommandError as exc:
            assert exc.code.value == "CANCELLED"
        assert self.engine.digest() == before, "a refused command changed state"

    @rule()
    def pull(self) -> None:
        expected = self.model.pull()
        r = self.apply({"cmd": "PULL", "queue": "q"})
        got = int(r["job"]["id"].split("-")[1]) if r["job"] else None
        assert got == expected
        for seq, token in list(self.tokens.items()):
            if self.model.jobs[seq]["state"] != "active" or seq == got:
                self.stale.append((seq, self.tokens.pop(seq)))
        if got is not None:
            self.tokens[got] = r["token"]
            assert r["job"]["attempts"] == self.model.jobs[got]["attempts"] - 1  # attempts made before this one

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), action=st.sampled_from(["ACK", "FAIL", "Release"]))
    def settle(self, data: st.DataObject, action: str) -> None:
        self.model.expire()
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[seq]
        job = self.model.jobs[seq]
        try:
            self.apply({"cmd": action, "id": f"0-{seq}", "token": token})
            accepted = True
        except CommandError as exc:
            accepted = False
            assert exc.code.value == "LEASE_MISMATCH"
        assert accepted == (job["state"] == "active"), "a lapsed lease must not be settled"
        self.stale.append((seq, self.tokens.pop(seq)))
        if not accepted:
            return
        if action == "ACK":
            job["state"] = "completed"
        elif action == "FAIL":
            job["state"] = "waiting" if job["attempts"] < job["max"] else "failed"
        else:
            job["state"] = "waiting"

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def stale_token_never_acks(self, data: st.DataObject) -> None:
        seq, token = data.draw(st.sampled_from(self.stale))
        if self.tokens.get(seq) == token:
            return
        before = self.engine.digest()
        try:
            self.apply({"cmd": "ACK", "id": f"0-{seq}", "token": token})
            raise AssertionError("a superseded token acked a job")
        except CommandError as exc:
            assert exc.code.value in ("LEASE_MISMATCH", "NOT_FOUND", "CANCELLED")
        assert self.engine.digest() == before, "a refused command changed state"

    @rule(dt=st.sampled_from([100, 600, 1100, 2500]))
    def advance(self, dt: int) -> None:
        self.model.now += dt
        self.apply({"cmd": "_Tick"})
        self.model.expire()

    @invariant()
    def counts_agree(self) -> None:
        got = self.apply({"cmd": "GetJobCounts", "queue": "q"})["counts"]
        assert got == self.model.counts()

    @invariant()
    def representation_never_shows(self) -> None:
        digest = self.engine.digest()
        assert digest == self.twin.digest(), "reads (materializing jobs) changed the snapshot"
        assert PartitionEngine.restore(self.engine.snapshot()).digest() == digest


TestEngineVsModel = EngineVsModel.TestCase
TestEngineVsModel.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


# --- flow control: rate limits and concurrency, per queue and per group -----------------------

GROUPS = [None, "a", "b", "c"]
LIMIT_TTR_MS = 24 * 3600 * 1000  # no lease lapses within a run: the model leaves them out


class LimitsModel:
    """Which job a pull may lease under the limits, recomputed from the whole lease history,
    and whose turn it is among the groups (docs/commands.md, "Groups": the least tag, then name)."""

    def __init__(self, opts: dict[str, Any]) -> None:
        self.opts = opts
        self.jobs: dict[int, dict[str, Any]] = {}
        # (time, group, counts for the queue's limit, counts for its group's) of every lease
        self.leases: list[tuple[int, str | None, bool, bool]] = []
        self.now = 0
        self.tags: dict[str, int] = {}  # group with a waiting or active job -> its virtual finish tag
        self.vtime = 0

    def push(self, seq: int, group: str | None, prio: int) -> None:
        self.jobs[seq] = {"group": group, "prio": prio, "state": "waiting"}
        if group is not None:
            self.tags.setdefault(group, self.vtime)

    def finish(self, seq: int, state: str) -> None:
        """An active job ends: its group rejoins no earlier than now, and forgets its tag if idle."""
        job = self.jobs[seq]
        job["state"] = state
        group = job["group"]
        if group is not None:
            self.tags[group] = max(self.tags[group], self.vtime)
            if not any(j["group"] == group and j["state"] in ("waiting", "active") for j in self.jobs.values()):
                del self.tags[group]

    def _stride(self, group: str) -> int:
        weight = (self.opts.get("groupWeights") or {}).get(group, 1)
        return FAIR_STRIDE // weight

    def _in_window(self, limit: dict[str, int] | None, group: str | None, grouped: bool) -> int:
        if not limit or not limit["max"]:
            return 0
        edge = self.now - limit["durationMs"]
        if grouped:
            return sum(1 for t, g, _, counted in self.leases if t > edge and g == group and counted)
        return sum(1 for t, _, counted, _ in self.leases if t > edge and counted)

    def _queue_open(self) -> bool:
        conc = self.opts.get("concurrency") or 0
        active = sum(1 for j in self.jobs.values() if j["state"] == "active")
        if conc and active >= conc:
            return False
        limit = self.opts.get("limit")
        return not limit or not limit["max"] or self._in_window(limit, None, False) < limit["max"]

    def _group_open(self, group: str) -> bool:
        conc = self.opts.get("groupConcurrency", 1)
        active = sum(1 for j in self.jobs.values() if j["state"] == "active" and j["group"] == group)
        if conc and active >= conc:
            return False
        limit = self._group_limit(group)
        return not limit or not limit["max"] or self._in_window(limit, group, True) < limit["max"]

    def _group_limit(self, group: str) -> dict[str, int] | None:
        overrides = self.opts.get("groupLimits") or {}
        return overrides[group] if group in overrides else self.opts.get("groupLimit")

    def pull(self) -> int | None:
        if not self._queue_open():
            return None
        seq, self.vtime = fair_pull(self.jobs, self.tags, self.vtime, self._group_open, self._stride)
        if seq is None:
            return None
        group = self.jobs[seq]["group"]
        self.leases.append((self.now, group, _on(self.opts.get("limit")),
                            group is not None and _on(self._group_limit(group))))
        return seq

    def update(self, opts: dict[str, Any]) -> None:
        """New options: a stamp out of the old window, or of a limit switched off, never counts again."""
        old, new = self.opts.get("limit"), {**self.opts, **opts}.get("limit")
        edge = self.now - old["durationMs"] if _on(old) else None
        self.leases = [(t, g, q and _on(new) and edge is not None and t > edge, gq)
                       for t, g, q, gq in self.leases]
        self.opts = {**self.opts, **opts}


def _on(limit: dict[str, int] | None) -> bool:
    return bool(limit and limit["max"])


_rate = st.one_of(st.none(), st.builds(lambda m, d: {"max": m, "durationMs": d},
                                       st.integers(0, 3), st.sampled_from([500, 1000, 2500])))


class LimitsVsModel(RuleBasedStateMachine):
    """The engine's limited pulls against :class:`LimitsModel`; windows survive a restore."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(0)
        self.twin = PartitionEngine(0)
        self.model = LimitsModel({})

    def apply(self, cmd: dict[str, Any]) -> dict[str, Any]:
        reply = self.engine.apply(cmd, self.model.now).result
        self.twin.apply(cmd, self.model.now, replies=False, events=False)
        return reply

    @initialize(limit=_rate, group_limit=_rate, conc=st.sampled_from([None, 0, 1, 2, 4]),
                group_conc=st.sampled_from([None, 0, 1, 2]), override=_rate,
                weights=st.sampled_from([None, {"a": 3}, {"b": 2, "c": 7}]))
    def create(self, limit: Any, group_limit: Any, conc: int | None, group_conc: int | None, override: Any,
               weights: dict[str, int] | None) -> None:
        opts: dict[str, Any] = {"ttr": LIMIT_TTR_MS}
        overrides = {"a": override} if override is not None else None
        for name, value in (("limit", limit), ("groupLimit", group_limit), ("concurrency", conc),
                            ("groupConcurrency", group_conc), ("groupLimits", overrides), ("groupWeights", weights)):
            if value is not None:
                opts[name] = value
        self.apply({"cmd": "CreateQueue", "queue": "q", "options": opts})
        self.model.opts = opts

    @rule(group=st.sampled_from(GROUPS), prio=st.integers(0, 2))
    def push(self, group: str | None, prio: int) -> None:
        cmd: dict[str, Any] = {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "priority": prio}
        if group is not None:
            cmd["group"] = group
        seq = int(self.apply(cmd)["id"].split("-")[1])
        self.model.push(seq, group, prio)

    @rule(n=st.integers(1, 4))
    def pull(self, n: int) -> None:
        got = [int(j["id"].split("-")[1]) for j in self.apply({"cmd": "PULLB", "queue": "q", "count": n})["jobs"]]
        expected = []
        for _ in range(n):
            seq = self.model.pull()
            if seq is None:
                break
            expected.append(seq)
        assert got == expected
        limit = self.model.opts.get("limit")
        if got and _on(limit):  # the window ending now holds at most max leases
            assert self.model._in_window(limit, None, False) <= limit["max"]

    @precondition(lambda self: any(j["state"] == "active" for j in self.model.jobs.values()))
    @rule(data=st.data(), cancel=st.booleans())
    def finish(self, data: st.DataObject, cancel: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(s for s, j in self.model.jobs.items() if j["state"] == "active")))
        self.apply({"cmd": "Cancel" if cancel else "ACK", "id": f"0-{seq}"})
        self.model.finish(seq, "cancelled" if cancel else "completed")

    @rule(dt=st.sampled_from([100, 400, 1000, 2600]))
    def advance(self, dt: int) -> None:
        self.model.now += dt
        self.apply({"cmd": "_Tick"})

    @rule()
    def restart(self) -> None:
        self.engine = PartitionEngine.restore(self.engine.snapshot())

    @rule(limit=_rate, conc=st.sampled_from([None, 0, 1, 3]))
    def update(self, limit: Any, conc: int | None) -> None:
        opts = {k: v for k, v in (("limit", limit), ("concurrency", conc)) if v is not None}
        self.apply({"cmd": "UpdateQueue", "queue": "q", "options": opts})
        self.model.update(opts)

    @invariant()
    def replicas_agree(self) -> None:
        digest = self.engine.digest()
        assert digest == self.twin.digest()
        assert PartitionEngine.restore(self.engine.snapshot()).digest() == digest


TestLimitsVsModel = LimitsVsModel.TestCase
TestLimitsVsModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# --- dedupe and debounce ------------------------------------------------------------------------

class DedupeVsModel(RuleBasedStateMachine):
    """Adds with ``dedupe``/``debounce`` against a model that keeps each id's entry in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = PartitionEngine(0)
        self.twin = PartitionEngine(0)
        self.now = 0
        self.jobs: dict[int, dict[str, Any]] = {}          # seq -> {data, run_at}
        self.dedupe: dict[str, tuple[int, int]] = {}       # id -> (seq, expires)
        self.debounce: dict[str, tuple[int, int]] = {}     # id -> (seq, first add)

    def apply(self, cmd: dict[str, Any]) -> dict[str, Any]:
        reply = self.engine.apply(cmd, self.now).result
        self.twin.apply(cmd, self.now, replies=False, events=False)
        return reply

    def _state(self, seq: int) -> str:
        job = self.apply({"cmd": "GetJob", "id": f"0-{seq}"})["job"]
        return str(job["state"])

    @rule(key=st.sampled_from(["a", "b"]), ttl=st.sampled_from([300, 1000]), extend=st.booleans(),
          replace=st.booleans(), data=st.integers(0, 99), batch=st.booleans())
    def add_dedupe(self, key: str, ttl: int, extend: bool, replace: bool, data: int, batch: bool) -> None:
        spec = {"id": key, "ttlMs": ttl, "extend": extend, "replace": replace}
        if batch:
            reply = self.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(data), "dedupe": spec}]})
            job_id, deduped = reply["ids"][0], reply.get("deduped") == [0]
        else:
            reply = self.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(data), "dedupe": spec})
            job_id, deduped = reply["id"], bool(reply.get("deduped"))
        seq = int(job_id.split("-")[1])
        entry = self.dedupe.get(key)
        if entry is not None and entry[1] > self.now:
            assert deduped and seq == entry[0]
            if extend:
                self.dedupe[key] = (seq, self.now + ttl)
            if replace and self._state(seq) in ("waiting", "delayed"):
                self.jobs[seq]["data"] = data
        else:
            assert not deduped and seq not in self.jobs
            self.jobs[seq] = {"data": data, "run_at": self.now}
            self.dedupe[key] = (seq, self.now + ttl)

    @rule(key=st.sampled_from(["k", "m"]), delay=st.sampled_from([200, 700]), wait=st.sampled_from([None, 700, 1500]),
          data=st.integers(0, 99))
    def add_debounce(self, key: str, delay: int, wait: int | None, data: int) -> None:
        spec: dict[str, Any] = {"id": key, "delayMs": delay}
        if wait is not None:
            if wait < delay:
                return
            spec["maxWaitMs"] = wait
        reply = self.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(data), "debounce": spec})
        seq = int(reply["id"].split("-")[1])
        entry = self.debounce.get(key)
        if entry is not None and self.jobs[entry[0]]["run_at"] > self.now:  # the burst's job is still delayed
            assert reply.get("deduped") and seq == entry[0]
            run_at = self.now + delay if wait is None else min(self.now + delay, entry[1] + wait)
            self.jobs[seq].update(data=data, run_at=run_at)
        else:
            assert not reply.get("deduped") and seq not in self.jobs
            self.jobs[seq] = {"data": data, "run_at": self.now + (delay if wait is None else min(delay, wait))}
            self.debounce[key] = (seq, self.now)

    @rule(dt=st.sampled_from([100, 300, 800]))
    def advance(self, dt: int) -> None:
        self.now += dt
        self.apply({"cmd": "_Tick"})

    @rule()
    def restart(self) -> None:
        self.engine = PartitionEngine.restore(self.engine.snapshot())

    @invariant()
    def jobs_agree(self) -> None:
        for seq, want in self.jobs.items():
            job = self.engine.apply({"cmd": "GetJob", "id": f"0-{seq}"}, self.now).result["job"]
            assert unpack(job["data"]) == want["data"]
            assert job["runAt"] == want["run_at"]
        assert self.engine.digest() == self.twin.digest()


def unpack(data: Any) -> Any:
    return msgpack.unpackb(data.packed if hasattr(data, "packed") else data, raw=False)


TestDedupeVsModel = DedupeVsModel.TestCase
TestDedupeVsModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
