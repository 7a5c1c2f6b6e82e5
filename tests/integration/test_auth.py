"""Auth tokens on the binary protocol: refused before Auth, wrong token refused, right token works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NODE_COMMAND
from rawproto import RawConn
from shoal.client import AuthError, Client
from shoal.cluster.launcher import LocalCluster, free_base_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(nodes=1, partitions=2, data_dir=tmp_path_factory.mktemp("auth"),
                      base_port=free_base_port(1, 2), tokens=("s3cret", "other"), node_command=NODE_COMMAND) as cl:
        yield cl


def test_only_hello_auth_and_ping_before_auth(secured: LocalCluster) -> None:
    with RawConn(secured.addresses[0]) as c:
        assert c.hello["ok"] and c.hello["authRequired"] is True
        assert c.call({"cmd": "Ping"})["ok"]
        r = c.call({"cmd": "PUSH", "queue": "a", "data": 1})
        assert r["code"] == "AUTH_REQUIRED"
        assert c.call({"cmd": "Auth", "token": "wrong"})["code"] == "AUTH_FAILED"
        assert c.call({"cmd": "PUSH", "queue": "a", "data": 1})["code"] == "AUTH_REQUIRED"
        assert c.call({"cmd": "Auth", "token": "other"})["ok"]
        assert c.call({"cmd": "PUSH", "queue": "a", "data": 1})["ok"]


def test_client_authenticates_with_its_token(secured: LocalCluster) -> None:
    with Client(secured.addresses, token="s3cret") as client:
        q = client.queue("auth-q")
        job_id = q.add("x")
        assert q.get_state(job_id) == "waiting"
    with pytest.raises(AuthError):
        with Client(secured.addresses, token="nope") as client:
            client.queue("auth-q").add("x")


def test_cluster_file_keeps_the_tokens(secured: LocalCluster) -> None:
    assert "s3cret" in Path(secured.config_path).read_text()
