"""docker-compose's three node services, run as local processes, form a working cluster.

Each process gets exactly the compose service's ``command`` and ``environment`` (with the
cluster id, secret and tokens supplied the way a user exports them for ``docker compose up``),
except what a single machine forces: service names become 127.0.0.1 with free ports (SHOAL_PEERS), the listen
address is 127.0.0.1 instead of 0.0.0.0 (loopback only here), and data goes to a temporary folder.
The test then speaks the binary protocol with ``shoal.cluster.codec``: Hello, PUSH to the
partition leader, PULL, ACK; runs the compose and Dockerfile health checks against the nodes; and
stops every node with SIGTERM, which must exit 0.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest

from shoal.cluster.codec import FrameDecoder, encode
from shoal.cluster.config import load_config
from shoal.cluster.partitioning import partition_for

from waiting import eventually
from _deploy import (NODE_SERVICES, compose, compose_test_argv, dashboard_metric_names, dockerfile_instructions,
                     healthcheck_argv, service_env)

pytestmark = pytest.mark.integration

SECRET = "compose-test-secret"
TOKEN = "compose-test-token"
CLUSTER_ID = "shoal-c0e5e7e57c1a5e12"
#: What the user exports for `docker compose up` (deploy/README.md).
USER_VARIABLES = {"SHOAL_CLUSTER_ID": CLUSTER_ID, "SHOAL_CLUSTER_SECRET": SECRET, "SHOAL_AUTH_TOKENS": TOKEN}
FORMING_S = 60.0
RETRY_S = 30.0
T = TypeVar("T")


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (the OS picks them; held open together so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class LocalNode:
    name: str
    env: dict[str, str]
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    http_port: int

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def _shoal_argv(command: list[str]) -> list[str]:
    """The compose command as is; `shoal` is the console script of this interpreter's environment."""
    if command[0] != "shoal":
        return command
    beside = Path(sys.executable).with_name("shoal")
    return [str(beside) if beside.exists() else "shoal", *command[1:]]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 20
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)


