"""Fixtures that start real node processes on loopback (stopped by pid afterwards)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port

#: Override how nodes start (e.g. "coverage run -m shoal.node"); default: this Python.
NODE_COMMAND = os.environ.get("SHOAL_TEST_NODE_COMMAND", "").split() or None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 3-node, 8-partition cluster shared by one test module."""
    data = tmp_path_factory.mktemp("cluster")
    with LocalCluster(nodes=3, partitions=8, data_dir=data, base_port=free_base_port(3, 8),
                      node_command=NODE_COMMAND) as cl:
        cl.wait_balanced()  # start the tests after the balancer's leadership moves
        yield cl


@pytest.fixture()
def fresh_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A 3-node cluster of its own, for tests that kill or pause nodes."""
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path / "c", base_port=free_base_port(3, 4),
                      node_command=NODE_COMMAND) as cl:
        cl.wait_balanced()
        yield cl
