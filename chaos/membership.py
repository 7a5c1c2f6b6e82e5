"""Membership changes as nemeses: nodes join, leave and are replaced while the workload runs.

Each is a blocking function ``(cluster, history, target) -> heal`` like the faults of
:mod:`.nemesis`: it starts the change (through a node's HTTP admin API, as an operator would)
and records it as a fault window; its heal waits, bounded, until the cluster reached the asked-for
shape, so the window spans the moves. ``target`` is the leader of the workload queue's partition
when the step starts. A change that does not finish in time raises :class:`MembershipTimeout`,
which the scenario reports as a broken run.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable

from shoal.cluster.admin_client import AdminError, ClusterShape
from shoal.cluster.launcher import node_health

from .history import History
from .nemesis import Heal
from .proxied_cluster import ProxiedCluster

__all__ = ["MEMBERSHIP", "MembershipTimeout", "SETTLE_TIMEOUT_S"]

#: How long a change may take to settle (moves of small partitions on a busy 2-core machine).
SETTLE_TIMEOUT_S = 90.0


class MembershipTimeout(Exception):
    """A membership change did not reach its shape in time; the message says what was still running."""


def _holds(shape: ClusterShape, node: str) -> bool:
    partitions = len(shape.topology["partitionMap"])
    return any(node in shape.replicas(p) for p in range(partitions)) or any(
        node in (m.get("from"), m.get("to")) for m in shape.moves)


def _wait(cluster: ProxiedCluster, what: str, done: Callable[[ClusterShape], bool],
          avoid: tuple[str, ...] = ()) -> ClusterShape:
    try:
        return cluster.wait_shape(done, SETTLE_TIMEOUT_S, avoid)
    except TimeoutError as exc:
        raise MembershipTimeout(f"{what}: {exc}") from exc


def _retry(call: Callable[[], object], what: str, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """An admin call a node may refuse for a moment (its view lagging); bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except AdminError as exc:
            if time.monotonic() >= deadline:
                raise MembershipTimeout(f"{what}: {exc}") from exc
        time.sleep(0.5)


def _take_out(cluster: ProxiedCluster, node: str) -> None:
    """Wait until no partition lists ``node``, remove it from the registry, stop its process."""
    assert cluster.cluster is not None
    _wait(cluster, f"{node} leaving", lambda s: s.settled() and not _holds(s, node), avoid=(node,))
    _retry(lambda: cluster.admin(avoid=(node,)).remove(node), f"removing {node}")
    cluster.cluster.stop_node(node)


def add_node(cluster: ProxiedCluster, history: History, target: str) -> Heal:
    """A new node joins under load; healed once it holds replicas and the cluster settled."""
    assert cluster.cluster is not None
    node = cluster.add_node()
    cluster.register(node)
    cluster.cluster.start_node(node)
    fault = history.fault("add-node", node)

    def heal() -> None:
        _wait(cluster, f"{node} joining", lambda s: s.settled() and _holds(s, node))
        history.heal(fault)
    return heal


def remove_busiest(cluster: ProxiedCluster, history: History, target: str) -> Heal:
    """Decommission the node that leads the most partitions; healed once it left and stopped."""
    assert cluster.cluster is not None
    led = Counter(p.leader for p in cluster.cluster.topology().partition_map if p.leader)
    node = max(sorted(led), key=lambda n: led[n])
    cluster.admin(avoid=(node,)).decommission(node)
    fault = history.fault("remove-node", f"{node} (leads {led[node]} partitions)")

    def heal() -> None:
        _take_out(cluster, node)
        history.heal(fault)
    return heal


def replace_wiped(cluster: ProxiedCluster, history: History, target: str) -> Heal:
    """SIGKILL ``target``, wipe its data directory, start it again (a new incarnation, refused by its
    peers) and replace it; healed once its new incarnation holds replicas and the cluster settled."""
    assert cluster.cluster is not None and cluster.config is not None
    cluster.cluster.kill(target)
    shutil.rmtree(cluster.config.node_data_dir(target), ignore_errors=True)
    cluster.cluster.start_node(target)
    fault = history.fault("wipe", target)
    spec = cluster.config.node(target)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    incarnation = ""
    while not incarnation:
        try:
            incarnation = str(node_health(spec.host, spec.http_port).get("incarnation", ""))
        except OSError:
            if time.monotonic() >= deadline:
                raise MembershipTimeout(f"{target} did not come back after its data was wiped") from None
            time.sleep(0.2)
    _retry(lambda: cluster.admin(avoid=(target,)).replace(target, incarnation), f"replacing {target}")

    def heal() -> None:
        _wait(cluster, f"{target} replaced by incarnation {incarnation}",
              lambda s: s.settled() and s.registry.nodes[target].incarnation == incarnation and _holds(s, target),
              avoid=(target,))
        history.heal(fault)
    return heal


def add_node_cut_from_leader(cluster: ProxiedCluster, history: History, target: str) -> Heal:
    """A new node joins while its link to ``target`` (a partition's leader) is cut: that leader adds
    it as a learner it cannot reach. Healed: the link back, then the join finishes."""
    assert cluster.cluster is not None
    node = cluster.add_node()
    cluster.cut(target, node)
    cluster.register(node)
    cluster.cluster.start_node(node)
    fault = history.fault("add-node-cut", f"{node} joins, link {target}-{node} cut")

    def heal() -> None:
        cluster.heal()
        _wait(cluster, f"{node} joining", lambda s: s.settled() and _holds(s, node))
        history.heal(fault)
    return heal


def decommission_leader_isolated(cluster: ProxiedCluster, history: History, target: str) -> Heal:
    """Decommission the newest node other than ``target``, then at once isolate ``target`` (a leader
    with membership changes pending). Healed: links back, the node out and stopped."""
    assert cluster.config is not None
    node = next(n for n in reversed(cluster.node_ids) if n != target and cluster.cluster is not None
                and cluster.cluster.pid(n) is not None)
    cluster.admin(avoid=(target, node)).decommission(node)
    cluster.isolate(target)
    fault = history.fault("decommission-isolated", f"{node} leaving, leader {target} isolated")

    def heal() -> None:
        cluster.heal()
        _take_out(cluster, node)
        history.heal(fault)
    return heal


MEMBERSHIP = {
    "add-node": add_node, "remove-busiest": remove_busiest, "replace-wiped": replace_wiped,
    "add-node-cut": add_node_cut_from_leader, "decommission-isolated": decommission_leader_isolated,
}
