"""`shoal queue` and `shoal job` without a cluster: argument checks, exit codes, the tables and
lines they print, the event-stream decoder. (Against real clusters: tests/integration/test_cli_queue_cluster.py.)"""

from __future__ import annotations

import datetime
import io
import socket
import threading
import time
from typing import Any

import click
import pytest
from click.testing import CliRunner

from shoal.cli import main
from shoal.cli._remote import EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNREACHABLE, _refusal, compact, table, when
from shoal.cli.job import job_lines
from shoal.cli.queue import dlq_rows, event_line, queue_lines, queue_rows
from shoal.cluster.admin_client import AdminError
from shoal.cluster.queue_admin import DLQ_LIMIT_MAX, EventTail, parse_sse


def invoke(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, list(args), input=input, env={"SHOAL_ADMIN_URL": None, "SHOAL_TOKEN": None})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- arguments ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, complaint", [
    (("queue", "show", "bad/name"), "queue: must be 1..256 characters"),
    (("queue", "pause", "x" * 257), "queue: must be 1..256 characters"),
    (("job", "get", "3-x"), "is not a job id like '3-17'"),
    (("job", "cancel", "../admin"), "is not a job id"),
    (("queue", "dlq", "q", "--limit", str(DLQ_LIMIT_MAX + 1)), "--limit"),
    (("queue", "events", "q", "--count", "0"), "--count"),
    (("queue", "events", "q", "--timeout", "0"), "--timeout"),
])
def test_bad_arguments_are_usage_errors_before_any_request(args: tuple[str, ...], complaint: str) -> None:
    result = invoke(*args, "--url", f"http://127.0.0.1:{closed_port()}")
    assert result.exit_code == 2, result.output
    assert complaint in result.output


def test_every_command_takes_the_cluster_commands_options() -> None:
    def options(*path: str) -> set[str]:
        command: Any = main
        ctx = click.Context(main)
        for name in path:
            command = command.get_command(ctx, name)
        return {opt for p in command.params for opt in p.opts}

    shared = {"--data", "--url", "--token", "--ca", "--cert", "--key"}
    assert shared <= options("cluster", "add-node")
    for path in (("queue", "ls"), ("queue", "show"), ("queue", "drain"), ("queue", "events"), ("job", "get"),
                 ("job", "retry")):
        assert shared <= options(*path), path
    assert "--yes" in options("queue", "purge-dlq") and "--yes" not in options("queue", "pause")


def test_a_node_that_does_not_answer_exits_4() -> None:
    result = invoke("queue", "ls", "--url", f"http://127.0.0.1:{closed_port()}")
    assert result.exit_code == EXIT_UNREACHABLE and "no answer" in result.output


def test_no_local_cluster_exits_4_saying_where_it_looked(tmp_path: Any) -> None:
    result = invoke("job", "get", "1-1", "--data", str(tmp_path))
    assert result.exit_code == EXIT_UNREACHABLE and "no cluster at" in result.output


def test_drain_asks_first_and_stops_on_no() -> None:
    result = invoke("queue", "drain", "q", "--url", f"http://127.0.0.1:{closed_port()}", input="n\n")
    assert "Remove every waiting and delayed job of q?" in result.output
    assert result.exit_code == 1 and "no answer" not in result.output  # stopped before any request


@pytest.mark.parametrize("error, code, words", [
    (AdminError("no job 1-9", "NOT_FOUND", 404), EXIT_NOT_FOUND, "not found: no job 1-9"),
    (AdminError("send Authorization", "AUTH_REQUIRED", 401), EXIT_REFUSED, "--token or $SHOAL_TOKEN"),
    (AdminError("invalid token", "AUTH_FAILED", 403), EXIT_REFUSED, "HTTP 403 AUTH_FAILED"),
    (AdminError("read-only", "READ_ONLY", 403), EXIT_REFUSED, "dashboard_read_only"),
    (AdminError("job 1-1 is waiting", "INVALID_STATE", 409), EXIT_REFUSED, "HTTP 409 INVALID_STATE"),
    (AdminError("http://h:1: connection refused"), EXIT_UNREACHABLE, "no answer: http://h:1"),
    (AdminError("https://h:1: [SSL: CERTIFICATE_VERIFY_FAILED]"), EXIT_UNREACHABLE, "with --ca"),
])
def test_refusals_become_exit_codes(error: AdminError, code: int, words: str) -> None:
    exc = _refusal(error)
    assert exc.exit_code == code and words in exc.message


