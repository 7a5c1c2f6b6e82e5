"""Which cluster, which node, which incarnation: real node processes and the real `shoal cluster up`.

A second `shoal cluster up` on a running cluster's ports fails at once naming them, and the
first cluster keeps serving; the launcher's readiness check never counts another cluster's
node; a node that cannot bind is reported with its log line; a wiped node comes back as a new
incarnation (in /health and Hello), refused on its peers' Raft links until it is replaced; a data directory of another
cluster refuses the start, naming both cluster ids; a node of another cluster is refused on the
Raft link, both sides naming both cluster ids.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster.admin_client import AdminClient
from shoal.cluster.launcher import ForeignNode, LocalCluster, busy_ports, free_base_port, write_cluster_file
from shoal.node.identity import IDENTITY_FILE, read_identity
from shoal.node.raft._io import RealIO

from conftest import NODE_COMMAND
from rawproto import RawConn, Router
from waiting import eventually

pytestmark = pytest.mark.integration

WAIT_S_MAX = 60.0
#: The second `shoal cluster up` must give up within this (the issue's bound; it checks ports first).
SECOND_UP_S_MAX = 60.0


def health(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    n = cluster.config.node(node_id)
    with urllib.request.urlopen(f"http://{n.host}:{n.http_port}/health", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def raft_stats(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    with RawConn(cluster.address_of(node_id)) as c:
        return c.call({"cmd": "Stats", "local": True})["raft"]  # type: ignore[no-any-return]


def peer_incarnations(cluster: LocalCluster, node_id: str) -> dict[str, str]:
    return raft_stats(cluster, node_id)["peerIncarnations"]  # type: ignore[no-any-return]


def push_and_pull(cluster: LocalCluster, queue: str) -> None:
    router = Router(cluster.addresses)
    try:
        pushed = router.call({"cmd": "PUSH", "queue": queue, "data": "still-serving", "idempotencyKey": queue})
        assert pushed["ok"], pushed
        pulled = router.call({"cmd": "PULL", "queue": queue, "timeout": 5000})
        assert pulled["ok"] and pulled["job"]["id"] == pushed["id"], pulled
    finally:
        router.close()


def test_a_second_cluster_up_on_taken_ports_fails_fast_naming_the_port(tmp_path: Path) -> None:
    base = free_base_port(3, 4)
    other = tmp_path / "other"
    shoal = [sys.executable, "-m", "shoal.cli", "cluster"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "first", base_port=base,
                      node_command=NODE_COMMAND) as first:
        pids = dict(first.pids)
        try:
            second = subprocess.run([*shoal, "up", "--data", str(other), "--base-port", str(base), "--nodes", "3",
                                     "--partitions", "4", "--detach"],
                                    capture_output=True, text=True, timeout=SECOND_UP_S_MAX, env=env)
        finally:
            subprocess.run([*shoal, "down", "--data", str(other)], capture_output=True, timeout=60, env=env)
        assert second.returncode != 0, second.stdout
        assert f"127.0.0.1:{base} (n1 client)" in second.stderr and "already in use" in second.stderr, second.stderr
        assert "ready" not in second.stdout
        assert not list(other.glob("*.pid")) and not (other / "cluster.toml").exists()
        assert first.pids == pids
        first.wait_ready(WAIT_S_MAX)
        push_and_pull(first, "after-second-up")


def test_readiness_never_counts_another_cluster_s_node(tmp_path: Path) -> None:
    """A node whose advertised client port is another cluster's: the launcher must not call it ready."""
    with LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "a", base_port=free_base_port(1, 1),
                      node_command=NODE_COMMAND) as a:
        b = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "b", base_port=free_base_port(1, 1),
                         node_command=NODE_COMMAND)
        own = b.config.node("n1")
        # b's node listens on its own port, but Hello for it goes to a's node.
        b.config = replace(b.config, nodes=(replace(own, port=a.config.node("n1").port, listen_port=own.port),))
        try:
            with pytest.raises(ForeignNode) as refused:
                b.start(timeout_s=WAIT_S_MAX)
        finally:
            b.stop()
        text = str(refused.value)
        assert str(a.config.node("n1").port) in text
        assert a.config.cluster_id in text and b.config.cluster_id in text


def test_a_node_that_cannot_bind_its_port_is_reported_with_its_log_line(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(1, 1),
                           node_command=NODE_COMMAND)
    raft_port = cluster.config.node("n1").raft_port
    try:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", raft_port))
            holder.listen()
            assert busy_ports(cluster.config, ["n1"]) == [f"127.0.0.1:{raft_port} (n1 raft)"]
            cluster.data_dir.mkdir(parents=True)
            write_cluster_file(cluster.config_path, cluster.config)
            cluster.start_node("n1")  # start() would refuse before starting; start_node does not check
            with pytest.raises(RuntimeError) as exited:
                cluster.wait_ready(WAIT_S_MAX)
    finally:
        cluster.stop()
    text = str(exited.value)
    assert "node n1 exited with 1" in text and "address already in use" in text and str(raft_port) in text


