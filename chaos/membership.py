"""Membership changes as nemeses: nodes join, leave and are replaced while the workload runs.

Each is a blocking function ``(stage, target) -> heal`` like the faults of
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
from typing import Any

from shoal.cluster.admin_client import AdminError, ClusterShape
from shoal.cluster.launcher import node_health

from .history import History
from .nemesis import Heal, Nemesis, Stage, wait_leader
from .polling import poll_until
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


def add_node(stage: Stage, target: str) -> Heal:
    """A new node joins under load; healed once it holds replicas and the cluster settled."""
    cluster, history = stage.cluster, stage.history
    assert cluster.cluster is not None
    node = cluster.add_node()
    cluster.register(node)
    cluster.cluster.start_node(node)
    fault = history.fault("add-node", node)

    def heal() -> None:
        _wait(cluster, f"{node} joining", lambda s: s.settled() and _holds(s, node))
        history.heal(fault)
    return heal


def remove_busiest(stage: Stage, target: str) -> Heal:
    """Decommission the node that leads the most partitions; healed once it left and stopped."""
    cluster, history = stage.cluster, stage.history
    assert cluster.cluster is not None
    led = Counter(p.leader for p in cluster.cluster.topology().partition_map if p.leader)
    node = max(sorted(led), key=lambda n: led[n])
    cluster.admin(avoid=(node,)).decommission(node)
    fault = history.fault("remove-node", f"{node} (leads {led[node]} partitions)")

    def heal() -> None:
        _take_out(cluster, node)
        history.heal(fault)
    return heal


def replace_wiped(stage: Stage, target: str) -> Heal:
    """SIGKILL ``target``, wipe its data directory, start it again (a new incarnation, refused by its
    peers) and replace it; healed once its new incarnation holds replicas and the cluster settled."""
    cluster, history = stage.cluster, stage.history
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


def add_node_cut_from_leader(stage: Stage, target: str) -> Heal:
    """A new node joins while its link to ``target`` (a partition's leader) is cut: that leader adds
    it as a learner it cannot reach. Healed: the link back, then the join finishes."""
    cluster, history = stage.cluster, stage.history
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


def decommission_leader_isolated(stage: Stage, target: str) -> Heal:
    """Decommission the newest node other than ``target``, then at once isolate ``target`` (a leader
    with membership changes pending). Healed: links back, the node out and stopped."""
    cluster, history = stage.cluster, stage.history
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


def _restart(cluster: ProxiedCluster, history: History, node: str, how: str) -> None:
    """Stop ``node`` (``kill``: SIGKILL; ``stop``: SIGTERM, a graceful stop that hands its
    leaderships over), start it on its data, and wait until it answers as this cluster's node;
    recorded as a fault window."""
    assert cluster.cluster is not None
    fault = history.fault(f"restart-{how}", node)
    if how == "kill":
        cluster.cluster.kill(node)
    else:
        cluster.cluster.stop_node(node)
    cluster.cluster.start_node(node)
    _wait_answers(cluster, node)
    history.heal(fault)


def _wait_answers(cluster: ProxiedCluster, node: str) -> None:
    """Until ``node`` answers as this cluster's node (bounded; raises if its process exited)."""
    local = cluster.cluster
    assert local is not None

    def answers() -> bool:
        if local.confirm_own(node):
            return True
        if local.pid(node) is None:
            raise RuntimeError(local.exit_report(node))
        return False

    poll_until(answers, SETTLE_TIMEOUT_S, 0.1, lambda: MembershipTimeout(
        f"{node} did not answer within {SETTLE_TIMEOUT_S:.0f} s of its start"))


def _wait_in_service(cluster: ProxiedCluster) -> None:
    """Until every partition has a leader and every running node is ready (``/ready``: its
    partitions have leaders it can reach and it applied what is committed); bounded. The
    leaders' view (:meth:`ClusterShape.settled`) can name as a voter a replica that cannot take
    its log: this is the replicas' own word."""
    local = cluster.cluster
    assert local is not None
    seen: dict[str, Any] = {}

    def in_service() -> bool:
        seen["leaders"] = leaders = {p.id: p.leader for p in local.topology().partition_map}
        running = [n for n in cluster.node_ids if local.pid(n) is not None]
        seen["unready"] = unready = {n: body for n in running if not (body := cluster.readiness(n)).get("ready")}
        return all(leaders.values()) and not unready

    poll_until(in_service, SETTLE_TIMEOUT_S, 0.2, lambda: MembershipTimeout(
        f"not in service within {SETTLE_TIMEOUT_S:.0f} s: leaders {seen['leaders']}, not ready {seen['unready']}"))


def rolling_restart_during_join(stage: Stage, target: str) -> Heal:
    """A new node joins (the rebalance moves replicas to it), and while the moves run every node
    restarts once, one at a time, each back in service before the next: the newcomer mid-catch-up
    (SIGKILL), then ``target`` (the partition's leader; SIGTERM: its graceful stop hands its
    leaderships over), then the others, SIGKILL and SIGTERM in turn. Healed once the newcomer
    holds replicas and the cluster settled."""
    cluster, history = stage.cluster, stage.history
    assert cluster.cluster is not None
    running = [n for n in cluster.node_ids if cluster.cluster.pid(n) is not None]
    node = cluster.add_node()
    cluster.register(node)
    cluster.cluster.start_node(node)
    join = history.fault("add-node", f"{node}, every node restarted while it joins")
    _wait_answers(cluster, node)   # it is catching up from here on
    order = [node, target] + [n for n in running if n != target]
    for i, n in enumerate(order):
        _restart(cluster, history, n, "kill" if i % 2 == 0 else "stop")
        _wait_in_service(cluster)

    def heal() -> None:
        _wait(cluster, f"{node} joining", lambda s: s.settled() and _holds(s, node))
        _wait_in_service(cluster)
        history.heal(join)
    return heal


def join_under_partition(stage: Stage, target: str) -> Heal:
    """A node joins while ``target`` (the partition's leader) is cut off: its Raft links, the
    newcomer's included, are cut and its clients still reach it (a deposed leader they may read
    from). While the change runs, the newcomer restarts mid-join (SIGKILL), then the cut-off node
    on its data (SIGKILL; still cut off). The majority must elect and serve meanwhile. Healed:
    links back, the join finished (the new node holds replicas, the cluster settled)."""
    cluster, history, p = stage.cluster, stage.history, stage.partition
    assert cluster.cluster is not None and cluster.config is not None
    cluster.isolate(target)
    cut = history.fault("isolate", target, serving=True)
    wait_leader(cluster, p, not_node=target)
    node = cluster.add_node()
    cluster.cut(target, node)
    spec = cluster.config.node(node)
    _retry(lambda: cluster.admin(avoid=(target, node)).add_node(spec.id, spec.host, spec.port, spec.http_port,
                                                                 spec.raft_port), f"adding {node}")
    cluster.cluster.start_node(node)
    join = history.fault("add-node", f"{node} joins while {target} is cut off")
    _wait_answers(cluster, node)   # it is catching up from here on
    for n in (node, target):
        _restart(cluster, history, n, "kill")

    def heal() -> None:
        cluster.heal()
        history.heal(cut)
        _wait(cluster, f"{node} joining", lambda s: s.settled() and _holds(s, node))
        _wait_in_service(cluster)   # settled is the leaders' view: the newcomer must serve too
        history.heal(join)
    return heal


MEMBERSHIP: dict[str, Nemesis] = {
    "add-node": add_node, "remove-busiest": remove_busiest, "replace-wiped": replace_wiped,
    "add-node-cut": add_node_cut_from_leader, "decommission-isolated": decommission_leader_isolated,
    "rolling-restart-join": rolling_restart_during_join, "join-under-partition": join_under_partition,
}
