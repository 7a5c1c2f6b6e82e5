"""deploy/: the Dockerfile, docker-compose and the Helm chart agree with what `shoal node` reads.

No Docker engine or helm binary runs here, so the files are checked statically and the
compose file's node services are started as local processes with exactly its command and
environment (hosts and ports remapped to loopback, data in a temporary folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from shoal.cluster.config import ENV_VARS
from shoal.cluster.launcher import free_base_port, hello

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CHART = DEPLOY / "helm" / "shoal"
NODE_SERVICES = ["shoal-1", "shoal-2", "shoal-3"]
CHAOS_SERVICES = ["shoal-chaos-1", "shoal-chaos-2", "shoal-chaos-3"]

sys.path.insert(0, str(DEPLOY))
import make_toxiproxy_config  # noqa: E402


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def interpolate(value: str, env: dict[str, str]) -> str:
    """docker compose's ``${NAME:-default}`` substitution (the only form the file uses)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), value)


def test_compose_has_three_nodes_with_volumes_health_checks_and_a_shared_secret() -> None:
    services = compose()["services"]
    secrets = set()
    for name in NODE_SERVICES:
        svc = services[name]
        env = svc["environment"]
        assert env["SHOAL_NODE_ID"] == name
        assert "healthcheck" in svc and "/healthz" in " ".join(svc["healthcheck"]["test"])
        assert svc["volumes"][0].endswith(":/data") and svc["volumes"][0].startswith(f"{name}-data")
        secrets.add(env["SHOAL_CLUSTER_SECRET"])
        assert set(env) <= set(ENV_VARS), f"{name} sets variables shoal node does not read"
    assert len(secrets) == 1
    assert services["shoal-3"]["depends_on"]["shoal-1"]["condition"] == "service_started"
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["toxiproxy"]["profiles"] == ["chaos"]


def test_chaos_profile_routes_every_link_through_toxiproxy() -> None:
    services = compose()["services"]
    proxies = json.loads((DEPLOY / "toxiproxy.json").read_text())
    assert proxies == make_toxiproxy_config.proxies(), "regenerate deploy/toxiproxy.json"
    listens = {int(p["listen"].rsplit(":", 1)[1]): p["upstream"] for p in proxies}
    for name in CHAOS_SERVICES:
        env = services[name]["environment"]
        assert env["SHOAL_PEERS"] == make_toxiproxy_config.peers()
        assert services[name]["profiles"] == ["chaos"]
    for peer in make_toxiproxy_config.peers().split(","):
        node, _, rest = peer.partition("=")
        host, client, _http, raft = rest.split(":")
        assert host == "toxiproxy"
        assert listens[int(client)] == f"{node}:{client}"
        for p in range(make_toxiproxy_config.PARTITIONS):
            assert listens[int(raft) + p] == f"{node}:{int(raft) + p}"


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="Debian's docker-compose is not installed "
                    "(scripts/test installs it when it runs as root with apt)")
def test_docker_compose_config_accepts_the_file_with_every_profile() -> None:
    env = {**os.environ, "SHOAL_CLUSTER_SECRET": "test-secret"}
    for args in ([], ["--profile", "chaos", "--profile", "monitoring"]):
        result = subprocess.run(["docker-compose", "-f", str(DEPLOY / "docker-compose.yml"), *args, "config", "-q"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    services = subprocess.run(["docker-compose", "-f", str(DEPLOY / "docker-compose.yml"), "--profile", "chaos",
                               "--profile", "monitoring", "config", "--services"], env=env, capture_output=True,
                              text=True, timeout=60).stdout.split()
    assert set(services) == {*NODE_SERVICES, *CHAOS_SERVICES, "toxiproxy", "prometheus"}


def test_dockerfile_is_a_small_non_root_image_with_a_health_check() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert re.search(r"^USER 10001$", text, re.M)
    assert "HEALTHCHECK" in text and "/healthz" in text
    assert 'VOLUME ["/data"]' in text and "STOPSIGNAL SIGTERM" in text
    assert 'ENTRYPOINT ["shoal", "node"]' in text


def test_chart_values_validate_against_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(values, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**values, "replicas": 0}, schema)


def _lookup(values: dict[str, Any], path: str) -> bool:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_values_path_used_by_a_template_exists() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = set()
    for template in (CHART / "templates").iterdir():
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()))
    assert used, "templates use values"
    missing = sorted(p for p in used if not _lookup(values, p))
    assert not missing, f"templates use values missing from values.yaml: {missing}"


def test_statefulset_environment_matches_what_shoal_node_reads() -> None:
    text = (CHART / "templates" / "statefulset.yaml").read_text()
    names = set(re.findall(r"- name: (SHOAL_[A-Z_]+)", text))
    assert names <= set(ENV_VARS), f"unknown variables: {sorted(names - set(ENV_VARS))}"
    assert {"SHOAL_NODE_ID", "SHOAL_PEERS", "SHOAL_CLUSTER_SECRET", "SHOAL_DATA_DIR", "SHOAL_LISTEN"} <= names
    assert "fieldPath: metadata.name" in text, "the node id comes from the pod's name"
    assert "path: /ready" in text and "path: /healthz" in text


def _shoal_executable() -> str:
    beside = Path(sys.executable).with_name("shoal")
    return str(beside) if beside.exists() else "shoal"


@pytest.mark.integration
def test_compose_nodes_started_as_local_processes_form_a_cluster(tmp_path: Path) -> None:
    services = compose()["services"]
    base = free_base_port(3, 8)
    ports = {name: (base + 2 * i, base + 2 * i + 1, base + 100 + 64 * i) for i, name in enumerate(NODE_SERVICES)}
    peers = ",".join(f"{name}=127.0.0.1:{c}:{h}:{r}" for name, (c, h, r) in ports.items())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in NODE_SERVICES:
            svc = services[name]
            clean = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
            env = {k: interpolate(str(v), clean) for k, v in svc["environment"].items()}
            assert env["SHOAL_PEERS"] == "shoal-1=shoal-1,shoal-2=shoal-2,shoal-3=shoal-3"
            env["SHOAL_PEERS"] = peers                  # service names -> loopback, ports remapped
            env["SHOAL_LISTEN"] = "127.0.0.1"           # never 0.0.0.0 on this machine
            env["SHOAL_DATA_DIR"] = str(tmp_path / name)
            command = [_shoal_executable() if svc["command"][0] == "shoal" else svc["command"][0],
                       *svc["command"][1:]]
            log = open(tmp_path / f"{name}.log", "wb")
            procs.append(subprocess.Popen(command, env={**clean, **env}, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + 60
        topo = None
        while time.monotonic() < deadline:
            try:
                topo = hello("127.0.0.1", ports["shoal-1"][0], 1.0)["topology"]
                if all(p["leader"] for p in topo["partitionMap"]):
                    break
            except OSError:
                pass
            assert all(p.poll() is None for p in procs), (tmp_path / "shoal-1.log").read_text()[-2000:]
            time.sleep(0.2)
        assert topo and all(p["leader"] for p in topo["partitionMap"])
        from shoal.client import Client
        with Client([f"127.0.0.1:{ports['shoal-1'][0]}"]) as client:
            q = client.queue("compose-smoke")
            job_id = q.add({"hello": "compose"})
            job = q.pull(timeout=5)
            assert job is not None and job.id == job_id and job.data == {"hello": "compose"}
            q.ack(job)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
