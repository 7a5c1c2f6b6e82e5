"""The batch worker's rules, with no I/O: when a batch is ready, what to pull next, how a batch
settles, and the ``ACKB``/``JobHeartbeatB`` frames that settle and extend it.

A slot of :class:`~shoal.client.batch.BatchWorker` keeps a :class:`BatchCollector`: the jobs it
holds (leased, not yet handed to the handler), never more than ``size``. ``next_pull(now_s)``
says how many jobs to pull and how long a ``PULLB`` may wait, or ``None`` once a batch is
ready: ``min_size`` jobs are held, the collector is full, or ``timeout`` seconds passed since
the batch's first job arrived. ``take(now_s)`` hands the batch over. Time is an argument.

With ``group_affinity`` a batch is one group's (jobs without a group make a group of their
own): the slot pulls one job, then only jobs of that job's group (pulls limited to the group on
the node, ``PULLB`` ``group`` or ``ungrouped``), so it never holds another group's jobs. The
batch waits for at least one such pull, which waits for nothing once ``min_size`` is met or the
``timeout`` passed: a batch takes what of its group is waiting, not just the first job.

:func:`settle_plan` turns a handler's outcome and the per-job marks of a :class:`Batch` into
what to send: acks (with results), fails and releases, and the jobs cancelled meanwhile (for
which nothing is sent).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from shoal.cluster import limits as L
from shoal.cluster.errors import CommandError as WireCommandError
from shoal.cluster.jobid import parse_job_id

from .job import Job

__all__ = ["BatchOptions", "Batch", "BatchCollector", "Pull", "Settlement", "settle_plan", "error_text",
           "ack_frames", "heartbeat_frames", "BATCH_SIZE_MAX", "BATCH_TIMEOUT_S_MAX"]

#: Jobs in one batch: what one ``PULLB`` may lease and one ``ACKB`` may complete.
BATCH_SIZE_MAX = min(L.pull_count_max, L.batch_jobs_max)
#: The longest ``timeout`` a batch may wait for ``min_size`` jobs (the wire's longest long poll).
BATCH_TIMEOUT_S_MAX = 86_400.0


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How a :class:`~shoal.client.batch.BatchWorker` forms batches (bunqueue's ``batch`` option).

    - ``size``: the most jobs in one batch (1..10,000);
    - ``min_size``: hold back a batch until this many jobs came (1..``size``) …
    - ``timeout``: … for at most this many seconds after its first job came, then run it with
      what came; ``None``: wait for ``min_size`` as long as it takes (leases are extended meanwhile);
    - ``group_affinity``: a batch holds jobs of one group only (jobs without a group form a group
      of their own): after a batch's first job, the slot pulls only jobs of its group.
    """

    size: int = 100
    min_size: int = 1
    timeout: float | None = None
    group_affinity: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= BATCH_SIZE_MAX:
            raise ValueError(f"size must be an integer in 1..{BATCH_SIZE_MAX}")
        if isinstance(self.min_size, bool) or not isinstance(self.min_size, int) \
                or not 1 <= self.min_size <= self.size:
            raise ValueError("min_size must be an integer in 1..size")
        if self.timeout is not None and not 0 <= self.timeout <= BATCH_TIMEOUT_S_MAX:
            raise ValueError(f"timeout must be None or in 0..{BATCH_TIMEOUT_S_MAX:g} seconds")


# --- what the handler gets -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Fail:
    error: str
    delay: float | None


@dataclass(frozen=True, slots=True)
class _Retry:
    delay: float