def test_a_wiped_node_comes_back_as_a_new_incarnation(tmp_path: Path) -> None:
    with LocalCluster(nodes=3, partitions=2, data_dir=tmp_path / "c", base_port=free_base_port(3, 2),
                      node_command=NODE_COMMAND) as cluster:
        first = health(cluster, "n3")
        assert (first["clusterId"], first["nodeId"], first["pid"]) == (cluster.config.cluster_id, "n3",
                                                                      cluster.pids["n3"])
        with RawConn(cluster.address_of("n3")) as c:
            assert c.hello["incarnation"] == first["incarnation"]
        eventually(lambda: all(peer_incarnations(cluster, n).get("n3") == first["incarnation"] for n in ("n1", "n2")),
                   "the peers to record n3's incarnation", WAIT_S_MAX, poll_s=0.2)

        cluster.stop_node("n3")  # a restart with its disk: the same incarnation
        cluster.start_node("n3")
        cluster.wait_ready(WAIT_S_MAX)
        assert health(cluster, "n3")["incarnation"] == first["incarnation"]

        cluster.stop_node("n3")  # the disk is wiped
        shutil.rmtree(cluster.config.node_data_dir("n3"))
        cluster.start_node("n3")
        cluster.wait_ready(WAIT_S_MAX)
        after = health(cluster, "n3")
        assert after["incarnation"] != first["incarnation"] and after["pid"] == cluster.pids["n3"]
        with RawConn(cluster.address_of("n3")) as c:
            assert c.hello["incarnation"] == after["incarnation"]
        assert "new incarnation" in cluster.log_file("n3").read_text()
        # The peers refuse it on the Raft link (the registry names its old incarnation) until an
        # operator replaces it; then they link with the new one (tests/integration/test_elastic.py
        # follows it joining every group as a new member).
        eventually(lambda: sum(raft_stats(cluster, n)["handshakesRefused"] for n in ("n1", "n2")) > 0,
                   "the peers to refuse n3's new incarnation", WAIT_S_MAX, poll_s=0.2)
        assert all(peer_incarnations(cluster, n).get("n3") != after["incarnation"] for n in ("n1", "n2"))
        n1 = cluster.config.node("n1")
        AdminClient(f"http://{n1.host}:{n1.http_port}").replace("n3", after["incarnation"])
        eventually(lambda: all(peer_incarnations(cluster, n).get("n3") == after["incarnation"] for n in ("n1", "n2")),
                   "the peers to see n3's new incarnation on the Raft link once it is replaced", WAIT_S_MAX,
                   poll_s=0.2)


def test_a_data_dir_of_another_cluster_refuses_to_start_naming_both_ids(tmp_path: Path) -> None:
    with LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "a", base_port=free_base_port(1, 1),
                      node_command=NODE_COMMAND) as a:
        pass  # n1 of cluster a wrote its identity, then stopped
    a_dir = a.config.node_data_dir("n1")
    written = read_identity(RealIO(), str(a_dir / IDENTITY_FILE))
    assert written is not None and written.cluster_id == a.config.cluster_id
    b = LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "b", base_port=free_base_port(1, 1),
                     node_command=NODE_COMMAND, cluster_id="another-cluster")
    b.config = replace(b.config, nodes=(replace(b.config.node("n1"), data_dir=str(a_dir)),))
    try:
        with pytest.raises(RuntimeError) as refused:
            b.start(timeout_s=WAIT_S_MAX)
    finally:
        b.stop()
    text = str(refused.value)
    assert "node n1 exited with 1" in text
    assert f"cluster {a.config.cluster_id!r}" in text and "'another-cluster'" in text
    assert read_identity(RealIO(), str(a_dir / IDENTITY_FILE)) == written


def test_a_node_of_another_cluster_is_refused_on_the_raft_link_naming_both_ids(tmp_path: Path) -> None:
    """Same secret, same node ids, another cluster id: n3 of 'intruders' never joins; both sides say why."""
    data = tmp_path / "c"
    cluster = LocalCluster(nodes=3, partitions=2, data_dir=data, base_port=free_base_port(3, 2),
                           node_command=NODE_COMMAND)
    intruder: subprocess.Popen[bytes] | None = None
    try:
        data.mkdir(parents=True)
        write_cluster_file(cluster.config_path, cluster.config)
        for node_id in ("n1", "n2"):
            cluster.start_node(node_id)
        other = tmp_path / "other.toml"
        write_cluster_file(other, replace(cluster.config, cluster_id="intruders",
                                          data_dir=str(tmp_path / "other-data")))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        with open(tmp_path / "n3.log", "wb") as log:
            intruder = subprocess.Popen([*(NODE_COMMAND or [sys.executable, "-m", "shoal.node"]),
                                         "--config", str(other), "--id", "n3"],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        cluster.wait_ready(WAIT_S_MAX)  # n1 and n2 form a majority of every partition
        ours = cluster.config.cluster_id
        eventually(lambda: f"it is in cluster '{ours}', this node in 'intruders'" in (tmp_path / "n3.log").read_text(),
                   "n3 to log the refusal naming both cluster ids", WAIT_S_MAX)
        for node_id in ("n1", "n2"):
            eventually(lambda node_id=node_id: f"the peer is in cluster 'intruders', this node in '{ours}'"
                       in cluster.log_file(node_id).read_text(), f"{node_id} to log the refusal naming both ids",
                       WAIT_S_MAX)
            assert "n3" not in peer_incarnations(cluster, node_id)
        push_and_pull(cluster, "without-the-intruder")
    finally:
        if intruder is not None and intruder.poll() is None:
            intruder.kill()
            intruder.wait(10)
        cluster.stop()
