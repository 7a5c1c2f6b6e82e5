"""deploy/: the Dockerfile, docker-compose and the Helm chart agree with what `shoal node` reads.

No Docker engine or helm binary runs here, so these tests read the files: compose's services,
profiles and environment (loaded with the node's own ``load_config``), the Dockerfile's effective
command, the chart's values against its schema and the StatefulSet's environment rendered and
loaded the same way. ``test_compose_cluster.py`` runs the compose node services as processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from shoal.cluster.config import ENV_VARS, load_config
from shoal.cluster.guard import TLS_ENV_VARS

from _deploy import (CHART, CHAOS_SERVICES, COMPOSE_FILE, DEPLOY, IDENTITY, NODE_SERVICES, MissingVariable,
                     bootstrap_count, chart_env_text, chart_schema, define_body, interpolate, pod_env, rendered_env,
                     chart_values, dashboard_metric_names, compose, compose_test_argv, dockerfile_instructions, final_stage,
                     healthcheck_argv, image_argv, lookup, resolve_conditionals, service_env,
                     template_texts,
                     values_paths_used)

REPO = DEPLOY.parent
#: What a user must give compose (deploy/.env or the environment); compose refuses the file without each.
REQUIRED_VARS = {"SHOAL_CLUSTER_ID": "shoal-0123456789abcdef", "SHOAL_CLUSTER_SECRET": "s3cret-for-tests",
                 "SHOAL_AUTH_TOKENS": "token-for-tests"}

sys.path.insert(0, str(DEPLOY))
import make_toxiproxy_config  # noqa: E402


# --- the configuration contract itself ----------------------------------------------------------

class _Recording(Mapping[str, str]):
    def __init__(self, data: dict[str, str]) -> None:
        self.data, self.read = data, set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read.add(key)
        return self.data.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_env_vars_lists_exactly_what_load_config_reads(tmp_path: Path) -> None:
    """ENV_VARS is what deploy/ is checked against, so it must match load_config's reads."""
    config = tmp_path / "c.toml"
    config.write_text('[cluster]\nid = "x"\n')
    env = _Recording({"SHOAL_CONFIG": str(config), "SHOAL_NODE_ID": "a", "SHOAL_PEERS": "a=127.0.0.1",
                      "SHOAL_DATA_DIR": str(tmp_path / "a"), "SHOAL_AUTH_TOKENS": "t"})
    load_config(env=env)
    read = {k for k in env.read if k.startswith("SHOAL_")}
    assert read == set(ENV_VARS), (f"read but not in ENV_VARS: {sorted(read - set(ENV_VARS))}; "
                                   f"in ENV_VARS but never read: {sorted(set(ENV_VARS) - read)}")


# --- docker-compose --------------------------------------------------------------------------

def _node_env(name: str, variables: dict[str, str] | None = None) -> dict[str, str]:
    return service_env(compose()["services"][name], REQUIRED_VARS if variables is None else variables)


def test_compose_has_three_nodes_with_own_volumes_health_checks_and_one_secret() -> None:
    doc = compose()
    services = doc["services"]
    volumes = set()
    secrets = set()
    for name in NODE_SERVICES:
        svc = services[name]
        assert "profiles" not in svc, f"{name} must start with a plain `docker compose up`"
        assert svc["command"] == ["shoal", "node"]
        assert "/healthz" in " ".join(compose_test_argv(svc["healthcheck"]["test"]))
        (volume,) = svc["volumes"]
        source, target = volume.split(":")[:2]
        assert target == "/data" and source in doc["volumes"], f"{name}: a named volume on /data"
        volumes.add(source)
        env = _node_env(name)
        assert env["SHOAL_NODE_ID"] == name
        assert env["SHOAL_DATA_DIR"] == "/data" and env["SHOAL_LISTEN"] == "0.0.0.0"
        secrets.add(env["SHOAL_CLUSTER_SECRET"])
        raw_secret = svc["environment"]["SHOAL_CLUSTER_SECRET"]
        assert raw_secret.startswith("${SHOAL_CLUSTER_SECRET"), "one secret, from the environment/.env"
        assert svc["environment"]["SHOAL_CLUSTER_ID"].startswith("${SHOAL_CLUSTER_ID:?"), \
            "one cluster id, from the environment/.env"
        assert env["SHOAL_CLUSTER_ID"] == REQUIRED_VARS["SHOAL_CLUSTER_ID"]
        assert svc.get("stop_grace_period") and svc.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert len(volumes) == 3 and secrets == {REQUIRED_VARS["SHOAL_CLUSTER_SECRET"]}


def test_compose_refuses_to_start_without_a_cluster_secret() -> None:
    with pytest.raises(MissingVariable):
        _node_env("shoal-1", {})
    with pytest.raises(MissingVariable):
        _node_env("shoal-1", {**REQUIRED_VARS, "SHOAL_CLUSTER_SECRET": ""})


def test_compose_refuses_to_start_without_a_cluster_id_and_says_how_to_make_one() -> None:
    without = {k: v for k, v in REQUIRED_VARS.items() if k != "SHOAL_CLUSTER_ID"}
    for name in (*NODE_SERVICES, *CHAOS_SERVICES):
        for variables in (without, {**without, "SHOAL_CLUSTER_ID": ""}):
            with pytest.raises(MissingVariable, match=r"SHOAL_CLUSTER_ID=shoal-\$\(openssl rand -hex 8\)"):
                _node_env(name, variables)


