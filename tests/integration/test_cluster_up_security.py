"""`shoal cluster up` secures a local cluster without editing files: --token, SHOAL_AUTH_TOKENS,
and a refusal (never a silent drop) of SHOAL_* variables it cannot apply."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rawproto import RawConn
from shoal.cli.cluster import cluster_group
from shoal.cluster.launcher import free_base_port

pytestmark = pytest.mark.integration


@pytest.fixture()
def data_dir(tmp_path: Path) -> Iterator[Path]:
    data = tmp_path / "up"
    yield data
    CliRunner().invoke(cluster_group, ["down", "--data", str(data)])  # stops by pid file, also on failure


def _up(data: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    base = free_base_port(1, 1)
    result = CliRunner().invoke(cluster_group, ["up", "--nodes", "1", "--partitions", "1", "--detach",
                                                "--data", str(data), "--base-port", str(base), *args], env=env)
    return result.exit_code, result.output, f"127.0.0.1:{base}"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_cluster_up_requires_the_given_token(data_dir: Path, how: str) -> None:
    args, env = (("--token", "t0k", "--token", "other"), None) if how == "flag" else ((), {"SHOAL_AUTH_TOKENS": "t0k"})
    code, output, address = _up(data_dir, *args, env=env)
    assert code == 0, output
    with RawConn(address) as c:
        assert c.hello["authRequired"] is True
        assert c.call({"cmd": "PUSH", "queue": "q", "data": 1})["code"] == "AUTH_REQUIRED"
        assert c.call({"cmd": "Auth", "token": "t0k"})["ok"]
        assert c.call({"cmd": "PUSH", "queue": "q", "data": 1})["ok"]


def test_cluster_up_refuses_variables_it_cannot_apply(data_dir: Path) -> None:
    code, output, _ = _up(data_dir, env={"SHOAL_PEERS": "n1=10.0.0.1", "SHOAL_CLIENT_PORT": "1"})
    assert code != 0 and "SHOAL_CLIENT_PORT, SHOAL_PEERS" in output
    assert not (data_dir / "cluster.toml").exists()


def test_cluster_up_warns_when_open(data_dir: Path) -> None:
    code, output, _ = _up(data_dir)
    assert code == 0 and "no client tokens" in output
