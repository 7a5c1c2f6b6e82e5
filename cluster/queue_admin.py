"""A running cluster's queues and jobs over a node's HTTP API: what ``shoal queue …`` and
``shoal job …`` do (the commands are :mod:`shoal.cli.queue`'s and :mod:`shoal.cli.job`'s).

Every call is one request, through :class:`~.admin_client.AdminClient`, to an endpoint the
dashboard uses (``node/openapi.yaml``): any node answers, and a request for a partition it does
not lead is forwarded to the leader. Refusals arrive as :class:`~.admin_client.AdminError` with
the node's error code (``NOT_FOUND``, ``AUTH_FAILED``, ``READ_ONLY``, …) and HTTP status, and a
node that does not answer as one with status 0.

- :meth:`QueueAdmin.queues`: every queue with its counts, totals and rates (``GET /cluster``,
  each queue as its partition's leader reports it);
- :meth:`QueueAdmin.queue`, :meth:`QueueAdmin.act` (pause, resume, drain, retry or purge the
  dead-letter queue), :meth:`QueueAdmin.dlq` (its jobs, paged);
- :meth:`QueueAdmin.job`, :meth:`QueueAdmin.job_action` (retry, promote, cancel);
- :meth:`QueueAdmin.events`: a queue's job events (``GET /events?queue=``) as an
  :class:`EventTail`, whose every wait is bounded by its caller.
"""

from __future__ import annotations

import json
import queue as queues_
import threading
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import Any

from .admin_client import AdminClient, AdminError
from .commands import validate
from .errors import CommandError
from .jobid import parse_job_id

__all__ = ["QueueAdmin", "EventTail", "QUEUE_ACTIONS", "JOB_ACTIONS", "DLQ_LIMIT_MAX", "OVERVIEW_QUEUES_PER_NODE_MAX", "STREAM_ENDED",
           "check_queue", "check_job_id", "parse_sse"]

#: ``shoal queue <action>`` -> the path under ``/queues/{queue}/`` that runs it.
QUEUE_ACTIONS = {"pause": "pause", "resume": "resume", "drain": "drain", "retry-dlq": "dlq/retry",
                 "purge-dlq": "dlq/purge"}
#: ``shoal job <action>`` -> (method, path under ``/jobs/{id}``).
JOB_ACTIONS = {"retry": ("POST", "/retry"), "promote": ("POST", "/promote"), "cancel": ("DELETE", "")}
#: The overview lists at most this many queues of one node (the dashboard's ``OVERVIEW_QUEUES_MAX``).
OVERVIEW_QUEUES_PER_NODE_MAX = 500
#: Jobs one ``GET /queues/{queue}/list`` returns at most (the endpoint's ``LIST_LIMIT_MAX``).
LIST_PAGE_MAX = 200
#: Dead-lettered jobs one :meth:`QueueAdmin.dlq` lists at most.
DLQ_LIMIT_MAX = 10_000
#: A node says ``: keep-alive`` on an idle event stream every 15 s: three missed, the link is dead.
STREAM_IDLE_S = 45.0
#: The longest line of an event stream (an event is one line of JSON).
EVENT_LINE_BYTES_MAX = 1024 * 1024
#: Events read ahead of a slow caller; past it the reader waits (and the node counts lost events).
EVENTS_BUFFERED_MAX = 1_000
#: The code of the AdminError an :class:`EventTail` ends with once its stream was open.
STREAM_ENDED = "STREAM_ENDED"
#: How often a reader blocked on a full buffer checks whether it was closed.
_PUT_POLL_S = 0.5


def check_queue(name: str) -> str:
    """``name`` when it is a valid queue name; ValueError saying why not (before any request)."""
    try:
        validate({"cmd": "Count", "queue": name})
    except CommandError as exc:
        raise ValueError(str(exc)) from exc
    return name


def check_job_id(job_id: str) -> str:
    """``job_id`` when it is a job id like ``3-17``; ValueError otherwise."""
    try:
        parse_job_id(job_id)
    except CommandError as exc:
        raise ValueError(str(exc)) from exc
    return job_id


def _q(name: str) -> str:
    return urllib.parse.quote(check_queue(name), safe="")


