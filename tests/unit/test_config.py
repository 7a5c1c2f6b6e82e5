"""Cluster configuration: TOML file, SHOAL_* overrides, validation, placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cluster.config import ENV_VARS, ClusterConfig, ConfigError, NodeSpec, load_config

TOML = """
[cluster]
id = "test"
partitions = 4
replication = 3
tokens = ["t1"]

[[nodes]]
id = "n1"
host = "127.0.0.1"
port = 7001
http_port = 7101
raft_port = 7201

[[nodes]]
id = "n2"
host = "127.0.0.1"
port = 7002

[[nodes]]
id = "n3"
host = "127.0.0.1"
port = 7003
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "shoal.toml"
    path.write_text(TOML)
    return path


def test_load_from_file(config_file: Path) -> None:
    cfg = load_config(config_file, env={}, node_id="n2")
    assert (cfg.cluster_id, cfg.partitions, cfg.rf, cfg.tokens) == ("test", 4, 3, ("t1",))
    assert cfg.node().port == 7002 and cfg.node("n1").raft_address() == "127.0.0.1:7201"
    assert cfg.node_data_dir("n3") == Path(".shoal") / "n3"
    placement = cfg.placement()
    assert sorted(placement) == [0, 1, 2, 3] and all(len(set(r)) == 3 for r in placement.values())
    topo = cfg.initial_topology()
    assert [p.replicas for p in topo.partition_map] == [tuple(placement[p]) for p in range(4)]
    assert all(p.leader is None for p in topo.partition_map)


def test_env_overrides_the_file(config_file: Path) -> None:
    env = {"SHOAL_CONFIG": str(config_file), "SHOAL_PARTITIONS": "16", "SHOAL_AUTH_TOKENS": "a, b,",
           "SHOAL_NODE_ID": "n1", "SHOAL_DATA_DIR": "/tmp/x", "SHOAL_FRAME_BYTES_MAX": "1024"}
    cfg = load_config(env=env)
    assert (cfg.partitions, cfg.tokens, cfg.node_id, cfg.frame_bytes_max) == (16, ("a", "b"), "n1", 1024)
    assert cfg.node_data_dir() == Path("/tmp/x")


def test_peers_from_env() -> None:
    cfg = load_config(env={"SHOAL_PEERS": "a=127.0.0.1:1:2:3, b=127.0.0.1", "SHOAL_REPLICATION": "0"})
    assert cfg.nodes == (NodeSpec("a", "127.0.0.1", 1, 2, 3), NodeSpec("b", "127.0.0.1", 6789, 6790, 7789))
    assert cfg.rf == 2  # 0 = auto: min(3, nodes)
    with pytest.raises(ConfigError):
        load_config(env={"SHOAL_PEERS": "a"})
    with pytest.raises(ConfigError):
        load_config(env={"SHOAL_PEERS": "a=h:x"})


