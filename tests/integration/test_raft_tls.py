"""Mutual TLS on the Raft link, against real node processes (DESIGN §5 "Raft transport", §9).

With ``[tls]`` configured, every node's Raft port speaks TLS only and asks each peer for a
certificate its CA signed; the cluster secret's handshake then runs inside TLS as before. The
cluster replicates over it; a plain TCP peer, a TLS peer without a certificate and one whose
certificate another CA signed never reach the secret's handshake; a peer with a good certificate
still has to prove the secret.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import NODE_COMMAND
from tlspki import make_pki
from shoal.client import Client, ConnectionOptions
from shoal.cluster.guard import TlsSettings
from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.node.raft.handshake import MAGIC, Handshake, HandshakeFailed, Role, SendBytes

pytestmark = pytest.mark.integration

TOKEN = "raft-tls-token"
SECRET = "raft-tls-secret"
PARTITIONS = 4
IO_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def outsider(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Certificates of another CA: well formed, for the right host, but not the cluster's."""
    return make_pki(tmp_path_factory.mktemp("outsider"), ca_name="some-other-ca")


@pytest.fixture(scope="module")
def cluster(pki: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tls = TlsSettings(pki["cert"], pki["key"], pki["ca"], "none")
    with LocalCluster(nodes=3, partitions=PARTITIONS, data_dir=tmp_path_factory.mktemp("raft-tls"),
                      base_port=free_base_port(3, PARTITIONS), tokens=(TOKEN,), secret=SECRET, tls=tls,
                      node_command=NODE_COMMAND) as cl:
        cl.wait_ready()
        yield cl


def _peer_context(cert: str | None, key: str | None, ca: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return ctx


def _raft_stats(cluster: LocalCluster, node_id: str, pki: dict[str, str]) -> dict[str, Any]:
    """The ``raft`` part of a node's ``/stats`` (over HTTPS, with the token)."""
    node = cluster.config.node(node_id)
    request = urllib.request.Request(f"https://{node.host}:{node.http_port}/stats",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=IO_TIMEOUT_S,
                                context=ssl.create_default_context(cafile=pki["ca"])) as reply:
        return json.loads(reply.read())["raft"]  # type: ignore[no-any-return]


def _raft_port(cluster: LocalCluster, node_id: str) -> int:
    return cluster.config.node(node_id).raft_port


def _hello(cluster: LocalCluster, secret: str) -> Handshake:
    """A dialer's handshake claiming to be n3 towards n1."""
    return Handshake(Role.DIALER, "n3", secret.encode(), cluster.config.cluster_id, incarnation="", peer_id="n1",
                     known_peers=frozenset({"n1", "n2"}))


def _first_bytes(hs: Handshake) -> bytes:
    event = hs.next_event()
    assert isinstance(event, SendBytes)
    return event.data


def _recv_some(sock: socket.socket) -> bytes:
    sock.settimeout(IO_TIMEOUT_S)
    try:
        return sock.recv(4096)
    except (ConnectionResetError, ssl.SSLError):
        return b""


def test_the_cluster_replicates_over_mutual_tls(cluster: LocalCluster, pki: dict[str, str]) -> None:
    options = ConnectionOptions(tls=ssl.create_default_context(cafile=pki["ca"]))
    with Client(cluster.addresses, token=TOKEN, options=options) as client:
        for i in range(2 * PARTITIONS):  # queues on every partition, led by different nodes
            q = client.queue(f"raft-tls-{i}")
            job_id = q.add({"n": i})
            assert q.get_state(job_id) == "waiting"
    for node_id in cluster.node_ids:
        raft = _raft_stats(cluster, node_id, pki)
        assert raft["peersConnected"] == sorted(set(cluster.node_ids) - {node_id}), (node_id, raft)
        assert "authenticated" in cluster.log_file(node_id).read_text()


def test_plain_tcp_on_the_raft_port_never_reaches_the_handshake(cluster: LocalCluster) -> None:
    with socket.create_connection(("127.0.0.1", _raft_port(cluster, "n1")), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(_first_bytes(_hello(cluster, SECRET)))
        assert MAGIC not in _recv_some(sock)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_a_peer_without_the_clusters_certificate_is_refused_by_tls(
        cluster: LocalCluster, pki: dict[str, str], outsider: dict[str, str], who: str) -> None:
    if who == "no certificate":
        ctx = _peer_context(None, None, pki["ca"])
    else:
        ctx = _peer_context(outsider["cert"], outsider["key"], pki["ca"])
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        with socket.create_connection(("127.0.0.1", _raft_port(cluster, "n1")), timeout=IO_TIMEOUT_S) as sock:
            with ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                tls.sendall(_first_bytes(_hello(cluster, SECRET)))  # TLS 1.3 reports the refusal on first use
                if MAGIC not in _recv_some(tls):
                    raise ConnectionResetError("refused")


def test_a_peer_with_a_good_certificate_still_proves_the_secret(cluster: LocalCluster, pki: dict[str, str]) -> None:
    ctx = _peer_context(pki["client_cert"], pki["client_key"], pki["ca"])
    hs = _hello(cluster, "not-the-secret")
    with socket.create_connection(("127.0.0.1", _raft_port(cluster, "n1")), timeout=IO_TIMEOUT_S) as sock:
        with ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            tls.sendall(_first_bytes(hs))
            challenge = _recv_some(tls)
    assert MAGIC in challenge  # TLS let us in: the node answered the secret's handshake
    with pytest.raises(HandshakeFailed, match="BAD_PROOF"):
        hs.receive_data(challenge)  # and its proof shows we do not share its secret
    assert _raft_stats(cluster, "n1", pki)["peersConnected"] == ["n2", "n3"]  # the cluster is unaffected
