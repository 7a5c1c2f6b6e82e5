"""A node's HTTP port as the integration tests read it: plain GETs and Prometheus samples."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from shoal.cluster.launcher import LocalCluster


def http_get(cluster: LocalCluster, node_id: str, path: str) -> bytes:
    """The body of ``GET path`` on ``node_id``'s HTTP port (a cluster without client tokens)."""
    n = cluster.config.node(node_id)
    with urllib.request.urlopen(f"http://{n.host}:{n.http_port}{path}", timeout=5) as resp:
        return resp.read()  # type: ignore[no-any-return]


def http_json(cluster: LocalCluster, node_id: str, path: str) -> Any:
    return json.loads(http_get(cluster, node_id, path))


def metric(cluster: LocalCluster, node_id: str, sample: str) -> float:
    """The value of one sample (``name{labels}``) of the node's /prometheus, 0 when absent."""
    for line in http_get(cluster, node_id, "/prometheus").decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