def test_validation_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no nodes"):
        load_config(env={})
    with pytest.raises(ConfigError, match="duplicate"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1,a=127.0.0.1"})
    with pytest.raises(ConfigError, match="partitions"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1", "SHOAL_PARTITIONS": "0"})
    with pytest.raises(ConfigError, match="not an integer"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1", "SHOAL_PARTITIONS": "many"})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not in the cluster"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1"}, node_id="zz")


def test_raft_off_loopback_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="secret"):
        load_config(env={"SHOAL_PEERS": "a=10.0.0.1"})
    cfg = load_config(env={"SHOAL_PEERS": "a=10.0.0.1", "SHOAL_CLUSTER_SECRET": "s3cret"})
    assert cfg.raft_needs_secret() and cfg.secret == "s3cret"
    assert not load_config(env={"SHOAL_PEERS": "a=127.0.0.1,b=localhost,c=[::1]:6800"}).raft_needs_secret()
    with pytest.raises(ConfigError, match="secret"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1", "SHOAL_LISTEN": "0.0.0.0"})


def test_what_is_bound_decides_the_secret_rule() -> None:
    """The check looks at the address the Raft listener binds, not at the advertised one."""
    peers = {"SHOAL_PEERS": "a=127.0.0.1,b=10.0.0.2"}
    with pytest.raises(ConfigError, match="secret"):     # a wildcard bind behind a loopback host
        load_config(env={**peers, "SHOAL_LISTEN": "0.0.0.0"}, node_id="a")
    with pytest.raises(ConfigError, match="secret"):
        load_config(env={**peers, "SHOAL_LISTEN": "::"}, node_id="a")
    with pytest.raises(ConfigError, match="secret"):
        load_config(env=peers, node_id="b")
    cfg = load_config(env=peers, node_id="a")            # a binds 127.0.0.1: loopback only
    assert cfg.raft_bind_host() == "127.0.0.1" and not cfg.raft_needs_secret()
    cfg = load_config(env={**peers, "SHOAL_LISTEN": "127.0.0.1"}, node_id="b")
    assert cfg.raft_bind_host() == "127.0.0.1" and not cfg.raft_needs_secret()


def test_one_dialler_per_node_pair() -> None:
    cfg = load_config(env={"SHOAL_PEERS": "n1=127.0.0.1,n2=127.0.0.1,n10=127.0.0.1"})
    dials = {n.id: set(cfg.raft_dials(n.id)) for n in cfg.nodes}
    assert dials == {"n1": set(), "n2": {"n1"}, "n10": {"n1", "n2"}}


def test_ipv6_peer_and_limits() -> None:
    cfg = load_config(env={"SHOAL_PEERS": "a=[::1]:1:2:3"})
    assert cfg.nodes == (NodeSpec("a", "::1", 1, 2, 3),)
    with pytest.raises(ConfigError, match="frame_bytes_max"):
        load_config(env={"SHOAL_PEERS": "a=127.0.0.1", "SHOAL_FRAME_BYTES_MAX": "0"})


def test_toml_round_trip(config_file: Path, tmp_path: Path) -> None:
    cfg = load_config(config_file, env={})
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml())
    assert load_config(again, env={}) == cfg


def test_env_var_list_is_the_documented_contract() -> None:
    assert len(ENV_VARS) == len(set(ENV_VARS)) and all(v.startswith("SHOAL_") for v in ENV_VARS)
    assert isinstance(ClusterConfig.__doc__, str)


def test_routes_and_listen_port_for_proxied_links(tmp_path: Path) -> None:
    """The chaos harness's hooks: a peer's Raft reached through a proxy, a client port behind one."""
    text = TOML.replace('raft_port = 7201\n', 'raft_port = 7201\nlisten_port = 7301\n'
                        '[nodes.raft_routes]\nn2 = "127.0.0.1:9000"\n')
    path = tmp_path / "routes.toml"
    path.write_text(text)
    cfg = load_config(path, env={}, node_id="n1")
    n1 = cfg.node("n1")
    assert n1.port == 7001 and n1.client_listen_port == 7301
    assert cfg.node("n2").client_listen_port == 7002
    assert cfg.peer_raft_address("n1", "n2") == ("127.0.0.1", 9000)        # routed
    assert cfg.peer_raft_address("n1", "n3") == ("127.0.0.1", cfg.node("n3").raft_port)
    assert cfg.peer_raft_address("n2", "n1") == ("127.0.0.1", 7201)        # routes are per node
    again = tmp_path / "again.toml"
    again.write_text(cfg.to_toml())
    assert load_config(again, env={}, node_id="n1") == cfg
    for bad in ('n9 = "127.0.0.1:9000"', 'n1 = "127.0.0.1:9000"', 'n2 = "nowhere"'):
        path.write_text(TOML.replace('raft_port = 7201\n', f'raft_port = 7201\n[nodes.raft_routes]\n{bad}\n'))
        with pytest.raises(ConfigError, match="raft route"):
            load_config(path, env={})


def test_dashboard_read_only_from_file_or_env(tmp_path: Path) -> None:
    peers = {"SHOAL_PEERS": "a=127.0.0.1"}
    assert load_config(env=peers).dashboard_read_only is False
    assert load_config(env={**peers, "SHOAL_DASHBOARD_READ_ONLY": "true"}).dashboard_read_only is True
    assert load_config(env={**peers, "SHOAL_DASHBOARD_READ_ONLY": "0"}).dashboard_read_only is False
    with pytest.raises(ConfigError, match="SHOAL_DASHBOARD_READ_ONLY"):
        load_config(env={**peers, "SHOAL_DASHBOARD_READ_ONLY": "maybe"})
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\ndashboard_read_only = true\n[[nodes]]\nid = "a"\n')
    assert load_config(path, env={}).dashboard_read_only is True
    path.write_text('[cluster]\ndashboard_read_only = "yes"\n[[nodes]]\nid = "a"\n')
    with pytest.raises(ConfigError, match="dashboard_read_only"):
        load_config(path, env={})


def test_a_node_added_later_names_itself_with_node_host() -> None:
    """SHOAL_NODE_HOST: a node SHOAL_PEERS (the first nodes) does not list joins them as a later node."""
    peers = "a=a.svc,b=b.svc,c=c.svc"
    env = {"SHOAL_PEERS": peers, "SHOAL_NODE_ID": "d", "SHOAL_NODE_HOST": "d.svc", "SHOAL_CLUSTER_SECRET": "s",
           "SHOAL_CLIENT_PORT": "7000",
           "SHOAL_HTTP_PORT": "7001", "SHOAL_RAFT_PORT": "7002"}
    config = load_config(env=env)
    assert [n.id for n in config.nodes] == ["a", "b", "c", "d"]
    assert config.node() == NodeSpec("d", "d.svc", 7000, 7001, 7002)
    assert config.bootstrap_ids() == ("a", "b", "c"), "a node added later is not one the cluster was created with"
    # A listed node with the same host is just itself; an explicit bootstrap list wins.
    first = load_config(env={**env, "SHOAL_NODE_ID": "b", "SHOAL_NODE_HOST": "b.svc"})
    assert [n.id for n in first.nodes] == ["a", "b", "c"] and first.bootstrap_ids() == ("a", "b", "c")
    later = load_config(env={**env, "SHOAL_BOOTSTRAP_NODES": "a,b"})
    assert later.bootstrap_ids() == ("a", "b")
    with pytest.raises(ConfigError, match="SHOAL_PEERS lists b at 'b.svc'"):
        load_config(env={**env, "SHOAL_NODE_ID": "b", "SHOAL_NODE_HOST": "elsewhere"})
    with pytest.raises(ConfigError, match="needs SHOAL_NODE_ID"):
        load_config(env={"SHOAL_PEERS": peers, "SHOAL_NODE_HOST": "d.svc", "SHOAL_CLUSTER_SECRET": "s"})