class Batch(Sequence[Job]):
    """The jobs handed to a batch handler, oldest first (a read-only sequence of :class:`Job`).

    ``batch.fail(job, error)`` fails that job alone (retried with the queue's backoff while
    attempts remain, then dead-lettered) and ``batch.retry(job, delay)`` puts it back without a
    failure, while the other jobs complete when the handler returns.
    """

    __slots__ = ("_jobs", "_ids", "_marks")

    def __init__(self, jobs: Iterable[Job]) -> None:
        self._jobs = tuple(jobs)
        self._ids = frozenset(j.id for j in self._jobs)
        if len(self._ids) != len(self._jobs):
            raise ValueError("a batch holds each job once")
        self._marks: dict[str, _Fail | _Retry] = {}

    def __repr__(self) -> str:
        return f"<Batch of {len(self._jobs)} jobs, {len(self._marks)} marked>"

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Job]: ...

    def __getitem__(self, index: int | slice) -> Job | Sequence[Job]:
        return self._jobs[index]

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs)

    @property
    def jobs(self) -> tuple[Job, ...]:
        return self._jobs

    def fail(self, job: Job, error: str | BaseException = "failed", *, delay: float | None = None) -> None:
        """Fail ``job`` alone with ``error`` (a text, or an exception as ``"Type: text"``); ``delay``
        overrides the backoff before its retry."""
        self._check(job)
        if delay is not None and not 0 <= delay <= BATCH_TIMEOUT_S_MAX:
            raise ValueError(f"delay must be in 0..{BATCH_TIMEOUT_S_MAX:g} seconds")
        self._marks[job.id] = _Fail(error_text(error) if isinstance(error, BaseException)
                                    else str(error)[:L.error_chars_max], delay)

    def retry(self, job: Job, delay: float = 0.0) -> None:
        """Put ``job`` back after ``delay`` seconds without counting a failure."""
        self._check(job)
        if not 0 <= delay <= BATCH_TIMEOUT_S_MAX:
            raise ValueError(f"delay must be in 0..{BATCH_TIMEOUT_S_MAX:g} seconds")
        self._marks[job.id] = _Retry(delay)

    def marked(self, job: Job) -> bool:
        """Was ``job`` failed or put back alone?"""
        return job.id in self._marks

    def _check(self, job: Job) -> None:
        if not isinstance(job, Job) or job.id not in self._ids:
            raise ValueError("that job is not in this batch")


def error_text(exc: BaseException) -> str:
    """A handler's exception as a job's error: ``"Type: text"``, within the wire's limit."""
    return f"{type(exc).__name__}: {exc}"[:L.error_chars_max]


# --- collecting a batch ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Pull:
    """Pull up to ``count`` jobs, waiting up to ``wait_s`` seconds for the first; only jobs of
    ``group``, or with ``ungrouped`` only jobs without a group, when set."""

    count: int
    wait_s: float
    group: str | None = None
    ungrouped: bool = False


class BatchCollector:
    """One slot's held jobs and the rule of when they make a batch (see the module docstring)."""

    def __init__(self, options: BatchOptions, poll_s: float) -> None:
        self.options = options
        self.poll_s = max(0.0, poll_s)
        self.held: list[Job] = []
        self._since_s: float | None = None  # when the batch being collected got its first job
        self._topped = False  # group_affinity: a pull of the batch's group came since its first job

    def __len__(self) -> int:
        return len(self.held)

    def add(self, jobs: Iterable[Job], now_s: float) -> None:
        """Hold freshly pulled ``jobs``."""
        before = len(self.held)
        self.held.extend(jobs)
        assert len(self.held) <= self.options.size, "pulled more jobs than the collector asked for"
        if before == 0 and self.held:
            self._since_s = now_s
        elif before:
            self._topped = True  # what :meth:`next_pull` asks for while jobs are held: the group's

    def deadline_s(self) -> float | None:
        """When the batch being collected runs with fewer than ``min_size`` jobs (None: no limit)."""
        if self._since_s is None or self.options.timeout is None:
            return None
        return self._since_s + self.options.timeout

    def ready(self, now_s: float) -> bool:
        """Is a batch ready to :meth:`take`?"""
        if not self.held:
            return False
        if len(self.held) >= self.options.size:
            return True
        return self._due(now_s) and (self._topped or not self.options.group_affinity)

    def _due(self, now_s: float) -> bool:
        """``min_size`` jobs of the batch are held, or its ``timeout`` passed."""
        if len(self._eligible()) >= self.options.min_size:
            return True
        deadline = self.deadline_s()
        return deadline is not None and now_s >= deadline

    def next_pull(self, now_s: float) -> Pull | None:
        """The pull that comes next, or ``None`` when a batch is ready."""
        if self.ready(now_s):
            return None
        count = self.options.size - len(self.held)
        if not self.held:
            return Pull(1 if self.options.group_affinity else count, self.poll_s)
        deadline = self.deadline_s()
        if self._due(now_s):
            wait_s = 0.0  # group_affinity: the one pull of the group's waiting jobs
        elif deadline is None:
            wait_s = self.poll_s
        else:
            wait_s = max(0.0, min(deadline - now_s, self.poll_s))
        if not self.options.group_affinity:
            return Pull(count, wait_s)
        group = self.held[0].group
        return Pull(count, wait_s, group) if group is not None else Pull(count, wait_s, ungrouped=True)

    def take(self, now_s: float) -> list[Job]:
        """The ready batch (oldest first); jobs of other groups (added by hand) stay held."""
        batch = self._eligible()[:self.options.size]
        taken = {id(j) for j in batch}
        self.held = [j for j in self.held if id(j) not in taken]
        self._since_s = now_s if self.held else None  # the held rest start the next batch's wait
        self._topped = False
        return batch

    def _eligible(self) -> list[Job]:
        if not self.options.group_affinity or not self.held:
            return self.held
        group = self.held[0].group
        return [j for j in self.held if j.group == group]


