"""Nemeses: faults injected into a :class:`ProxiedCluster`, each recorded as a fault window.

Each nemesis is a blocking function ``(stage, target) -> heal`` that injects its fault,
records it, and returns the function that heals it; ``target`` is the leader of the
workload queue's partition when the step starts, and the :class:`Stage` holds the cluster,
the history, that partition and the workload. Process faults use signals on the node's pid;
network faults use the proxies.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoal.cluster.partitioning import partition_for
from shoal.cluster.registry import node_of_member

from .history import Fault, History
from .polling import poll_until
from .proxied_cluster import ProxiedCluster

if TYPE_CHECKING:
    from .workload import Workload

__all__ = ["NEMESES", "Heal", "Nemesis", "Stage", "StepFailed", "wait_leader"]

Heal = Callable[[], None]

#: How long a step waits for a partition to elect a leader, or for a resumed node to step down.
ELECTION_WAIT_S = 20.0
#: How long ``pause-transfer-target`` keeps the target frozen (at least): longer than the recovery
#: bound of the tests, so a transfer that keeps the partition's writes refused shows.
FROZEN_S = 9.0
#: Attempts of ``pause-transfer-target`` to freeze the target before the balancer hands it the lead.
TRANSFER_ATTEMPTS = 6
#: The balancer's round (``node/server.py``: once a second) with a margin: how long the workload
#: stays held after the target froze. Nothing shows a round from outside, so it is waited out.
BALANCE_ROUND_S = 1.3
POLL_S = 0.02
#: How long a held partition's commit index must stay put after an idle tick to count as quiet.
QUIET_S = 0.15
#: Time for probe reads to reach a paused node's sockets before it resumes (loopback: far less).
PROBE_SEND_S = 0.1
PROBE_WAIT_S = 10.0


class StepFailed(Exception):
    """A step could not do what it must (a partition never elected, a node never stepped down)."""


@dataclass
class Stage:
    """What a step acts on: the cluster, the run's history, the workload queue's partition, and
    the workload (to hold it for a quiet moment, or to fire reads at one node)."""

    cluster: ProxiedCluster
    history: History
    partition: int
    workload: Workload | None = None


Nemesis = Callable[[Stage, str], Heal]


def wait_leader(cluster: ProxiedCluster, partition: int, not_node: str | None = None,
                timeout_s: float = ELECTION_WAIT_S) -> str:
    """The leader of ``partition`` once there is one other than ``not_node`` (bounded)."""
    assert cluster.cluster is not None
    leader_of = cluster.cluster.leader_of

    def other_leader() -> str | None:
        leader = leader_of(partition)
        return leader if leader != not_node else None

    return poll_until(other_leader, timeout_s, 0.1, lambda: StepFailed(
        f"partition {partition} elected no leader other than {not_node} in {timeout_s:.0f} s"))


def kill(stage: Stage, node: str) -> Heal:
    """SIGKILL ``node``; healing restarts it on its data."""
    cluster, history = stage.cluster, stage.history
    assert cluster.cluster is not None
    cluster.cluster.kill(node)
    fault = history.fault("kill", node)

    def heal() -> None:
        assert cluster.cluster is not None
        cluster.cluster.start_node(node)
        history.heal(fault)
    return heal


def pause(stage: Stage, node: str) -> Heal:
    """SIGSTOP ``node``: a half-open peer whose sockets stay up; healing sends SIGCONT."""
    cluster, history = stage.cluster, stage.history
    assert cluster.cluster is not None
    cluster.cluster.signal(node, signal.SIGSTOP)
    fault = history.fault("pause", node)

    def heal() -> None:
        assert cluster.cluster is not None
        cluster.cluster.signal(node, signal.SIGCONT)
        history.heal(fault)
    return heal


def isolate(stage: Stage, node: str) -> Heal:
    """Cut ``node``'s Raft links; clients can still reach it (a stale leader)."""
    cluster, history = stage.cluster, stage.history
    cluster.isolate(node)
    fault = history.fault("isolate", node)
    return _healer(cluster, history, fault)


