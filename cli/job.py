"""``shoal job``: one job of a running cluster from the terminal (``get``, ``retry``, ``promote``,
``cancel``).

A job id (``3-17``: partition, then sequence) names its partition, so a job needs no queue
name. The work is :class:`shoal.cluster.queue_admin.QueueAdmin`'s; options and exit codes are
``shoal queue``'s (1 refused, 3 no such job, 4 no node answered).
"""

from __future__ import annotations

from typing import Any

import click

from ._options import cluster_options
from ._remote import compact, connect, job_arg, refusals, show, when

__all__ = ["job_group", "job_lines"]

#: Fields `get` shows first, in this order, with their labels; the rest follow by name.
_FIELDS = (("state", "state"), ("name", "name"), ("data", "data"), ("priority", "priority"),
           ("attempts", "attempts"), ("progress", "progress"), ("createdAt", "created"), ("runAt", "run at"),
           ("startedAt", "started"), ("leaseDeadline", "lease ends"), ("finishedAt", "finished"),
           ("result", "result"), ("error", "error"))
#: Other wire fields holding times (milliseconds since the epoch) end with these; shown as UTC times.
_TIME_SUFFIXES = ("At", "Deadline")


@click.group("job")
def job_group() -> None:
    """One job of a running cluster, by id: show, retry, promote, cancel.

    Local with --data (default ./.shoal), remote with --url. Exits 1 when the cluster refuses, 3
    when there is no such job, 4 when no node answers.
    """


def _value(field: str, value: Any) -> str:
    if field.endswith(_TIME_SUFFIXES):
        return when(value)
    return compact(value, quote=field not in ("state", "name", "error"))


def job_lines(job: dict[str, Any]) -> list[str]:
    """What `get` prints of a job: state, data, attempts, times, result or error, then every other
    field that is set (`--json` shows every field)."""
    rows: list[tuple[str, str]] = []
    for field, label in _FIELDS:
        if job.get(field) is None:
            continue
        if field == "attempts":
            rows.append((label, f"{job['attempts']} of {job.get('maxAttempts', '?')}"))
        else:
            rows.append((label, _value(field, job[field])))
    shown = {f for f, _ in _FIELDS} | {"id", "queue", "maxAttempts"}
    # The rest only where set: bunqueue's job form carries many fields that are mostly empty.
    rows += [(field, _value(field, job[field])) for field in sorted(job)
             if field not in shown and job[field] not in (None, False, 0, "", [], {})]
    width = max((len(label) for label, _ in rows), default=0)
    head = f"job {job.get('id')} of queue {job.get('queue')}"
    return [head] + [f"  {label.ljust(width)}  {text}" for label, text in rows]


@job_group.command("get")
@click.argument("job_id", metavar="ID", callback=job_arg)
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@refusals
def job_get(job_id: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
            key: str | None, as_json: bool) -> None:
    """Show a job: state, data, attempts, times, result or error.

    Exits 3 when there is no such job.
    """
    show(connect(data_dir, url, token, ca, cert, key).job(job_id), as_json, job_lines)


def _action(action: str, summary: str, done: str) -> None:
    """Register ``shoal job <action> ID``: one request, then ``done``."""

    @job_group.command(action, help=summary)
    @click.argument("job_id", metavar="ID", callback=job_arg)
    @cluster_options
    @refusals
    def command(job_id: str, data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
                key: str | None) -> None:
        connect(data_dir, url, token, ca, cert, key).job_action(job_id, action)
        click.echo(f"{done} {job_id}")


_action("retry", "Run a failed (dead-lettered) or completed job again.", "retried")
_action("promote", "Run a delayed job now.", "promoted")
_action("cancel", "Cancel a job. One not active is deleted; an active one ends cancelled (its worker's "
                  "next ack or fail is refused).", "cancelled")
