"""Golden scripts for the Raft core: ``scripts/*.txt``, commands with the expected output beneath.

The format is the engine scripts' (``tests/unit/engine/scripts/README.md``): one case per
command, a ``----`` line, the output, cases separated by a blank line, ``#`` for comments.
Each file drives one in-memory network of cores (:mod:`raft_network`); the output lists
every message delivered or dropped (``1->2 AppendEntries …``), every change of role and
what a command asked to see.

Commands::

    cluster 1 2 3 [voters=1,2,3] [learners=4] [seed=N]   a new group (voters default to all)
    campaign N              N's election deadline passes now
    postpone N SECONDS      N's election deadline moves SECONDS from now
    elect N                 campaign N, deliver until quiet, one heartbeat round; shows role changes only
    tick SECONDS            the clock moves; every node that is up ticks (nothing is delivered)
    run SECONDS [step=S]    tick S (0.1) at a time, delivering until quiet after each; heartbeats
                            and their answers are delivered but not shown
    stabilize               deliver until nothing is in flight
    deliver [from=A] [to=B] [type=T] [count=K]   deliver the messages in flight that match (in order)
    drop [from=A] [to=B] [type=T]                lose the messages in flight that match
    hold [from=A] [to=B] [type=T]                hold matching messages, in flight and sent from now on
    release [drop]          stop holding: held messages go back in flight after the others (or are lost)
    reorder                 reverse the order of the messages in flight
    duplicate               send every message in flight twice
    send A B KIND FIELDS    put a hand-made message from A to B in flight (see ``craft``)
    propose N TEXT [class=disk]  N proposes an entry (its output: the index, or the refusal); a
                            disk-class entry counts once appended, before any sync
    change N KIND NODE      N proposes a membership change (add_learner, promote, demote, remove)
    transfer N TARGET       N hands leadership to TARGET
    cut A B / heal [A B]    drop messages between A and B (both ways) / stop dropping
    isolate N               cut N from everyone
    crash N [power] / restart N   N stops (its storage stays; a power cut loses what no sync made
                            durable) / starts from its storage
    sync N                  N's periodic sync makes its disk-class entries durable
    restart N lost          N starts with its log and snapshot discarded (the replica's repair): recovering
    loading N on|off        N's state machine is (no longer) loading a snapshot
    add-node N              a new, empty node that knows no membership yet
    snapshot N              N snapshots its applied state and drops that log prefix
    snapshot-failed N PEER  N's snapshot stream to PEER broke (its InstallSnapshot in flight or held is lost)
    status [N]              role, term, commit, applied, log span, membership (and progress on a leader)
    log N                   the entries on N's storage
    applied N               the payloads N applied

Output: ``A->B Message …`` for every message delivered (``(dropped)`` when lost), ``N became
ROLE at term T`` on every change of role or term, ``N stores term=T vote=V`` when N makes
its hard state durable (before anything it sends in the same step leaves), ``N sends
snapshot I/T to P`` and ``N installed snapshot I/T`` for catch-up by snapshot.

Rewrite the expected output after a deliberate change, then review the diff::

    SHOAL_REWRITE_SCRIPTS=1 pytest tests/unit/raft/test_raft_scripts.py
"""

from __future__ import annotations

import difflib
import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from raft_network import Cluster, storage_span

from shoal.node.raft.core import NotLeader, ProposalRefused
from shoal.node.raft.membership import ConfigChange
from shoal.node.raft.messages import (AppendEntries, AppendResponse, Heartbeat, HeartbeatResponse, InstallSnapshot,
                                      Message, RequestVote, TimeoutNow, VoteResponse)

SCRIPTS = Path(__file__).parent / "scripts"
REWRITE = os.environ.get("SHOAL_REWRITE_SCRIPTS") == "1"
SEPARATOR = "----"


def parse_cases(text: str) -> list[tuple[list[str], str, list[str]]]:
    """(comment lines, command, expected output lines) per case."""
    cases: list[tuple[list[str], str, list[str]]] = []
    lines = text.splitlines()
    k = 0
    while k < len(lines):
        comments: list[str] = []
        while k < len(lines) and (not lines[k].strip() or lines[k].startswith("#")):
            if lines[k].startswith("#"):
                comments.append(lines[k])
            k += 1
        if k >= len(lines):
            if comments:
                cases.append((comments, "", []))
            break
        command = lines[k]
        k += 1
        if k >= len(lines) or lines[k] != SEPARATOR:
            raise ValueError(f"line {k}: expected {SEPARATOR!r} after {command!r}")
        k += 1
        out: list[str] = []
        while k < len(lines) and lines[k].strip():
            out.append(lines[k])
            k += 1
        cases.append((comments, command, out))
    return cases