def minority(stage: Stage, node: str) -> Heal:
    """Split {node} from the majority: Raft links and its client link cut."""
    cluster, history = stage.cluster, stage.history
    others = [n for n in cluster.node_ids if n != node]
    cluster.partition([node], others)
    cluster.cut_clients(node)
    fault = history.fault("majority-minority", f"[{node}] | {others}")
    return _healer(cluster, history, fault)


def bridge(stage: Stage, node: str) -> Heal:
    """``node`` stays connected to everyone; the other nodes cannot reach each other."""
    cluster, history = stage.cluster, stage.history
    others = [n for n in cluster.node_ids if n != node]
    for i, a in enumerate(others):
        for b in others[i + 1:]:
            cluster.cut(a, b)
    fault = history.fault("bridge", f"{node} bridges {others}")
    return _healer(cluster, history, fault)


def one_way(stage: Stage, node: str) -> Heal:
    """Everything ``node`` sends to its peers is dropped; what they send still arrives."""
    cluster, history = stage.cluster, stage.history
    for other in cluster.node_ids:
        if other != node:
            cluster.cut_one_way(node, other)
    fault = history.fault("one-way", f"{node} -> *")
    return _healer(cluster, history, fault)


def slow(stage: Stage, node: str) -> Heal:
    """Latency 40 ms ± 20 ms on every link, Raft and client, both directions."""
    cluster, history = stage.cluster, stage.history
    cluster.toxic_everywhere("latency", {"latency": 40, "jitter": 20}, "slow", raft=True, clients=True)
    fault = history.fault("slow-network", "latency 40±20 ms everywhere")
    return _healer(cluster, history, fault)


def narrow(stage: Stage, node: str) -> Heal:
    """Bandwidth of 256 KB/s per direction on every Raft link."""
    cluster, history = stage.cluster, stage.history
    cluster.toxic_everywhere("bandwidth", {"rate": 256}, "narrow")
    fault = history.fault("bandwidth", "256 KB/s per Raft link direction")
    return _healer(cluster, history, fault)


def reset_peer(stage: Stage, node: str) -> Heal:
    """Connections of ``node``'s Raft links are reset 200 ms after they open."""
    cluster, history = stage.cluster, stage.history
    for other in cluster.node_ids:
        if other == node:
            continue
        names, a_to_b, _ = cluster.link(node, other)
        for name in names:
            cluster.proxy(name).add_toxic(name=f"reset-{node}-{other}", type="reset_peer", stream=a_to_b,
                                          attributes={"timeout": 200})
    fault = history.fault("reset-peer", node)
    return _healer(cluster, history, fault)


def kill_all(stage: Stage, node: str) -> Heal:
    """SIGKILL every node at once; healing restarts them all on their data."""
    cluster, history = stage.cluster, stage.history
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


def pause_leader(stage: Stage, node: str) -> Heal:
    """SIGSTOP ``node`` (the partition's leader) until another node leads. Healing sends reads to
    it over connections it accepted before the pause (they wait in its sockets beside the new
    leader's messages), sends SIGCONT, and waits until the reads are answered (they must not
    see an older state than writes the new leader acknowledged) and it has stepped down (a newer
    term, or another leader)."""
    cluster, history, p = stage.cluster, stage.history, stage.partition
    assert cluster.cluster is not None
    _, term = cluster.claim(node, p)
    cluster.cluster.signal(node, signal.SIGSTOP)
    fault = history.fault("pause-leader", node, serving=True)

    def heal() -> None:
        assert cluster.cluster is not None
        probe = None
        try:
            wait_leader(cluster, p, not_node=node)
            if stage.workload is not None:
                probe = stage.workload.probe(node)
                time.sleep(PROBE_SEND_S)
        finally:
            cluster.cluster.signal(node, signal.SIGCONT)
            history.heal(fault)
        if probe is not None:
            probe.result(PROBE_WAIT_S)
        _wait_stepped_down(cluster, node, p, term)
    return heal


def _wait_stepped_down(cluster: ProxiedCluster, node: str, partition: int, term: int) -> None:
    """Until ``node`` no longer claims to lead ``partition`` in ``term`` (bounded)."""
    def stepped_down() -> bool:
        try:
            leader, now_term = cluster.claim(node, partition)
        except (OSError, TimeoutError):
            return False
        return leader != node or now_term > term

    poll_until(stepped_down, ELECTION_WAIT_S, 0.1, lambda: StepFailed(
        f"{node} still claims to lead partition {partition} in term {term} {ELECTION_WAIT_S:.0f} s after it "
        "was resumed"))


