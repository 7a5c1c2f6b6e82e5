"""An elastic cluster with real processes: ``shoal cluster add-node | remove-node | replace-node |
settings`` run as the operator runs them (the real CLI, a subprocess), while a writer pushes.

Every node process, whether the test's launcher or the CLI started it, is stopped by its pid
when the test ends (the pid files of the cluster's directory name them all).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shoal.client import Client, ConnectionOptions
from shoal.client.exceptions import ShoalError
from shoal.cluster.admin_client import AdminClient, ClusterShape
from shoal.cluster.config import NodeSpec, load_config
from shoal.cluster.launcher import LocalCluster, _is_our_node, free_base_port, node_health, write_cluster_file

from conftest import NODE_COMMAND
from nodehttp import http_json, metric
from rawproto import RawConn
from waiting import eventually

pytestmark = pytest.mark.integration

CLI_TIMEOUT_S = 240
PRELOAD_JOBS = 20_000
QUEUES = [f"q{i}" for i in range(8)]
WRITER_PUSHES_MAX = 200_000
WAIT_S = 60.0


def shoal(*args: str, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the ``shoal`` command line as an operator does; its output is printed for the log."""
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    print(f"$ shoal {' '.join(args)}\n{proc.stdout}{proc.stderr}(exit {proc.returncode})")
    return proc


