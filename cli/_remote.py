"""What ``shoal queue`` and ``shoal job`` share: finding the cluster, turning its refusals into
exit codes, and printing tables, times and JSON.

Exit codes: 0 done, 1 refused (a bad token, a read-only node, a job in the wrong state, …),
2 bad usage (click's), 3 no such queue or job, 4 no node answered (or an event stream ended).
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

from shoal.cluster import operator
from shoal.cluster.admin_client import AdminError
from shoal.cluster.operator import OperatorError
from shoal.cluster.queue_admin import STREAM_ENDED, QueueAdmin, check_job_id, check_queue

__all__ = ["EXIT_REFUSED", "EXIT_NOT_FOUND", "EXIT_UNREACHABLE", "REQUEST_TIMEOUT_S", "connect", "refusals",
           "queue_arg", "job_arg", "table", "when", "compact", "echo_json", "show"]

EXIT_REFUSED = 1
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
#: A node forwarding a command follows its partition's leadership for up to 30 s before it answers
#: NO_LEADER: wait a little longer than that for any answer.
REQUEST_TIMEOUT_S = 35.0

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def connect(data_dir: str, url: str | None, token: str | None, ca: str | None, cert: str | None,
            key: str | None) -> QueueAdmin:
    """The queues of the cluster at ``url``, else of the local cluster at ``data_dir`` (as ``shoal cluster``)."""
    where = operator.connect(data_dir, url, token, ca, cert, key)
    where.admin.timeout_s = REQUEST_TIMEOUT_S
    return QueueAdmin(where.admin)


def _failure(message: str, code: int) -> click.ClickException:
    exc = click.ClickException(message)
    exc.exit_code = code
    return exc


def _refusal(exc: AdminError) -> click.ClickException:
    """The error exit for ``exc``: what the node said, with a hint where one helps."""
    if exc.code == STREAM_ENDED:
        return _failure(str(exc), EXIT_UNREACHABLE)
    if not exc.status:
        hint = " (trust the nodes' CA with --ca)" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else ""
        return _failure(f"no answer: {exc}{hint}", EXIT_UNREACHABLE)
    if exc.code == "NOT_FOUND":
        return _failure(f"not found: {exc}", EXIT_NOT_FOUND)
    hint = ""
    if exc.code in ("AUTH_REQUIRED", "AUTH_FAILED"):
        hint = " (give a client token of the cluster: --token or $SHOAL_TOKEN)"
    elif exc.code == "READ_ONLY":
        hint = " (the node runs with dashboard_read_only, which refuses queue and job actions over HTTP)"
    return _failure(f"refused (HTTP {exc.status} {exc.code}): {exc}{hint}", EXIT_REFUSED)


def refusals(command: F) -> F:
    """``command`` with the cluster's refusals, and a cluster not found, turned into error exits."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AdminError as exc:
            raise _refusal(exc) from exc
        except OperatorError as exc:
            raise _failure(str(exc), EXIT_UNREACHABLE) from exc
    return run  # type: ignore[return-value]


def queue_arg(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """Click callback: a valid queue name, else a usage error before any request."""
    try:
        return check_queue(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def job_arg(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """Click callback: a job id like ``3-17``, else a usage error before any request."""
    try:
        return check_job_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()) -> list[str]:
    """``rows`` under ``headers`` in columns two spaces apart; the columns in ``right`` right-aligned."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = set(right)
    out = []
    for r in cells:
        out.append("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                   .rstrip())
    return out


def when(ms: Any) -> str:
    """A wire time (milliseconds since the epoch) as ``2026-11-30 12:09:35.122Z``; ``-`` when unset."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0:
        return "-"
    try:
        t = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def compact(value: Any, width: int | None = None, *, quote: bool = True) -> str:
    """``value`` as one line of JSON (a string unquoted with ``quote=False``), cut to ``width``
    characters with ``…``."""
    if isinstance(value, str) and not quote:
        text = " ".join(value.split())
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    if width is not None and len(text) > width:
        return text[:max(0, width - 1)] + "…"
    return text


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))


def show(value: T, as_json: bool, lines: Callable[[T], list[str]]) -> None:
    """Print ``value`` as JSON, or as the lines ``lines`` makes of it."""
    if as_json:
        echo_json(value)
        return
    for line in lines(value):
        click.echo(line)
