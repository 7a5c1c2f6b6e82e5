"""Parent/child flows: a parent waits in ``waiting-children`` until each of its children is done.

A flow spans partitions, so no command sees all of it. The engine of each partition
keeps its own part, all replicated:

- ``flow_parents``: seq of a parent job here -> :class:`FlowParent` (how many children it
  waits for, and what each finished child reported, keyed by child id);
- ``flow_children``: seq of a child job here -> ``[parent id, onFailure, notified]``;
- ``flow_outbox``: seq of a finished child here -> the report its parent has not
  acknowledged yet. The leader's forwarder (``shoal.node.flows``) sends these reports as
  ``_ChildDone`` to the parent's partition, and removes them with ``_FlowAcked`` once that
  partition answered; a new leader finds the same outbox and sends again.

``_ChildDone`` is idempotent (keyed by child id): a report the parent already holds
changes nothing. A report for a parent that is gone is answered ``gone`` (and dropped
by the sender). A child's report is final: completed (with its result), failed (out of
attempts, buried) or removed (cancelled, drained, expired), the last two handled by the
child's ``onFailure``: ``fail`` the parent (default), ``ignore`` (the parent proceeds;
the error is kept) or ``remove`` (the dependency is dropped).
"""

from __future__ import annotations

from typing import Any

from shoal.cluster.codec import Raw
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.cluster.flow import ON_FAILURE
from shoal.cluster.jobid import format_job_id, parse_job_id

from ._model import IDEMPOTENCY_WINDOW_MS, Job, Queue
from ._store import Store
from ._transitions import FAILED, NEW, WAITING_CHILDREN, check_transition

__all__ = ["FlowOps", "FlowParent"]

check_transition(NEW, WAITING_CHILDREN)


class FlowParent:
    """What one parent waits for: ``expected`` children and their reports so far."""

    __slots__ = ("expected", "values", "ignored", "removed", "failed", "keys")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.values: dict[str, bytes | None] = {}   # completed child id -> its result (raw MessagePack)
        self.ignored: dict[str, str] = {}            # failed child (onFailure: ignore) -> its error
        self.removed: dict[str, str] = {}            # failed child (onFailure: remove) -> its error
        self.failed: dict[str, str] = {}             # failed child (onFailure: fail) -> its error
        self.keys: dict[str, str] = {}               # child id -> "<queue>:<wire id>" (bunqueue's key)

    def done(self) -> int:
        return len(self.values) + len(self.ignored) + len(self.removed) + len(self.failed)

    def knows(self, child: str) -> bool:
        return child in self.values or child in self.ignored or child in self.removed or child in self.failed

    def to_list(self) -> list[Any]:
        return [self.expected, self.values, self.ignored, self.removed, self.failed, *([self.keys] if self.keys else [])]

    @classmethod
    def from_list(cls, data: list[Any]) -> "FlowParent":
        rec = cls(data[0])
        rec.values, rec.ignored, rec.removed, rec.failed = data[1], data[2], data[3], data[4]
        if len(data) > 5:
            rec.keys = data[5]
        return rec


