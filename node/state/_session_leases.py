"""Which jobs each session holds leased.

A consumer's session leases jobs a batch at a time and lets them go as it acks them. Jobs
leased one at a time (job objects, and single slots) are indexed one by one, seq → lease
number, as their leases begin and end one by one anyway. Slots a batch pull leased together
are kept as the run they were leased in, ``(first seq, count, first lease number)``, with how
many such slots the session holds: a pull adds one run (or extends the last), an ack only
lowers the count. Which slots of a run are still held is asked of the slots themselves
(state, session and lease number: a lease number is never given twice), so a run whose jobs
were acked or reclaimed is dropped the next time the runs are looked over, which happens
once a session's runs have doubled: the list stays within twice the runs still held plus a
constant. A leased slot made a job object moves to the single leases. A session that never
leased a run keeps only its single leases (a dict, nothing more); a session goes when it
holds nothing.

Lease numbers grow with every lease, so the order a session leased its jobs in is the order
of their lease numbers: that is how a snapshot lists them and a ``ReleaseSession`` lets them go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

__all__ = ["SessionLeases", "Run", "LiveRuns", "add_lease"]

#: ``(first seq, count, lease number of the first)``: slots leased together, consecutive in both.
Run = tuple[int, int, int]
#: Given a session and a run, the parts of the run whose slots the session still holds.
LiveRuns = Callable[[str, int, int, int], list[Run]]

#: Runs a session keeps before they are looked over the first time.
RUNS_MIN = 64


def add_lease(runs: list[Run], seq: int, lease_no: int) -> None:
    """Append job ``seq``'s lease ``lease_no`` to ``runs``, extending the last run it follows on
    from in both."""
    if runs:
        first, k, number = runs[-1]
        if first + k == seq and number + k == lease_no:
            runs[-1] = (first, k + 1, number)
            return
    runs.append((seq, 1, lease_no))


class _Held:
    """A session's leases once it leased a run (before, a dict of its single leases is enough)."""

    __slots__ = ("singles", "slots", "runs", "limit")

    def __init__(self, singles: dict[int, int]) -> None:
        self.singles = singles  # seq -> lease number, of jobs leased one at a time
        self.slots = 0          # slots held of ``runs``
        self.runs: list[Run] = []
        self.limit = RUNS_MIN


