"""Scaling as the deployments do it, with their commands and environments run as local processes.

- compose: the three node services and ``docker-compose.node-4.yml``'s ``shoal-4``, registered with
  deploy/README.md's own admin call, then the cluster moves replicas onto it;
- Helm: the chart's pods (the rendered environment of each, with its ``$(VAR)`` references
  expanded) run the init container's ``shoal pod join`` and then ``shoal node``; a fourth pod joins;
  a scale-down runs the preStop hook's ``shoal pod leave`` as the chart writes it, against a local
  stand-in for the Kubernetes API that answers the StatefulSet's replica count; a pod whose volume
  was deleted comes back through ``shoal pod join`` as a replacement.

What one machine forces changes, as in ``test_compose_cluster.py``: hosts become 127.0.0.1 with
free ports, listeners bind loopback, data goes to a temporary folder. Every acknowledged job is
counted again at the end; every process is stopped by its pid, also on failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from shoal.client import Client
from shoal.cluster.admin_client import AdminClient, AdminError, ClusterShape
from shoal.cluster.config import load_config
from shoal.cluster.registry import REMOVED

from _deploy import DEPLOY, NODE_SERVICES, chart_values, pod_env, resolve_conditionals, service_env, template_texts
from test_compose_cluster import USER_VARIABLES, LocalNode, _free_ports, _shoal_argv, _stop, wait_formed
from waiting import eventually

pytestmark = pytest.mark.integration

TOKEN = USER_VARIABLES["SHOAL_AUTH_TOKENS"]
SETTLE_S = 150.0
STEP_S = 120.0
QUEUES = [f"scale-{i}" for i in range(8)]


class Processes:
    """Node processes started for a test; stopped (SIGTERM, then SIGKILL) at its end by pid."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: dict[str, LocalNode] = {}
        self.all: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], port: int, http_port: int) -> LocalNode:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / f"node-{len(self.all)}.log"
        host_env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        with open(log, "wb") as out:
            proc = subprocess.Popen(_shoal_argv(argv), env={**host_env, **env}, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=folder)
        self.all.append(proc)
        node = LocalNode(name, env, argv, proc, log, port, http_port)
        self.nodes[name] = node
        return node

    def run(self, argv: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """A pod step (init container, preStop hook) to its end."""
        host_env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        return subprocess.run(_shoal_argv(argv), env={**host_env, **env}, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        _stop(self.all)

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{n.log_tail()}" for n in self.nodes.values())


@pytest.fixture
def processes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    request.addfinalizer(procs.stop)
    yield procs


def _push(addresses: list[str], count: int, tag: str) -> int:
    """Push ``count`` jobs over the queues (each acknowledged); how many."""
    with Client(addresses, token=TOKEN) as client:
        for i in range(count):
            client.queue(QUEUES[i % len(QUEUES)]).add({"tag": tag, "i": i})
    return count


def _count(addresses: list[str]) -> int:
    with Client(addresses, token=TOKEN) as client:
        return sum(client.queue(q).counts().get("waiting", 0) for q in QUEUES)


def _wait(admin: AdminClient, done: Any, procs: Processes, what: str, timeout_s: float = SETTLE_S) -> ClusterShape:
    """The cluster's shape once ``done(shape)``; on a timeout, the moves still running and the nodes' logs."""
    seen: list[ClusterShape] = []

    def reached() -> ClusterShape | None:
        shape = admin.shape()
        seen[:] = [shape]
        return shape if done(shape) else None

    try:
        return eventually(reached, what, timeout_s, poll_s=0.5, ignoring=(AdminError,))
    except AssertionError as exc:
        running = seen[0].moves if seen else "the node did not answer"
        raise AssertionError(f"{exc} (still running: {running})\n{procs.logs()}") from None


def _holds(shape: ClusterShape, node: str) -> int:
    return sum(node in shape.replicas(p) for p in shape.placement)


# --- compose -------------------------------------------------------------------------------------

def _readme_admin_body() -> dict[str, Any]:
    """The JSON body of deploy/README.md's `POST /admin/nodes` for shoal-4."""
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index("### Adding a node"):text.index("### Replacing a dead node (compose)")]
    m = re.search(r"/admin/nodes \\\n\s+-d '(\{.*?\})'", section)
    assert m, "deploy/README.md shows the admin call that registers shoal-4"
    return json.loads(m.group(1))


def test_compose_adds_a_fourth_node_with_the_documented_admin_call(processes: Processes, tmp_path: Path) -> None:
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    extra = yaml.safe_load((DEPLOY / "docker-compose.node-4.yml").read_text())["services"]
    services = {**{n: base[n] for n in NODE_SERVICES}, "shoal-4": extra["shoal-4"]}
    variables = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}, **USER_VARIABLES}
    envs = {name: service_env(svc, variables) for name, svc in services.items()}
    ports = _free_ports(3 * len(services))
    remap = {name: (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i, name in enumerate(services)}
    first = [n.id for n in load_config(env=envs["shoal-4"]).nodes if n.id != "shoal-4"]
    assert first == list(NODE_SERVICES) and load_config(env=envs["shoal-4"]).bootstrap_ids() == tuple(NODE_SERVICES)
    peers = ",".join(f"{n}=127.0.0.1:{':'.join(map(str, remap[n]))}" for n in first)

    def local_env(name: str) -> dict[str, str]:
        env = dict(envs[name])
        env.update(SHOAL_PEERS=peers, SHOAL_LISTEN="127.0.0.1", SHOAL_DATA_DIR=str(tmp_path / name / "data"))
        if "SHOAL_NODE_HOST" in env:  # the added node: its own address and ports, remapped
            client, http, raft = remap[name]
            env.update(SHOAL_NODE_HOST="127.0.0.1", SHOAL_CLIENT_PORT=str(client), SHOAL_HTTP_PORT=str(http),
                       SHOAL_RAFT_PORT=str(raft))
        return env

    for name in NODE_SERVICES:
        processes.start(name, services[name]["command"], local_env(name), remap[name][0], remap[name][1])
    wait_formed(processes.nodes)
    addresses = [f"127.0.0.1:{remap[n][0]}" for n in NODE_SERVICES]
    pushed = _push(addresses, 200, "compose")

    body = _readme_admin_body()
    assert body == {"id": "shoal-4", "host": "shoal-4", "port": 6795, "httpPort": 6796, "raftPort": 7789}
    assert load_config(env=envs["shoal-4"]).node().port == body["port"], "the call names the file's ports"
    admin = AdminClient(f"http://127.0.0.1:{remap['shoal-1'][1]}", TOKEN)
    admin.add_node(body["id"], "127.0.0.1", *remap["shoal-4"])
    processes.start("shoal-4", services["shoal-4"]["command"], local_env("shoal-4"), *remap["shoal-4"][:2])
    shape = _wait(admin, lambda s: s.settled() and _holds(s, "shoal-4") > 0, processes, "shoal-4 joins")
    assert shape.registry.nodes["shoal-4"].incarnation, "linked: its incarnation is recorded"
    assert _count(addresses + [f"127.0.0.1:{remap['shoal-4'][0]}"]) == pushed


# --- Helm ----------------------------------------------------------------------------------------

class _StatefulSetApi(ThreadingHTTPServer):
    """Stands in for the Kubernetes API: GET of one StatefulSet, with the service account's token."""

    def __init__(self, namespace: str, name: str, token: str) -> None:
        self.replicas = 0
        self.asked = 0
        path, expected = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}", f"Bearer {token}"
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                ok = self.path == path and self.headers.get("Authorization") == expected
                body = json.dumps({"kind": "StatefulSet", "spec": {"replicas": api.replicas}} if ok else
                                  {"kind": "Status", "code": 403}).encode()
                api.asked += ok
                self.send_response(200 if ok else 403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[tuple[_StatefulSetApi, Path]]:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("sa-token\n")
    (account / "namespace").write_text("queues\n")
    api = _StatefulSetApi("queues", "shoal", "sa-token")
    thread = threading.Thread(target=api.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, account
    finally:
        api.shutdown()
        api.server_close()
        thread.join(5)


def _pod_spec() -> dict[str, Any]:
    text = resolve_conditionals(template_texts()["statefulset.yaml"], chart_values())
    skeleton = re.sub(r"\{\{.*?\}\}", "X", re.sub(r"(?m)^\s*\{\{.*?\}\}\s*\n", "", text))
    return yaml.safe_load(skeleton)["spec"]["template"]["spec"]


def test_helm_pods_join_scale_down_highest_first_and_replace_a_lost_volume(
        processes: Processes, tmp_path: Path, kube_api: tuple[_StatefulSetApi, Path]) -> None:
    api, account = kube_api
    spec = _pod_spec()
    join_argv = spec["initContainers"][0]["command"]
    node_argv = spec["containers"][0]["command"]
    prestop = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert join_argv[:3] == ["shoal", "pod", "join"] and node_argv == ["shoal", "node"]
    assert prestop == ["shoal", "pod", "leave", "--statefulset", "X", "--timeout", "X"]
    # X: the release's full name and scaleDown.timeoutSeconds, as the template fills them in.
    leave_argv = prestop[:4] + ["shoal", "--timeout", str(chart_values()["scaleDown"]["timeoutSeconds"])]
    # The stand-in API and service account instead of the in-cluster ones.
    leave_argv += ["--kube-api", api.url, "--service-account", str(account)]
    values = {**chart_values(), "replicas": 4, "initialReplicas": 3}
    secret = {"cluster-secret": "helm-test-secret", "auth-tokens": TOKEN}
    ports = _free_ports(3 * 4)
    remap = {f"shoal-{i}": (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(4)}

    def local_env(ordinal: int) -> dict[str, str]:
        env = pod_env(values, ordinal, secret)
        name = env["SHOAL_NODE_ID"]
        assert env["SHOAL_NODE_HOST"] == f"{name}.shoal-peers.queues.svc.cluster.local"
        listed = [item.split("=")[0] for item in env["SHOAL_PEERS"].split(",")]
        assert listed == ["shoal-0", "shoal-1", "shoal-2"] == env["SHOAL_BOOTSTRAP_NODES"].split(",")
        client, http, raft = remap[name]
        env.update(SHOAL_PEERS=",".join(f"{n}=127.0.0.1:{':'.join(map(str, remap[n]))}" for n in listed),
                   SHOAL_NODE_HOST="127.0.0.1", SHOAL_CLIENT_PORT=str(client), SHOAL_HTTP_PORT=str(http),
                   SHOAL_RAFT_PORT=str(raft), SHOAL_LISTEN="127.0.0.1",
                   SHOAL_DATA_DIR=str(tmp_path / name / "data"))
        return env

    def start_pod(ordinal: int) -> None:
        name, env = f"shoal-{ordinal}", local_env(ordinal)
        init = processes.run(join_argv, env, timeout_s=120)
        assert init.returncode == 0, (name, init.stdout, init.stderr)
        processes.start(name, node_argv, env, *remap[name][:2])

    for ordinal in range(3):  # the first install: nobody to join, each init container goes on
        start_pod(ordinal)
    wait_formed(processes.nodes)
    admin = AdminClient(f"http://127.0.0.1:{remap['shoal-0'][1]}", TOKEN)
    first_three = [f"127.0.0.1:{remap[f'shoal-{i}'][0]}" for i in range(3)]
    pushed = _push(first_three, 200, "helm")

    # Scale to 4: the new pod's init container registers it, the leaders move replicas onto it.
    start_pod(3)
    shape = _wait(admin, lambda s: s.settled() and _holds(s, "shoal-3") > 0, processes, "shoal-3 joins")
    assert shape.registry.nodes["shoal-3"].incarnation
    pushed += _push(first_three, 100, "helm-4")

    # Any other stop (a rolling update: ordinal < replicas) returns at once, nothing decommissioned.
    api.replicas = 4
    plain = processes.run(leave_argv, local_env(3), timeout_s=60)
    assert plain.returncode == 0 and "plain stop" in plain.stdout, (plain.stdout, plain.stderr)
    assert admin.registry().nodes["shoal-3"].state == "active"

    # Scale back to 3: shoal-3's preStop hook decommissions it, waits for its moves, removes it.
    api.replicas = 3
    left = processes.run(leave_argv, local_env(3), timeout_s=STEP_S + SETTLE_S)
    assert left.returncode == 0, (left.stdout, left.stderr, processes.logs())
    assert "decommissioned" in left.stdout and "removed" in left.stdout, left.stdout
    shape = admin.shape()
    assert shape.registry.nodes["shoal-3"].state == REMOVED and _holds(shape, "shoal-3") == 0
    stopping = processes.nodes["shoal-3"].proc
    os.kill(stopping.pid, signal.SIGTERM)
    assert stopping.wait(30) == 0
    assert api.asked >= 2, "the hook asked the API for the StatefulSet's replicas"
    assert _count(first_three) == pushed

    # shoal-2 loses its volume: delete the claim and the pod; the new pod's init container replaces it.
    old = admin.registry().nodes["shoal-2"].incarnation
    lost = processes.nodes["shoal-2"].proc
    lost.kill()
    lost.wait(10)
    subprocess.run(["rm", "-rf", str(tmp_path / "shoal-2" / "data")], check=True)
    start_pod(2)
    shape = _wait(admin, lambda s: s.settled() and s.registry.nodes["shoal-2"].incarnation != old
                  and _holds(s, "shoal-2") > 0, processes, "shoal-2 replaced")
    new = shape.registry.nodes["shoal-2"]
    assert new.incarnation != old and new.original == old, "the plain id still names the old incarnation"
    assert _count(first_three) == pushed
