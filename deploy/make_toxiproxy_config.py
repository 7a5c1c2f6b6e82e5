"""Write deploy/toxiproxy.json: the proxies of docker-compose's chaos profile.

In that profile every node is known to its peers (and to clients) as
``toxiproxy:<port>``, so each client and Raft link crosses Toxiproxy and a fault
can hit one link. Node *i* (1-based) uses client port ``16789 + 100·i``, HTTP
``client + 1`` and its one Raft port ``client + 10`` (every partition shares
it); Toxiproxy listens on the same ports and forwards to ``shoal-chaos-<i>``.
Proxy names: ``client_<i>``, ``http_<i>``, ``raft_<i>`` (the Raft links the other
nodes dial to node *i*).

    python deploy/make_toxiproxy_config.py   # after changing NODES
"""

from __future__ import annotations

import json
from pathlib import Path

NODES = 3


def node_ports(i: int) -> tuple[int, int, int]:
    """(client, http, raft) ports of chaos node ``i`` (1-based)."""
    client = 16789 + 100 * i
    return client, client + 1, client + 10


def proxies() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(1, NODES + 1):
        client, http, raft = node_ports(i)
        upstream = f"shoal-chaos-{i}"
        out.append({"name": f"client_{i}", "listen": f"0.0.0.0:{client}", "upstream": f"{upstream}:{client}",
                    "enabled": True})
        out.append({"name": f"http_{i}", "listen": f"0.0.0.0:{http}", "upstream": f"{upstream}:{http}",
                    "enabled": True})
        out.append({"name": f"raft_{i}", "listen": f"0.0.0.0:{raft}", "upstream": f"{upstream}:{raft}",
                    "enabled": True})
    return out


def peers() -> str:
    """SHOAL_PEERS of the chaos nodes: everyone reaches everyone through Toxiproxy."""
    return ",".join(f"shoal-chaos-{i}=toxiproxy:{':'.join(map(str, node_ports(i)))}" for i in range(1, NODES + 1))


if __name__ == "__main__":
    Path(__file__).with_name("toxiproxy.json").write_text(json.dumps(proxies(), indent=2) + "\n")
    print(peers())