class SessionLeases:
    """The leases each session holds (see the module docstring); ``live_runs`` says which part
    of a run of slots a session still holds."""

    __slots__ = ("_held", "_live_runs", "drifts")

    def __init__(self, live_runs: LiveRuns) -> None:
        # per session: its single leases (seq -> lease number) while it has only those
        self._held: dict[str, dict[int, int] | _Held] = {}
        self._live_runs = live_runs
        #: Look-overs that found a count other than the slots held (a bug: tests require 0).
        self.drifts = 0

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[str]:
        """The sessions that hold a lease."""
        return iter(self._held)

    def count(self, session: str) -> int:
        """How many jobs ``session`` holds leased."""
        held = self._held.get(session)
        if held is None:
            return 0
        return len(held) if type(held) is dict else len(held.singles) + held.slots  # type: ignore[union-attr]

    def hold_one(self, session: str, seq: int, lease_no: int) -> None:
        """``session`` leased job ``seq`` (a job object, or a slot on its own) under ``lease_no``."""
        held = self._held.get(session)
        if held is None:
            self._held[session] = {seq: lease_no}
        elif type(held) is dict:
            held[seq] = lease_no
        else:
            held.singles[seq] = lease_no  # type: ignore[union-attr]

    def hold_slots(self, session: str, first: int, k: int, lease_no: int, segment_first: int) -> None:
        """``session`` leased the slots of jobs ``first .. first+k-1`` of the segment that begins
        at ``segment_first`` together, under lease numbers from ``lease_no`` on. A run that goes
        on from the session's last one in the same segment extends it (consecutive pulls)."""
        held = self._held.get(session)
        if type(held) is not _Held:
            held = self._held[session] = _Held(held if held is not None else {})  # type: ignore[arg-type]
        held.slots += k
        runs = held.runs
        if runs:
            head, count, number = runs[-1]
            if head + count == first and number + count == lease_no and head >= segment_first:
                runs[-1] = (head, count + k, number)
                return
        runs.append((first, k, lease_no))
        if len(runs) > held.limit:
            self._look_over(session, held)

    def slot_to_job(self, session: str, seq: int, lease_no: int) -> None:
        """The leased slot of job ``seq`` became a job object, still under lease ``lease_no``."""
        held = self._held.get(session)
        if type(held) is _Held and seq not in held.singles:  # else it was leased on its own
            held.slots -= 1
            held.singles[seq] = lease_no

    def let_go(self, session: str, seq: int) -> None:
        """Job ``seq``'s lease by ``session`` ended (acked, reclaimed, released, removed)."""
        held = self._held.get(session)
        if held is None:
            return
        if type(held) is dict:
            held.pop(seq, None)
            if not held:
                del self._held[session]
            return
        if held.singles.pop(seq, None) is None:  # type: ignore[union-attr]
            held.slots -= 1  # type: ignore[union-attr]
        self._drop_if_empty(session, held)  # type: ignore[arg-type]

    def let_go_slots(self, session: str, first: int, k: int, n: int) -> None:
        """The leases by ``session`` of ``n`` of the slots of jobs ``first .. first+k-1`` ended."""
        held = self._held.get(session)
        if held is None:
            return
        singles = held if type(held) is dict else held.singles  # type: ignore[union-attr]
        if singles:  # some may have been leased one at a time
            pop = singles.pop
            n -= sum(pop(seq, None) is not None for seq in range(first, first + k))
        if type(held) is _Held:
            held.slots -= n
            self._drop_if_empty(session, held)
        elif not held:
            del self._held[session]

    def _drop_if_empty(self, session: str, held: _Held) -> None:
        if held.slots <= 0 and not held.singles:
            del self._held[session]

    def forget(self, session: str) -> None:
        """``session`` holds nothing any more (its leases were all let go)."""
        self._held.pop(session, None)

    def seqs(self, session: str) -> list[int]:
        """The jobs ``session`` holds, in the order it leased them."""
        held = self._held.get(session)
        if held is None:
            return []
        if type(held) is dict:
            return list(held)  # inserted as leased
        self._look_over(session, held)  # type: ignore[arg-type]
        leases = [(n, seq) for seq, n in held.singles.items()]  # type: ignore[union-attr]
        for first, k, lease_no in held.runs:  # type: ignore[union-attr]
            leases += zip(range(lease_no, lease_no + k), range(first, first + k))
        leases.sort()
        return [seq for _, seq in leases]

    def state(self) -> dict[str, list[int]]:
        """Every session's jobs, as a snapshot lists them."""
        return {session: self.seqs(session) for session in list(self._held)}

    def load(self, session: str, singles: dict[int, int], runs: list[Run]) -> None:
        """A restored session's leases: one at a time, and runs of slots."""
        if runs:
            held = self._held[session] = _Held(singles)
            held.runs = runs
            held.slots = sum(k for _, k, _ in runs)
            held.limit = max(RUNS_MIN, 2 * len(runs))
        elif singles:
            self._held[session] = singles

    def _look_over(self, session: str, held: _Held) -> None:
        """Keep only the parts of ``held``'s runs whose slots its session still holds."""
        live_runs = self._live_runs
        kept: list[Run] = []
        for first, k, lease_no in held.runs:
            kept += live_runs(session, first, k, lease_no)
        held.runs = kept
        held.limit = max(RUNS_MIN, 2 * len(kept))
        slots = sum(k for _, k, _ in kept)
        if slots != held.slots:  # a lease begun or ended without the index told: the slots are right
            self.drifts += 1
            held.slots = slots
            self._drop_if_empty(session, held)
