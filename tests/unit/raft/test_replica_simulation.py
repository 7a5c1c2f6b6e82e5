"""A seeded simulation of whole replicas, TigerBeetle-VOPR style (the package ``sim`` beside this file).

Each seed runs one partition's replica group — 3 nodes, sometimes 5, or a group that
grows and shrinks between 1, 3 and 5 voters of a pool of nodes — in one process,
from one ``random.Random(seed)``: the real :class:`~shoal.node.raft.replica.PartitionReplica`
driving the real Raft core, journal (on :class:`~shoal.node.raft._io.SimIO`), engine,
snapshots and snapshot streaming, on a simulated event loop (``sim.loop``) and network
(``sim.network``: real MessagePack frames, lost, duplicated, reordered, delayed, cut by
partitions), with crashes that lose unsynced writes, damaged journal and snapshot files
(``sim.disk``), and, drawn per seed (``sim.cluster.Features``), membership changes by the
node's own planner, the balancer's transfers, paused nodes, drifting clocks, a disk-class
queue and reads; clients that push, pull, ack and read (``sim.workload``), and checkers
(``sim.checkers``): no acknowledged push lost (a disk-class one only to a power cut), no job
acked complete delivered again, no token handed out twice, every read reflecting the writes
acknowledged before it, equal digests at equal applied indexes, one leader per term and none
while loading, applied entries that agree, bounded work per loop callback, and, once the
faults stop, a group that settles on its target within a bounded virtual time with every
replica whole and in line. ``sim.cluster`` runs a seed.

The test command runs :data:`DEFAULT_SEEDS`; ``-m soak`` runs :data:`SOAK_SEEDS`, with a
longer chaos period. A failing seed prints the command that replays it (the run is the
same each time: nothing in it reads a clock or an unseeded random generator) and the
last events of its run.

Issue 29's findings 1-3, re-created on the real code (``sim.defects``), each caught by
seed (the tests below name the seeds):

1. a snapshot stream that spins sending empty messages: bounded work per callback fails
   (seeds 0-4, and every seed that streams a snapshot);
2. a snapshot chunk that moves the commit index over unchecked entries: a deposed leader
   applies its own uncommitted entries, and applied entries disagree (seeds 0, 14, 20);
3. a snapshot damaged in its body that loads as an empty engine: digests differ at equal
   applied indexes, and a leader on the empty state hands out job ids already acknowledged
   for other pushes (seeds 73, 175, 207).

``SimConfig.damage_last_segment`` (on by default) lets damage reach the last journal segment
too, in every byte the journal reported synced before the node stopped (its synced mark as it
ran, not as the disk holds it): the journal must refuse it where its ``synced`` file or a mark
record vouches for it, and restore the newest batch from the copy its sync flushed with it
(finding 6; *Copies* in its module docstring).

Issue 41's findings 1 and 3-7, re-created the same way, are each caught by the seeds of
:data:`ISSUE_41_CAUGHT` (finding 2, a paused transfer target, by a scene of its own), and
every one of those seeds passes without its defect.

A change that gives the seeds other histories may leave a named seed passing with its defect
too; ``python -m sim.find_seeds`` (from ``tests/unit/raft``) finds seeds that catch it again.

The regression seeds of the defects the simulation found are listed in :data:`REGRESSIONS`;
defects that need a scene of their own (a lost answer, a repair under a steady leader) have
their own tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from sim.checkers import Violation
from sim.cluster import Features, SimConfig, SimRun, run_seed
from sim.find_seeds import Find, find_seeds

from shoal.node.raft.core import RaftCore
from sim.defects import (commit_on_snapshot_chunk, configs_of_the_commit_hint, disk_class_as_durable,
                         extended_transfers, loading_replicas_lead, reads_without_lease, repeated_tokens,
                         spinning_snapshot_sender, swallowed_snapshot_damage, unprotected_last_batch)

#: Seeds of the test command, and their chaos period (virtual seconds).
DEFAULT_SEEDS = range(200)
CHAOS_S = 10.0
#: Seeds of ``-m soak``.
SOAK_SEEDS = range(1000, 4000)
SOAK_CHAOS_S = 30.0
_FILE = "tests/unit/raft/test_replica_simulation.py"

#: Seeds that failed on a defect the simulation found, with their chaos period, each fixed
#: by its own commit (the seeds fail again if the fix is taken out), run without the features
#: drawn since (the classic runs they were found in):
REGRESSIONS = {
    # replica._quarantine moved damaged files with os.rename, past the node's I/O layer: on
    # the simulated disk the damaged journal was opened again and the replica did not start.
    "quarantine through the I/O layer": (9, CHAOS_S),
    # RaftLog took an emptied journal's end (the log it dropped on a snapshot install) for
    # entries it still held: a conflict then cut a journal with no segments (IndexError).
    "an emptied journal holds nothing past the snapshot": (22, CHAOS_S),
    # The leader's journal dropped the entries after the snapshot it was streaming: a
    # follower caught up by snapshot needed a new snapshot each time, for ever.
    "a streamed snapshot's successors stay in the journal": (123, CHAOS_S),
    # A local snapshot started while a received one was being synced was renamed over it:
    # the replica loaded an older state than the index it reported.
    "no local snapshot over an installed one": (16, CHAOS_S),
    # A deposed leader applied its own entry, committed by its successor, without building
    # replies: its proposer got results without job ids (fewer results than commands).
    "a deposed leader answers its own committed entries": (29, CHAOS_S),
    # A tick-only entry was of the disk class: a follower's power cut lost it after it
    # counted toward the commit, and replicas applied different entries at one index.
    "a tick entry is synced before it counts": (38, 20.0),
    # The journal's commit hint was at least 1 (pysyncobj's log began with a committed
    # entry): a restarted replica applied its uncommitted first entry.
    "no commit hint beyond what was committed": (167, CHAOS_S),
    # A replica repairing damage voted again once it matched its leader anywhere: lacking
    # committed entries, it elected a leader without them.
    "a repaired replica votes once it holds every committed entry": (163, 20.0),
    # Journal recovery synced the segments it found but not the directory naming them: after a
    # crash and a restart, a power cut lost the newest segment while the synced mark vouched for
    # its entries, and two replicas repairing at once left the group without a leader.
    "recovery syncs the directory of the segments it found": (1088, SOAK_CHAOS_S),
    "a segment found at recovery survives the next power cut": (1397, SOAK_CHAOS_S),
    # A snapshot sender rewound to every stale (duplicated, reordered) answer and resent its
    # window each time: one callback sent hundreds of chunks.
    "a snapshot sender ignores stale answers": (1007, SOAK_CHAOS_S),
}


#: Seeds of the runs with features (membership changes, pauses, reads, ...) that failed on a
#: defect the simulation found, each fixed in the same change as the features:
FEATURE_REGRESSIONS = {
    # A learner added by a leader started with no membership and, damaged, was refused repair as
    # if it had been its group's only member.
    "a damaged joiner is repaired": (358, CHAOS_S),
    # Vote requests refused for a candidate no voter of one's own configuration: a group whose
    # members' configurations differed by one change could elect nobody.
    "votes are answered whatever one's own configuration": (124, CHAOS_S),
    # A leader whose fsync-class entries the periodic lazy sync synced first never counted them.
    "a leader counts what any sync synced": (1084, SOAK_CHAOS_S),
    # A voter was removed while one of those left was being repaired: the two left could not elect.
    "a removal waits for a caught-up majority of the voters left": (1572, SOAK_CHAOS_S),
    # A local snapshot written while one was installed from the leader replaced it afterwards: the
    # replica loaded the older state and, elected, handed out job ids twice.
    "a snapshot overtaken by an installed one is dropped": (3448, SOAK_CHAOS_S),
}


def _replay(test: str, seed: int, soak: bool = False) -> str:
    marker = " -m soak" if soak else ""
    return f".venv/bin/python -m pytest{marker} '{_FILE}::{test}[{seed}]'"


def _run(test: str, seed: int, chaos_s: float, soak: bool = False) -> SimRun:
    try:
        return run_seed(seed, chaos_s=chaos_s)
    except Violation as exc:
        failure = str(exc)
    except Exception as exc:  # a crash of the code under test: the seed replays it too
        raise AssertionError(f"seed {seed} crashed: {exc!r}\nreplay: {_replay(test, seed, soak)}") from exc
    pytest.fail(f"seed {seed}: {failure}\nreplay: {_replay(test, seed, soak)}", pytrace=False)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_seed(seed: int) -> None:
    _run("test_seed", seed, CHAOS_S)


@pytest.mark.soak
@pytest.mark.parametrize("seed", SOAK_SEEDS)
def test_soak_seed(seed: int) -> None:
    _run("test_soak_seed", seed, SOAK_CHAOS_S, soak=True)


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression(name: str) -> None:
    seed, chaos_s = REGRESSIONS[name]
    try:
        run_seed(seed, chaos_s=chaos_s, features=Features.none())  # the classic run they were found in
        return
    except Violation as exc:
        failure = str(exc)
    pytest.fail(f"{name}: seed {seed} (chaos {chaos_s} s): {failure}", pytrace=False)


@pytest.mark.parametrize("name", sorted(FEATURE_REGRESSIONS))
def test_feature_regression(name: str) -> None:
    seed, chaos_s = FEATURE_REGRESSIONS[name]
    try:
        run_seed(seed, chaos_s=chaos_s)
        return
    except Violation as exc:
        failure = str(exc)
    pytest.fail(f"{name}: seed {seed} (chaos {chaos_s} s): {failure}", pytrace=False)


@pytest.mark.parametrize("seed", [2, 4, 6, 17])
def test_a_lost_install_answer_costs_one_more_stream(seed: int) -> None:
    """The frame with a follower's answers to an installed snapshot (COMPLETE and its match) is
    lost once the faults stop, on a partition that then writes nothing new: the leader streams
    the snapshot once more, learns the follower holds it, and the follower — a repaired one in
    seed 17 — votes again, from the leader's heartbeats."""
    run = SimRun(seed, chaos_s=CHAOS_S, quiet_after_heal=True, features=Features.none())
    follower: list[str] = []
    offers = 0

    def drop(src: str, dst: str, items: list[Any]) -> bool:
        nonlocal offers
        if follower:  # count the leader's new streams to it: a chunk at offset 0 with no data
            offers += sum(1 for _, m in items if m[0] == 9 and m[4] == 0 and not m[8] and dst == follower[0])
            return False
        if run.healed_at and any(m[0] == 10 and m[4] == 1 for _, m in items):  # SnapshotChunkAck COMPLETE
            follower.append(src)
            return True
        return False

    run.fabric.drop_if = drop
    run.run()
    assert follower and offers <= 1, (follower, offers)


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_a_follower_repaired_under_a_steady_leader_is_caught_up(seed: int) -> None:
    """Right as the faults stop, a follower's snapshot is damaged and the follower restarted: it
    discards its log and starts over while the same leader goes on, on a partition that then
    writes nothing new. The leader must probe it below the entries it had acknowledged (its
    match index) rather than go on sending what follows them."""
    run = SimRun(seed, chaos_s=CHAOS_S, quiet_after_heal=True, features=Features.none())
    struck: list[str] = []

    def strike(tries: int = 200) -> None:
        leader = next((r for r in run._replicas() if r.is_leader()), None)  # noqa: SLF001 (a test's nemesis)
        if leader is None:  # an election is under way: strike once it is over (bounded)
            assert tries > 0, "no leader within 10 s of the healing"
            run.loop.call_later(0.05, strike, tries - 1)
            return
        node = next(n for n in run.nodes.values() if n.up and n.id != leader.node_id)
        node.crash(power_cut=False)
        node.io.flip_bits(f"{node.data_dir}/p0.snap", 40)  # the healing restarts it, with repair on
        if run.healed_at:
            run._restart(node.id, True)  # noqa: SLF001 (struck after the healing: restarted here)
        struck.append(node.id)

    run.loop.call_at(run.loop.time() + CHAOS_S - 0.001, strike)
    run.run()
    assert struck


