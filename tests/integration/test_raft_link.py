"""The Raft link against real node processes: nobody unauthenticated is heard.

Probes send pickles to every port a node listens on, a node with the wrong
secret tries to join, a default ``shoal cluster up`` is checked for wildcard
listeners, and a 64-partition cluster loses a node and still serves every
partition with agreeing replicas.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import pickle
import socket
import stat
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster.config import load_config
from shoal.cluster.launcher import LocalCluster, free_base_port, write_cluster_file
from shoal.cluster.partitioning import partition_for

from conftest import NODE_COMMAND
from rawproto import RawConn, Router
from waiting import eventually

pytestmark = pytest.mark.integration

WAIT_S_MAX = 30.0


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in ((f"/proc/{pid}/net/tcp", False), (f"/proc/{pid}/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            if v6:  # four host-order 32-bit words
                address = str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
            else:
                address = str(ipaddress.IPv4Address(raw[::-1]))
            found.append((address, int(hex_port, 16)))
    return found


class _Marker:
    """Unpickling this creates ``path``: the proof that a node ran a peer's code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def probes(marker: Path) -> list[bytes]:
    evil = pickle.dumps({"type": "append_entries", "x": _Marker(str(marker))}, protocol=2)
    framed = zlib.compress(evil, 3)
    return [struct.pack("i", len(framed)) + framed,      # pysyncobj's TCP framing
            framed, evil,                                 # unframed, and a bare pickle
            struct.pack(">H", len(evil) % 65536) + evil]  # a handshake-sized length prefix


