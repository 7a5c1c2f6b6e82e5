"""Nemeses: faults injected into a :class:`ProxiedCluster`, each recorded as a fault window.

Each nemesis is a blocking function ``(cluster, history, target) -> heal`` that
injects its fault, records it, and returns the function that heals it. Process
faults use signals on the node's pid; network faults use the proxies.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from .history import History
from .proxied_cluster import ProxiedCluster

__all__ = ["NEMESES", "Heal", "Nemesis"]

Heal = Callable[[], None]
Nemesis = Callable[[ProxiedCluster, History, str], Heal]


def kill(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """SIGKILL ``node``; healing restarts it on its data."""
    assert cluster.cluster is not None
    cluster.cluster.kill(node)
    fault = history.fault("kill", node)

    def heal() -> None:
        assert cluster.cluster is not None
        cluster.cluster.start_node(node)
        history.heal(fault)
    return heal


def pause(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """SIGSTOP ``node``: a half-open peer whose sockets stay up; healing sends SIGCONT."""
    assert cluster.cluster is not None
    cluster.cluster.signal(node, signal.SIGSTOP)
    fault = history.fault("pause", node)

    def heal() -> None:
        assert cluster.cluster is not None
        cluster.cluster.signal(node, signal.SIGCONT)
        history.heal(fault)
    return heal


def isolate(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """Cut ``node``'s Raft links; clients can still reach it (a stale leader)."""
    cluster.isolate(node)
    fault = history.fault("isolate", node)
    return _healer(cluster, history, fault)


def minority(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """Split {node} from the majority: Raft links and its client link cut."""
    others = [n for n in cluster.node_ids if n != node]
    cluster.partition([node], others)
    cluster.cut_clients(node)
    fault = history.fault("majority-minority", f"[{node}] | {others}")
    return _healer(cluster, history, fault)


def bridge(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """``node`` stays connected to everyone; the other nodes cannot reach each other."""
    others = [n for n in cluster.node_ids if n != node]
    for i, a in enumerate(others):
        for b in others[i + 1:]:
            cluster.cut(a, b)
    fault = history.fault("bridge", f"{node} bridges {others}")
    return _healer(cluster, history, fault)


def one_way(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """Everything ``node`` sends to its peers is dropped; what they send still arrives."""
    for other in cluster.node_ids:
        if other != node:
            cluster.cut_one_way(node, other)
    fault = history.fault("one-way", f"{node} -> *")
    return _healer(cluster, history, fault)


def slow(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """Latency 40 ms ± 20 ms on every link, Raft and client, both directions."""
    cluster.toxic_everywhere("latency", {"latency": 40, "jitter": 20}, "slow", raft=True, clients=True)
    fault = history.fault("slow-network", "latency 40±20 ms everywhere")
    return _healer(cluster, history, fault)


def narrow(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """Bandwidth of 256 KB/s per direction on every Raft link."""
    cluster.toxic_everywhere("bandwidth", {"rate": 256}, "narrow")
    fault = history.fault("bandwidth", "256 KB/s per Raft link direction")
    return _healer(cluster, history, fault)


def reset_peer(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """Connections of ``node``'s Raft links are reset 200 ms after they open."""
    for other in cluster.node_ids:
        if other == node:
            continue
        names, a_to_b, _ = cluster.link(node, other)
        for name in names:
            cluster.proxy(name).add_toxic(name=f"reset-{node}-{other}", type="reset_peer", stream=a_to_b,
                                          attributes={"timeout": 200})
    fault = history.fault("reset-peer", node)
    return _healer(cluster, history, fault)


def kill_all(cluster: ProxiedCluster, history: History, node: str) -> Heal:
    """SIGKILL every node at once; healing restarts them all on their data."""
    assert cluster.cluster is not None
    for n in cluster.node_ids:
        cluster.cluster.kill(n)
    fault = history.fault("full-restart", "all nodes")

    def heal() -> None:
        assert cluster.cluster is not None
        for n in cluster.node_ids:
            cluster.cluster.start_node(n)
        history.heal(fault)
    return heal


def _healer(cluster: ProxiedCluster, history: History, fault: object) -> Heal:
    def heal() -> None:
        cluster.heal()
        history.heal(fault)  # type: ignore[arg-type]
    return heal


NEMESES: dict[str, Nemesis] = {
    "kill": kill, "pause": pause, "isolate": isolate, "minority": minority, "bridge": bridge,
    "one-way": one_way, "slow": slow, "bandwidth": narrow, "reset-peer": reset_peer, "kill-all": kill_all,
}