def test_the_chaos_profile_is_a_cluster_of_its_own() -> None:
    main = {load_config(env=_node_env(name)).cluster_id for name in NODE_SERVICES}
    chaos = {load_config(env=_node_env(name)).cluster_id for name in CHAOS_SERVICES}
    assert main == {REQUIRED_VARS["SHOAL_CLUSTER_ID"]} and chaos == {REQUIRED_VARS["SHOAL_CLUSTER_ID"] + "-chaos"}


def test_compose_refuses_to_start_without_client_tokens() -> None:
    for name in (*NODE_SERVICES, *CHAOS_SERVICES, "prometheus"):
        with pytest.raises(MissingVariable):
            _node_env(name, {"SHOAL_CLUSTER_ID": "c", "SHOAL_CLUSTER_SECRET": "s"})
        with pytest.raises(MissingVariable):
            _node_env(name, {**REQUIRED_VARS, "SHOAL_AUTH_TOKENS": ""})
    assert load_config(env=_node_env("shoal-1")).tokens == ("token-for-tests",)


def test_compose_publishes_ports_on_loopback_unless_told_otherwise() -> None:
    for name, svc in compose()["services"].items():
        for spec in svc.get("ports", []):
            assert interpolate(spec, {}).startswith("127.0.0.1:"), f"{name}: {spec}"
            assert interpolate(spec, {"SHOAL_PUBLISH": "0.0.0.0"}).startswith("0.0.0.0:")


def test_compose_depends_on_conditions_name_real_services() -> None:
    services = compose()["services"]
    seen = 0
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_started", "service_healthy", "service_completed_successfully")
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no check"
            if services[dep].get("profiles"):
                assert set(services[dep]["profiles"]) <= set(svc.get("profiles", [])), \
                    f"{name} depends on {dep}, which only exists in profile {services[dep]['profiles']}"
            seen += 1
    assert services["shoal-2"]["depends_on"]["shoal-1"]["condition"] == "service_healthy"
    assert services["shoal-3"]["depends_on"]["shoal-1"]["condition"] == "service_healthy"
    assert seen >= 6


@pytest.mark.parametrize("name", NODE_SERVICES + CHAOS_SERVICES)
def test_compose_node_environment_is_a_valid_node_configuration(name: str) -> None:
    env = _node_env(name)
    assert set(env) <= set(ENV_VARS), f"{name} sets variables shoal node does not read: {set(env) - set(ENV_VARS)}"
    config = load_config(env=env)
    assert config.node_id == name and len(config.nodes) == 3 and config.rf == 3
    assert config.raft_needs_secret() and config.secret == REQUIRED_VARS["SHOAL_CLUSTER_SECRET"]
    assert str(config.node_data_dir()) == "/data"
    peers_by_service = {n.id: n for n in config.nodes}
    assert set(peers_by_service) == set(CHAOS_SERVICES if name.startswith("shoal-chaos") else NODE_SERVICES)


def test_compose_publishes_each_node_on_its_own_advertised_ports() -> None:
    """Hello advertises host:port per node; the host sees the same ports (with /etc/hosts names)."""
    services = compose()["services"]
    for name in NODE_SERVICES:
        me = load_config(env=_node_env(name)).node()
        assert me.host == name, "peers reach a node by its compose service name"
        published = {tuple(interpolate(p, {}).split(":")) for p in services[name]["ports"]}
        assert published == {("127.0.0.1", str(me.port), str(me.port)),
                             ("127.0.0.1", str(me.http_port), str(me.http_port))}
    clients = [load_config(env=_node_env(n)).node().port for n in NODE_SERVICES]
    assert len(set(clients)) == 3


def test_chaos_profile_routes_every_link_through_the_real_toxiproxy_image() -> None:
    services = compose()["services"]
    toxi = services["toxiproxy"]
    assert toxi["image"].startswith("ghcr.io/shopify/toxiproxy:") and toxi["profiles"] == ["chaos"]
    config_mount = next(v for v in toxi["volumes"] if v.startswith("./toxiproxy.json:"))
    target = config_mount.split(":")[1]
    assert f"-config={target}" in toxi["command"]
    proxies = json.loads((DEPLOY / "toxiproxy.json").read_text())
    assert proxies == make_toxiproxy_config.proxies(), "regenerate: python deploy/make_toxiproxy_config.py"
    assert len({p["name"] for p in proxies}) == len(proxies)
    listens = {int(p["listen"].rsplit(":", 1)[1]): p["upstream"] for p in proxies}
    published = set()
    for spec in toxi["ports"]:
        bind, host, container = interpolate(spec, {}).split(":")
        assert bind == "127.0.0.1"
        lo, _, hi = container.partition("-")
        published |= set(range(int(lo), int(hi or lo) + 1))
    for name in CHAOS_SERVICES:
        svc = services[name]
        assert svc["profiles"] == ["chaos"] and svc["depends_on"]["toxiproxy"]["condition"] == "service_healthy"
        assert "ports" not in svc, "chaos nodes are reached only through Toxiproxy"
        config = load_config(env=_node_env(name))
        for node in config.nodes:
            assert node.host == "toxiproxy"
            assert listens[node.port] == f"{node.id}:{node.port}"
            assert listens[node.http_port] == f"{node.id}:{node.http_port}"
            assert {node.port, node.http_port} <= published
            assert listens[node.raft_port] == f"{node.id}:{node.raft_port}"  # one Raft port per node
        assert not any(p["name"].startswith("raft_") and "_p" in p["name"] for p in proxies)


