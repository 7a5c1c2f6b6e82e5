"""TLS on the client and HTTP ports, end to end with the client library (DESIGN §9).

A throwaway CA signs a certificate for 127.0.0.1 and one for a client; the nodes serve TLS
only, optionally requiring client certificates.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
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

    from shoal.cluster.launcher import cluster_group

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