class Runner:
    """Runs one script's commands against one :class:`Cluster`."""

    def __init__(self) -> None:
        self.cluster: Cluster | None = None

    @property
    def c(self) -> Cluster:
        assert self.cluster is not None, "a script starts with 'cluster'"
        return self.cluster

    def run(self, command: str) -> list[str]:
        words = shlex.split(command)
        name, args = words[0], words[1:]
        kw = dict(a.split("=", 1) for a in args if "=" in a)
        pos = [a for a in args if "=" not in a]
        out: list[str] = []
        if name == "cluster":
            self.cluster = Cluster(pos, voters=kw["voters"].split(",") if "voters" in kw else None,
                                   learners=kw["learners"].split(",") if "learners" in kw else (),
                                   seed=int(kw.get("seed", 0)))
            self.c.on_output = out.append
            return ["ok"]
        c = self.c
        c.on_output = out.append
        if name == "campaign":
            c.campaign(pos[0])
        elif name == "elect":
            c.on_output = lambda line: out.append(line) if " became " in line else None
            c.campaign(pos[0])
            c.stabilize()
            c.tick(c.params.heartbeat_s)
            c.stabilize()
        elif name == "postpone":
            c.nodes[pos[0]].core.schedule_election(c.now + float(pos[1]))
        elif name == "tick":
            c.tick(float(pos[0]))
        elif name == "run":
            c.on_output = lambda line: None if _is_heartbeat(line) else out.append(line)
            step = float(kw.get("step", 0.1))
            for _ in range(round(float(pos[0]) / step)):
                c.tick(step)
                c.stabilize()
        elif name == "stabilize":
            c.stabilize()
        elif name == "deliver":
            chosen = self.matching(kw)
            for m in chosen[:int(kw["count"])] if "count" in kw else chosen:
                c.deliver_at(next(k for k, x in enumerate(c.in_flight) if x is m))
        elif name == "drop":
            for m in self.matching(kw):
                c.drop_at(next(k for k, x in enumerate(c.in_flight) if x is m))
        elif name == "hold":
            c.hold(self.matcher(kw))
        elif name == "release":
            c.release(lose="drop" in pos)
        elif name == "reorder":
            c.in_flight.reverse()
        elif name == "duplicate":
            c.in_flight = [m for m in c.in_flight for _ in range(2)]
        elif name == "send":
            c.in_flight.append((pos[0], pos[1], craft(pos[2], pos[3:], kw)))
        elif name == "propose":
            try:
                out.append(f"index {c.propose(pos[0], ' '.join(pos[1:]), lazy=kw.get('class') == 'disk')}")
            except (NotLeader, ProposalRefused) as exc:
                out.append(f"refused: {exc}")
        elif name == "change":
            node = c.nodes[pos[0]]
            try:
                index = node.core.propose_change(ConfigChange(pos[1], pos[2]), c.now)
                c.process(node)
                out.append(f"index {index}")
            except (NotLeader, ProposalRefused) as exc:
                out.append(f"refused: {exc}")
        elif name == "transfer":
            node = c.nodes[pos[0]]
            try:
                node.core.transfer_leadership(pos[1], c.now)
            except ProposalRefused as exc:
                out.append(f"refused: {exc}")
            c.process(node)
        elif name == "cut":
            c.cut |= {(pos[0], pos[1]), (pos[1], pos[0])}
        elif name == "heal":
            c.cut = set() if not pos else c.cut - {(pos[0], pos[1]), (pos[1], pos[0])}
        elif name == "isolate":
            c.cut |= {p for other in c.nodes if other != pos[0] for p in ((pos[0], other), (other, pos[0]))}
        elif name == "crash":
            c.crash(pos[0], power_cut="power" in pos[1:])
        elif name == "sync":
            c.sync(pos[0])
        elif name == "restart":
            c.restart(pos[0], lose_log="lost" in pos[1:])
        elif name == "add-node":
            c.add_node(pos[0])
        elif name == "loading":
            c.nodes[pos[0]].core.loading = pos[1] == "on"
        elif name == "snapshot":
            index, term = c.take_snapshot(pos[0])
            out.append(f"snapshot {index}/{term}; log {storage_span(c.nodes[pos[0]].storage)}")
        elif name == "snapshot-failed":
            def stream(m: tuple[str, str, Message]) -> bool:
                return m[0] == pos[0] and m[1] == pos[1] and isinstance(m[2], InstallSnapshot)
            c.in_flight = [m for m in c.in_flight if not stream(m)]
            c.held = [m for m in c.held if not stream(m)]
            c._stream_failed(pos[0], pos[1])  # noqa: SLF001 (the script breaks the stream)
        elif name == "status":
            for n in ([c.nodes[pos[0]]] if pos else list(c.nodes.values())):
                out.append(self.status_line(n.id))
        elif name == "log":
            node = c.nodes[pos[0]]
            st = node.storage
            ents = st.entries(st.first_index, st.last_index + 1)
            out.append(" ".join(f"{i}/{t}" for _, i, t in ents) or "(empty)")
        elif name == "applied":
            node = c.nodes[pos[0]]
            out.append(" ".join(f"{i}:{p[1:].decode()}" for i, p in node.applied) or "(nothing)")
        else:
            raise ValueError(f"unknown command {name!r}")
        return out or ["ok"]

    def matcher(self, kw: dict[str, str]) -> Callable[[tuple[str, str, Message]], bool]:
        """Does a message in flight match ``from``, ``to`` and ``type`` (those given)?"""
        def match(m: tuple[str, str, Message]) -> bool:
            return (kw.get("from", m[0]) == m[0] and kw.get("to", m[1]) == m[1]
                    and kw.get("type", type(m[2]).__name__) == type(m[2]).__name__)
        return match

    def matching(self, kw: dict[str, str]) -> list[tuple[str, str, Message]]:
        """The messages in flight now that match ``from``, ``to`` and ``type``."""
        return [m for m in self.c.in_flight if self.matcher(kw)(m)]

    def status_line(self, node_id: str) -> str:
        node = self.c.nodes[node_id]
        if not node.up:
            term, vote = node.hard_state
            return f"{node_id}: down term={term} vote={vote} log={storage_span(node.storage)}"
        s = node.core.status()
        recovering = " recovering" if node.core.recovering else ""
        line = (f"{node_id}: {s['state']}{recovering} term={s['term']} vote={node.core.vote} leader={s['leader']} "
                f"commit={s['commit']} applied={s['applied']} log={storage_span(node.storage)} "
                f"snap={s['snapshot']} voters={','.join(s['voters'])}")
        if node.core.durable != s["commit"]:
            line += f" durable={node.core.durable}"
        if s["learners"]:
            line += f" learners={','.join(s['learners'])}"
        if s.get("progress"):
            line += " progress=" + " ".join(f"{p}:{v['match']}/{v['next']}/{v['state']}"
                                            for p, v in s["progress"].items())
        return line


