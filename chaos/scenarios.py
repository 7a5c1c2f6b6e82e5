"""Named chaos scenarios: a proxied cluster, a workload, a fault schedule, a check, a report.

A scenario's schedule is a list of (start fraction, end fraction, nemesis) over the
run's producing time; the target of each fault is the leader of the workload
queue's partition at the moment the fault starts. After the last fault is healed
the producers stop, the consumers drain the queue, and the checker runs (readers
read all along, through the client and from each node directly).

Membership scenarios (:mod:`.membership`) change the cluster's nodes under the same load: a
step's heal waits until the cluster reached its new shape, so producers go on until the
schedule is done (bounded), and a change that never settles breaks the run.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

from shoal.cluster.partitioning import partition_for

from .checker import RECOVERY_MAX_S, check
from .history import History
from .membership import MEMBERSHIP, SETTLE_TIMEOUT_S
from .nemesis import NEMESES, Heal, Nemesis, Stage
from .proxied_cluster import ProxiedCluster
from .report import RunReport, write_report
from .workload import Workload, WorkloadConfig

__all__ = ["SCENARIOS", "RunReport", "run_scenario"]

# name -> [(start, end, nemesis)], start/end as fractions of the producing time
SCENARIOS: dict[str, list[tuple[float, float, str]]] = {
    "leader-kill": [(0.25, 0.6, "kill")],
    "leader-pause": [(0.25, 0.6, "pause")],
    "partition-leader": [(0.25, 0.6, "isolate")],
    "majority-minority": [(0.25, 0.6, "minority")],
    "flapping": [(0.15 + 0.12 * i, 0.21 + 0.12 * i, "isolate") for i in range(5)],
    "slow-network": [(0.2, 0.45, "slow"), (0.5, 0.7, "bandwidth")],
    "full-restart": [(0.3, 0.4, "kill-all")],
    "bridge": [(0.25, 0.6, "bridge")],
    "one-way": [(0.25, 0.6, "one-way")],
    "reset-peer": [(0.25, 0.6, "reset-peer")],
    # Membership changes under load (each heal waits for the cluster's new shape).
    "add-node": [(0.2, 0.5, "add-node")],
    "remove-leader-node": [(0.2, 0.5, "remove-busiest")],
    "replace-wiped-node": [(0.25, 0.5, "replace-wiped")],
    "membership-cut": [(0.1, 0.35, "add-node-cut"), (0.5, 0.75, "decommission-isolated")],
    # Real operations: a paused leader, a paused transfer target, restarts during moves, a change
    # while the leader is cut off (each step sets its own length where it needs one).
    "pause-leader": [(0.3, 0.65, "pause-leader")],
    "pause-transfer-target": [(0.15, 0.5, "pause-transfer-target")],
    "rolling-restart-during-rebalance": [(0.15, 0.5, "rolling-restart-join")],
    "membership-change-under-partition": [(0.15, 0.5, "join-under-partition")],
}
#: Scenarios that need more nodes than the default three (so a removal keeps RF 3).
SCENARIO_NODES = {"remove-leader-node": 4}
#: Every step by name: faults and membership changes.
ACTIONS: dict[str, Nemesis] = {**NEMESES, **MEMBERSHIP}
SETTLE_S = 1.0  # producing time after the last heal, so recovery is visible before the drain
RECOVERY_POLL_S = 0.1
#: How long producers may go on past the planned time while the schedule finishes.
OVERRUN_S = 4 * SETTLE_TIMEOUT_S


async def _schedule(stage: Stage, steps: list[tuple[float, float, str]], produce_s: float,
                    errors: list[str], recovery_max_s: float = RECOVERY_MAX_S) -> None:
    """Run the fault schedule: inject at start, heal at end (blocking calls in a thread). A step that
    raises is recorded in ``errors`` and ends the schedule (the cluster is healed afterwards).
    After the last heal it lasts until a write is back or ``recovery_max_s`` passed, so producers
    go on long enough for the checker's recovery bound to be judged on a slow machine too."""
    cluster, history = stage.cluster, stage.history
    for start, end, name in steps:
        await asyncio.sleep(max(0.0, start * produce_s - history.now()))
        # A step that starts late (the previous heal waited for a membership change) keeps its length.
        heal_at = max(end * produce_s, history.now() + (end - start) * produce_s)
        try:
            target = await asyncio.to_thread(cluster.leader_of, stage.partition)
            heal: Heal = await asyncio.to_thread(ACTIONS[name], stage, target)
            await asyncio.sleep(max(0.0, heal_at - history.now()))
            await asyncio.to_thread(heal)
        except Exception as exc:  # reported as a broken run, with what was running
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return
    healed = max((f.end for f in history.faults if f.end is not None), default=None)
    if healed is not None:
        while not history.wrote_since(healed) and history.now() < healed + recovery_max_s:
            await asyncio.sleep(RECOVERY_POLL_S)
    if history.now() > produce_s:
        await asyncio.sleep(SETTLE_S)  # writes after the last heal, before producers stop


def run_scenario(name: str, duration_s: float = 20.0, nodes: int = 3, seed: int | None = None,
                 out_dir: str | Path | None = None, toxiproxy: str | None = None,
                 partitions: int = 2, recovery_max_s: float = RECOVERY_MAX_S,
                 workload: WorkloadConfig | None = None) -> RunReport:
    """Run scenario ``name`` against a fresh proxied cluster; write the report files to ``out_dir``."""
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    seed = random.randrange(1 << 30) if seed is None else seed
    random.seed(seed)
    steps = SCENARIOS[name]
    nodes = max(nodes, SCENARIO_NODES.get(name, 0))
    produce_s = duration_s + SETTLE_S
    config = workload or WorkloadConfig()
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="shoal-chaos-") as tmp:
        with ProxiedCluster(Path(tmp) / "cluster", nodes=nodes, partitions=partitions,
                            toxiproxy=toxiproxy, seed=seed) as cluster:
            history = History()
            partition = partition_for(config.queue, partitions)

            async def main() -> None:
                nodes = dict(zip(cluster.node_ids, cluster.addresses))
                work = Workload(cluster.addresses, history, config, nodes=nodes)
                stage = Stage(cluster, history, partition, work)
                faults = asyncio.create_task(_schedule(stage, steps, duration_s, errors, recovery_max_s))
                try:
                    await work.run(produce_s, until=faults, overrun_s=OVERRUN_S)
                finally:
                    if not faults.done():
                        faults.cancel()
                    try:
                        await faults
                    except asyncio.CancelledError:
                        pass
                    await asyncio.to_thread(cluster.heal)

            asyncio.run(main())
    result = check(history, recovery_max_s)
    report = RunReport(name, seed, nodes, duration_s, result, history, errors=errors)
    if out_dir is not None:
        write_report(report, Path(out_dir))
    return report


def describe() -> dict[str, Any]:
    """Scenario name -> its fault schedule, for ``--help`` and the docs."""
    return {name: [f"{ACTIONS[n].__name__} {s:.0%}–{e:.0%}" for s, e, n in steps] for name, steps in SCENARIOS.items()}