# --- output ---------------------------------------------------------------------------------------

def test_table_aligns_columns() -> None:
    assert table(["A", "NUMBER"], [["long-name", 1], ["b", 1234]], right=[1]) == [
        "A          NUMBER",
        "long-name       1",
        "b            1234"]


def test_times_are_utc_with_milliseconds() -> None:
    assert when(1_796_189_375_122.0) == "2026-12-02 05:29:35.122Z"
    assert when(None) == when(0) == when("x") == when(True) == "-"
    assert when(1e300) == "1e+300"


def test_compact_cuts_long_values() -> None:
    assert compact({"a": [1, 2]}) == '{"a":[1,2]}'
    assert compact("x" * 10, 5) == '"xxx…'
    assert compact("two\nlines", quote=False) == "two lines"


QUEUE = {"name": "emails", "partition": 3, "paused": True, "type": "standard",
         "counts": {"waiting": 12, "delayed": 0, "active": 1, "completed": 250, "failed": 2},
         "rates": {"enqueued": 4.25, "completed": 3.0, "failed": 0.0}}


def test_ls_table_has_a_row_per_queue() -> None:
    lines = queue_rows([QUEUE, {"name": "q2", "counts": {}, "rates": {}}])
    assert lines[0].split() == ["QUEUE", "PARTITION", "PAUSED", "WAITING", "DELAYED", "ACTIVE", "COMPLETED",
                                "FAILED", "ADDED/S", "DONE/S", "FAILED/S"]
    assert lines[1].split() == ["emails", "3", "yes", "12", "0", "1", "250", "2", "4.2", "3.0", "0.0"]
    assert lines[2].split() == ["q2", "-", "no", "0", "0", "0", "0", "0", "0.0", "0.0", "0.0"]


def test_show_lists_counts_rates_and_options() -> None:
    lines = queue_lines({**QUEUE, "durability": "fsync", "totals": {"enqueued": 265}, "calls": {"PUSH": 265},
                         "options": {"ttr": 30000, "durable": True}})
    assert lines[0] == "queue emails: standard, paused, durability fsync"
    assert "waiting 12" in lines[1] and "enqueued 4.2/s" in lines[3] and "durable true" in lines[5]


def test_dlq_table_shows_the_last_error_plainly() -> None:
    jobs = [{"id": "3-7", "attempts": 3, "maxAttempts": 3, "finishedAt": 1_796_189_375_122, "error": "smtp: 550",
             "data": {"to": "a" * 100}}]
    header, row = dlq_rows(jobs)
    assert header.split() == ["ID", "ATTEMPTS", "FAILED", "AT", "ERROR", "DATA"]
    assert row.startswith("3-7  3/3       2026-12-02 05:29:35.122Z  smtp: 550  {")
    assert row.endswith("…") and len(row) < 150


def test_job_lines_show_times_and_skip_unset_fields() -> None:
    job = {"id": "3-17", "queue": "emails", "state": "failed", "name": "send", "data": {"to": "a"},
           "priority": 0, "attempts": 3, "maxAttempts": 3, "createdAt": 1_796_189_375_122.0, "startedAt": None,
           "error": "timeout", "failedAt": 1_796_189_375_500.0, "lifo": False, "tags": [], "group": "tenant-a"}
    lines = job_lines(job)
    assert lines[0] == "job 3-17 of queue emails"
    fields = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert fields == {"state": "failed", "name": "send", "data": '{"to":"a"}', "priority": "0",
                      "attempts": "3 of 3", "created": "2026-12-02 05:29:35.122Z", "error": "timeout",
                      "failedAt": "2026-12-02 05:29:35.500Z", "group": '"tenant-a"'}


def test_event_lines() -> None:
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, 678_000)
    added = event_line("job", {"id": "3-1", "prev": None, "state": "waiting"}, now)
    assert added == "03:04:05.678  3-1  new -> waiting"
    done = event_line("job", {"id": "3-1", "prev": "active", "state": "completed"}, now)
    assert done.endswith("active -> completed")
    assert event_line("progress", {"id": "3-1", "progress": 50}, now).endswith("3-1  progress 50")


# --- the event stream -----------------------------------------------------------------------------