def pause_transfer_target(stage: Stage, node: str) -> Heal:
    """SIGSTOP the node leadership is being handed to, with its TCP links up.

    The partition's preferred replica T (first of its target placement) is cut off (Raft and
    client links) until another node L leads; the workload is held, T's links come back once
    the partition is quiet right after one of L's idle ticks, and the moment T holds L's whole
    log it is frozen. L's balancer then finds T connected and caught up, and may hand it
    the lead; T never answers. After a balancer round a write to the partition shows whether L
    is handing over (it refuses writes meanwhile). If it is, T stays frozen (``FROZEN_S``) and
    the workload goes on: writes must come back while T is still frozen. If not, T is cut off
    again and resumed, and the step starts over (also when the balancer handed T the lead before
    it froze), at most ``TRANSFER_ATTEMPTS`` times; the last freeze is kept either way. Healing
    sends SIGCONT. Each freeze is a fault window whose detail says what every attempt saw.
    """
    cluster, history, p, work = stage.cluster, stage.history, stage.partition, stage.workload
    assert cluster.cluster is not None and work is not None
    preferred = _preferred(cluster, p)
    fault: Fault | None = None
    outcomes: list[str] = []
    cut: Fault | None = None   # T cut off (its links come back once the partition is quiet)
    for attempt in range(1, TRANSFER_ATTEMPTS + 1):
        if cut is None:
            leader, cut = _lead_elsewhere(stage, preferred)
        else:
            leader = wait_leader(cluster, p, not_node=preferred)
        if not work.hold():
            work.release()
            raise StepFailed("the workload's operations did not finish within the hold")
        try:
            _wait_quiet(cluster, leader, p)
            if cut is not None:
                cluster.heal()   # T's links back: it catches up from L
                history.heal(cut)
                cut = None
            frozen, why = _freeze_when_caught_up(cluster, leader, preferred, p)
            if frozen is None:
                outcomes.append(f"{attempt}: {why}")
                continue
            # Not yet a serving fault: writes are held until the probe below.
            fault = history.fault("pause-transfer-target", f"{preferred} frozen as {leader} may hand it "
                                  f"partition {p}")
            time.sleep(BALANCE_ROUND_S)
            after = _status(cluster, leader, p)
            seen = _transfer_seen(cluster, leader, p)
            outcomes.append(f"{attempt}: commit {frozen['commit']} at the freeze, "
                            f"{after['commit'] if after else '?'} a round later; {seen}")
            fault.detail += f" ({'; '.join(outcomes)})"
            if seen.startswith("the leader refused") or attempt == TRANSFER_ATTEMPTS:
                fault.serving = True
                break
            # No transfer to the frozen node: again. T is cut off before it resumes, or L's balancer
            # would hand it the lead as soon as it caught up, before the partition is quiet.
            cluster.isolate(preferred, clients=True)
            cut = history.fault("isolate-preferred", preferred)
            cluster.cluster.signal(preferred, signal.SIGCONT)
            history.heal(fault)
            fault = None
        finally:
            work.release()
    if cut is not None:
        cluster.heal()
        history.heal(cut)
    if fault is None:
        if not any("at the freeze" in o for o in outcomes):
            raise StepFailed(f"{preferred} could not be frozen caught up: {'; '.join(outcomes)}")
        last = [f for f in history.faults if f.name == "pause-transfer-target"][-1]
        last.detail += f" (then {'; '.join(outcomes[-1:])})"
        return lambda: None   # every freeze was resumed: no transfer to a frozen node seen
    frozen_at = fault.start

    def heal() -> None:
        assert cluster.cluster is not None and fault is not None
        time.sleep(max(0.0, FROZEN_S - (history.now() - frozen_at)))   # the fault's length
        cluster.cluster.signal(preferred, signal.SIGCONT)
        history.heal(fault)
    return heal


