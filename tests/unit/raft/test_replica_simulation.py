"""A seeded simulation of whole replicas, TigerBeetle-VOPR style (the package ``sim`` beside this file).

Each seed runs one partition's replica group — 3 nodes, sometimes 5 — in one process,
from one ``random.Random(seed)``: the real :class:`~shoal.node.raft.replica.PartitionReplica`
driving the real Raft core, journal (on :class:`~shoal.node.raft._io.SimIO`), engine,
snapshots and snapshot streaming, on a simulated event loop (``sim.loop``) and network
(``sim.network``: real MessagePack frames, lost, duplicated, reordered, delayed, cut by
partitions), with crashes that lose unsynced writes, damaged journal and snapshot files
(``sim.disk``), clients that push, pull and ack (``sim.workload``), and checkers
(``sim.checkers``): no acknowledged push lost, no job acked complete delivered again,
equal digests at equal applied indexes, one leader per term, applied entries that agree,
bounded work per loop callback, and, once the faults stop, a group that settles within
a bounded virtual time with every replica whole and in line. ``sim.cluster`` runs a seed.

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
   for other pushes (seeds 41, 50, 96).

``SimConfig.damage_last_segment`` (on by default) lets damage reach the last journal segment
too, where the journal tells damaged synced records from a torn tail by its synced mark (finding
6): the ``synced`` file, written without a sync, and the mark records in the segment. The damage
stays in the bytes a durable mark vouches for. Past them is the window the journal documents
(*The synced mark* in its module docstring), where damage after a power cut passes for a torn
tail: let in there, it loses a committed entry in soak seed 1761.

The regression seeds of the defects the simulation found are listed in :data:`REGRESSIONS`;
defects that need a scene of their own (a lost answer, a repair under a steady leader) have
their own tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from sim.checkers import Violation
from sim.cluster import SimRun, run_seed
from sim.defects import commit_on_snapshot_chunk, spinning_snapshot_sender, swallowed_snapshot_damage

#: Seeds of the test command, and their chaos period (virtual seconds).
DEFAULT_SEEDS = range(200)
CHAOS_S = 10.0
#: Seeds of ``-m soak``.
SOAK_SEEDS = range(1000, 4000)
SOAK_CHAOS_S = 30.0
_FILE = "tests/unit/raft/test_replica_simulation.py"

#: Seeds that failed on a defect the simulation found, with their chaos period, each fixed
#: by its own commit (the seeds fail again if the fix is taken out):
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
    run = SimRun(seed, chaos_s=CHAOS_S, quiet_after_heal=True)
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
    run = SimRun(seed, chaos_s=CHAOS_S, quiet_after_heal=True)
    struck: list[str] = []

    def strike() -> None:
        leader = next(r for r in run._replicas() if r.is_leader())  # noqa: SLF001 (a test's nemesis)
        node = next(n for n in run.nodes.values() if n.up and n.id != leader.node_id)
        node.crash(power_cut=False)
        node.io.flip_bits(f"{node.data_dir}/p0.snap", 40)  # the healing restarts it, with repair on
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
    and repaired, leaders moving (counted over a sample of them)."""
    installs = refusals = callbacks = 0
    for seed in range(12):
        run = run_seed(seed, chaos_s=CHAOS_S)
        summary = run.summary()
        installs += summary["installs"]
        refusals += summary["refusals"]
        callbacks += summary["callbacks"]
        assert summary["pushes"] > 0 and summary["acks"] > 0
    assert installs > 0 and refusals > 0 and callbacks > 10_000


def _caught(seed: int, defect: object) -> str:
    run = SimRun(seed, chaos_s=CHAOS_S)
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


@pytest.mark.parametrize("seed, sign", [(41, "holds digest"), (50, "holds digest"), (96, "holds digest")])
def test_finding_3_a_damaged_snapshot_loaded_as_empty_is_caught(seed: int, sign: str) -> None:
    assert sign in _caught(seed, swallowed_snapshot_damage())