class FlowOps(Store):
    """Mixin of :class:`~._engine.PartitionEngine` (see its module for the theory of operation)."""

    # --- creating a flow's jobs ----------------------------------------------------------------

    def _op_FlowPush(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Jobs of one queue of a flow (``_items``: job fields plus ``_expect`` = children to
        wait for, ``_parent`` = parent id, ``_onFailure``). An item whose idempotencyKey or
        customId was seen answers the existing id and changes nothing (a re-sent PushFlow)."""
        q = self._queue(cmd["queue"], create=True)
        if q.type == "log":
            raise CommandError(ErrorCode.INVALID, f"queue {q.name!r} is a log queue: it holds no flow jobs")
        items = cmd["_items"]
        fresh = 0
        ahead: dict[str, int] = {}  # group -> its items before this one (groupMaxSize)
        for item in items:  # every check before any change
            if self._duplicate(q, item) is not None:
                continue
            group = item.get("group")
            self._check_push(q, item, extra=fresh, group_ahead=ahead.get(group, 0) if group is not None else 0)
            if group is not None and not item.get("_expect"):
                ahead[group] = ahead.get(group, 0) + 1
            fresh += 1
        ids = []
        for item in items:
            dup = self._duplicate(q, item)
            if dup is not None:
                ids.append(dup)
                continue
            if item.get("_expect"):
                job = self._new_parent(q, item)
            else:
                job = self._new_job(q, item["data"], item)
            parent = item.get("_parent")
            if parent is not None:
                self.flow_children[job.seq] = [parent, item.get("_onFailure") or ON_FAILURE[0], False]
            ids.append(self._id(job))
        self._count(q, "PushFlow")
        return {"ids": ids}

    def _new_parent(self, q: Queue, item: dict[str, Any]) -> Job:
        """A job that waits in ``waiting-children`` (no ready-heap entry, no delay, no TTL)."""
        self.seq = seq = self.seq + 1
        get, opts, now = item.get, q.opts, self.now_ms
        data = item["data"]
        job = Job(seq, q.name, self._keep(data), (get("priority") or 0) if q.preset["priority"] else 0, now)
        job.state = WAITING_CHILDREN
        job.max_attempts = get("attempts") or opts["attempts"]
        backoff = get("backoff")
        job.backoff_ms = opts["backoff"] if backoff is None else backoff
        job.ttr_ms = (get("ttr") if q.preset["ttr"] else None) or opts["ttr"]
        job.group, job.custom_id, job.tag = get("group"), get("customId"), get("tag")
        job.name = get("name")
        if job.custom_id is not None:
            q.custom_ids[job.custom_id] = seq
        key = get("idempotencyKey")
        if key is not None:
            self._remember_key(q.name, key, seq, now + IDEMPOTENCY_WINDOW_MS)  # type: ignore[attr-defined]
        self.jobs[seq] = job
        self.flow_parents[seq] = FlowParent(item["_expect"])
        q.totals["enqueued"] += 1
        q.counts[WAITING_CHILDREN] += 1
        if self._events is not None:
            self._events.append((q.name, seq, WAITING_CHILDREN, None))
        return job

    # --- reports from children -----------------------------------------------------------------

    def _op_ChildDone(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Children's final outcomes for parents here; per report ``ok``, ``dup`` or ``gone``."""
        return {"results": [self._child_report(*report) for report in cmd["_reports"]]}

    def _child_report(self, parent: str, child: str, failed: bool, result: bytes | None, error: str | None,
                      on_failure: str, key: str | None = None) -> str:
        p, seq = parse_job_id(parent)
        rec = self.flow_parents.get(seq) if p == self.partition else None
        job = self.jobs.get(seq) if rec is not None else None
        if job is None or rec is None:
            return "gone"
        if rec.knows(child):
            return "dup"
        text = error or "failed"
        if key is not None:
            rec.keys[child] = key
        if not failed:
            rec.values[child] = result
        elif on_failure == "ignore":
            rec.ignored[child] = text
        elif on_failure == "remove":
            rec.removed[child] = text
        else:
            rec.failed[child] = text
        if job.state == WAITING_CHILDREN:
            q = self.queues[job.queue]
            if rec.failed:
                job.error = f"child {child} failed: {text}"
                self._finish(q, job, FAILED)
            elif rec.done() >= rec.expected:
                self._to_waiting(q, job)
        return "ok"

    def _op_FlowAcked(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The parents' partitions hold these children's reports: stop sending them."""
        outbox = self.flow_outbox
        return {"count": sum(outbox.pop(seq, None) is not None for seq in cmd["_children"])}

    def _flow_child_done(self, job: Job, failed: bool, error: str | None = None) -> None:
        """Hook of the state moves: a child reached its final outcome; queue its report once."""
        link = self.flow_children.get(job.seq)
        if link is None or link[2]:
            return
        link[2] = True
        # The report names the child as bunqueue keys children's values: "<queue>:<its wire id>".
        self.flow_outbox[job.seq] = (link[0], failed, None if failed else job.result,
                                     (error or job.error or "failed") if failed else None, link[1],
                                     f"{job.queue}:{self._wire_id(job)}")

    def _flow_forget(self, job: Job) -> None:
        """Hook of removal: a child removed before it finished reports so; a parent's record goes."""
        if job.seq in self.flow_children:
            self._flow_child_done(job, True, "removed")
            del self.flow_children[job.seq]
        self.flow_parents.pop(job.seq, None)

    # --- reads -----------------------------------------------------------------------------------

    def _op_GetChildrenValues(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job = self._job(cmd["id"])
        rec = self.flow_parents.get(job.seq)
        if rec is None:
            return {"values": {}, "data": {"values": {}}}
        values = {child: None if r is None else Raw(r) for child, r in rec.values.items()}
        # bunqueue's client reads data.values, keyed "<queue>:<child id>" (its flows' own ids)
        keyed = {rec.keys.get(child, child): v for child, v in values.items()}
        out: dict[str, Any] = {"values": values, "data": {"values": keyed}, "expected": rec.expected,
                               "done": rec.done()}
        for name in ("ignored", "removed", "failed"):
            errors = getattr(rec, name)
            if errors:
                out[name] = dict(errors)
        return out

    def flow_wire(self, job: Job, out: dict[str, Any]) -> None:
        """A job's flow fields on the wire: ``parent`` of a child, ``children`` of a parent."""
        link = self.flow_children.get(job.seq)
        if link is not None:
            out["parent"] = link[0]
        rec = self.flow_parents.get(job.seq)
        if rec is not None:
            out["children"] = {"expected": rec.expected, "done": rec.done()}

    # --- snapshot --------------------------------------------------------------------------------

    def flow_state(self) -> list[Any]:
        """The flow tables as plain data (a snapshot's last element)."""
        return [[(seq, rec.to_list()) for seq, rec in self.flow_parents.items()],
                [(seq, list(link)) for seq, link in self.flow_children.items()],
                [(seq, list(report)) for seq, report in self.flow_outbox.items()]]

    def restore_flows(self, state: list[Any]) -> None:
        parents, children, outbox = state
        self.flow_parents = {seq: FlowParent.from_list(rec) for seq, rec in parents}
        self.flow_children = {seq: list(link) for seq, link in children}
        self.flow_outbox = {seq: tuple(report) for seq, report in outbox}  # type: ignore[misc]