def _lead_elsewhere(stage: Stage, preferred: str) -> tuple[str, Fault | None]:
    """A leader of the stage's partition other than ``preferred``: when ``preferred`` leads, its
    Raft and client links are cut until another node does (the cut's fault window is returned
    for the caller to heal)."""
    cluster, history, p = stage.cluster, stage.history, stage.partition
    leader = wait_leader(cluster, p)
    if leader != preferred:
        return leader, None
    cluster.isolate(preferred, clients=True)
    cut = history.fault("isolate-preferred", preferred)
    try:
        return wait_leader(cluster, p, not_node=preferred), cut
    except StepFailed:
        cluster.heal()
        history.heal(cut)
        raise


def _preferred(cluster: ProxiedCluster, partition: int) -> str:
    """The node of ``partition``'s preferred replica (first of its target placement)."""
    return node_of_member(cluster.admin().shape().placement[partition][0])


def _status(cluster: ProxiedCluster, leader: str, partition: int) -> dict[str, Any] | None:
    """``leader``'s Raft status of ``partition`` while it leads it, else None."""
    try:
        status = cluster.raft_status(leader, partition)
    except (OSError, TimeoutError):
        return None
    return status if status is not None and status.get("state") == "leader" else None


def _transfer_seen(cluster: ProxiedCluster, leader: str, partition: int) -> str:
    """Whether ``leader`` refuses a write to ``partition`` because its leadership is moving, asked
    with a push to a queue of that partition other than the workload's."""
    names = (f"chaos-probe-{k}" for k in range(10_000))
    queue = next(q for q in names if partition_for(q, cluster.partitions) == partition)
    try:
        reply = cluster.ask(leader, {"cmd": "PUSH", "queue": queue, "data": "probe"})
    except (OSError, TimeoutError) as exc:
        return f"the leader did not answer a write: {exc}"
    if reply.get("ok"):
        return "the leader took a write: no transfer under way"
    return f"the leader refused a write: {reply.get('code')} {reply.get('error')}"


def _wait_quiet(cluster: ProxiedCluster, leader: str, partition: int, timeout_s: float = 5.0) -> None:
    """Until ``leader``'s commit index of ``partition`` moved (an idle tick, once a second) and then
    stayed for ``QUIET_S``: the next tick is most of a second away. Bounded; goes on regardless."""
    deadline = time.monotonic() + timeout_s
    last: int | None = None
    moved_at: float | None = None
    while time.monotonic() < deadline:
        status = _status(cluster, leader, partition)
        if status is None:
            return
        now = time.monotonic()
        if last is not None and status["commit"] != last:
            moved_at = now
        elif moved_at is not None and now - moved_at >= QUIET_S:
            return
        last = status["commit"]
        time.sleep(POLL_S)


def _freeze_when_caught_up(cluster: ProxiedCluster, leader: str, target: str, partition: int,
                           timeout_s: float = 5.0) -> tuple[dict[str, Any] | None, str]:
    """SIGSTOP ``target`` once ``leader`` sees it holding its whole log; ``leader``'s status then, or
    None and why not (``leader`` stopped leading first: its balancer handed the lead over; or
    ``target`` did not catch up in time)."""
    assert cluster.cluster is not None
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        status = _status(cluster, leader, partition)
        if status is None:
            return None, f"{leader} stopped leading before {target} could be frozen"
        match = [pr["match"] for m, pr in status.get("progress", {}).items() if node_of_member(m) == target]
        if match and match[0] == status["last"] == status["commit"]:
            cluster.cluster.signal(target, signal.SIGSTOP)
            return status, ""
        time.sleep(POLL_S)
    return None, f"{target} did not catch up in {timeout_s:.0f} s (last status {status})"


def _healer(cluster: ProxiedCluster, history: History, fault: object) -> Heal:
    def heal() -> None:
        cluster.heal()
        history.heal(fault)  # type: ignore[arg-type]
    return heal


NEMESES: dict[str, Nemesis] = {
    "kill": kill, "pause": pause, "isolate": isolate, "minority": minority, "bridge": bridge,
    "one-way": one_way, "slow": slow, "bandwidth": narrow, "reset-peer": reset_peer, "kill-all": kill_all,
    "pause-leader": pause_leader, "pause-transfer-target": pause_transfer_target,
}
