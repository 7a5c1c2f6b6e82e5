"""``[limits]`` and ``[tls]`` in the cluster file and their SHOAL_* variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cluster.config import ENV_VARS, ConfigError, load_config
from shoal.cluster.guard import NodeLimits, memory_total_bytes

BASE = '[cluster]\npartitions = 2\n[[nodes]]\nid = "n1"\nhost = "127.0.0.1"\n'


def test_defaults_and_the_memory_budget(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    cfg = load_config(path, env={})
    assert cfg.limits == NodeLimits() and cfg.tls is None
    assert cfg.limits.memory_budget_bytes() == int(memory_total_bytes() * 0.7)


def test_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE + "[limits]\nframe_timeout_ms = 5000\nconnections_max = 7\n")
    cfg = load_config(path, env={"SHOAL_CONNECTIONS_MAX": "9", "SHOAL_MEMORY_MAX_BYTES": "1000000"})
    assert (cfg.limits.frame_timeout_ms, cfg.limits.connections_max) == (5000, 9)
    assert cfg.limits.memory_budget_bytes() == 1_000_000
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml())
    assert load_config(again, env={}).limits == cfg.limits
    for var in ("SHOAL_FRAME_TIMEOUT_MS", "SHOAL_MEMORY_MAX_BYTES", "SHOAL_TLS_CERT"):
        assert var in ENV_VARS


def test_http_port_limits(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE + "[limits]\nhttp_connections_max = 50\nhttp_header_timeout_ms = 2000\n")
    cfg = load_config(path, env={"SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS": "5000", "SHOAL_HTTP_HEADER_TIMEOUT_MS": "3000"})
    assert (cfg.limits.http_connections_max, cfg.limits.http_header_timeout_ms,
            cfg.limits.http_keepalive_timeout_ms) == (50, 3000, 5000)
    assert NodeLimits().http_connections_max == 4096
    for var in ("SHOAL_HTTP_CONNECTIONS_MAX", "SHOAL_HTTP_HEADER_TIMEOUT_MS", "SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS"):
        assert var in ENV_VARS


@pytest.mark.parametrize("extra,env", [
    ("[limits]\nconnections_max = 0\n", {}),
    ("", {"SHOAL_HTTP_CONNECTIONS_MAX": "0"}),
    ("[limits]\nhttp_header_timeout_ms = 0\n", {}),
    ("[limits]\nbogus = 1\n", {}),
    ("", {"SHOAL_FRAME_TIMEOUT_MS": "soon"}),
    ("[limits]\noutput_high_bytes = 100\noutput_max_bytes = 10\n", {}),
    ("[tls]\ncert = \"/nonexistent.pem\"\nkey = \"/nonexistent.key\"\n", {}),
    ("", {"SHOAL_TLS_CERT": "/x.pem"}),
])
def test_bad_limits_are_config_errors(tmp_path: Path, extra: str, env: dict[str, str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE + extra)
    with pytest.raises(ConfigError):
        load_config(path, env=env)
