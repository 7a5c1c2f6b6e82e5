"""The report of a chaos run: a text summary, the history, the checker's result and a PNG timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .checker import Result
from .history import History

__all__ = ["RunReport", "write_report", "plot_timeline"]

BUCKET_S = 0.5
LABEL_CHARS_MAX = 40


@dataclass
class RunReport:
    """The outcome of one scenario run."""

    scenario: str
    seed: int
    nodes: int
    duration_s: float
    result: Result
    history: History
    out_dir: Path | None = None
    files: list[Path] = field(default_factory=list)
    #: Steps that failed (a membership change that did not settle, a fault that could not start).
    errors: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.result.valid and not self.errors

    def summary(self) -> str:
        r = self.result
        lines = [
            f"scenario {self.scenario} (nodes {self.nodes}, seed {self.seed}, {self.duration_s:.0f} s of load)",
            f"  pushes: {r.attempted} attempted, {r.acknowledged} acknowledged, {r.indeterminate} unknown outcome",
            f"  deliveries: {r.delivered} ({r.redelivered} redeliveries), acks accepted: {r.acked}",
            f"  lost: {len(r.lost)}  duplicated: {len(r.duplicated)}  unexpected: {len(r.unexpected)}  "
            f"stale acks accepted: {len(r.stale_acks)}  double acks: {len(r.double_acks)}",
            f"  reads answered: {sum(r.reads.values())} ({', '.join(f'{w} {n}' for w, n in sorted(r.reads.items()))})"
            f"  stale reads: {len(r.stale_reads)}",
        ]
        for rec in r.recovery:
            lines.append(f"  fault {rec['fault']} at {rec['start']}s, healed {rec['end']}s: "
                         f"first write {_s(rec['after_fault_s'])} after the fault, "
                         f"{_s(rec['after_heal_s'])} after healing")
        for error in self.errors:
            lines.append(f"  step failed: {error}")
        lines.append("  VALID" if self.valid else "  INVALID: " + "; ".join(r.problems() + self.errors))
        return "\n".join(lines)


def _s(v: float | None) -> str:
    return "none" if v is None else f"{v:.2f} s"


def write_report(report: RunReport, out_dir: Path) -> list[Path]:
    """Write ``summary.txt``, ``result.json``, ``history.jsonl`` and ``timeline.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.txt"
    summary.write_text(report.summary() + "\n")
    result = out_dir / "result.json"
    r = report.result
    result.write_text(json.dumps({
        "scenario": report.scenario, "seed": report.seed, "nodes": report.nodes, "valid": r.valid,
        "attempted": r.attempted, "acknowledged": r.acknowledged, "indeterminate": r.indeterminate,
        "delivered": r.delivered, "redelivered": r.redelivered, "acked": r.acked,
        "lost": r.lost, "duplicated": r.duplicated, "unexpected": r.unexpected,
        "stale_acks": r.stale_acks, "double_acks": r.double_acks, "recovery": r.recovery,
        "reads": r.reads, "stale_reads": r.stale_reads, "problems": r.problems(),
    }, indent=2, default=str) + "\n")
    history = out_dir / "history.jsonl"
    report.history.save(history)
    png = out_dir / "timeline.png"
    plot_timeline(report, png)
    report.out_dir = out_dir
    report.files = [summary, result, history, png]
    return report.files


def plot_timeline(report: RunReport, path: Path) -> None:
    """Throughput of successful pushes and acks per second, with fault windows shaded."""
    import matplotlib
    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    ops = report.history.ops
    end = max((op.time for op in ops), default=1.0)
    n = int(end / BUCKET_S) + 1
    series = {("push", "ok"): [0] * n, ("ack", "ok"): [0] * n, ("push", "info"): [0] * n}
    for op in ops:
        key = (op.f, op.type)
        if key in series:
            series[key][int(op.time / BUCKET_S)] += 1
    xs = [i * BUCKET_S for i in range(n)]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(xs, [c / BUCKET_S for c in series[("push", "ok")]], label="pushes ok/s", color="tab:blue")
    ax.plot(xs, [c / BUCKET_S for c in series[("ack", "ok")]], label="acks ok/s", color="tab:green")
    ax.plot(xs, [c / BUCKET_S for c in series[("push", "info")]], label="pushes unknown/s", color="tab:red")
    for i, fault in enumerate(report.history.faults):
        ax.axvspan(fault.start, fault.end if fault.end is not None else end, color="tab:orange", alpha=0.2,
                   label="fault" if i == 0 else None)
        label = f"{fault.name} {fault.detail}"
        # A step may say much in its detail (history.jsonl has it whole): the plot takes a line.
        ax.text(fault.start, ax.get_ylim()[1] * 0.95, label[:LABEL_CHARS_MAX], fontsize=7, va="top")
    ax.set_xlabel("seconds")
    ax.set_ylabel("operations per second")
    verdict = "valid" if report.valid else "INVALID"
    ax.set_title(f"shoal chaos {report.scenario} (seed {report.seed}): {verdict}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