class QueueAdmin:
    """Queue and job operations of the cluster that ``admin``'s node belongs to."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin

    def queues(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every queue (by name) with ``partition, type, paused, counts, totals, rates, reportedBy``,
        and warnings: nodes that did not answer, and a list that may be cut at the overview's cap."""
        doc = self.admin.call("GET", "/cluster")
        found = doc.get("queues") or {}
        rows = [{"name": name, **{k: v for k, v in q.items() if k != "history"}} for name, q in sorted(found.items())]
        warnings = [f"node {n.get('nodeId')} did not answer ({n.get('error') or 'unreachable'}): "
                    "queues only it reports are missing" for n in doc.get("nodes", ()) if not n.get("reachable")]
        if len(rows) >= OVERVIEW_QUEUES_PER_NODE_MAX:  # some node may hold more than its view shows
            warnings.append(f"each node lists at most {OVERVIEW_QUEUES_PER_NODE_MAX} queues (the first by name): "
                            "more may exist (`shoal queue show NAME` reads any one)")
        return rows, warnings

    def queue(self, name: str) -> dict[str, Any]:
        """``name``'s type, paused flag, counts, totals, calls, options and rates (``Metrics``)."""
        doc = self.admin.call("GET", f"/queues/{_q(name)}")
        return {"name": name, **doc.get("metrics", {}), "rates": doc.get("rates", {})}

    def act(self, name: str, action: str) -> int | None:
        """Run one of :data:`QUEUE_ACTIONS` on ``name``; the number of jobs it changed, when the node says.

        Only on a queue that exists (AdminError ``NOT_FOUND`` otherwise): the engine creates a queue
        a command names, and a misspelt name must not leave a new, paused queue behind.
        """
        self.queue(name)
        doc = self.admin.call("POST", f"/queues/{_q(name)}/{QUEUE_ACTIONS[action]}")
        count = doc.get("count")
        return int(count) if isinstance(count, int) else None

    def dlq(self, name: str, limit: int = 100) -> tuple[list[dict[str, Any]], int]:
        """The first ``limit`` (at most :data:`DLQ_LIMIT_MAX`) dead-lettered jobs of ``name`` in id
        order, and how many there are; AdminError ``NOT_FOUND`` when there is no such queue."""
        if not 1 <= limit <= DLQ_LIMIT_MAX:
            raise ValueError(f"limit: must be 1..{DLQ_LIMIT_MAX}")
        jobs: list[dict[str, Any]] = []
        total = 0
        for _ in range(-(-limit // LIST_PAGE_MAX)):
            page = min(LIST_PAGE_MAX, limit - len(jobs))
            doc = self.admin.call("GET", f"/queues/{_q(name)}/list?state=failed&offset={len(jobs)}&limit={page}")
            got, total = list(doc.get("jobs") or ()), int(doc.get("total") or 0)
            jobs += got
            if len(got) < page or len(jobs) >= total:
                break
        if not jobs:
            self.queue(name)  # an empty list also answers a queue that does not exist
        return jobs, total

    def job(self, job_id: str) -> dict[str, Any]:
        """The job ``job_id`` (``GetJob``): AdminError ``NOT_FOUND`` when there is none."""
        job = self.admin.call("GET", f"/jobs/{check_job_id(job_id)}").get("job")
        if not isinstance(job, dict):
            raise AdminError(f"no job {job_id}", "NOT_FOUND", 404)
        return job

    def job_action(self, job_id: str, action: str) -> dict[str, Any]:
        """Run one of :data:`JOB_ACTIONS` on ``job_id``: retry (a failed or completed job), promote
        (a delayed one), cancel (delete a job not active; an active one ends cancelled)."""
        method, suffix = JOB_ACTIONS[action]
        return self.admin.call(method, f"/jobs/{check_job_id(job_id)}{suffix}")

    def events(self, name: str) -> "EventTail":
        """``name``'s job events from now on; close the tail when done."""
        return EventTail(self.admin, f"/events?queue={_q(name)}")


def parse_sse(lines: Iterable[bytes]) -> Iterator[tuple[str, str]]:
    """``(event name, data)`` of each event of a Server-Sent Events stream (comments, ``id`` and
    ``retry`` skipped; several ``data`` lines joined by newlines, as EventSource does)."""
    name, data = "message", []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)


def _lines(response: Any, stop: threading.Event) -> Iterator[bytes]:
    """The lines of ``response`` until it ends or ``stop`` is set (seen at each line, keep-alives too)."""
    while not stop.is_set():
        line = response.readline(EVENT_LINE_BYTES_MAX + 1)
        if not line:
            return
        if len(line) > EVENT_LINE_BYTES_MAX:
            raise ValueError(f"a line of the event stream is over {EVENT_LINE_BYTES_MAX} bytes")
        yield line


class EventTail:
    """A queue's event stream read by a thread of its own, so that a wait for the next event is
    bounded by the caller's deadline, not by when the node next writes.

    The thread connects, reads and decodes; :meth:`next` hands its events over.
    :meth:`close` tells it to stop: it does at the next line the node sends (an idle stream
    gets one every 15 s), and being a daemon it never holds up the process's exit.
    """

    def __init__(self, admin: AdminClient, path: str) -> None:
        self._items: queues_.Queue[tuple[str, dict[str, Any]] | AdminError] = queues_.Queue(EVENTS_BUFFERED_MAX)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(admin, path), daemon=True, name="shoal-events")
        self._thread.start()

    def __enter__(self) -> "EventTail":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next(self, timeout_s: float | None) -> tuple[str, dict[str, Any]] | None:
        """The next ``(event name, data)``; None when none came within ``timeout_s`` (None: wait
        for one). AdminError when the stream could not be opened, broke or ended."""
        try:
            item = self._items.get(timeout=timeout_s)
        except queues_.Empty:
            return None
        if isinstance(item, AdminError):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()

    def _put(self, item: tuple[str, dict[str, Any]] | AdminError) -> bool:
        while not self._stop.is_set():
            try:
                self._items.put(item, timeout=_PUT_POLL_S)
                return True
            except queues_.Full:
                continue
        return False

    def _read(self, admin: AdminClient, path: str) -> None:
        try:
            response = admin.stream(path, STREAM_IDLE_S)
        except AdminError as exc:
            self._put(exc)
            return
        try:
            with response:
                for name, text in parse_sse(_lines(response, self._stop)):
                    data = json.loads(text)
                    if not self._put((name, data if isinstance(data, dict) else {"data": data})):
                        return
                if self._stop.is_set():
                    return
        except (OSError, ValueError) as exc:  # a timeout (no keep-alive), a reset, a bad line
            self._put(AdminError(f"{admin.base_url}: the event stream broke: {exc}", STREAM_ENDED))
            return
        self._put(AdminError(f"{admin.base_url}: the node closed the event stream (a new leader, or it stopped)",
                             STREAM_ENDED))