def send_probe(port: int, payload: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        try:
            s.sendall(payload)
            s.settimeout(1.0)
            s.recv(4096)
        except OSError:
            pass


def push_everywhere(router: Router, partitions: int, tag: str) -> None:
    """One acknowledged push per partition (queue names chosen to cover every partition)."""
    queues: dict[int, str] = {}
    i = 0
    while len(queues) < partitions and i < 100_000:
        queues.setdefault(partition_for(f"q{i}", partitions), f"q{i}")
        i += 1
    for p, queue in sorted(queues.items()):
        reply = router.call({"cmd": "PUSH", "queue": queue, "data": f"{tag}-{p}", "idempotencyKey": f"{tag}-{p}"},
                            timeout_s=20)
        assert reply["ok"], (p, reply)


def test_pickles_sent_to_every_port_run_nothing_and_the_node_keeps_serving(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "c", base_port=free_base_port(3, 4),
                      node_command=NODE_COMMAND) as cluster:
        pid = cluster.pids["n1"]
        ports = sorted({port for _, port in listening_sockets(pid)})
        n1 = cluster.config.node("n1")
        assert {n1.port, n1.http_port, n1.raft_port} <= set(ports)
        for port in ports:
            for payload in probes(marker):
                send_probe(port, payload)
        # A crowd of silent connections holds no more than a bounded number of handshakes.
        idle = [socket.create_connection(("127.0.0.1", n1.raft_port), timeout=2) for _ in range(80)]
        time.sleep(0.5)
        assert not marker.exists(), "a node unpickled bytes from an unauthenticated peer"
        log = cluster.log_file("n1").read_text()
        assert "raft handshake refused 127.0.0.1:" in log
        assert cluster.pid("n1") == pid
        cluster.wait_ready(WAIT_S_MAX)
        router = Router(cluster.addresses)
        try:
            push_everywhere(router, 4, "after-probe")
        finally:
            router.close()
            for sock in idle:
                sock.close()
        with RawConn(cluster.address_of("n1")) as conn:
            refused = conn.call({"cmd": "Stats", "local": True})["raft"]["handshakesRefused"]
        assert refused >= 80 - 64, refused  # beyond 64 pending handshakes, closed at once


def test_a_node_with_the_wrong_secret_never_joins(tmp_path: Path) -> None:
    data = tmp_path / "c"
    cluster = LocalCluster(nodes=3, partitions=4, data_dir=data, base_port=free_base_port(3, 4),
                           node_command=NODE_COMMAND)
    intruder: subprocess.Popen[bytes] | None = None
    try:
        data.mkdir(parents=True)
        write_cluster_file(cluster.config_path, cluster.config)
        for node_id in ("n1", "n2"):
            cluster.start_node(node_id)
        wrong = tmp_path / "wrong.toml"
        config = load_config(cluster.config_path, env={})
        write_cluster_file(wrong, dataclasses.replace(config, secret="not-the-secret"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        with open(tmp_path / "n3.log", "wb") as log:
            intruder = subprocess.Popen([*(NODE_COMMAND or [sys.executable, "-m", "shoal.node"]),
                                         "--config", str(wrong), "--id", "n3"],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        cluster.wait_ready(WAIT_S_MAX)  # n1 and n2 form a majority of every partition
        n3 = config.node("n3")
        eventually(lambda: "BAD_PROOF" in (tmp_path / "n3.log").read_text(), "n3 to log the refusal")
        time.sleep(2.0)  # several dial attempts and election timeouts
        with RawConn(f"{n3.host}:{n3.port}") as conn:
            stats = conn.call({"cmd": "Stats", "local": True})
        assert stats["raft"]["peersConnected"] == []
        assert not any(r["isLeader"] or r["leader"] for r in stats["replicas"].values())
        for node_id in ("n1", "n2"):
            log_text = cluster.log_file(node_id).read_text()
            assert "claims to be n3" in log_text and "BAD_PROOF" in log_text, node_id
        router = Router(cluster.addresses[:2])
        try:
            push_everywhere(router, 4, "without-n3")
        finally:
            router.close()
    finally:
        if intruder is not None and intruder.poll() is None:
            intruder.kill()
            intruder.wait(10)
        cluster.stop()


def test_default_cluster_up_binds_no_wildcard_and_keeps_its_secret_private(tmp_path: Path) -> None:
    data = tmp_path / "c"
    base = free_base_port(3, 8)
    shoal = [sys.executable, "-m", "shoal.cli", "cluster"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    try:
        up = subprocess.run([*shoal, "up", "--data", str(data), "--base-port", str(base), "--detach"],
                            capture_output=True, text=True, timeout=120, env=env)
        assert up.returncode == 0, up.stderr
        assert "ready" in up.stdout
        path = data / "cluster.toml"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(load_config(path, env={}).secret) >= 32
        pids = [int(p.read_text()) for p in sorted(data.glob("*.pid"))]
        assert len(pids) == 3
        for pid in pids:
            sockets = listening_sockets(pid)
            assert len(sockets) == 3, sockets  # client, HTTP, one Raft port
            for address, port in sockets:
                assert address in ("127.0.0.1", "::1"), f"pid {pid} listens on {address}:{port}"
    finally:
        subprocess.run([*shoal, "down", "--data", str(data)], capture_output=True, timeout=60, env=env)


def test_64_partitions_survive_a_node_kill_and_replicas_agree(tmp_path: Path) -> None:
    partitions = 64
    with LocalCluster(nodes=3, partitions=partitions, data_dir=tmp_path / "c",
                      base_port=free_base_port(3, partitions), node_command=NODE_COMMAND) as cluster:
        router = Router(cluster.addresses)
        try:
            push_everywhere(router, partitions, "before")
            cluster.kill("n3")
            eventually(lambda: all(p.leader in ("n1", "n2") for p in cluster.topology().partition_map),
                       "a leader on n1 or n2 for every partition", poll_s=0.2)
            router.close()
            router = Router(cluster.addresses[:2])
            push_everywhere(router, partitions, "after-kill")
            cluster.start_node("n3")
            cluster.wait_ready(WAIT_S_MAX)
            push_everywhere(router, partitions, "after-restart")
        finally:
            router.close()

        disagree: dict[str, list[Any]] = {}

        def digests_agree() -> bool:
            views = []
            for node_id in cluster.node_ids:
                with RawConn(cluster.address_of(node_id)) as conn:
                    views.append(conn.call({"cmd": "Stats", "local": True})["replicas"])
            disagree.clear()
            for p in map(str, range(partitions)):
                replicas = [v[p] for v in views if p in v]
                if len(replicas) != 3 or len({(r["appliedIndex"], r["digest"]) for r in replicas}) != 1:
                    disagree[p] = [(r["leader"], r["commitIndex"], r["appliedIndex"], r["digest"]) for r in replicas]
            return not disagree

        try:
            eventually(digests_agree, "every partition's three replicas to agree", poll_s=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {dict(list(disagree.items())[:4])} ({len(disagree)} partitions)") from None