def stop_every_node(data_dir: Path) -> None:
    """SIGTERM every node of the directory's pid files that still runs, SIGKILL the stragglers."""
    pids = []
    for pid_file in data_dir.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text().strip())
            if _is_our_node(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
    with contextlib.suppress(AssertionError):  # the stragglers are killed below
        eventually(lambda: not any(_is_our_node(p) for p in pids), "every node to exit on SIGTERM", 15.0, poll_s=0.1)
    for pid in pids:
        if _is_our_node(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def elastic_cluster(data_dir: Path, nodes: int, partitions: int, **kwargs: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(nodes=nodes, partitions=partitions, data_dir=data_dir,
                           base_port=free_base_port(nodes + 2, partitions), node_command=NODE_COMMAND, **kwargs)
    try:
        cluster.start()
        cluster.wait_balanced(WAIT_S)
        yield cluster
    finally:
        cluster.stop()
        stop_every_node(Path(data_dir))


def admin_of(cluster: LocalCluster, node_id: str) -> AdminClient:
    n = cluster.config.node(node_id)
    token = cluster.config.tokens[0] if cluster.config.tokens else None
    return AdminClient(f"http://{n.host}:{n.http_port}", token)


def local_stats(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    """``Stats local`` of one node (after Auth when the cluster has tokens)."""
    with RawConn(cluster.address_of(node_id)) as c:
        if cluster.config.tokens:
            assert c.call({"cmd": "Auth", "token": cluster.config.tokens[0]})["ok"]
        return c.call({"cmd": "Stats", "local": True})


class Writer(threading.Thread):
    """Pushes one job at a time through ``shoal.client`` (idempotency keys set by the client) and
    records every acknowledged id; bounded by a count and by :meth:`stop`."""

    def __init__(self, seeds: list[str]) -> None:
        super().__init__(daemon=True)
        self.seeds = seeds
        self.acked: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with Client(self.seeds, options=ConnectionOptions(command_timeout=30.0)) as client:
            queues = [client.queue(name) for name in QUEUES]
            for k in range(WRITER_PUSHES_MAX):
                if self._stop_event.is_set():
                    return
                q = queues[k % len(queues)]
                try:
                    self.acked.append((q.name, q.add({"writer": k})))
                except ShoalError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def acks(self) -> int:
        return len(self.acked)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(60)
        assert not self.is_alive(), "the writer did not stop"


def missing_jobs(seeds: list[str], expected: dict[str, set[str]]) -> dict[str, int]:
    """Per queue, how many of ``expected``'s ids the cluster no longer has (every job is still waiting)."""
    missing: dict[str, int] = {}
    with Client(seeds) as client:
        for name, ids in expected.items():
            found: set[str] = set()
            offset = 0
            for _ in range(100):
                reply = client.call({"cmd": "GetJobs", "queue": name, "state": "waiting", "offset": offset,
                                     "limit": 10_000})
                found.update(j["id"] for j in reply["jobs"])
                offset += len(reply["jobs"])
                if not reply["jobs"] or offset >= reply["total"]:
                    break
            if ids - found:
                missing[name] = len(ids - found)
    return missing


def preload(seeds: list[str]) -> dict[str, set[str]]:
    per_queue = PRELOAD_JOBS // len(QUEUES)
    with Client(seeds) as client:
        return {name: set(client.queue(name).add_bulk(({"n": k} for k in range(per_queue)), batch_size=500))
                for name in QUEUES}


def expected_after(loaded: dict[str, set[str]], writer: Writer) -> dict[str, set[str]]:
    out = {name: set(ids) for name, ids in loaded.items()}
    for name, job_id in list(writer.acked):
        out[name].add(job_id)
    return out


def held(shape: ClusterShape, node_id: str) -> tuple[int, int]:
    parts = shape.topology["partitionMap"]
    return sum(node_id in p["replicas"] for p in parts), sum(p["leader"] == node_id for p in parts)


@pytest.mark.timeout(900)
def test_add_then_remove_a_node_under_writes(tmp_path: Path) -> None:
    data = tmp_path / "c"
    with elastic_cluster(data, 3, 8) as cluster:
        seeds = cluster.addresses
        loaded = preload(seeds)
        assert sum(map(len, loaded.values())) == PRELOAD_JOBS
        writer = Writer(seeds)
        writer.start()
        try:
            eventually(lambda: writer.acks() >= 50, "the writer's first acks", WAIT_S, poll_s=0.2)

            added = shoal("cluster", "add-node", "--data", str(data), "--timeout", "180")
            assert added.returncode == 0, added.stderr
            assert "n4 joined" in added.stdout
            config = load_config(data / "cluster.toml", env={})
            assert [n.id for n in config.nodes] == ["n1", "n2", "n3", "n4"]
            assert config.bootstrap_nodes == ("n1", "n2", "n3")
            admin = admin_of(cluster, "n2")
            shape = eventually(lambda: (found := admin.shape()).settled() and found, "settled with n4", WAIT_S,
                               poll_s=0.2)
            replicas, leads = held(shape, "n4")
            assert replicas >= 4 and leads >= 1, (replicas, leads)
            status = shoal("cluster", "status", "--data", str(data))
            assert status.returncode == 0 and "n4: active" in status.stdout and "moves: none" in status.stdout

            before = writer.acks()
            eventually(lambda: writer.acks() > before + 20, "acks after the add", WAIT_S, poll_s=0.2)
            assert missing_jobs(seeds, expected_after(loaded, writer)) == {}

            n1_proc = cluster.procs["n1"]
            removed = shoal("cluster", "remove-node", "--data", str(data), "n1", "--timeout", "180")
            assert removed.returncode == 0, removed.stderr
            shape = admin_of(cluster, "n2").shape()
            assert not any("n1" in p["replicas"] or p["leader"] == "n1" for p in shape.topology["partitionMap"])
            assert shape.registry.nodes["n1"].state == "removed"
            assert n1_proc.poll() is not None, "n1's process still runs"
            assert [n.id for n in load_config(data / "cluster.toml", env={}).nodes] == ["n2", "n3", "n4"]

            before = writer.acks()
            eventually(lambda: writer.acks() > before + 20, "acks after the removal", WAIT_S, poll_s=0.2)
        finally:
            writer.stop()
        survivors = [cluster.address_of(n) for n in ("n2", "n3")] + [
            f"127.0.0.1:{load_config(data / 'cluster.toml', env={}).node('n4').port}"]
        assert missing_jobs(survivors, expected_after(loaded, writer)) == {}
        with Client(survivors) as client:
            assert client.queue("after-removal").add({"ok": True})
        assert writer.errors == []

    # `shoal cluster up` brings the grown and shrunk cluster back from its file.
    up = shoal("cluster", "up", "--data", str(data), "--detach", timeout_s=120)
    try:
        assert up.returncode == 0, up.stderr
        assert "3 nodes" in up.stdout and "n4:" in up.stdout and "n1:" not in up.stdout
        assert missing_jobs(survivors, expected_after(loaded, writer)) == {}
    finally:
        shoal("cluster", "down", "--data", str(data), timeout_s=60)
        stop_every_node(data)


def read_until(proc: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    """Lines of ``proc``'s stdout up to the first holding ``text`` (or its end, or the deadline)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline and not any(text in line for line in lines):
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
    return "".join(lines)


def members_of_leaders(cluster: LocalCluster, nodes: list[str]) -> dict[int, dict[str, Any]]:
    """Every partition's Raft status (voters, learners as member ids) as its leader reports it."""
    out: dict[int, dict[str, Any]] = {}
    for node in nodes:
        with contextlib.suppress(OSError):
            for p, replica in local_stats(cluster, node)["replicas"].items():
                if replica["isLeader"]:
                    out[int(p)] = replica["raft"]
    return out


@pytest.mark.timeout(600)
def test_a_wiped_node_is_refused_until_replaced_and_then_joins_as_a_new_member(tmp_path: Path) -> None:
    data = tmp_path / "c"
    with elastic_cluster(data, 3, 4, tokens=("t0k",)) as cluster:
        with Client(cluster.addresses, token="t0k") as client:
            ids = {name: set(client.queue(name).add_bulk(range(100))) for name in QUEUES[:4]}
        n3 = cluster.config.node("n3")
        old = node_health(n3.host, n3.http_port, token="t0k")["incarnation"]
        refused_before = sum(local_stats(cluster, n)["raft"]["handshakesRefused"] for n in ("n1", "n2"))

        cluster.kill("n3")
        shutil.rmtree(cluster.config.node_data_dir("n3"))
        cluster.start_node("n3")
        eventually(lambda: _confirmed(cluster, "n3"), "n3 answering", WAIT_S, poll_s=0.2)
        new = node_health(n3.host, n3.http_port, token="t0k")["incarnation"]
        assert new != old
        # Refused on the link: its peers count the refusals, it hosts no replica, and no
        # partition's membership names its new incarnation.
        eventually(lambda: sum(local_stats(cluster, n)["raft"]["handshakesRefused"] for n in ("n1", "n2"))
                   > refused_before, "n3's handshakes refused", WAIT_S, poll_s=0.2)
        assert local_stats(cluster, "n3")["replicas"] == {}
        for raft in members_of_leaders(cluster, ["n1", "n2"]).values():
            assert f"n3/{new}" not in raft["voters"] + raft["learners"]

        url = f"http://{cluster.config.node('n1').host}:{cluster.config.node('n1').http_port}"
        replaced = shoal("cluster", "replace-node", "--url", url, "--token", "t0k", "n3", "--incarnation", new,
                         "--timeout", "180")
        assert replaced.returncode == 0, replaced.stderr
        member = f"n3/{new}"
        admin = AdminClient(url, "t0k")
        # The command returns once the cluster settled; the balancer may then hand a leadership
        # back, leaving a partition without a known leader for a moment.
        eventually(lambda: (shape := admin.shape()).registry.nodes["n3"].incarnation == new and shape.settled(),
                   "settled on n3's new member", WAIT_S, poll_s=0.2)
        leaders = eventually(lambda: (
            found if len(found := members_of_leaders(cluster, ["n1", "n2", "n3"])) == 4 else None),
            "every partition's leader", WAIT_S, poll_s=0.2)
        for p, raft in leaders.items():
            assert "n3" not in raft["voters"] + raft["learners"], (p, raft)
            assert member in raft["voters"], (p, raft)
        hosted = local_stats(cluster, "n3")["replicas"]
        assert hosted and all(member in r["raft"]["voters"] for r in hosted.values())

        # The local form: a dead node (killed, its disk intact) rebuilt on a fresh data directory.
        cluster.kill("n2")
        local = shoal("cluster", "replace-node", "--data", str(data), "n2", "--timeout", "180")
        assert local.returncode == 0, local.stderr
        assert list(data.glob("n2.replaced-*")), "n2's old data directory was not kept aside"
        n2 = cluster.config.node("n2")
        new2 = node_health(n2.host, n2.http_port, token="t0k")["incarnation"]
        for p, raft in members_of_leaders(cluster, ["n1", "n2", "n3"]).items():
            assert "n2" not in raft["voters"] and f"n2/{new2}" in raft["voters"], (p, raft)
        with Client([cluster.address_of("n1"), cluster.address_of("n3")], token="t0k") as client:
            for name, expected in ids.items():
                jobs, total = client.queue(name).get_jobs("waiting", limit=1000)
                assert {j.id for j in jobs} == expected and total == len(expected)


def _confirmed(cluster: LocalCluster, node_id: str) -> bool:
    with contextlib.suppress(OSError, RuntimeError):
        return cluster.confirm_own(node_id)
    return False


@pytest.mark.timeout(600)
def test_a_node_added_remotely_and_replication_3_to_5_to_3(tmp_path: Path) -> None:
    data = tmp_path / "c"
    with elastic_cluster(data, 4, 4) as cluster:
        with Client(cluster.addresses) as client:
            ids = {name: set(client.queue(name).add_bulk(range(200))) for name in QUEUES[:4]}
        manual = shoal("cluster", "settings", "--data", str(data), "--no-rebalance-auto")
        assert manual.returncode == 0 and "rebalance_auto off" in manual.stdout
        # The remote form, as compose does it: the node is described to the cluster, the
        # operator starts its process (here from the same cluster file, now listing it).
        config = cluster.config
        first = config.nodes[0]
        n5 = NodeSpec("n5", "127.0.0.1", first.port + 8, first.port + 9, first.raft_port + 4)
        grown = replace(config, nodes=(*config.nodes, n5), bootstrap_nodes=tuple(n.id for n in config.nodes))
        write_cluster_file(cluster.config_path, grown)
        cluster.config = grown
        url = f"http://{first.host}:{first.http_port}"
        add = subprocess.Popen([sys.executable, "-m", "shoal.cli", "cluster", "add-node", "--url", url, "--id", "n5",
                                "--host", n5.host, "--port", str(n5.port), "--http-port", str(n5.http_port),
                                "--raft-port", str(n5.raft_port), "--timeout", "180"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            cluster.start_node("n5")
            out, _ = add.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            if add.poll() is None:
                add.kill()
                add.wait(10)
        print(out)
        assert add.returncode == 0, out
        assert "n5 joined" in out and "shoal cluster rebalance" in out

        # With rebalance_auto off the moves onto n5 wait for the operator, and every view shows them.
        pending = AdminClient(url).shape().moves
        assert pending and all(m["state"] == "pending rebalance" and m["to"] == "n5" for m in pending), pending
        status = shoal("cluster", "status", "--url", url)
        assert status.returncode == 0 and f"moves ({len(pending)}):" in status.stdout
        assert status.stdout.count("pending rebalance") == len(pending)
        assert len(http_json(cluster, "n2", "/cluster")["moves"]) == len(pending)
        assert sum(len(http_json(cluster, n, "/stats")["moves"]) for n in cluster.node_ids) == len(pending)
        assert sum(metric(cluster, n, 'shoal_moves_in_progress{state="pending rebalance"}')
                   for n in cluster.node_ids) == len(pending)
        balanced = shoal("cluster", "rebalance", "--url", url, "--timeout", "180")
        assert balanced.returncode == 0, balanced.stderr
        admin = AdminClient(url)
        eventually(lambda: (shape := admin.shape()).settled() and shape.leaders_balanced()
                   and held(shape, "n5")[0] >= 1, "settled and balanced with n5", WAIT_S, poll_s=0.2)
        assert sum(metric(cluster, n, "shoal_moves_started_total") for n in cluster.node_ids) >= len(pending)
        assert sum(metric(cluster, n, "shoal_moves_finished_total") for n in cluster.node_ids) >= len(pending)
        auto = shoal("cluster", "settings", "--data", str(data), "--rebalance-auto")
        assert auto.returncode == 0 and "rebalance_auto on" in auto.stdout

        rate = shoal("cluster", "settings", "--data", str(data), "--move-rate", "40MiB")
        assert rate.returncode == 0 and "move rate 40.0 MiB/s" in rate.stdout
        share = 40 * 1024 * 1024 // 5
        for node in cluster.node_ids:
            assert http_json(cluster, node, "/stats")["moveCounters"]["rateBytesPerS"] == share, node
        cluster.restart("n5")
        eventually(lambda: _confirmed(cluster, "n5"), "n5 back", WAIT_S, poll_s=0.2)
        assert http_json(cluster, "n5", "/stats")["moveCounters"]["rateBytesPerS"] == share

        for rf in (5, 3):
            changed = shoal("cluster", "settings", "--data", str(data), "--replication", str(rf), "--timeout", "180")
            assert changed.returncode == 0, changed.stderr
            leaders = eventually(lambda: (
                found if len(found := members_of_leaders(cluster, cluster.node_ids)) == 4 else None),
                "every partition's leader", WAIT_S, poll_s=0.2)
            for p, raft in leaders.items():
                assert len(raft["voters"]) == rf and not raft["learners"], (p, raft)
            shape = admin_of(cluster, "n1").shape()
            assert all(len(shape.replicas(p)) == rf for p in range(4))
            assert all(metric(cluster, str(shape.leader(p)), f'shoal_partition_voters{{partition="{p}"}}') == rf
                       for p in range(4))
        with Client(cluster.addresses) as client:
            for name, expected in ids.items():
                jobs, total = client.queue(name).get_jobs("waiting", limit=1000)
                assert {j.id for j in jobs} == expected and total == len(expected)



SNAPSHOT_ENV = {"SHOAL_SNAPSHOT_ENTRIES_MIN": "30", "SHOAL_SNAPSHOT_INTERVAL_S": "3600"}


@pytest.mark.timeout(600)
def test_a_snapshot_move_shows_bytes_rate_and_eta_and_its_rate_changes_while_it_runs(tmp_path: Path) -> None:
    """A new replica whose log was compacted away gets a snapshot, streamed at the cluster's move
    rate: status shows its bytes, rate and time left, and a higher rate set meanwhile finishes it."""
    data = tmp_path / "c"
    with elastic_cluster(data, 3, 1, replication=2, extra_env=SNAPSHOT_ENV) as cluster:
        with Client(cluster.addresses) as client:
            # ~8 MB of state that does not compress, in 80 entries: snapshots are written and the
            # journal's head dropped, so a new replica cannot catch up from the log.
            ids = client.queue("big").add_bulk(({"blob": os.urandom(512).hex()} for _ in range(8_000)),
                                              batch_size=100)
        leader = cluster.leader_of(0)
        assert leader is not None
        eventually(lambda: local_stats(cluster, leader)["replicas"]["0"]["snapshots"]["written"] >= 1,
                   "a snapshot on the leader", WAIT_S, poll_s=0.2)
        slow = shoal("cluster", "settings", "--data", str(data), "--move-rate", "1MiB")
        assert slow.returncode == 0, slow.stderr
        grow = subprocess.Popen([sys.executable, "-m", "shoal.cli", "cluster", "settings", "--data", str(data),
                                 "--replication", "3", "--timeout", "180"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            admin = admin_of(cluster, leader)
            shape = admin.wait(lambda s: any(m.get("bytesSent") for m in s.moves), 60, 0.2)
            move = next(m for m in shape.moves if m.get("bytesSent"))
            assert move["state"] == "catching up" and move["partition"] == 0
            assert 0 < move["bytesSent"] < move["bytesTotal"]
            # The stream's first window goes out at once (the token bucket's burst): the rate shown
            # is what the move rate allows from here on, and the time left follows from it.
            assert 0 < move["rateBytesPerS"] <= 1024 * 1024, move
            assert move["etaS"] >= (move["bytesTotal"] - move["bytesSent"]) / (1024 * 1024), move
            status = shoal("cluster", "status", "--data", str(data))
            assert status.returncode == 0 and "catching up" in status.stdout and "ETA" in status.stdout
            # The command's own progress names the stream's time left while it is slow (its polls
            # run on their own clock): read its lines until it has, then speed the stream up.
            shown = read_until(grow, "ETA", 60.0)
            fast = shoal("cluster", "settings", "--data", str(data), "--move-rate", "256MiB")
            assert fast.returncode == 0, fast.stderr
            out, _ = grow.communicate(timeout=CLI_TIMEOUT_S)
            out = shown + out
        finally:
            if grow.poll() is None:
                grow.kill()
                grow.wait(10)
        print(out)
        assert grow.returncode == 0, out
        assert "ETA" in out  # its progress named the stream's bytes and time left
        assert metric(cluster, leader, "shoal_snapshot_bytes_sent_total") >= move["bytesTotal"]
        assert len(members_of_leaders(cluster, cluster.node_ids)[0]["voters"]) == 3
        with Client(cluster.addresses) as client:
            assert client.queue("big").count() == len(ids) == 8_000
