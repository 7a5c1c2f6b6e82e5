"""``shoal queue``: a running cluster's queues from the terminal (``ls``, ``show``, ``pause``,
``resume``, ``drain``, ``dlq``, ``retry-dlq``, ``purge-dlq``, ``events``).

The work is :class:`shoal.cluster.queue_admin.QueueAdmin`'s, over any node's HTTP API; these
commands find the cluster as ``shoal cluster`` does (``--url``, ``--token``, ``--ca``, or the
local cluster at ``--data``), print a table (or ``--json``) and exit 1 when refused, 3 when the
queue does not exist, 4 when no node answered.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import click

from shoal.cluster.admin_client import AdminError
from shoal.cluster.queue_admin import DLQ_LIMIT_MAX, STREAM_ENDED

from ._options import cluster_options
from ._remote import compact, connect, echo_json, queue_arg, refusals, show, table, when

#: ``shoal queue events`` opens an ended stream again this many times in a row before it fails.
EVENTS_REOPEN_MAX = 5
#: Seconds before the n-th reopening in a row: n times this.
EVENTS_REOPEN_PAUSE_S = 0.5

__all__ = ["queue_group", "queue_rows", "queue_lines", "dlq_rows", "event_line"]

#: Counts shown by `ls` (the failed state is the dead-letter queue).
_COUNTS = ("waiting", "delayed", "active", "completed", "failed")
#: `ls` rate columns: header -> the overview's rate name (jobs per second over the last 5 s).
_RATES = {"ADDED/S": "enqueued", "DONE/S": "completed", "FAILED/S": "failed"}
#: The widest error and data shown in a `dlq` table (`--json` shows them whole).
_CELL_CHARS_MAX = 60
#: Events `events --count` takes at most.
EVENTS_COUNT_MAX = 1_000_000


@click.group("queue")
def queue_group() -> None:
    """Queues of a running cluster: counts, pause, drain, dead letters, events.

    Local with --data (default ./.shoal), remote with --url. Exits 1 when the cluster refuses, 3
    when the queue does not exist, 4 when no node answers.
    """


# --- formatting (pure) ---------------------------------------------------------------------------

def queue_rows(queues: list[dict[str, Any]]) -> list[str]:
    """The `ls` table: one row per queue with its partition, paused flag, counts and rates."""
    headers = ["QUEUE", "PARTITION", "PAUSED", *(s.upper() for s in _COUNTS), *_RATES]
    rows = []
    for q in queues:
        counts, rates = q.get("counts") or {}, q.get("rates") or {}
        rows.append([q["name"], q.get("partition", "-"), "yes" if q.get("paused") else "no",
                     *(counts.get(s, 0) for s in _COUNTS),
                     *(f"{float(rates.get(r, 0.0)):.1f}" for r in _RATES.values())])
    return table(headers, rows, right=range(1, len(headers)))


def _pairs(values: dict[str, Any], unit: str = "") -> str:
    return "  ".join(f"{k} {v}{unit}" for k, v in values.items()) or "-"


def queue_lines(q: dict[str, Any]) -> list[str]:
    """What `show` prints of one queue."""
    state = "paused" if q.get("paused") else "running"
    out = [f"queue {q['name']}: {q.get('type', '?')}, {state}, durability {q.get('durability', '?')}",
           f"  counts   {_pairs(q.get('counts') or {})}",
           f"  totals   {_pairs(q.get('totals') or {})}",
           f"  rates    {_pairs({k: f'{float(v):.1f}' for k, v in (q.get('rates') or {}).items()}, '/s')}",
           f"  calls    {_pairs(q.get('calls') or {})}",
           f"  options  {_pairs({k: compact(v) for k, v in (q.get('options') or {}).items()})}"]
    if "logRecords" in q:
        out.append(f"  log      {q['logRecords']} records, next seq {q.get('nextSeq')}")
    return out


def dlq_rows(jobs: list[dict[str, Any]]) -> list[str]:
    """The `dlq` table: id, attempts, when it failed, its last error and data (both cut short)."""
    rows = [[j.get("id"), f"{j.get('attempts', 0)}/{j.get('maxAttempts', '?')}", when(j.get("finishedAt")),
             compact(j.get("error"), _CELL_CHARS_MAX, quote=False) if j.get("error") is not None else "-",
             compact(j.get("data"), _CELL_CHARS_MAX)] for j in jobs]
    return table(["ID", "ATTEMPTS", "FAILED AT", "ERROR", "DATA"], rows)


def event_line(name: str, event: dict[str, Any], now: datetime.datetime | None = None) -> str:
    """One event as a line: the time it was received, the job and its change."""
    stamp = (now or datetime.datetime.now()).strftime("%H:%M:%S.%f")[:-3]
    if name == "job":
        return f"{stamp}  {event.get('id')}  {event.get('prev') or 'new'} -> {event.get('state')}"
    if name == "progress":
        return f"{stamp}  {event.get('id')}  progress {compact(event.get('progress'))}"
    return f"{stamp}  {name} {compact(event)}"


# --- commands -----------------------------------------------------------------------------------

@queue_group.command("ls")
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of the queues instead of a table.")
@refusals
def queue_ls(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
             key: str | None, as_json: bool) -> None:
    """List every queue with its counts and rates.

    One row per queue: its partition, whether it is paused, its jobs by state and its rates.
    Counts come from each queue's partition leader as of now; rates are jobs per second added,
    completed and failed over the last five seconds. FAILED is the dead-letter queue.
    """
    rows, warnings = connect(data_dir, url, token, ca, cert, key).queues()
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    show(rows, as_json, lambda found: queue_rows(found) if found else ["no queues"])


@queue_group.command("show")
@click.argument("name", callback=queue_arg)
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print the queue as JSON.")
@refusals
def queue_show(name: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
               key: str | None, as_json: bool) -> None:
    """Show a queue's counts, totals, rates and options.

    Also its type, whether it is paused, its durability class and its calls by command.
    """
    show(connect(data_dir, url, token, ca, cert, key).queue(name), as_json, queue_lines)


def _action(action: str, summary: str, done: str, confirm: str | None = None) -> None:
    """Register ``shoal queue <action> NAME``: one request, then ``done`` (with the count when the node gives one)."""

    @queue_group.command(action, help=summary + (" Asks first unless --yes." if confirm else ""))
    @click.argument("name", callback=queue_arg)
    @cluster_options
    @refusals
    def command(name: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
                key: str | None, yes: bool = False) -> None:
        if confirm and not yes:
            click.confirm(confirm.format(name=name), abort=True)
        count = connect(data_dir, url, token, ca, cert, key).act(name, action)
        click.echo(done.format(name=name) + (f": {count} job(s)" if count is not None else ""))

    if confirm:
        click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(command)


_action("pause", "Pause a queue. Pulls wait until it is resumed; new jobs are still accepted.", "paused {name}")
_action("resume", "Resume a paused queue.", "resumed {name}")
_action("drain", "Remove a queue's waiting and delayed jobs. Active jobs finish.", "drained {name}",
        confirm="Remove every waiting and delayed job of {name}?")
_action("retry-dlq", "Retry a queue's dead-lettered jobs. Each goes back to waiting, its attempts reset.",
        "retried the dead-letter queue of {name}")
_action("purge-dlq", "Delete a queue's dead-lettered jobs.", "purged the dead-letter queue of {name}",
        confirm="Delete every dead-lettered job of {name}?")


@queue_group.command("dlq")
@click.argument("name", callback=queue_arg)
@cluster_options
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, DLQ_LIMIT_MAX),
              help="List at most this many jobs (oldest id first).")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON array.")
@refusals
def queue_dlq(name: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
              key: str | None, limit: int, as_json: bool) -> None:
    """List a queue's dead-lettered jobs.

    Its failed jobs, oldest id first, with their attempts, when they failed, their last error and data.
    """
    jobs, total = connect(data_dir, url, token, ca, cert, key).dlq(name, limit)
    if as_json:
        echo_json(jobs)
        return
    if not jobs:
        click.echo(f"the dead-letter queue of {name} is empty")
        return
    for line in dlq_rows(jobs):
        click.echo(line)
    click.echo(f"{len(jobs)} of {total} dead-lettered job(s)")


@queue_group.command("events")
@click.argument("name", callback=queue_arg)
@cluster_options
@click.option("--count", type=click.IntRange(1, EVENTS_COUNT_MAX), default=None,
              help="Stop after this many events.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 86_400), default=None,
              help="Stop after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print each event as one line of JSON.")
@refusals
def queue_events(name: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
                 key: str | None, count: int | None, timeout_s: float | None, as_json: bool) -> None:
    """Print a queue's job events as they happen.

    One line per change of a job's state (added, pulled, completed, failed, …) or progress.
    Runs until --count events, --timeout seconds or Ctrl-C, then exits 0.
    """
    admin = connect(data_dir, url, token, ca, cert, key)
    deadline = time.monotonic() + timeout_s if timeout_s is not None else None
    seen = 0
    reopened = 0  # in a row, without an event between: a stream that keeps ending is an error
    try:
        while count is None or seen < count:
            try:
                with admin.events(name) as tail:
                    while count is None or seen < count:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            return
                        got = tail.next(left)
                        if got is None:
                            continue
                        reopened = 0
                        event_name, event = got
                        if event_name == "lost":
                            click.echo(f"warning: {event.get('count')} event(s) lost: this reader fell behind", err=True)
                            continue
                        seen += 1
                        click.echo(compact({"event": event_name, **event}) if as_json else event_line(event_name, event))
            except AdminError as exc:
                # The queue's leader moved (the node ends its streams then) or the link broke: open
                # the stream again, through the same node, a few times before giving up.
                if exc.code != STREAM_ENDED or reopened >= EVENTS_REOPEN_MAX:
                    raise
                reopened += 1
                click.echo(f"warning: {exc}; reopening the stream (events meanwhile are not shown)", err=True)
                pause = min(EVENTS_REOPEN_PAUSE_S * reopened,
                            max(0.0, deadline - time.monotonic()) if deadline is not None else 60.0)
                time.sleep(pause)  # a new leader is elected within a few seconds
    except KeyboardInterrupt:
        pass  # Ctrl-C is how an unbounded tail ends
