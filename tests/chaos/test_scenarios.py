"""The CI-sized chaos suite: each scenario against a real 3-node cluster behind proxies.

Every Raft and client link goes through the built-in Toxiproxy-compatible proxy (a
child process), the nodes are real processes, and the workload uses the real
client. Each run is bounded (10 s of load, a bounded drain) and stops every process
it started, also on failure. ``shoal chaos run SCENARIO`` runs the same code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.chaos.scenarios import SCENARIOS, run_scenario

pytestmark = pytest.mark.chaos

DURATION_S = 10.0
RECOVERY_MAX_S = 8.0  # writes back within this long of each heal


# The CI-sized set; `-m soak` (tests/chaos/test_soak.py) runs every scenario for 60 s, these and
# the rest: leader-pause (pause-leader below pauses the leader and reads from it too),
# partition-leader and membership-cut (membership-change-under-partition cuts the leader off
# during a change), majority-minority, slow-network, bridge, one-way and reset-peer.
@pytest.mark.parametrize("scenario", ["flapping", "full-restart"])
def test_invariants_hold_under(scenario: str, tmp_path: Path) -> None:
    report = run_scenario(scenario, duration_s=DURATION_S, seed=7, out_dir=tmp_path,
                          recovery_max_s=RECOVERY_MAX_S)
    print(report.summary())
    r = report.result
    assert r.valid, r.problems()
    assert r.acknowledged > 100 and r.delivered >= r.acknowledged
    assert not r.lost and not r.duplicated and not r.stale_acks
    assert all(rec["after_heal_s"] is not None for rec in r.recovery)
    assert (tmp_path / "timeline.png").stat().st_size > 1000


@pytest.mark.parametrize("scenario", ["add-node", "remove-leader-node", "replace-wiped-node"])
def test_invariants_hold_while_the_membership_changes(scenario: str, tmp_path: Path) -> None:
    """A node joins / the busiest leader leaves / a wiped node is replaced / changes meet a cut
    link and an isolated leader, under load: each change reaches its shape (bounded), and the
    history checker finds nothing lost or duplicated."""
    report = run_scenario(scenario, duration_s=DURATION_S, seed=7, out_dir=tmp_path,
                          recovery_max_s=RECOVERY_MAX_S)
    print(report.summary())
    r = report.result
    assert report.errors == [], report.errors
    assert r.valid and report.valid, r.problems()
    assert r.acknowledged > 100 and r.delivered >= r.acknowledged
    assert not r.lost and not r.duplicated and not r.stale_acks
    assert r.recovery and all(rec["after_heal_s"] is not None for rec in r.recovery)
    assert len(r.recovery) == len(SCENARIOS[scenario])


#: The scenarios of real operations, and a fault window each must have recorded.
OPERATIONS = {"pause-leader": "pause-leader", "pause-transfer-target": "pause-transfer-target",
              "rolling-restart-during-rebalance": "restart-stop", "membership-change-under-partition": "isolate"}


@pytest.mark.parametrize("scenario", sorted(OPERATIONS))
def test_invariants_and_reads_hold_through_real_operations(scenario: str, tmp_path: Path) -> None:
    """A paused leader (reads sent to it as it resumes), a paused transfer target (writes back while
    it is frozen), every node restarted during a join, a join while the leader is cut off and
    nodes restart: nothing lost or duplicated, no read went back in time, every fault window
    that leaves a majority up kept writes going, every step reached its shape (bounded)."""
    report = run_scenario(scenario, duration_s=DURATION_S, seed=7, out_dir=tmp_path,
                          recovery_max_s=RECOVERY_MAX_S)
    print(report.summary())
    r = report.result
    assert report.errors == [], report.errors
    assert r.valid and report.valid, r.problems()
    assert r.acknowledged > 100 and r.delivered >= r.acknowledged
    assert r.reads.get("client", 0) > 0 and all(r.reads.get(n, 0) > 0 for n in ("n1", "n2", "n3")), r.reads
    assert OPERATIONS[scenario] in [rec["fault"] for rec in r.recovery]
    if scenario == "pause-leader":
        probes = [op for op in report.history.ops if op.process.startswith("probe") and op.type == "ok"]
        assert probes, "no read reached the paused leader as it resumed"


def test_chaos_run_command_reports_leader_kill(tmp_path: Path) -> None:
    """``shoal chaos run leader-kill``: summary, files, exit 0; writes back soon after the kill."""
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "chaos", "run", "leader-kill",
                           "--duration", str(DURATION_S), "--seed", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=180, env={**os.environ})
    print(proc.stdout, proc.stderr[-2000:])
    assert proc.returncode == 0
    assert "VALID" in proc.stdout and "lost: 0" in proc.stdout
    for name in ("summary.txt", "result.json", "history.jsonl", "timeline.png"):
        assert (out / name).exists()
    import json
    result = json.loads((out / "result.json").read_text())
    kill = result["recovery"][0]
    assert kill["fault"] == "kill" and kill["after_fault_s"] is not None and kill["after_fault_s"] < 5.0


def test_unknown_scenario_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "chaos", "run", "no-such-thing"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "choose from" in proc.stderr
