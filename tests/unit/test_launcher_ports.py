"""Local clusters before their nodes run: port choice, the check of every port first, the cluster id,
and how an early exit is reported."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from shoal.cluster.launcher import (LocalCluster, PortInUse, _ephemeral_low, _exit_line, _is_or_descends_from,
                                    _ports_of, busy_ports, check_ports_free, free_base_port, new_cluster_id,
                                    write_cluster_file)


@pytest.mark.parametrize(("nodes", "partitions"), [(1, 2), (3, 4), (3, 8), (5, 8)])
def test_free_base_port_keeps_the_layout_below_the_ephemeral_range(nodes: int, partitions: int) -> None:
    ephemeral = _ephemeral_low()
    span = max(_ports_of(20_000, nodes, partitions)) - 20_000
    # Where the ephemeral range starts too low to stay under it, any free layout in range will do.
    top = ephemeral if ephemeral - span > 21_000 else 55_000 + span
    for _ in range(20):
        base = free_base_port(nodes, partitions)
        assert 20_000 <= base and max(_ports_of(base, nodes, partitions)) < top


def test_one_raft_port_per_node_whatever_the_partitions() -> None:
    assert len(_ports_of(20_000, 3, 1024)) == len(_ports_of(20_000, 3, 1)) == 9


def test_local_cluster_is_authenticated_and_its_file_private(tmp_path: Path) -> None:
    import stat

    from shoal.cluster.launcher import LocalCluster, write_cluster_file
    cluster = LocalCluster(nodes=3, partitions=4, data_dir=tmp_path)
    other = LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "other")
    assert len(cluster.config.secret) >= 32 and cluster.config.secret != other.config.secret
    assert LocalCluster(nodes=1, data_dir=tmp_path / "given", secret="mine").config.secret == "mine"
    path = tmp_path / "cluster.toml"
    path.write_text("old")
    path.chmod(0o644)
    write_cluster_file(path, cluster.config)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and cluster.config.secret in path.read_text()


# --- the port check before anything starts, and the launcher's own cluster id ---------------------

def _held(port: int) -> socket.socket:
    """A listener on ``port`` that no SO_REUSEADDR bind can share (as a running node's)."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_busy_ports_names_every_taken_port_with_its_node_and_role(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=2, partitions=2, data_dir=tmp_path, base_port=free_base_port(2, 2))
    n1, n2 = cluster.config.node("n1"), cluster.config.node("n2")
    assert busy_ports(cluster.config, ["n1", "n2"]) == []
    check_ports_free(cluster.config, ["n1", "n2"])
    with _held(n1.http_port), _held(n2.raft_port):
        assert busy_ports(cluster.config, ["n1", "n2"]) == [f"127.0.0.1:{n1.http_port} (n1 http)",
                                                           f"127.0.0.1:{n2.raft_port} (n2 raft)"]
        assert busy_ports(cluster.config, ["n1"]) == [f"127.0.0.1:{n1.http_port} (n1 http)"]
        with pytest.raises(PortInUse, match=f"127.0.0.1:{n1.http_port} \\(n1 http\\), "
                                            f"127.0.0.1:{n2.raft_port} \\(n2 raft\\)"):
            check_ports_free(cluster.config, ["n1", "n2"])


def test_the_check_binds_what_the_node_binds(tmp_path: Path) -> None:
    """A node behind a proxy binds its listen_port, not the advertised port."""
    cluster = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path, base_port=free_base_port(1, 1))
    spec = cluster.config.node("n1")
    listen_port = free_base_port(1, 1)
    config = replace(cluster.config, nodes=(replace(spec, listen_port=listen_port),))
    with _held(spec.port):  # the advertised port (the proxy's) is not the node's to bind
        assert busy_ports(config, ["n1"]) == []
    with _held(listen_port):
        assert busy_ports(config, ["n1"]) == [f"127.0.0.1:{listen_port} (n1 client)"]


def test_start_refuses_a_taken_port_before_writing_or_starting_anything(tmp_path: Path) -> None:
    data = tmp_path / "c"
    cluster = LocalCluster(nodes=3, partitions=2, data_dir=data, base_port=free_base_port(3, 2))
    raft = cluster.config.node("n3").raft_port
    try:
        with _held(raft), pytest.raises(PortInUse, match=f"127.0.0.1:{raft} \\(n3 raft\\)"):
            cluster.start()
    finally:
        cluster.stop()
    assert cluster.procs == {} and not data.exists(), "nothing started, no cluster.toml kept"


def test_every_local_cluster_gets_its_own_random_id_and_keeps_it(tmp_path: Path) -> None:
    first = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "a")
    second = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "b")
    assert first.config.cluster_id != second.config.cluster_id
    assert first.config.cluster_id.startswith("shoal-") and first.config.validate()
    assert len({new_cluster_id() for _ in range(100)}) == 100
    (tmp_path / "a").mkdir()
    write_cluster_file(first.config_path, first.config)
    again = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "a")
    assert again.config.cluster_id == first.config.cluster_id  # same cluster.toml, same cluster
    assert LocalCluster(nodes=1, data_dir=tmp_path / "c", cluster_id="mine").config.cluster_id == "mine"


@pytest.mark.parametrize(("log", "line"), [
    ("INFO starting\nTraceback (most recent call last):\n  File x\nOSError: [Errno 98] error while attempting to "
     "bind on address ('127.0.0.1', 7001): address already in use\n",
     "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 7001): address already in use"),
    ("INFO a\nError: node n1: /d holds data of cluster 'x', but this node is configured for cluster 'y'\n",
     "Error: node n1: /d holds data of cluster 'x', but this node is configured for cluster 'y'"),
    ("INFO a\nINFO b\n", "INFO b"),
    ("", "(nothing in its log)"),
])
def test_the_exit_line_is_the_one_that_says_why(log: str, line: str) -> None:
    assert _exit_line(log) == line


def test_a_node_may_run_under_a_wrapper_of_the_started_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _is_or_descends_from(child.pid, os.getpid())
        assert _is_or_descends_from(os.getpid(), os.getpid())
        assert not _is_or_descends_from(os.getpid(), child.pid)
    finally:
        child.kill()
        child.wait(10)


def test_a_port_released_within_the_wait_passes_the_check(tmp_path: Path) -> None:
    """A process on its way out (a killed node's forked child) may hold a port a moment longer."""
    cluster = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path, base_port=free_base_port(1, 1))
    holder = _held(cluster.config.node("n1").http_port)
    release = threading.Timer(0.3, holder.close)
    release.start()
    try:
        check_ports_free(cluster.config, ["n1"], wait_s=30.0)
    finally:
        release.cancel()
        holder.close()
