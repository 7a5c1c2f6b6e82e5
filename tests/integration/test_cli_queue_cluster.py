"""`shoal queue …` and `shoal job …` run as a user runs them (a subprocess), against a real secured
cluster: queues listed with their counts, a job shown, pause and resume, the dead-letter queue
retried and purged, drain, a bounded event tail, job actions, and the token from a flag, the
environment or the local cluster's file."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.client import Client
from shoal.cluster.launcher import LocalCluster

from conftest import follower_url, http_url, secured_cluster
from waiting import eventually

pytestmark = pytest.mark.integration

#: Bound on one CLI run (it makes one or two requests).
RUN_TIMEOUT_S = 60.0
TOKEN = "cli-s3cret"


def _env(token: str | None) -> dict[str, str]:
    """This environment without the caller's SHOAL_* settings; ``$SHOAL_TOKEN`` = ``token``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    return {**env, "SHOAL_TOKEN": token} if token else env


def shoal(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    """`shoal ARGS` in a process of its own, stdin closed."""
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S, env=_env(token))


def ok(*args: str, token: str | None = TOKEN) -> str:
    done = shoal(*args, token=token)
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The module's cluster: 3 nodes that require a client token."""
    with secured_cluster(tmp_path_factory, "cli", TOKEN) as cl:
        yield cl


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.addresses, token=TOKEN) as c:
        yield c


def _dead_letter(client: Client, queue: str, n: int) -> list[str]:
    """``n`` jobs of ``queue`` that failed their only attempt (in the dead-letter queue)."""
    q = client.queue(queue)
    ids = [q.add({"n": i}, attempts=1) for i in range(n)]
    for _ in ids:
        job = q.pull(timeout=5.0)
        assert job is not None
        assert q.fail(job, "boom") == "failed"
    return ids


def test_ls_lists_every_queue_with_its_counts(cluster: LocalCluster, client: Client) -> None:
    queues = {f"cli-ls-{i}": i + 1 for i in range(6)}  # spread over the partitions, so over the leaders
    for name, n in queues.items():
        client.queue(name).add_bulk([{"i": k} for k in range(n)])
    busy = client.queue("cli-ls-5")
    assert busy.pull(timeout=5.0) is not None
    _dead_letter(client, "cli-ls-0", 1)

    def listed() -> dict[str, Any] | None:
        rows = {r["name"]: r for r in as_json("queue", "ls", "--data", str(cluster.data_dir))}
        return rows if all(n in rows for n in queues) else None

    rows = eventually(listed, "every queue in `shoal queue ls`", timeout_s=20, poll_s=0.2)
    for name, n in queues.items():
        counts = rows[name]["counts"]
        active = 1 if name == "cli-ls-5" else 0
        assert (counts["waiting"], counts["active"]) == (n - active, active), (name, counts)
        assert rows[name]["paused"] is False and "enqueued" in rows[name]["rates"]
    assert rows["cli-ls-0"]["counts"]["failed"] == 1
    text = ok("queue", "ls", "--url", follower_url(cluster, "cli-ls-3"))  # any node answers for all
    header, *lines = text.splitlines()
    assert header.split()[:4] == ["QUEUE", "PARTITION", "PAUSED", "WAITING"]
    by_name = {line.split()[0]: line.split() for line in lines}
    assert by_name["cli-ls-3"][2:4] == ["no", "4"]


def test_job_get_shows_a_job(cluster: LocalCluster, client: Client) -> None:
    q = client.queue("cli-job")
    job_id = q.add({"to": "a@example.com"}, priority=3)
    url = http_url(cluster, cluster.node_ids[0])
    text = ok("job", "get", job_id, "--url", url)
    assert text.splitlines()[0] == f"job {job_id} of queue cli-job"
    fields = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()[1:]}
    assert fields["state"] == "prioritized" and fields["data"] == '{"to":"a@example.com"}'
    assert fields["priority"] == "3" and fields["attempts"].startswith("0 of ")
    assert fields["created"].endswith("Z")
    shown = as_json("job", "get", job_id, "--url", url)
    assert (shown["id"], shown["queue"], shown["data"]) == (job_id, "cli-job", {"to": "a@example.com"})

    missing = shoal("job", "get", job_id.split("-")[0] + "-999999", "--url", url)
    assert missing.returncode == 3 and "not found" in missing.stderr


def test_pause_resume_and_drain(cluster: LocalCluster, client: Client) -> None:
    q = client.queue("cli-pause")
    q.add_bulk([1, 2, 3])
    q.add(4, delay=60.0)
    data = ["--data", str(cluster.data_dir)]
    assert ok("queue", "pause", "cli-pause", *data).strip() == "paused cli-pause"
    assert q.is_paused()
    assert as_json("queue", "show", "cli-pause", *data)["paused"] is True
    assert q.pull(timeout=0.2) is None  # a paused queue hands nothing out
    ok("queue", "resume", "cli-pause", *data)
    assert not q.is_paused()

    refused = shoal("queue", "drain", "cli-pause", *data)  # no --yes and nobody to answer the question
    assert refused.returncode == 1 and q.counts()["waiting"] == 3
    assert ok("queue", "drain", "cli-pause", "--yes", *data).strip() == "drained cli-pause: 4 job(s)"
    counts = q.counts()
    assert counts["waiting"] + counts["delayed"] == 0

    typo = shoal("queue", "pause", "cli-no-such-queue", *data)
    assert typo.returncode == 3 and "does not exist" in typo.stderr
    assert "cli-no-such-queue" not in client.list_queues()  # refused before it could create it