@pytest.fixture
def compose_nodes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, LocalNode]]:
    services = compose()["services"]
    host_env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    variables = {**host_env, **USER_VARIABLES}
    envs = {name: service_env(services[name], variables) for name in NODE_SERVICES}
    configs = {name: load_config(env=env) for name, env in envs.items()}
    ports = _free_ports(3 * len(NODE_SERVICES))  # client, HTTP and the one Raft port of each node
    remap = {name: ("127.0.0.1", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
             for i, name in enumerate(NODE_SERVICES)}
    procs: list[subprocess.Popen[bytes]] = []
    request.addfinalizer(lambda: _stop(procs))  # registered first: runs even if a start fails
    nodes: dict[str, LocalNode] = {}
    for name in NODE_SERVICES:
        env = dict(envs[name])
        peer_ids = [n.id for n in configs[name].nodes]
        assert peer_ids == list(NODE_SERVICES)
        # Only what one machine forces changes; every other variable is the compose file's.
        env["SHOAL_PEERS"] = ",".join(f"{pid}={':'.join(map(str, remap[pid]))}" for pid in peer_ids)
        assert env["SHOAL_LISTEN"] == "0.0.0.0"
        env["SHOAL_LISTEN"] = "127.0.0.1"
        env["SHOAL_DATA_DIR"] = str(tmp_path / name / "data")
        (tmp_path / name).mkdir()
        argv = _shoal_argv(services[name]["command"])
        log = tmp_path / name / "node.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env={**host_env, **env}, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=tmp_path / name)
        procs.append(proc)
        _, port, http_port, _ = remap[name]
        nodes[name] = LocalNode(name, env, argv, proc, log, port, http_port)
    yield nodes


# --- a minimal binary-protocol client (shoal.cluster.codec over a socket) -------------------

class Conn:
    def __init__(self, port: int, timeout_s: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.decoder = FrameDecoder(requests=False)
        self.req_ids = itertools.count(1)
        assert self.call({"cmd": "Auth", "token": TOKEN}).get("ok"), "compose requires client tokens"

    def call(self, frame: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        req_id = next(self.req_ids)
        self.sock.sendall(encode({**frame, "reqId": req_id}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for reply in self.decoder:
                if reply.get("reqId") == req_id:
                    return reply
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the node closed the connection")
            self.decoder.feed(data)
        raise TimeoutError(f"no reply to {frame['cmd']}")

    def close(self) -> None:
        self.sock.close()


def hello(port: int) -> dict[str, Any]:
    conn = Conn(port)
    try:
        reply = conn.call({"cmd": "Hello", "protocolVersion": 2})
    finally:
        conn.close()
    assert reply.get("ok"), reply
    return reply


class _NotLeader(Exception):
    pass


def routed(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply``, or a retry when it says the partition's leader is elsewhere or being elected."""
    if not reply.get("ok") and reply.get("code") in ("NOT_LEADER", "NO_LEADER"):
        raise _NotLeader(reply)
    return reply


def on_leader(seed_port: int, queue: str, steps: Callable[[Conn], T]) -> T:
    """Run ``steps`` on a v2 connection to the leader of ``queue``'s partition (from the Hello
    topology); on NOT_LEADER/NO_LEADER or a lost link, look the leader up again, for up to 30 s."""

    def attempt() -> tuple[T]:
        topology = hello(seed_port)["topology"]
        partition = partition_for(queue, topology["partitions"])
        leader = topology["partitionMap"][partition]["leader"]
        if leader is None:
            raise _NotLeader(f"partition {partition}: no leader yet")
        conn = Conn({n["id"]: n["port"] for n in topology["nodes"]}[leader])
        try:
            assert conn.call({"cmd": "Hello", "protocolVersion": 2})["ok"]
            return (steps(conn),)  # a tuple: true whatever ``steps`` returns
        finally:
            conn.close()

    return eventually(attempt, f"the leader of {queue!r} to run the steps", RETRY_S, poll_s=0.2,
                      ignoring=(_NotLeader, OSError, TimeoutError))[0]


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=3) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_formed(nodes: dict[str, LocalNode]) -> dict[str, Any]:
    """Every node answers Hello, and every partition has a leader (bounded)."""

    def formed() -> dict[str, Any]:
        for node in nodes.values():
            if node.proc.poll() is not None:  # pytest.fail: not an AssertionError, so not polled again
                pytest.fail(f"{node.name} exited {node.proc.returncode}:\n{node.log_tail()}")
        topologies = [hello(n.port)["topology"] for n in nodes.values()]
        leaderless = [p["id"] for t in topologies for p in t["partitionMap"] if not p["leader"]]
        if leaderless:
            raise _NotLeader(f"partitions without a leader: {sorted(set(leaderless))}")
        return topologies[0]

    try:
        return eventually(formed, "the cluster to form", FORMING_S, poll_s=0.25,
                          ignoring=(_NotLeader, OSError, TimeoutError, AssertionError))
    except AssertionError as exc:
        logs = "\n".join(f"--- {n.name}\n{n.log_tail()}" for n in nodes.values())
        raise AssertionError(f"{exc}\n{logs}") from None


def test_compose_node_services_form_a_cluster_that_pushes_and_pulls(compose_nodes: dict[str, LocalNode]) -> None:
    nodes = compose_nodes
    topology = wait_formed(nodes)
    # The settings come from the compose environment alone (no config file, no flags).
    compose_env = service_env(compose()["services"]["shoal-1"], USER_VARIABLES)
    assert {n["id"] for n in topology["nodes"]} == set(NODE_SERVICES)
    assert topology["clusterId"] == compose_env["SHOAL_CLUSTER_ID"] == CLUSTER_ID
    assert topology["partitions"] == int(compose_env["SHOAL_PARTITIONS"])
    assert all(len(p["replicas"]) == int(compose_env["SHOAL_REPLICATION"]) for p in topology["partitionMap"])
    for node in nodes.values():
        assert node.argv[1:] == compose()["services"][node.name]["command"][1:] and "SHOAL_CONFIG" not in node.env
        status, body = http_get(node.http_port, "/healthz")
        assert status == 200 and json.loads(body).get("ok") is True, body
    seed = nodes["shoal-1"].port

    queue = "compose-smoke"
    data = {"hello": "compose", "n": 1}
    pushed = on_leader(seed, queue, lambda c: routed(c.call({"cmd": "PUSH", "queue": queue, "data": data})))
    assert pushed["ok"], pushed
    job_id = pushed["id"]
    assert job_id.startswith(f"{partition_for(queue, topology['partitions'])}-")

    def pull_and_ack(conn: Conn) -> tuple[dict[str, Any], dict[str, Any]]:
        # One connection: the lease belongs to the pulling session and ends with it.
        pulled = routed(conn.call({"cmd": "PULL", "queue": queue, "timeout": 5000}))
        if not pulled.get("ok") or pulled.get("job") is None:
            return pulled, {}
        ack = {"cmd": "ACK", "id": pulled["job"]["id"], **({"token": pulled["token"]} if "token" in pulled else {})}
        return pulled, routed(conn.call(ack))

    pulled, acked = on_leader(seed, queue, pull_and_ack)
    assert pulled["ok"] and pulled["job"] is not None, pulled
    assert pulled["job"]["id"] == job_id and pulled["job"]["data"] == data
    assert acked.get("ok"), acked

    # Readiness on every node (quorum everywhere), then the health checks the containers would run.
    eventually(lambda: all(http_get(n.http_port, "/ready")[0] == 200 for n in nodes.values()),
               "/ready to answer 200 on every node", RETRY_S, poll_s=0.25)
    for node in nodes.values():
        status, body = http_get(node.http_port, "/ready")
        assert status == 200, (node.name, body)
    compose_check = compose_test_argv(compose()["services"]["shoal-1"]["healthcheck"]["test"])
    docker_check = healthcheck_argv(dockerfile_instructions())
    for node in nodes.values():
        for argv in (compose_check, docker_check):
            argv = [sys.executable if a == "python" else a for a in argv]
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}, **node.env}
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, (node.name, argv, result.stderr[-2000:])

    # The Grafana dashboard's metrics exist on the live nodes.
    exposed = set()
    for node in nodes.values():
        status, body = http_get(node.http_port, "/prometheus")
        assert status == 200
        exposed |= {line.split("{")[0].split(" ")[0] for line in body.decode().splitlines()
                    if line and not line.startswith("#")}
    missing = sorted(dashboard_metric_names() - exposed)
    assert not missing, f"the Grafana dashboard queries metrics no node exposes: {missing}"

    # SIGTERM is the container stop signal: every node stops gracefully with exit code 0.
    for node in nodes.values():
        os.kill(node.proc.pid, signal.SIGTERM)
    for node in nodes.values():
        try:
            code = node.proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{node.name} did not stop within 30 s of SIGTERM:\n{node.log_tail()}")
        assert code == 0, f"{node.name} exited {code} on SIGTERM:\n{node.log_tail()}"

