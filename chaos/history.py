"""The operation history of a chaos run, Jepsen-style.

Every client operation is recorded twice: ``invoke`` when it starts, then ``ok``
(it happened), ``fail`` (it certainly did not) or ``info`` (unknown: a timeout or
a lost connection after retries). Entries are plain tuples, appended from one
event loop; times are seconds since the run started. A process has at most one
operation in flight, so an operation's completion is its process's next entry of
the same ``f``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Op", "Fault", "History"]

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"


class Op(NamedTuple):
    """One history entry. ``value`` by ``f``:

    - ``push``: the pushed value; on ``ok``, (value, job id);
    - ``pull``: None; on ``ok``, (job id, value, token), or None when no job came;
    - ``ack``: (job id, token);
    - ``read``: (kind, where, arg); on ``ok``, (kind, where, arg, result). ``kind`` is ``job``
      (GetJob), ``state`` (GetState), ``counts`` (GetJobCounts) or ``count`` (Count); ``where``
      is the node id a read was sent to directly (that node answers or forwards it), or
      ``client`` for the routing client; ``arg`` is the job id or the queue. ``result``: the
      job's state, or None when the job was not found (``job``, ``state``); the counts by
      state (``counts``); the number (``count``).
    """

    time: float
    process: str
    type: str      # invoke | ok | fail | info
    f: str         # push | pull | ack
    value: Any


@dataclass
class Fault:
    """A fault window: injected at ``start``, healed at ``end`` (seconds since the run began).

    ``serving``: a majority of every group stays up and connected during this fault, so writes
    must be back before it is healed (within the checker's recovery bound).
    """

    name: str
    start: float
    end: float | None = None
    detail: str = ""
    serving: bool = False


@dataclass
class History:
    """Operations and faults of one run."""

    started: float = field(default_factory=time.monotonic)
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def add(self, process: str, type: str, f: str, value: Any) -> None:
        self.ops.append(Op(self.now(), process, type, f, value))

    def fault(self, name: str, detail: str = "", serving: bool = False) -> Fault:
        fault = Fault(name, self.now(), None, detail, serving)
        self.faults.append(fault)
        return fault

    def heal(self, fault: Fault) -> None:
        fault.end = self.now()

    def wrote_since(self, t: float) -> bool:
        """A push invoked at or after ``t`` has been acknowledged (what the checker's recovery
        bound looks for after a heal)."""
        acknowledged: set[tuple[str, Any]] = set()
        for op in reversed(self.ops):
            if op.time < t:
                return False
            if op.f == "push" and op.type == OK:
                acknowledged.add((op.process, op.value[0]))
            elif op.f == "push" and op.type == INVOKE and (op.process, op.value) in acknowledged:
                return True
        return False

    def save(self, path: str | Path) -> None:
        """JSON lines: one op per line, then the faults (for offline checking)."""
        with open(path, "w") as out:
            for op in self.ops:
                out.write(json.dumps(op._asdict()) + "\n")
            for fault in self.faults:
                out.write(json.dumps({"fault": fault.name, "start": fault.start, "end": fault.end,
                                      "detail": fault.detail, "serving": fault.serving}) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "History":
        history = cls(started=0.0)
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                if "fault" in d:
                    history.faults.append(Fault(d["fault"], d["start"], d["end"], d.get("detail", ""),
                                                bool(d.get("serving", False))))
                else:
                    value = d["value"]
                    history.ops.append(Op(d["time"], d["process"], d["type"], d["f"],
                                          tuple(value) if isinstance(value, list) else value))
        return history
