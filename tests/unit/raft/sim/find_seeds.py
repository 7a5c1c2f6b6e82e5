"""Find seeds that catch a defect re-created in the simulation (:mod:`.defects`).

``test_replica_simulation.py`` names, for each defect the simulation found, seeds whose run
fails with the defect put back and passes without it. A change to what a run draws, or when
(a new delay, a new fault, a message sent in another order), gives every seed another
history, and a named seed may then pass with its defect too. This finds seeds that catch it
again, each checked both ways::

    cd tests/unit/raft
    python -m sim.find_seeds repeated_tokens --first 0 --count 800 --want 2 --sign "an earlier take"
    python -m sim.find_seeds unprotected_last_batch --first 1000 --chaos 30 --sign "a different entry"
    python -m sim.find_seeds commit_on_snapshot_chunk --classic --sign "a different entry"

``--classic`` runs without the features drawn since issue 29 (as ``_caught`` does). The search
stops after ``--count`` seeds, ``--want`` finds or ``--budget`` seconds, whichever comes first.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from . import defects
from .checkers import Violation
from .cluster import Features, SimRun

__all__ = ["Find", "find_seeds", "main"]


@dataclass(frozen=True)
class Find:
    """A seed that fails with the defect (the checkers' first line) and passes without it."""

    seed: int
    message: str


def _failure(seed: int, chaos_s: float, classic: bool,
             defect: Callable[[], AbstractContextManager[None]] | None) -> str | None:
    """The first line of what the checkers (or an invariant) say of the run, or None if it passes."""
    run = SimRun(seed, chaos_s=chaos_s, features=Features.none() if classic else None)
    try:
        if defect is None:
            run.run()
        else:
            with defect():
                run.run()
    except (Violation, AssertionError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def find_seeds(defect: Callable[[], AbstractContextManager[None]], seeds: range, *, chaos_s: float = 10.0,
               classic: bool = False, signs: tuple[str, ...] = (), want: int = 3,
               budget_s: float = 600.0) -> Iterator[Find]:
    """Yield the seeds of ``seeds`` whose run fails with ``defect`` (saying one of ``signs``,
    if given) and passes without it; at most ``want`` of them, within ``budget_s`` seconds."""
    deadline = time.monotonic() + budget_s
    found = 0
    for seed in seeds:
        if found >= want or time.monotonic() > deadline:
            return
        message = _failure(seed, chaos_s, classic, defect)
        if message is None or (signs and not any(sign in message for sign in signs)):
            continue
        if _failure(seed, chaos_s, classic, None) is None:
            found += 1
            yield Find(seed, message)


def main(argv: list[str] | None = None) -> int:
    """Command line: print each seed found with what the checkers said; 1 if none was."""
    names = sorted(name for name in defects.__all__ if callable(getattr(defects, name)))
    parser = argparse.ArgumentParser(prog="python -m sim.find_seeds", description=__doc__.splitlines()[0])
    parser.add_argument("defect", choices=names)
    parser.add_argument("--first", type=int, default=0, help="first seed tried")
    parser.add_argument("--count", type=int, default=1000, help="seeds tried at most")
    parser.add_argument("--want", type=int, default=3, help="seeds to find")
    parser.add_argument("--chaos", type=float, default=10.0, help="the chaos period, virtual seconds")
    parser.add_argument("--classic", action="store_true", help="without the features drawn since issue 29")
    parser.add_argument("--sign", action="append", default=[], help="what the failure must say (any of them)")
    parser.add_argument("--budget", type=float, default=600.0, help="wall seconds at most")
    args = parser.parse_args(argv)
    found = list(find_seeds(getattr(defects, args.defect), range(args.first, args.first + args.count),
                            chaos_s=args.chaos, classic=args.classic, signs=tuple(args.sign), want=args.want,
                            budget_s=args.budget))
    for hit in found:
        print(f"{hit.seed}\t{hit.message}")
    return 0 if found else 1


if __name__ == "__main__":
    raise SystemExit(main())