def test_monitoring_profile_scrapes_every_node_and_provisions_grafana() -> None:
    services = compose()["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["grafana"]["profiles"] == ["monitoring"]
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "shoal"]
    assert job["metrics_path"] == "/prometheus"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    expected = set()
    for name in NODE_SERVICES:
        me = load_config(env=_node_env(name)).node()
        expected.add(f"{me.host}:{me.http_port}")
    assert targets == expected
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        source = mount.split(":")[0]
        if source.startswith("./"):
            assert (DEPLOY / source).exists(), f"{mount}: missing in deploy/"
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (ds,) = datasource["datasources"]
    assert ds["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/shoal.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert any(m.endswith(f":{path}:ro") for m in services["grafana"]["volumes"])
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (DEPLOY / "grafana/dashboards" / Path(home).name).exists()
    dashboard = json.loads((DEPLOY / "grafana/dashboards/shoal.json").read_text())
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == ds["uid"]


def test_dashboard_uses_metrics_the_node_defines() -> None:
    source = "".join((REPO / "node" / f).read_text() for f in ("metrics.py", "collector.py"))
    names = dashboard_metric_names()
    assert names
    for name in names:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert f'"{base}"' in source, f"the dashboard uses {name}; node/metrics.py and collector.py define no {base}"


COMPOSE_TLS_FILE = DEPLOY / "docker-compose.tls.yml"


@pytest.mark.parametrize("client_certs", ["", "required"])
def test_compose_tls_overlay_configures_every_node_from_the_mounted_directory(tmp_path: Path,
                                                                              client_certs: str) -> None:
    overlay = yaml.safe_load(COMPOSE_TLS_FILE.read_text())["services"]
    assert set(overlay) == set(NODE_SERVICES)
    mount = tmp_path / "tls"
    mount.mkdir()
    for name in ("node.pem", "node.key", "ca.pem"):
        (mount / name).write_text("PEM")
    variables = {**REQUIRED_VARS, "SHOAL_TLS_DIR": str(mount), "SHOAL_TLS_CLIENT_CERTS": client_certs}
    for name in NODE_SERVICES:
        svc = overlay[name]
        (volume,) = svc["volumes"]
        assert interpolate(volume, variables) == f"{mount}:/etc/shoal/tls:ro"
        with pytest.raises(MissingVariable):  # no directory named: compose refuses the overlay
            interpolate(volume, REQUIRED_VARS)
        check = " ".join(compose_test_argv(svc["healthcheck"]["test"]))
        assert "https://127.0.0.1" in check and "/healthz" in check and "load_cert_chain" in check
        # What compose merges: the base file's environment, then the overlay's.
        env = {**_node_env(name), **service_env(svc, variables)}
        assert set(env) <= set(ENV_VARS)
        config = load_config(env={k: v.replace("/etc/shoal/tls", str(mount)) for k, v in env.items()})
        assert config.node_id == name and config.tls is not None
        assert (config.tls.cert, config.tls.key, config.tls.ca) == (
            str(mount / "node.pem"), str(mount / "node.key"), str(mount / "ca.pem"))
        assert config.tls.client_certs == (client_certs or "none")


@pytest.mark.skipif(not shutil.which("docker-compose"),
                    reason="Debian's docker-compose is not installed (apt-get install -y docker-compose; "
                           "scripts/test does it when it runs as root with apt); only this check is skipped")
def test_docker_compose_config_merges_the_tls_overlay(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}, **REQUIRED_VARS,
           "SHOAL_TLS_DIR": str(tmp_path)}
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "-f", str(COMPOSE_TLS_FILE), "config"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in NODE_SERVICES:
        svc = services[name]
        assert svc["environment"]["SHOAL_NODE_ID"] == name and svc["environment"]["SHOAL_TLS_CLIENT_CERTS"] == "none"
        assert f"{tmp_path}:/etc/shoal/tls:ro" in svc["volumes"] and any(":/data" in v for v in svc["volumes"])
        assert "https://" in " ".join(svc["healthcheck"]["test"]) and svc["healthcheck"]["interval"] == "5s"


@pytest.mark.skipif(not shutil.which("docker-compose"),
                    reason="Debian's docker-compose is not installed (apt-get install -y docker-compose; "
                           "scripts/test does it when it runs as root with apt); only this check is skipped")
