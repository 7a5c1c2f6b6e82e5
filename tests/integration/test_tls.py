"""TLS on the client and HTTP ports, end to end with the client library.

A throwaway CA signs a certificate for 127.0.0.1 and one for a client; the nodes serve TLS
only, optionally requiring client certificates.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from conftest import NODE_COMMAND
from tlspki import make_pki
from shoal.client import Client, ConnectionOptions
from shoal.cluster.guard import TlsSettings
from shoal.cluster.launcher import LocalCluster, free_base_port

pytestmark = pytest.mark.integration

TOKEN = "tls-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_cluster(pki: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tls = TlsSettings(pki["cert"], pki["key"], pki["ca"], "required")
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path_factory.mktemp("tls"),
                      base_port=free_base_port(3, 4), tokens=(TOKEN,), tls=tls, node_command=NODE_COMMAND) as cl:
        cl.wait_ready()
        yield cl


def _client_context(pki: dict[str, str], *, with_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if with_cert:
        ctx.load_cert_chain(pki["client_cert"], pki["client_key"])
    return ctx


def test_client_library_over_tls(tls_cluster: LocalCluster, pki: dict[str, str]) -> None:
    options = ConnectionOptions(tls=_client_context(pki))
    with Client(tls_cluster.addresses, token=TOKEN, options=options) as client:
        q = client.queue("tls-q")
        job_id = q.add({"secret": "payload"})
        job = q.pull()
        assert job is not None and job.id == job_id and job.data == {"secret": "payload"}
        q.ack(job)
        assert q.get_state(job_id) == "completed"


def test_plain_tcp_and_certificateless_clients_get_nothing(tls_cluster: LocalCluster, pki: dict[str, str]) -> None:
    host, port = tls_cluster.addresses[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:   # plain TCP: a TLS handshake is expected
        sock.sendall(b"\x00\x00\x00\x0e\x81\xa3cmd\xa4Ping")
        sock.settimeout(5)
        try:
            data = sock.recv(100)
        except ConnectionResetError:
            data = b""
        assert b"pong" not in data
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):  # TLS without a client certificate
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            with _client_context(pki, with_cert=False).wrap_socket(sock, server_hostname=host) as tls:
                tls.sendall(b"\x00\x00\x00\x0e\x81\xa3cmd\xa4Ping")
                if not tls.recv(100):
                    raise ConnectionResetError("closed")


def test_http_port_speaks_tls(tls_cluster: LocalCluster, pki: dict[str, str]) -> None:
    n = tls_cluster.config.nodes[0]

    async def main() -> None:
        connector = aiohttp.TCPConnector(ssl=_client_context(pki))
        async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            async with s.get(f"https://{n.host}:{n.http_port}/health") as r:
                assert r.status == 200 and (await r.json())["ok"]
            # A follower forwards to the leader over HTTPS too.
            for node in tls_cluster.config.nodes:
                async with s.post(f"https://{node.host}:{node.http_port}/queues/tls-http/jobs", json={"data": 1}) as r:
                    assert r.status in (200, 201), await r.text()

    asyncio.run(main())


def test_cluster_up_takes_tls_from_the_environment(pki: dict[str, str], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shoal.cli.cluster import cluster_group

    data, base = tmp_path / "up", free_base_port(1, 1)
    env = {"SHOAL_TLS_CERT": pki["cert"], "SHOAL_TLS_KEY": pki["key"]}
    try:
        result = CliRunner().invoke(cluster_group, ["up", "--nodes", "1", "--partitions", "1", "--detach",
                                                    "--data", str(data), "--base-port", str(base),
                                                    "--token", TOKEN], env=env)
        assert result.exit_code == 0, result.output
        options = ConnectionOptions(tls=ssl.create_default_context(cafile=pki["ca"]))
        with Client([f"127.0.0.1:{base}"], token=TOKEN, options=options) as client:
            assert client.ping()["pong"] is True
    finally:
        CliRunner().invoke(cluster_group, ["down", "--data", str(data)])


def test_helm_chart_exec_probes_pass_against_a_node_that_requires_client_certificates(
        tls_cluster: LocalCluster, pki: dict[str, str], tmp_path: Path) -> None:
    """The chart's in-pod probes (tls.clientCerts: required), run as written, with the mounted Secret
    stood in for by this test's certificates: they must pass against a real node."""
    chart = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shoal" / "templates" / "statefulset.yaml"
    commands = [yaml.safe_load(m) for m in re.findall(r"^\s+command: (\[\"python\".*\])$", chart.read_text(), re.M)]
    assert len(commands) == 2  # readiness and liveness
    mount = tmp_path / "tls"
    mount.mkdir()
    for name, source in (("tls.crt", pki["cert"]), ("tls.key", pki["key"]), ("ca.crt", pki["ca"])):
        (mount / name).symlink_to(source)
    node = tls_cluster.config.nodes[0]
    for command in commands:
        argv = [sys.executable if command[0] == "python" else command[0],
                *(arg.replace("/etc/shoal/tls", str(mount)) for arg in command[1:])]
        done = subprocess.run(argv, env={"SHOAL_HTTP_PORT": str(node.http_port)}, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr.decode()
    # The same probe without a client certificate is refused: the probe's certificate is what passes.
    without_cert = [sys.executable, "-c", commands[0][2].replace(
        "c.load_cert_chain('/etc/shoal/tls/tls.crt','/etc/shoal/tls/tls.key');", "").replace(
        "/etc/shoal/tls", str(mount))]
    done = subprocess.run(without_cert, env={"SHOAL_HTTP_PORT": str(node.http_port)}, capture_output=True, timeout=30)
    assert done.returncode != 0


def test_compose_tls_health_check_passes_against_a_node_that_requires_client_certificates(
        tls_cluster: LocalCluster, pki: dict[str, str]) -> None:
    """deploy/docker-compose.tls.yml's health check, run as written with this node's settings."""
    overlay = Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.tls.yml"
    kind, *argv = yaml.safe_load(overlay.read_text())["services"]["shoal-1"]["healthcheck"]["test"]
    assert kind == "CMD" and argv[0] == "python"
    env = {"SHOAL_CONFIG": str(tls_cluster.config_path), "SHOAL_NODE_ID": "n1", "SHOAL_TLS_CERT": pki["cert"],
           "SHOAL_TLS_KEY": pki["key"], "SHOAL_TLS_CA": pki["ca"]}
    done = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()


def test_http_connection_cap_refuses_clearly_over_tls(pki: dict[str, str], tmp_path: Path) -> None:
    """Past limits.http_connections_max a TLS client still reads the 503 (the refusal is written
    after the handshake, then the connection closed)."""
    tls = TlsSettings(pki["cert"], pki["key"], pki["ca"], "none")
    with LocalCluster(nodes=1, partitions=1, data_dir=tmp_path / "c", base_port=free_base_port(1, 1), tls=tls,
                      extra_env={"SHOAL_HTTP_CONNECTIONS_MAX": "2"}, node_command=NODE_COMMAND) as cl:
        cl.wait_ready()
        n = cl.config.node("n1")
        ctx = _client_context(pki, with_cert=False)
        held = [ctx.wrap_socket(socket.create_connection((n.host, n.http_port), timeout=5), server_hostname=n.host)
                for _ in range(2)]
        try:
            for _ in range(3):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(f"https://{n.host}:{n.http_port}/healthz", context=ctx, timeout=5)
                assert refused.value.code == 503
                assert json.loads(refused.value.read())["code"] == "OVERLOADED"
        finally:
            for sock in held:
                sock.close()


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_operator_commands_speak_tls_with_a_token(tls_cluster: LocalCluster, pki: dict[str, str]) -> None:
    """Locally the cluster file's TLS and token are used; remotely --url https, --token, --ca, --cert/--key."""
    local = _shoal("cluster", "status", "--data", str(tls_cluster.data_dir))
    assert local.returncode == 0, local.stderr
    assert "n1: active" in local.stdout and "moves: none" in local.stdout
    n = tls_cluster.config.node("n2")
    url = f"https://{n.host}:{n.http_port}"
    tls_args = ["--ca", pki["ca"], "--cert", pki["client_cert"], "--key", pki["client_key"]]
    remote = _shoal("cluster", "settings", "--url", url, "--token", TOKEN, *tls_args, "--move-rate", "16MiB")
    assert remote.returncode == 0, remote.stderr
    assert "move rate 16.0 MiB/s" in remote.stdout
    back = _shoal("cluster", "settings", "--url", url, "--token", TOKEN, *tls_args, "--move-rate", "32MiB")
    assert back.returncode == 0 and "move rate 32.0 MiB/s" in back.stdout
    refused = _shoal("cluster", "status", "--url", url, *tls_args)
    assert refused.returncode == 1 and "AUTH_REQUIRED" in refused.stderr, refused.stderr