def test_dead_letter_queue_listed_retried_and_purged(cluster: LocalCluster, client: Client) -> None:
    url = ["--url", http_url(cluster, cluster.node_ids[1])]
    ids = _dead_letter(client, "cli-dlq", 3)
    listed = as_json("queue", "dlq", "cli-dlq", *url)
    assert [j["id"] for j in listed] == sorted(ids, key=lambda i: int(i.split("-")[1]))
    assert all(j["state"] == "failed" and j["error"] == "boom" for j in listed)
    text = ok("queue", "dlq", "cli-dlq", "--limit", "2", *url)
    assert text.splitlines()[-1] == "2 of 3 dead-lettered job(s)" and "boom" in text

    assert ok("queue", "retry-dlq", "cli-dlq", *url).strip() == "retried the dead-letter queue of cli-dlq: 3 job(s)"
    q = client.queue("cli-dlq")
    assert (q.counts()["failed"], q.counts()["waiting"]) == (0, 3)
    for _ in ids:
        job = q.pull(timeout=5.0)
        assert job is not None
        q.fail(job, "boom again")
    assert ok("queue", "purge-dlq", "cli-dlq", "--yes", *url).strip().endswith(": 3 job(s)")
    assert q.counts()["failed"] == 0
    assert ok("queue", "dlq", "cli-dlq", *url).strip() == "the dead-letter queue of cli-dlq is empty"


def test_job_retry_promote_and_cancel(cluster: LocalCluster, client: Client) -> None:
    url = ["--url", http_url(cluster, cluster.node_ids[2])]
    q = client.queue("cli-job-actions")
    (dead,) = _dead_letter(client, "cli-job-actions", 1)
    assert ok("job", "retry", dead, *url).strip() == f"retried {dead}"
    assert q.get_state(dead) == "waiting"
    later = q.add("later", delay=3600.0)
    ok("job", "promote", later, *url)
    assert q.get_state(later) == "waiting"
    ok("job", "cancel", later, *url)
    assert q.get_job(later) is None
    again = shoal("job", "retry", dead, *url)  # waiting: neither failed nor completed
    assert again.returncode == 1 and "INVALID_STATE" in again.stderr


def test_events_tail_is_bounded_by_count_timeout_and_ctrl_c(cluster: LocalCluster, client: Client) -> None:
    q = client.queue("cli-events")
    q.add("first")  # the queue exists before the tail starts
    args = [sys.executable, "-m", "shoal.cli", "queue", "events", "cli-events", "--url",
            follower_url(cluster, "cli-events"), "--json"]
    tail = subprocess.Popen([*args, "--count", "2", "--timeout", "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=_env(TOKEN))
    try:
        # The tail subscribes in its own time: add jobs until it has seen two events and exited.
        eventually(lambda: q.add("more") and tail.poll() is not None, "the tail to stop after 2 events",
                   timeout_s=30, poll_s=0.2)
        out, err = tail.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert len(events) == 2 and all(e["queue"] == "cli-events" and e["event"] == "job" for e in events)

    quiet = shoal("queue", "events", "cli-events", "--url", http_url(cluster, cluster.node_ids[0]),
                  "--timeout", "0.5")
    assert (quiet.returncode, quiet.stderr) == (0, "")

    # Unbounded but for Ctrl-C (its --timeout only keeps a failing test from hanging).
    interrupted = subprocess.Popen([*args, "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True, env=_env(TOKEN))

    def printed() -> bool:
        q.add("seen")
        return bool(select.select([interrupted.stdout], [], [], 0.2)[0])

    try:
        eventually(printed, "the tail to print an event", timeout_s=30, poll_s=0)
        interrupted.send_signal(signal.SIGINT)
        _, err = interrupted.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        interrupted.kill()
    assert interrupted.returncode == 0 and "Traceback" not in err, err


def test_the_token_comes_from_a_flag_the_environment_or_the_local_file(cluster: LocalCluster,
                                                                       client: Client) -> None:
    job_id = client.queue("cli-secure").add({"x": 1})
    url = ["--url", http_url(cluster, cluster.node_ids[0])]
    anonymous = shoal("queue", "ls", *url, token=None)
    assert anonymous.returncode == 1 and "AUTH_REQUIRED" in anonymous.stderr and "--token" in anonymous.stderr
    wrong = shoal("job", "get", job_id, *url, "--token", "nope", token=None)
    assert wrong.returncode == 1 and "AUTH_FAILED" in wrong.stderr
    assert ok("job", "get", job_id, *url, "--token", TOKEN, token=None).startswith(f"job {job_id} of queue cli-secure")
    # $SHOAL_TOKEN is how every other test here authenticates; the local form reads the cluster's file.
    assert "cli-secure" in ok("queue", "ls", "--data", str(cluster.data_dir), token=None)