def test_a_seed_replays_the_same_run() -> None:
    first, second = SimRun(7, chaos_s=CHAOS_S), SimRun(7, chaos_s=CHAOS_S)
    first.run()
    second.run()
    assert list(first.trace) == list(second.trace)
    assert first.summary() == second.summary()


def test_runs_exercise_every_fault() -> None:
    """The default seeds do what they are for: snapshots streamed and installed, damage refused
    and repaired, leaders moving, membership changes, paused nodes, reads (counted over a
    sample of them)."""
    totals: dict[str, int] = {}
    for seed in range(40):
        summary = run_seed(seed, chaos_s=CHAOS_S).summary()
        for key in ("installs", "refusals", "callbacks", "membership_changes", "pauses", "reads", "acks"):
            totals[key] = totals.get(key, 0) + summary[key]
        assert summary["pushes"] > 0
    assert totals["acks"] > 0 and totals["installs"] > 0 and totals["refusals"] > 0 and totals["callbacks"] > 10_000, totals
    assert totals["membership_changes"] > 0 and totals["pauses"] > 0 and totals["reads"] > 0, totals


def _caught(seed: int, defect: object) -> str:
    run = SimRun(seed, chaos_s=CHAOS_S, features=Features.none())  # issue 29's were found in classic runs
    with pytest.raises(Violation) as caught:
        with defect:  # type: ignore[attr-defined]
            run.run()
    return str(caught.value).splitlines()[0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_finding_1_a_spinning_snapshot_stream_is_caught(seed: int) -> None:
    assert "one loop callback sent" in _caught(seed, spinning_snapshot_sender())


@pytest.mark.parametrize("seed", [0, 14, 20])
def test_finding_2_commit_over_unchecked_entries_on_a_snapshot_is_caught(seed: int) -> None:
    assert "applied a different entry" in _caught(seed, commit_on_snapshot_chunk())


@pytest.mark.parametrize("seed, sign", [(82, "holds digest"), (207, "holds digest"), (50, "holds digest")])
def test_finding_3_a_damaged_snapshot_loaded_as_empty_is_caught(seed: int, sign: str) -> None:
    assert sign in _caught(seed, swallowed_snapshot_damage())


# --- issue 41 -----------------------------------------------------------------------------------


def _paused_transfer_target_run() -> tuple[SimRun, list[float]]:
    """Three nodes, the balancer on, no random faults. The preferred replica n0 is crashed and
    restarted, so another node leads and the balancer hands leadership back to n0; n0 is
    paused (SIGSTOP: links up, nothing read or answered) right as that transfer starts, for
    20 s. Returns the run and when the pause began."""
    config = SimConfig(nodes=3, chaos_s=40.0, crash_weight=0.0, partition_weight=0.0, damage_weight=0.0,
                       clients=2)
    run = SimRun(3, config=config, features=Features(balancer=True))
    paused: list[float] = []
    n0 = run.nodes["n0"]

    def crash_n0() -> None:
        n0.crash(power_cut=False)
        run.loop.call_later(2.0, run._restart, "n0", True)  # noqa: SLF001 (the test's own nemesis)

    transfer = RaftCore.transfer_leadership

    def transfer_then_freeze(core: RaftCore, target: str, now: float) -> None:
        transfer(core, target, now)
        if core.lead_transferee == "n0" and not paused:
            n0.pause(20.0)  # before the TimeoutNow leaves: n0 reads it only once it resumes
            paused.append(run.loop.time())

    run.loop.call_at(run.loop.time() + 2.0, crash_n0)
    RaftCore.transfer_leadership = transfer_then_freeze  # type: ignore[method-assign]
    try:
        run.run()
    finally:
        RaftCore.transfer_leadership = transfer  # type: ignore[method-assign]
    return run, paused


def _write_gap_s(run: SimRun, since: float, until: float) -> float:
    """The longest time in [since, until] with no push acknowledged."""
    acked = sorted(p.acked_at for p in run.workload.records.pushes.values()
                   if p.acked_at is not None and since <= p.acked_at <= until)
    marks = [since, *acked, until]
    return max(b - a for a, b in zip(marks, marks[1:]))


def test_finding_41_2_a_paused_transfer_target_stalls_writes_for_one_transfer_timeout_at_most() -> None:
    """The leader starts handing leadership to n0, then n0 freezes with its links up. The transfer
    is given up after its timeout and never extended, and n0 is no target while it answers
    nothing: writes stall for about one transfer timeout (1.6 s), not for the whole pause."""
    run, paused = _paused_transfer_target_run()
    assert paused, "the balancer never started a transfer to n0"
    assert _write_gap_s(run, paused[0], paused[0] + 20.0) < 5.0


def test_finding_41_2_is_caught_when_transfers_are_extended() -> None:
    with extended_transfers():
        run, paused = _paused_transfer_target_run()
    assert paused and _write_gap_s(run, paused[0], paused[0] + 20.0) > 15.0


#: Issue 41's findings, each caught by seed against its defect re-introduced (``sim.defects``):
#: finding -> (defect, seeds with their chaos period, what the checkers say). Every seed passes
#: without its defect.
ISSUE_41_CAUGHT = {
    # A restarted replica counts the voters of its stale commit hint: two replicas apply
    # different entries at one index (1252), the group is left unable to elect anyone (59), or
    # the config-entry invariant fails where the wrong configuration is used (223).
    1: (configs_of_the_commit_hint, [(1252, SOAK_CHAOS_S), (59, CHAOS_S), (223, CHAOS_S)],
        ("applied a different entry", "did not settle", "changes voters")),
    3: (reads_without_lease, [(58, CHAOS_S), (143, CHAOS_S), (268, CHAOS_S)], ("a stale read",)),
    4: (disk_class_as_durable, [(177, CHAOS_S), (375, CHAOS_S)], ("applied a different entry",)),
    5: (repeated_tokens, [(366, CHAOS_S), (63, CHAOS_S)], ("which an earlier take handed out",)),
    # Damage to the newest synced batch, with no copy and a mark that did not reach the disk,
    # passes for a torn tail: a replica votes with a log shorter than it acknowledged, and two
    # replicas apply different entries at one index (1761) or hold different digests (8670).
    6: (unprotected_last_batch, [(1761, SOAK_CHAOS_S), (8670, SOAK_CHAOS_S)],
        ("applied a different entry", "holds digest")),
    7: (loading_replicas_lead, [(674, CHAOS_S), (526, CHAOS_S)], ("while it loads its snapshot",)),
}
_ISSUE_41_CASES = [(finding, seed, chaos_s) for finding, (_, seeds, _) in sorted(ISSUE_41_CAUGHT.items())
                   for seed, chaos_s in seeds]


@pytest.mark.parametrize("finding, seed, chaos_s", _ISSUE_41_CASES)
def test_issue_41_finding_is_caught_by_seed(finding: int, seed: int, chaos_s: float) -> None:
    defect, _, signs = ISSUE_41_CAUGHT[finding]
    run_seed(seed, chaos_s=chaos_s)  # passes as the code is
    with pytest.raises((Violation, AssertionError)) as caught:
        with defect():
            run_seed(seed, chaos_s=chaos_s)
    message = str(caught.value).splitlines()[0]
    assert any(sign in message for sign in signs), message


def test_find_seeds_yields_a_seed_that_fails_with_its_defect_and_passes_without_it() -> None:
    caught = list(find_seeds(loading_replicas_lead, range(674, 675), signs=("while it loads its snapshot",)))
    assert [hit.seed for hit in caught] == [674] and isinstance(caught[0], Find)
    assert list(find_seeds(loading_replicas_lead, range(674, 675), signs=("no checker says this",))) == []