def test_docker_compose_config_accepts_the_file_with_every_profile() -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}, **REQUIRED_VARS}
    base = ["docker-compose", "-f", str(COMPOSE_FILE)]
    for profiles in ([], ["--profile", "chaos"], ["--profile", "monitoring"],
                     ["--profile", "chaos", "--profile", "monitoring"]):
        result = subprocess.run([*base, *profiles, "config", "-q"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
    result = subprocess.run([*base, "--profile", "chaos", "--profile", "monitoring", "config", "--services"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert set(result.stdout.split()) == set(compose()["services"])
    # Without a secret compose refuses the file (no insecure default secret).
    no_secret = {k: v for k, v in env.items() if k != "SHOAL_CLUSTER_SECRET"}
    result = subprocess.run([*base, "config", "-q"], env=no_secret, capture_output=True, text=True, timeout=60,
                            cwd=REPO)
    if not (DEPLOY / ".env").exists():
        assert result.returncode != 0 and "SHOAL_CLUSTER_SECRET" in result.stderr


COMPOSE_NODE_4 = DEPLOY / "docker-compose.node-4.yml"


def test_the_fourth_compose_node_joins_the_first_three_as_a_later_node() -> None:
    """docker-compose.node-4.yml: the others' environment plus its own id, host and ports; its peers
    are the three the cluster was created with, it is not one of them, and it runs `shoal node`."""
    base = compose()["services"]
    svc = yaml.safe_load(COMPOSE_NODE_4.read_text())["services"]["shoal-4"]
    env = service_env(svc, REQUIRED_VARS)
    shared = service_env(base["shoal-1"], REQUIRED_VARS)
    own = {"SHOAL_NODE_ID", "SHOAL_NODE_HOST", "SHOAL_CLIENT_PORT", "SHOAL_HTTP_PORT"}
    assert {k: v for k, v in env.items() if k not in own} == {k: v for k, v in shared.items() if k != "SHOAL_NODE_ID"}
    assert set(env) <= set(ENV_VARS)
    config = load_config(env=env)
    me = config.node()
    assert [n.id for n in config.nodes] == [*NODE_SERVICES, "shoal-4"] and config.bootstrap_ids() == NODE_SERVICES
    assert (me.host, me.port, me.http_port, me.raft_port) == ("shoal-4", 6795, 6796, 7789)
    assert {(n.port, n.http_port) for n in config.nodes if n.id != "shoal-4"}.isdisjoint({(6795, 6796)})
    assert svc["command"] == base["shoal-1"]["command"] == ["shoal", "node"]
    assert svc["healthcheck"]["test"] == base["shoal-1"]["healthcheck"]["test"]
    assert svc["stop_grace_period"] == base["shoal-1"]["stop_grace_period"]
    published = {tuple(interpolate(p, {}).split(":")) for p in svc["ports"]}
    assert published == {("127.0.0.1", "6795", "6795"), ("127.0.0.1", "6796", "6796")}
    (volume,) = svc["volumes"]
    assert volume == "shoal-4-data:/data" and "shoal-4-data" in yaml.safe_load(COMPOSE_NODE_4.read_text())["volumes"]
    # The admin call in the file's header and in deploy/README.md registers exactly this node.
    body = '{"id": "shoal-4", "host": "shoal-4", "port": 6795, "httpPort": 6796, "raftPort": 7789}'
    assert body in COMPOSE_NODE_4.read_text() and body in (DEPLOY / "README.md").read_text()


@pytest.mark.skipif(not shutil.which("docker-compose"),
                    reason="Debian's docker-compose is not installed (apt-get install -y docker-compose; "
                           "scripts/test does it when it runs as root with apt); only this check is skipped")
def test_docker_compose_config_merges_the_fourth_node() -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}, **REQUIRED_VARS}
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "-f", str(COMPOSE_NODE_4), "config"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)
    assert set(NODE_SERVICES) | {"shoal-4"} <= set(merged["services"])
    assert merged["services"]["shoal-4"]["environment"]["SHOAL_NODE_HOST"] == "shoal-4"
    assert {"shoal-1-data", "shoal-4-data"} <= set(merged["volumes"])


# --- Dockerfile ------------------------------------------------------------------------------

def test_dockerfile_is_a_small_non_root_image_with_data_volume_and_health_check() -> None:
    instructions = dockerfile_instructions()
    stage = final_stage(instructions)
    assert stage[0] == ("FROM", "python:3.11-slim"), "runtime stage: slim Python"
    (user,) = [a for w, a in stage if w == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root user (runAsNonRoot can check it)"
    assert ("VOLUME", '["/data"]') in stage
    env = " ".join(a for w, a in stage if w == "ENV")
    assert "SHOAL_DATA_DIR=/data" in env and "SHOAL_LISTEN=0.0.0.0" in env
    exposed = " ".join(a for w, a in stage if w == "EXPOSE").split()
    assert {"6789", "6790"} <= set(exposed) and any(p.startswith("7789") for p in exposed)
    assert "/healthz" in " ".join(healthcheck_argv(instructions))
    assert ("STOPSIGNAL", "SIGTERM") in stage
    assert any(w == "RUN" and "pip install" in a for w, a in stage)
    assert "rm -rf /wheels" in " ".join(a for w, a in stage if w == "RUN"), "no wheel files left in the image"


def test_dockerfile_copies_every_package_folder_the_build_needs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = {d.split("/")[0] for d in pyproject["tool"]["setuptools"]["package-dir"].values()}
    copied = set()
    for word, args in dockerfile_instructions():
        if word == "COPY" and not args.startswith("--from"):
            *sources, _dest = args.split()
            copied |= {s.rstrip("/").removeprefix("./") for s in sources}
    assert folders <= copied, f"the image would miss {sorted(folders - copied)}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    ignored = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert not (set(ignored) & copied), "Dockerfile.dockerignore hides files the build copies"


def test_every_container_runs_exactly_shoal_node() -> None:
    """ENTRYPOINT + command: a compose `command` or a k8s `command` must not be appended to another one."""
    instructions = dockerfile_instructions()
    assert image_argv(instructions, None) == ["shoal", "node"], "docker run <image> runs shoal node"
    services = compose()["services"]
    for name in NODE_SERVICES + CHAOS_SERVICES:
        assert "entrypoint" not in services[name]
        assert image_argv(instructions, services[name]["command"]) == ["shoal", "node"], name
    statefulset = template_texts()["statefulset.yaml"]
    assert re.search(r'^\s+command: \["shoal", "node"\]$', statefulset, re.M)
    assert [c["command"][:2] for c in _pod_spec(chart_values())["spec"]["template"]["spec"]["containers"]] == [
        ["shoal", "node"]]
    assert not re.search(r"^\s+args:", statefulset, re.M)


# --- Helm chart --------------------------------------------------------------------------------

def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "shoal" and chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"]) and chart["appVersion"]
    assert set(template_texts()) >= {"statefulset.yaml", "services.yaml", "secret.yaml", "identity.yaml", "pdb.yaml",
                                      "servicemonitor.yaml", "rbac.yaml", "NOTES.txt", "_helpers.tpl"}


def test_chart_templates_are_well_formed() -> None:
    """What helm would reject first: unbalanced actions and blocks (no helm binary here)."""
    for name, text in template_texts().items():
        assert text.count("{{") == text.count("}}"), f"{name}: unbalanced {{{{ }}}}"
        actions = re.findall(r"\{\{-?\s*(\w+)", re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", text, flags=re.S))
        opened = sum(a in ("if", "with", "range", "define", "block") for a in actions)
        assert opened == actions.count("end"), f"{name}: {opened} blocks opened, {actions.count('end')} ended"
        if name.endswith(".yaml"):
            for line in text.splitlines():
                assert "\t" not in line, f"{name}: tab in YAML"


def test_chart_values_validate_against_the_schema() -> None:
    values, schema = chart_values(), chart_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(values, schema)
    for bad in ({**values, "replicas": 0},
                {**values, "replicaCount": 3},                                  # typo: unknown key
                {**values, "cluster": {**values["cluster"], "tokens": ["a,b"]}},  # joined with commas
                {**values, "cluster": {**values["cluster"], "partitions": "8"}},
                {**values, "cluster": {**values["cluster"], "id": "-starts-with-a-dash"}},
                {**values, "cluster": {**values["cluster"], "id": "has space"}},
                {**values, "ports": {**values["ports"], "raft": 70000}},
                {**values, "podAntiAffinity": "sometimes"},
                {**values, "tls": {**values["tls"], "enabled": True}},                   # no Secret named
                {**values, "tls": {**values["tls"], "clientCerts": "required", "caKey": ""}},  # nothing to verify with
                {**values, "tls": {**values["tls"], "clientCerts": "always"}},
                {**values, "limits": {**values["limits"], "httpConnectionsMax": 0}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_every_values_path_used_by_a_template_exists_and_every_value_is_used() -> None:
    values = chart_values()
    used: set[str] = set()
    for name, text in template_texts().items():
        paths = values_paths_used(text)
        missing = sorted(p for p in paths if not lookup(values, p)[0])
        assert not missing, f"{name} uses values missing from values.yaml: {missing}"
        used |= paths

    def leaves(node: Any, prefix: str = "") -> Iterator[str]:
        if isinstance(node, dict) and node:
            for key, child in node.items():
                yield from leaves(child, f"{prefix}{key}.")
        else:
            yield prefix.rstrip(".")

    unused = [leaf for leaf in leaves(values)
              if not any(leaf == u or leaf.startswith(u + ".") for u in used)]
    assert not unused, f"values.yaml keys no template reads: {unused}"


def test_statefulset_environment_matches_what_shoal_node_reads() -> None:
    """Fails when a variable is renamed on one side only (compared with ENV_VARS and load_config)."""
    text = chart_env_text(template_texts()["_helpers.tpl"])
    env = rendered_env(chart_values())
    names = [item["name"] for item in env]
    assert len(names) == len(set(names))
    assert set(names) <= set(ENV_VARS), f"the chart sets variables shoal node does not read: " \
                                        f"{sorted(set(names) - set(ENV_VARS))}"
    assert {"SHOAL_NODE_ID", "SHOAL_PEERS", "SHOAL_CLUSTER_SECRET", "SHOAL_AUTH_TOKENS", "SHOAL_DATA_DIR",
            "SHOAL_LISTEN", "SHOAL_PARTITIONS", "SHOAL_REPLICATION", "SHOAL_CLIENT_PORT", "SHOAL_HTTP_PORT",
            "SHOAL_RAFT_PORT", "SHOAL_CLUSTER_ID", "SHOAL_BOOTSTRAP_NODES", "SHOAL_NODE_HOST"} <= set(names)
    # TLS variables are set only with tls.enabled (test_chart_tls_*).
    not_for_pods = {"SHOAL_CONFIG", *TLS_ENV_VARS}
    assert set(ENV_VARS) - set(names) <= not_for_pods, \
        f"shoal node reads variables the chart does not set: {sorted(set(ENV_VARS) - set(names) - not_for_pods)}"
    secret_keys = set(re.findall(r"^  ([a-z-]+): ", template_texts()["secret.yaml"], re.M))
    refs = set(re.findall(r"secretKeyRef:\s+name: .*\s+key: ([a-z-]+)", text))
    assert refs and refs <= secret_keys, \
        f"the StatefulSet reads Secret keys the chart does not write: {refs - secret_keys}"
    identity_keys = set(re.findall(r"^  ([a-z-]+): ", template_texts()["identity.yaml"].split("\ndata:")[1], re.M))
    refs = set(re.findall(r"configMapKeyRef:\s+name: .*\s+key: ([a-z-]+)", text))
    assert refs == {"cluster-id"} and identity_keys == {"cluster-id", "bootstrap-replicas"}
    sts = template_texts()["statefulset.yaml"]
    assert "enableServiceLinks: false" in sts, "Service links would inject SHOAL_* variables"
    # The node and the pod steps around it (init container, preStop hook) read the same environment.
    assert sts.count('env: {{- include "shoal.env" . | nindent 12 }}') == 2 and sts.count("env:") == 2


@pytest.mark.parametrize("overrides", [{}, {"replicas": 5, "cluster": {"partitions": 16, "replication": 3,
                                                                        "frameBytesMax": 16777216},
                                            "ports": {"client": 16789, "http": 16790, "raft": 20000}},
                                       {"replicas": 5, "initialReplicas": 3}])
def test_statefulset_environment_configures_every_pod_as_the_values_say(overrides: dict[str, Any]) -> None:
    """Every pod's configuration: the pods the cluster was created with list each other; a later pod
    (ordinal >= initialReplicas) lists them and itself, and is not one the cluster was created with."""
    values = chart_values()
    for key, value in overrides.items():
        values[key] = {**values[key], **value} if isinstance(value, dict) else value
    jsonschema.validate(values, chart_schema())
    secret = {"cluster-secret": "k8s-secret", "auth-tokens": "tok1,tok2"}
    first = [f"shoal-{i}" for i in range(bootstrap_count(values))]
    for ordinal in range(values["replicas"]):
        config = load_config(env=pod_env(values, ordinal, secret))
        me = config.node()
        assert config.node_id == me.id == f"shoal-{ordinal}"
        assert [n.id for n in config.nodes] == first + ([me.id] if me.id not in first else [])
        assert config.bootstrap_ids() == tuple(first)
        assert config.partitions == values["cluster"]["partitions"]
        assert config.rf == min(values["cluster"]["replication"], len(config.nodes))
        assert config.cluster_id == IDENTITY["cluster-id"]
        assert config.frame_bytes_max == values["cluster"]["frameBytesMax"]
        assert config.session_grace_ms == values["cluster"]["sessionGraceMs"]
        assert (me.port, me.http_port, me.raft_port) == (values["ports"]["client"], values["ports"]["http"],
                                                         values["ports"]["raft"])
        assert me.host == f"shoal-{ordinal}.shoal-peers.queues.svc.cluster.local"
        assert config.listen == "0.0.0.0" and config.secret == "k8s-secret" and config.tokens == ("tok1", "tok2")
        assert str(config.node_data_dir()) == "/data"
    without_tokens = load_config(env=pod_env(values, 0, {"cluster-secret": "k"}))
    assert without_tokens.tokens == ()


def test_scaling_changes_no_pod_environment() -> None:
    """``replicas`` is not in any container's environment: scaling restarts no running pod, and a new
    pod's SHOAL_PEERS and SHOAL_BOOTSTRAP_NODES are the first pods', whatever ``replicas`` says."""
    values = chart_values()
    env = rendered_env(values)
    for replicas in (1, 4, 7):
        assert rendered_env({**values, "replicas": replicas, "initialReplicas": 3}) == env
    helpers = template_texts()["_helpers.tpl"]
    assert "Values.replicas" not in define_body(helpers, "shoal.env")
    for name in ("shoal.peers", "shoal.bootstrapNodes"):
        assert 'until (int (include "shoal.bootstrapReplicas" .))' in define_body(helpers, name)
    # The StatefulSet uses `replicas` for its size alone.
    sts = template_texts()["statefulset.yaml"]
    assert re.findall(r"\.Values\.replicas\b", sts) == [".Values.replicas"] and "replicas: {{ .Values.replicas }}" in sts


def test_the_chart_records_how_many_pods_created_the_cluster_and_keeps_it() -> None:
    """SHOAL_PEERS / SHOAL_BOOTSTRAP_NODES come from a count the identity ConfigMap holds from the first
    install on, like the cluster id: what it recorded, else initialReplicas, else replicas."""
    helpers, identity = template_texts()["_helpers.tpl"], template_texts()["identity.yaml"]
    count = define_body(helpers, "shoal.bootstrapReplicas")
    assert '(lookup "v1" "ConfigMap" .Release.Namespace (include "shoal.identityName" .)).data | default dict' in count
    assert '$stored := get $current "bootstrap-replicas"' in count
    assert "{{- if and $wanted (ne $wanted (int $stored)) -}}" in count and "never change" in count, \
        "an upgrade naming another initialReplicas fails instead of changing the cluster's first nodes"
    assert "{{- $stored -}}" in count and "{{- $wanted | default (int .Values.replicas) -}}" in count
    assert "cannot exceed replicas" in count
    assert 'bootstrap-replicas: {{ include "shoal.bootstrapReplicas" . | quote }}' in identity
    assert "helm.sh/resource-policy: keep" in identity
    assert chart_values()["initialReplicas"] == 0, "the first install's replicas unless set"
    schema = chart_schema()
    for bad in (-1, 65, "3"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**chart_values(), "initialReplicas": bad}, schema)


def _pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    """The StatefulSet's structure: whole-line actions resolved or dropped, inline ones stood in for by X."""
    text = resolve_conditionals(template_texts()["statefulset.yaml"], values)
    skeleton = re.sub(r"\{\{.*?\}\}", "X", re.sub(r"(?m)^\s*\{\{.*?\}\}\s*\n", "", text))
    return yaml.safe_load(skeleton)


def test_a_new_pod_joins_and_a_scale_down_decommissions_highest_ordinal_first() -> None:
    """An init container registers the pod (`shoal pod join`); a preStop hook (`shoal pod leave`)
    decommissions a pod a scale-down takes away, with the grace period to do it, a get-only Role on
    the StatefulSet for its replica count, and the volume deleted afterwards."""
    from shoal.cli.pod import join_command, leave_command

    values = chart_values()
    assert values["scaleDown"]["decommission"] is True and values["persistence"]["deleteOnScaleDown"] is True
    sts = _pod_spec(values)
    pod = sts["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["command"][:3] == ["shoal", "pod", "join"]
    join_command.make_context("join", init["command"][3:])  # options `shoal pod join` accepts
    assert {"name": "data", "mountPath": "/data"} in init["volumeMounts"], "join writes the node's identity"
    [container] = pod["containers"]
    leave = container["lifecycle"]["preStop"]["exec"]["command"]
    assert leave[:3] == ["shoal", "pod", "leave"] and leave[3:5] == ["--statefulset", "X"]
    text = template_texts()["statefulset.yaml"]
    assert '"--statefulset", {{ include "shoal.fullname" . | quote }}' in text
    assert '"--timeout", {{ .Values.scaleDown.timeoutSeconds | int | quote }}' in text
    ctx = leave_command.make_context("leave", ["--statefulset", "shoal", "--timeout", "3600"])
    assert ctx.params["statefulset"] == "shoal" and ctx.params["timeout_s"] == 3600
    assert pod["serviceAccountName"] == "X" and pod["automountServiceAccountToken"] is True
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Delete"}
    # get on this StatefulSet alone.
    rbac = [yaml.safe_load(re.sub(r"\{\{.*?\}\}", "X", doc))
            for doc in resolve_conditionals(template_texts()["rbac.yaml"], values).split("\n---\n")]
    assert [d["kind"] for d in rbac] == ["ServiceAccount", "Role", "RoleBinding"]
    assert rbac[1]["rules"] == [{"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["X"],
                                 "verbs": ["get"]}]
    assert '[{{ include "shoal.fullname" . | quote }}]' in template_texts()["rbac.yaml"]
    assert rbac[2]["roleRef"]["kind"] == "Role" and rbac[2]["subjects"][0]["kind"] == "ServiceAccount"
    # Off: no hook, no account, no token, volumes kept.
    off = {**values, "scaleDown": {**values["scaleDown"], "decommission": False},
           "persistence": {**values["persistence"], "deleteOnScaleDown": False}}
    jsonschema.validate(off, chart_schema())
    plain = _pod_spec(off)
    assert "lifecycle" not in plain["spec"]["template"]["spec"]["containers"][0]
    assert plain["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "persistentVolumeClaimRetentionPolicy" not in plain["spec"]
    assert resolve_conditionals(template_texts()["rbac.yaml"], off).strip() == ""


def test_the_disruption_budget_holds_at_any_size() -> None:
    """One pod down at a time, whatever ``replicas``: the budget names no count that scaling changes."""
    pdb = template_texts()["pdb.yaml"]
    assert "maxUnavailable: 1" in pdb and "replicas" not in pdb and "minAvailable" not in pdb
    assert chart_values()["podDisruptionBudget"]["enabled"] is True


def test_the_chart_makes_the_cluster_id_once_and_keeps_it() -> None:
    """cluster.id when set, else the id the ConfigMap already holds (upgrades), else a random one;
    the ConfigMap outlives `helm uninstall` like the volumes stamped with its id."""
    values, t = chart_values(), template_texts()["identity.yaml"]
    assert values["cluster"]["id"] == "", "generated unless an operator sets one"
    assert '$name := include "shoal.identityName" .' in t
    assert '(lookup "v1" "ConfigMap" .Release.Namespace $name).data | default dict' in t
    assert ('.Values.cluster.id | default (get $current "cluster-id") '
            '| default (printf "shoal-%s" (randAlphaNum 16 | lower))') in t
    assert "helm.sh/resource-policy: keep" in t and "cluster-id: {{ $id | quote }}" in t
    generated = "shoal-" + "a1b2c3d4e5f6g7h8"  # what printf "shoal-%s" (randAlphaNum 16 | lower) gives
    jsonschema.validate({**values, "cluster": {**values["cluster"], "id": generated}}, chart_schema())
    assert load_config(env=pod_env(values, 0, {"cluster-secret": "k"}, {"cluster-id": generated})).cluster_id \
        == generated
    assert "get configmap" in template_texts()["NOTES.txt"]


def test_chart_helpers_keep_pod_names_peer_ids_and_services_consistent() -> None:
    t = template_texts()
    helpers, sts, services = t["_helpers.tpl"], t["statefulset.yaml"], t["services.yaml"]
    assert re.search(r'^metadata:\n  name: \{\{ include "shoal.fullname" \. \}\}', sts, re.M)
    assert 'serviceName: {{ include "shoal.headless" . }}' in sts
    peers = helpers[helpers.index('define "shoal.peers"'):]
    assert '$full := include "shoal.fullname" .' in peers and "{{ $full }}-{{ $i }}=" in peers, \
        "peer ids must be the pod names (<fullname>-<ordinal>), which SHOAL_NODE_ID gets from metadata.name"
    host = define_body(helpers, "shoal.podHost")
    domain = define_body(helpers, "shoal.podDomain")
    assert 'include "shoal.podDomain"' in host and 'include "shoal.headless"' in domain and "clusterDomain" in domain
    headless = services.split("---")[0]
    assert 'name: {{ include "shoal.headless" . }}' in headless
    assert "clusterIP: None" in headless and "publishNotReadyAddresses: true" in headless
    # Numbers from values.yaml are float64 in Helm: quote them only after int (1e6 -> "1e+06").
    numeric = {p for p in values_paths_used(sts)
               if isinstance(v := lookup(chart_values(), p)[1], int) and not isinstance(v, bool)}
    for path in numeric:
        for m in re.finditer(rf"\.Values\.{re.escape(path)}((?:\s*\|\s*\w+)*)", sts):
            fns = re.findall(r"\|\s*(\w+)", m.group(1))
            if "quote" in fns:
                assert {"int", "int64"} & set(fns[:fns.index("quote")]), f"{path} is quoted as a float"


def test_statefulset_probes_identity_storage_and_disruption_budget() -> None:
    t = template_texts()
    sts = resolve_conditionals(t["statefulset.yaml"], chart_values())
    assert re.search(r"readinessProbe:\n\s+httpGet: \{path: /ready, port: http\}", sts)
    assert re.search(r"livenessProbe:\n\s+httpGet: \{path: /healthz, port: http\}", sts)
    assert "fieldPath: metadata.name" in define_body(t["_helpers.tpl"], "shoal.env")
    assert "podAntiAffinity:" in sts and "topologyKey: kubernetes.io/hostname" in sts
    assert "volumeClaimTemplates:" in sts and "mountPath: /data" in sts
    assert "runAsNonRoot: true" in sts and "runAsUser: 10001" in sts
    assert "podManagementPolicy: Parallel" in sts
    assert ("terminationGracePeriodSeconds: {{ add .Values.terminationGracePeriodSeconds "
            ".Values.scaleDown.timeoutSeconds }}") in sts, "the preStop hook's decommission runs inside the grace period"
    plain = resolve_conditionals(t["statefulset.yaml"], {**chart_values(), "scaleDown": {"decommission": False}})
    assert "terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}" in plain
    assert "kind: PodDisruptionBudget" in t["pdb.yaml"] and "maxUnavailable: 1" in t["pdb.yaml"]
    sm = t["servicemonitor.yaml"]
    assert sm.startswith("{{- if .Values.serviceMonitor.enabled }}") and "path: /prometheus" in sm
    assert "app.kubernetes.io/component: peers" in sm, "scrape each pod once, through the headless Service"
    assert "kind: Secret" in t["secret.yaml"] and "required" in t["secret.yaml"]
    notes = t["NOTES.txt"]
    assert "from shoal.client import Client" in notes and "rollout status" in notes and "port-forward" in notes


def _tls_values(client_certs: str, ca_key: str = "ca.crt") -> dict[str, Any]:
    values = chart_values()
    values["tls"] = {**values["tls"], "enabled": True, "existingSecret": "shoal-certs", "caKey": ca_key,
                     "clientCerts": client_certs}
    jsonschema.validate(values, chart_schema())
    return values


@pytest.mark.parametrize("client_certs,ca_key", [("none", ""), ("none", "ca.crt"), ("optional", "ca.crt"),
                                                 ("required", "ca.crt")])
def test_chart_tls_configures_every_pod_from_the_mounted_secret(tmp_path: Path, client_certs: str,
                                                                ca_key: str) -> None:
    values = _tls_values(client_certs, ca_key)
    names = {item["name"] for item in rendered_env(values)}
    assert set(ENV_VARS) - names <= {"SHOAL_CONFIG"} | ({"SHOAL_TLS_CA"} if not ca_key else set())
    # The node checks that the files exist: stand in for the mounted Secret.
    mount = tmp_path / "tls"
    mount.mkdir()
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (mount / name).write_text("PEM")
    env = {k: v.replace("/etc/shoal/tls", str(mount)) for k, v in
           pod_env(values, 0, {"cluster-secret": "k8s-secret"}).items()}
    config = load_config(env=env)
    assert config.tls is not None
    assert (config.tls.cert, config.tls.key) == (str(mount / "tls.crt"), str(mount / "tls.key"))
    assert config.tls.ca == (str(mount / "ca.crt") if ca_key else None)
    assert config.tls.client_certs == client_certs

    text = resolve_conditionals(template_texts()["statefulset.yaml"], values)
    # Parse the structure: whole-line actions dropped, inline ones stood in for by a scalar.
    skeleton = re.sub(r"\{\{.*?\}\}", "X", re.sub(r"(?m)^\s*\{\{.*?\}\}\s*\n", "", text))
    sts = yaml.safe_load(skeleton)
    pod = sts["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert {"name": "tls", "mountPath": "/etc/shoal/tls", "readOnly": True} in container["volumeMounts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert [item["path"] for item in volume["secret"]["items"]] == ["tls.crt", "tls.key"] + (["ca.crt"] if ca_key else [])
    assert '{{ required "tls.existingSecret' in text and "{key: {{ .Values.tls.certKey }}, path: tls.crt}" in text
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/healthz")):
        if client_certs == "required":  # the kubelet has no client certificate: probe from inside the pod
            command = container[probe]["exec"]["command"]
            assert command[:2] == ["python", "-c"] and f"%s{path}'" in command[2]
            assert "/etc/shoal/tls/tls.crt" in command[2] and "/etc/shoal/tls/ca.crt" in command[2]
        else:
            assert container[probe]["httpGet"] == {"path": path, "port": "http", "scheme": "HTTPS"}


def test_chart_without_tls_mounts_nothing_and_probes_plain_http() -> None:
    values = chart_values()
    assert values["tls"]["enabled"] is False
    text = resolve_conditionals(template_texts()["statefulset.yaml"], values)
    assert "/etc/shoal/tls" not in text and "scheme: HTTPS" not in text
    assert not {"SHOAL_TLS_CERT", "SHOAL_TLS_KEY"} & {item["name"] for item in rendered_env(values)}
    monitor = resolve_conditionals(template_texts()["servicemonitor.yaml"], {**values, "serviceMonitor": {
        **values["serviceMonitor"], "enabled": True}})
    assert "scheme: https" not in monitor
    tls_monitor = resolve_conditionals(template_texts()["servicemonitor.yaml"], {
        **_tls_values("required"), "serviceMonitor": {**values["serviceMonitor"], "enabled": True}})
    assert "scheme: https" in tls_monitor and "keySecret:" in tls_monitor and "serverName:" in tls_monitor


def test_one_raft_port_per_node_everywhere() -> None:
    """Compose, the image and the chart expose one Raft port per node, whatever the partition count."""
    text = template_texts()["statefulset.yaml"]
    assert text.count("containerPort") == 3 and "{name: raft, containerPort: {{ .Values.ports.raft }}}" in text
    assert "until (int .Values.cluster.partitions)" not in text
    assert re.search(r"^EXPOSE 6789 6790 7789$", (DEPLOY / "Dockerfile").read_text(), re.M)
    raft_proxies = [p for p in json.loads((DEPLOY / "toxiproxy.json").read_text()) if p["name"].startswith("raft_")]
    assert len(raft_proxies) == make_toxiproxy_config.NODES
