"""Port choice for local clusters: the layout stays clear of ports the kernel lends out."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cluster.launcher import _ephemeral_low, _ports_of, free_base_port


@pytest.mark.parametrize(("nodes", "partitions"), [(1, 2), (3, 4), (3, 8), (5, 8)])
def test_free_base_port_keeps_the_layout_below_the_ephemeral_range(nodes: int, partitions: int) -> None:
    ephemeral = _ephemeral_low()
    span = max(_ports_of(20_000, nodes, partitions)) - 20_000
    # Where the ephemeral range starts too low to stay under it, any free layout in range will do.
    top = ephemeral if ephemeral - span > 21_000 else 55_000 + span
    for _ in range(20):
        base = free_base_port(nodes, partitions)
        assert 20_000 <= base and max(_ports_of(base, nodes, partitions)) < top


def test_one_raft_port_per_node_whatever_the_partitions() -> None:
    assert len(_ports_of(20_000, 3, 1024)) == len(_ports_of(20_000, 3, 1)) == 9


def test_local_cluster_is_authenticated_and_its_file_private(tmp_path: Path) -> None:
    import stat

    from shoal.cluster.launcher import LocalCluster, write_cluster_file
    cluster = LocalCluster(nodes=3, partitions=4, data_dir=tmp_path)
    other = LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "other")
    assert len(cluster.config.secret) >= 32 and cluster.config.secret != other.config.secret
    assert LocalCluster(nodes=1, data_dir=tmp_path / "given", secret="mine").config.secret == "mine"
    path = tmp_path / "cluster.toml"
    path.write_text("old")
    path.chmod(0o644)
    write_cluster_file(path, cluster.config)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and cluster.config.secret in path.read_text()