# --- settling a batch --------------------------------------------------------------------------

@dataclass(slots=True)
class Settlement:
    """What to send for one batch: ``acks`` (job, result), ``fails`` (job, error, delay),
    ``releases`` (job, delay); ``cancelled`` jobs were cancelled on the node: nothing is sent."""

    acks: list[tuple[Job, Any]] = field(default_factory=list)
    fails: list[tuple[Job, str, float | None]] = field(default_factory=list)
    releases: list[tuple[Job, float]] = field(default_factory=list)
    cancelled: list[Job] = field(default_factory=list)


def settle_plan(batch: Batch, *, result: Any = None, error: BaseException | None = None,
                retry_delay: float | None = None) -> Settlement:
    """How ``batch`` settles after its handler returned ``result`` or raised ``error``
    (``retry_delay`` set: it raised ``Retry(retry_delay)``).

    A job failed or put back alone keeps that outcome. The others: put back after
    ``retry_delay``, else failed with ``error``, else acked. A ``result`` that is a list or
    tuple of one item per job gives each job its item; any other value is every job's result.
    """
    per_job = isinstance(result, (list, tuple)) and len(result) == len(batch)
    plan = Settlement()
    for i, job in enumerate(batch):
        mark = batch._marks.get(job.id)
        if job.cancelled:
            plan.cancelled.append(job)
        elif isinstance(mark, _Fail):
            plan.fails.append((job, mark.error, mark.delay))
        elif isinstance(mark, _Retry):
            plan.releases.append((job, mark.delay))
        elif retry_delay is not None:
            plan.releases.append((job, retry_delay))
        elif error is not None:
            plan.fails.append((job, error_text(error), None))
        else:
            plan.acks.append((job, result[i] if per_job else result))
    return plan


def _routable(job_id: str) -> bool:
    try:
        parse_job_id(job_id)
    except WireCommandError:
        return False  # a custom id: the node finds its queue's partition
    return True


def _by_queue(jobs: Iterable[tuple[Job, Any]]) -> list[list[tuple[Job, Any]]]:
    """Jobs per queue (one queue lives on one partition, as ``ACKB`` needs), each list in chunks of
    at most ``batch_jobs_max``, a job with a routable id first (it routes the frame)."""
    groups: dict[str, list[tuple[Job, Any]]] = {}
    for item in jobs:
        groups.setdefault(item[0].queue, []).append(item)
    out = []
    for items in groups.values():
        items.sort(key=lambda item: not _routable(item[0].id))  # stable: the rest keep their order
        out += [items[k:k + L.batch_jobs_max] for k in range(0, len(items), L.batch_jobs_max)]
    return out


def _frames(cmd: str, items: Iterable[tuple[Job, Any]],
            fields: dict[str, Any]) -> Iterator[tuple[list[tuple[Job, Any]], dict[str, Any]]]:
    """One ``cmd`` frame (``ids``, ``tokens`` when a job has one, ``fields``) per queue chunk."""
    for chunk in _by_queue(items):
        frame: dict[str, Any] = {"cmd": cmd, "ids": [j.id for j, _ in chunk], **fields}
        if any(j.token is not None for j, _ in chunk):
            frame["tokens"] = [j.token for j, _ in chunk]
        yield chunk, frame


def ack_frames(acks: Iterable[tuple[Job, Any]]) -> list[tuple[list[Job], dict[str, Any]]]:
    """``ACKB`` frames completing ``acks`` (job, result), one per queue (and 10,000 jobs), each with
    its jobs. Results are sent only when one is not ``None`` (a plain ack is the cheapest)."""
    out = []
    for chunk, frame in _frames("ACKB", acks, {}):
        if any(r is not None for _, r in chunk):
            frame["results"] = [r for _, r in chunk]
        out.append(([j for j, _ in chunk], frame))
    return out


def heartbeat_frames(jobs: Iterable[Job], ttr_ms: int) -> list[tuple[list[Job], dict[str, Any]]]:
    """``JobHeartbeatB`` frames extending the leases of ``jobs`` to ``ttr_ms`` from now, one per
    queue (and 10,000 jobs), each with its jobs."""
    return [([j for j, _ in chunk], frame)
            for chunk, frame in _frames("JobHeartbeatB", ((j, None) for j in jobs), {"ttr": ttr_ms})]
