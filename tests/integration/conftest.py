"""Fixtures that start real node processes on loopback (stopped by pid afterwards)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster.launcher import LocalCluster, free_base_port
from shoal.cluster.partitioning import partition_for

from rawproto import RawConn
from waiting import eventually

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


@contextlib.contextmanager
def secured_cluster(tmp_path_factory: pytest.TempPathFactory, name: str, token: str) -> Iterator[LocalCluster]:
    """A 3-node, 4-partition cluster that requires ``token``, balanced before use."""
    with LocalCluster(nodes=3, partitions=4, data_dir=tmp_path_factory.mktemp(name),
                      base_port=free_base_port(3, 4), tokens=(token,), node_command=NODE_COMMAND) as cl:
        cl.wait_balanced()
        yield cl


def http_url(cluster: LocalCluster, node_id: str) -> str:
    n = cluster.config.node(node_id)
    return f"http://{n.host}:{n.http_port}"


def leader_of(cluster: LocalCluster, queue: str) -> str:
    leader = cluster.leader_of(partition_for(queue, cluster.config.partitions))
    assert leader is not None
    return leader


def leader_url(cluster: LocalCluster, queue: str) -> str:
    return http_url(cluster, leader_of(cluster, queue))


def follower_url(cluster: LocalCluster, queue: str) -> str:
    leader = leader_of(cluster, queue)
    return http_url(cluster, next(n for n in cluster.node_ids if n != leader))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def replica_views(cluster: LocalCluster, queue: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every running node's local Stats of ``queue``'s partition, once all have applied the
    same index and hashed it (or the timeout passed): compare their ``digest`` to check the replicas
    agree. (A large partition's digest is computed in the background and may lag its applied index.)"""
    p = str(partition_for(queue, cluster.config.partitions))

    def views() -> list[dict[str, Any]]:
        out = []
        for node_id in cluster.pids:
            with RawConn(cluster.address_of(node_id)) as c:
                out.append(c.call({"cmd": "Stats", "local": True, "partition": int(p)})["replicas"][p])
        return out

    def agreed() -> list[dict[str, Any]] | None:
        seen = views()
        same = len({v["appliedIndex"] for v in seen}) == 1 and all(v["digestIndex"] == v["appliedIndex"] for v in seen)
        return seen if same else None

    try:
        return eventually(agreed, f"every replica of {queue!r}'s partition to apply and hash the same index",
                          timeout_s, poll_s=0.2)
    except AssertionError:
        return views()  # the caller compares them and shows how they differ