def test_parse_sse_follows_the_event_stream_format() -> None:
    stream = [b"retry: 2000\n", b": connected to n2\n", b"\n", b"id: 1\n", b"event: job\n", b'data: {"id":"3-1"}\n',
              b"\n", b": keep-alive\n", b"\n", b"data: one\r\n", b"data:two\n", b"\n", b"event: lost\n", b"data: 3\n"]
    # The last event is unfinished (no blank line after it): not an event yet.
    assert list(parse_sse(stream)) == [("job", '{"id":"3-1"}'), ("message", "one\ntwo")]


class _Stream:
    """What :meth:`AdminClient.stream` returns, with fixed bytes."""

    def __init__(self, body: bytes) -> None:
        self.body = io.BytesIO(body)

    def readline(self, limit: int) -> bytes:
        return self.body.readline(limit)

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.body.close()


class _Admin:
    base_url = "http://node:1"

    def __init__(self, body: bytes | AdminError) -> None:
        self.body = body

    def stream(self, path: str, idle_s: float) -> _Stream:
        if isinstance(self.body, AdminError):
            raise self.body
        return _Stream(self.body)


def test_event_tail_hands_over_events_then_says_the_stream_ended() -> None:
    body = b': hi\n\nevent: job\ndata: {"id": "3-1", "state": "waiting"}\n\nevent: lost\ndata: {"count": 2}\n\n'
    with EventTail(_Admin(body), "/events?queue=q") as tail:  # type: ignore[arg-type]
        assert tail.next(5.0) == ("job", {"id": "3-1", "state": "waiting"})
        assert tail.next(5.0) == ("lost", {"count": 2})
        with pytest.raises(AdminError, match="closed the event stream") as ended:
            tail.next(5.0)
    assert _refusal(ended.value).exit_code == EXIT_UNREACHABLE
    assert _refusal(ended.value).message.startswith("http://node:1: the node closed the event stream")


def test_event_tail_reports_a_refusal_and_a_bad_line() -> None:
    with EventTail(_Admin(AdminError("no", "AUTH_FAILED", 403)), "/events") as tail:  # type: ignore[arg-type]
        with pytest.raises(AdminError, match="no"):
            tail.next(5.0)
    with EventTail(_Admin(b"data: {not json\n\n"), "/events") as tail:  # type: ignore[arg-type]
        with pytest.raises(AdminError, match="broke"):
            tail.next(5.0)


def test_event_tail_waits_no_longer_than_asked() -> None:
    release = threading.Event()

    class Slow(_Admin):
        def stream(self, path: str, idle_s: float) -> _Stream:
            release.wait(10.0)  # a node slow to answer
            return _Stream(b"")

    try:
        with EventTail(Slow(b""), "/events") as tail:  # type: ignore[arg-type]
            started = time.monotonic()
            assert tail.next(0.05) is None
            assert time.monotonic() - started < 1.0
    finally:
        release.set()


class _Streams:
    """A cluster whose event streams end after the bodies given, one body per opening."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies, self.opened = bodies, 0

    def events(self, name: str) -> EventTail:
        body = self.bodies[min(self.opened, len(self.bodies) - 1)]
        self.opened += 1
        return EventTail(_Admin(body), f"/events?queue={name}")  # type: ignore[arg-type]


def test_events_reopens_a_stream_the_node_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    import shoal.cli.queue as cli_queue

    streams = _Streams([b'event: job\ndata: {"id": "3-1", "state": "waiting"}\n\n',
                        b'event: job\ndata: {"id": "3-2", "state": "active"}\n\n'])
    monkeypatch.setattr(cli_queue, "connect", lambda *args: streams)
    monkeypatch.setattr(cli_queue, "EVENTS_REOPEN_PAUSE_S", 0.01)
    result = invoke("queue", "events", "q", "--count", "2", "--json")
    assert result.exit_code == 0, result.output
    assert '"id":"3-1"' in result.stdout and '"id":"3-2"' in result.stdout
    assert "reopening the stream" in result.stderr and streams.opened == 2


def test_events_gives_up_on_a_stream_that_keeps_ending(monkeypatch: pytest.MonkeyPatch) -> None:
    import shoal.cli.queue as cli_queue

    streams = _Streams([b""])
    monkeypatch.setattr(cli_queue, "connect", lambda *args: streams)
    monkeypatch.setattr(cli_queue, "EVENTS_REOPEN_PAUSE_S", 0.01)
    result = invoke("queue", "events", "q", "--timeout", "30")
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    assert streams.opened == cli_queue.EVENTS_REOPEN_MAX + 1
    assert "closed the event stream" in result.stderr