def _is_heartbeat(line: str) -> bool:
    return " Heartbeat " in line or " HeartbeatResponse " in line


def _index_term(text: str) -> tuple[int, int]:
    index, term = text.split("/")
    return int(index), int(term)


def craft(kind: str, flags: list[str], kw: dict[str, str]) -> Message:
    """A hand-made message: ``AppendEntries term=T prev=I/T commit=C [entries=I/T:text,...]``,
    ``AppendResponse term=T index=I [reject hint=I/T]``, ``Heartbeat term=T commit=C``,
    ``HeartbeatResponse term=T``, ``RequestVote term=T last=I/T [pre] [transfer]``,
    ``VoteResponse term=T granted|refused [pre]``, ``TimeoutNow term=T``."""
    term = int(kw["term"])
    if kind == "AppendEntries":
        entries = []
        for item in filter(None, kw.get("entries", "").split(",")):
            at, _, text = item.partition(":")
            index, entry_term = _index_term(at)
            entries.append((b"\0" + text.encode(), index, entry_term))
        prev = _index_term(kw["prev"])
        return AppendEntries(term, prev[0], prev[1], int(kw["commit"]), entries)
    if kind == "AppendResponse":
        hint = _index_term(kw.get("hint", "0/0"))
        return AppendResponse(term, int(kw["index"]), "reject" in flags, hint[0], hint[1])
    if kind == "Heartbeat":
        return Heartbeat(term, int(kw["commit"]))
    if kind == "HeartbeatResponse":
        return HeartbeatResponse(term)
    if kind == "RequestVote":
        last = _index_term(kw["last"])
        return RequestVote(term, last[0], last[1], pre="pre" in flags, transfer="transfer" in flags)
    if kind == "VoteResponse":
        return VoteResponse(term, "granted" in flags, pre="pre" in flags)
    if kind == "TimeoutNow":
        return TimeoutNow(term)
    raise ValueError(f"cannot craft a {kind}")


def render(cases: list[tuple[list[str], str, list[str]]]) -> str:
    blocks = []
    for comments, command, out in cases:
        lines = list(comments)
        if command:
            lines += [command, SEPARATOR, *out]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


@pytest.mark.parametrize("path", sorted(SCRIPTS.glob("*.txt")), ids=lambda p: p.stem)
def test_script(path: Path) -> None:
    cases = parse_cases(path.read_text())
    runner = Runner()
    actual = [(comments, command, runner.run(command) if command else []) for comments, command, _ in cases]
    got, want = render(actual), render(cases)
    if REWRITE:
        if got != want:
            path.write_text(got)
        return
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "actual"))
        pytest.fail(f"{path.name} differs (SHOAL_REWRITE_SCRIPTS=1 rewrites it):\n{diff}")
