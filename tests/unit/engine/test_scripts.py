"""Golden scripts for the engine: ``scripts/*.txt``, commands with the expected output beneath.

Format (one case per command, cases separated by a blank line; ``#`` starts a comment line)::

    # a comment
    push q=a pri=1 data=hello
    ----
    ok id=0-1
    events: 0-1 new>waiting

A command is a word and ``key=value`` arguments (shell quoting: ``error="no disk"``). The
word is an alias below (``push``, ``pullb``, ``tick``, ...) or any engine command by its wire
name (``GetJobCounts``); arguments are wire fields or their aliases (``q``, ``pri``, ...).
``now=MS`` sets the clock for this and the following commands (it starts at 1000). Values
are ints, ``none``, ``true``/``false`` or text; ``data``/``result`` become MessagePack data
(an int or a string). Lists are comma-separated: ``ids``, ``tokens``, ``results``, and
``data`` of ``pushb`` / ``push-many`` (one job per value; other arguments of ``pushb`` go to
every item). ``create`` puts every argument but ``queue`` and ``type`` into ``options``.
Each command is validated as the node validates it, so a script can show refusals.

Output: ``ok`` and the reply's scalar fields, then one indented line per job (``job:``,
``jobs:``) or other record; ``error CODE: message`` for a refused command; ``events:``
with the events the command caused (``id prev>state``, ``new`` for a created job). Two
directives: ``restart`` replaces the engine by one restored from its snapshot (its digest
must be equal), ``digest`` prints the first 16 hex digits of the digest.

Every write is also applied to a follower twin (``replies=False, events=False``); its
digest must equal the engine's at every ``digest``, ``restart`` and the end of the file.

Rewrite the expected output after a deliberate change, then review the diff::

    SHOAL_REWRITE_SCRIPTS=1 pytest tests/unit/engine/test_scripts.py
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest

from shoal.cluster.codec import Raw, raw_bytes
from shoal.cluster.commands import READ_COMMANDS, validate
from shoal.cluster.errors import CommandError
from shoal.node.state import Command, PartitionEngine, PushRun, SessionPull

SCRIPTS = Path(__file__).parent / "scripts"
REWRITE = os.environ.get("SHOAL_REWRITE_SCRIPTS") == "1"
SEPARATOR = "----"
START_MS = 1_000

COMMAND_ALIASES = {
    "push": "PUSH", "pushb": "PUSHB", "push-many": "PushRun", "pull": "PULL", "pullb": "PULLB",
    "ack": "ACK", "ackb": "ACKB", "fail": "FAIL", "release": "Release", "bury": "Bury", "kick": "Kick",
    "touch": "Touch", "heartbeat": "JobHeartbeat", "release-all": "ReleaseAll", "tick": "_Tick",
    "release-session": "_ReleaseSession", "create": "CreateQueue", "cancel": "Cancel", "promote": "Promote",
    "delay": "MoveToDelayed", "progress": "Progress", "log": "AddLog", "logs": "GetLogs", "pause": "Pause",
    "resume": "Resume", "drain": "Drain", "clean": "Clean", "obliterate": "Obliterate", "retry-dlq": "RetryDlq",
    "retry-completed": "RetryCompleted", "purge-dlq": "PurgeDlq", "truncate": "Truncate", "read": "Read",
    "cron": "Cron", "cron-delete": "CronDelete", "cron-list": "CronList", "get": "GetJob", "state": "GetState",
    "result": "GetResult", "jobs": "GetJobs", "counts": "GetJobCounts", "count": "Count", "dlq": "Dlq",
    "by-custom-id": "GetJobByCustomId", "prio-counts": "GetCountsPerPriority", "metrics": "Metrics",
}
ARG_ALIASES = {"q": "queue", "pri": "priority", "every": "repeatEvery", "from": "fromSeq",
               "before": "beforeSeq", "custom": "customId", "key": "idempotencyKey"}
LIST_ARGS = {"ids", "tokens", "results"}
_INT = re.compile(r"-?\d+")


# --- parsing -------------------------------------------------------------------------------------

def parse_value(text: str) -> Any:
    if text.startswith("{"):
        return json.loads(text)  # a nested option, e.g. limit='{"max": 2, "durationMs": 1000}'
    if _INT.fullmatch(text):
        return int(text)
    return {"none": None, "true": True, "false": False}.get(text, text)


def as_data(value: Any) -> Raw:
    return Raw(msgpack.packb(value, use_bin_type=True))


def build_flow_command(word: str, args: list[str]) -> dict[str, Any]:
    """The flow commands, whose fields are lists of records:

    ``flow-push q=a data=x expect=2`` (a parent of 2 children), ``flow-push q=b data=y
    parent=0-1 onFailure=ignore`` (a child), both with PUSH's options; ``child-done
    parent=0-1 child=3-7 result=5`` or ``... failed=true error=boom onFailure=remove``;
    ``flow-acked partition=0 children=2,3``; ``children-values id=0-1``.
    """
    fields = dict(arg.partition("=")[::2] for arg in args)
    fields = {ARG_ALIASES.get(k, k): parse_value(v) for k, v in fields.items()}
    if word == "flow-push":
        item: dict[str, Any] = {"data": as_data(fields.pop("data")).packed}
        for key in ("expect", "parent", "onFailure"):
            if key in fields:
                item["_" + key] = str(fields.pop(key)) if key == "parent" else fields.pop(key)
        queue = fields.pop("queue")
        item.update({k: str(v) if k in ("idempotencyKey", "customId", "group", "tag") else v
                     for k, v in fields.items()})
        return {"cmd": "_FlowPush", "queue": queue, "_items": [item]}
    if word == "child-done":
        failed = bool(fields.get("failed"))
        result = None if failed or "result" not in fields else as_data(fields["result"]).packed
        report = [str(fields["parent"]), str(fields["child"]), failed, result,
                  fields.get("error") if failed else None, fields.get("onFailure", "fail")]
        return {"cmd": "_ChildDone", "partition": 0, "_reports": [report]}
    if word == "flow-acked":
        return {"cmd": "_FlowAcked", "partition": 0,
                "_children": [int(c) for c in str(fields["children"]).split(",")]}
    return {"cmd": "GetChildrenValues", "id": str(fields["id"])}


FLOW_WORDS = ("flow-push", "child-done", "flow-acked", "children-values")


def build_command(line: str, now_ms: int) -> tuple[dict[str, Any], int]:
    """The engine command a script line stands for, and its clock."""
    word, *args = shlex.split(line)
    if word in FLOW_WORDS:
        now_args = [a for a in args if a.startswith("now=")]
        rest = [a for a in args if not a.startswith("now=")]
        return build_flow_command(word, rest), int(now_args[0][4:]) if now_args else now_ms
    name = COMMAND_ALIASES.get(word, word)
    cmd: dict[str, Any] = {"cmd": name}
    for arg in args:
        key, _, text = arg.partition("=")
        key = ARG_ALIASES.get(key, key)
        if key == "now":
            now_ms = int(text)
        elif key in LIST_ARGS or (key == "data" and name in ("PUSHB", "PushRun")):
            cmd[key] = [parse_value(v) for v in text.split(",")] if text else []
        else:
            cmd[key] = parse_value(text)
    if "data" in cmd:
        data = cmd.pop("data")
        if name == "PUSHB":
            extra = {k: cmd.pop(k) for k in list(cmd) if k not in ("cmd", "queue")}
            cmd["jobs"] = [{"data": as_data(d), **extra} for d in data]
        elif name == "PushRun":
            cmd["datas"] = [as_data(d).packed for d in data]
        else:
            cmd["data"] = as_data(data)
    if "keys" in cmd and name == "PushRun":
        cmd["keys"] = [None if k == "-" else k for k in str(cmd.pop("keys")).split(",")]
    if "result" in cmd:
        cmd["result"] = as_data(cmd["result"])
    if "results" in cmd:
        cmd["results"] = [as_data(r) for r in cmd["results"]]
    if name == "CreateQueue":
        options = {k: cmd.pop(k) for k in list(cmd) if k not in ("cmd", "queue", "type")}
        if options:
            cmd["options"] = options
    for key in ("ids", "tokens"):
        if key in cmd:
            cmd[key] = [str(v) for v in cmd[key]]
    for key in ("id", "token", "idempotencyKey", "customId", "group", "tag", "name", "session"):
        if key in cmd and cmd[key] is not None:
            cmd[key] = str(cmd[key])
    return cmd, now_ms


def engine_form(cmd: dict[str, Any]) -> Command:
    """The command as the node hands it to the engine: validated, or in the typed form the
    node replicates (a run of plain pushes, a pull stamped with its connection's session)."""
    name = cmd["cmd"]
    if name == "PushRun":
        return PushRun(cmd["queue"], cmd["datas"], cmd.get("keys"))
    session = cmd.pop("session", None) if name in ("PULL", "PULLB") else None
    validate(cmd, internal=True)
    return SessionPull(cmd, session) if session is not None else cmd


# --- rendering -----------------------------------------------------------------------------------

def fmt(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (Raw, msgspec.Raw)):
        return json.dumps(msgpack.unpackb(raw_bytes(value), raw=False))
    if isinstance(value, bytes):
        return json.dumps(msgpack.unpackb(value, raw=False))
    if isinstance(value, str):
        return value if value and not re.search(r"[\s{}\[\]=\"]", value) else json.dumps(value)
    if isinstance(value, CommandError):
        return f"error({value.code.value})"
    if isinstance(value, dict):
        return "{" + " ".join(f"{k}={fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(fmt(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r}")


def render_reply(reply: dict[str, Any]) -> list[str]:
    head, more = ["ok"], []
    for key, value in reply.items():
        records = [value] if isinstance(value, dict) and "id" in value else value
        if isinstance(records, list) and records and all(isinstance(r, dict) for r in records):
            more += [f"  {key}: {fmt({k: v for k, v in r.items() if k != 'queue'})}" for r in records]
        else:
            head.append(f"{key}={fmt(value)}")
    return [" ".join(head), *more]


def render_events(partition: int, events: list[Any]) -> list[str]:
    if not events:
        return []
    parts = []
    for _queue, seq, state, prev in events:
        if state == "progress":
            parts.append(f"{partition}-{seq} progress={fmt(prev)}")
        else:
            parts.append(f"{partition}-{seq} {prev or 'new'}>{state}")
    return ["events: " + " ".join(parts)]


# --- running -------------------------------------------------------------------------------------

class Runner:
    """One engine and its follower twin, driven by a script's commands."""

    def __init__(self) -> None:
        self.engine = PartitionEngine(0)
        self.twin = PartitionEngine(0)
        self.now_ms = START_MS

    def check_twin(self) -> None:
        assert self.twin.digest() == self.engine.digest(), "the follower twin's state differs"

    def run(self, line: str) -> list[str]:
        if line == "restart":
            digest = self.engine.digest()
            self.engine = PartitionEngine.restore(self.engine.snapshot())
            assert self.engine.digest() == digest, "a restored engine differs"
            self.check_twin()
            return ["ok"]
        if line == "outbox":  # a flow child's reports not yet acknowledged by its parent's partition
            rows = [f"  {self.engine.partition}-{seq}: parent={r[0]} failed={fmt(r[1])} result={fmt(r[2])} "
                    f"error={fmt(r[3])} onFailure={r[4]}" for seq, r in self.engine.flow_outbox.items()]
            return ["ok", *rows]
        if line == "digest":
            self.check_twin()
            return [f"ok digest={self.engine.digest()[:16]}"]
        frame, self.now_ms = build_command(line, self.now_ms)
        name = frame["cmd"]
        try:
            cmd = engine_form(frame)
        except CommandError as exc:
            return [f"error {exc.code.value}: {exc}"]
        try:
            applied = self.engine.apply(cmd, self.now_ms)
        except CommandError as exc:
            if name not in READ_COMMANDS:
                with pytest.raises(CommandError) as twin_exc:
                    self.twin.apply(cmd, self.now_ms, replies=False, events=False)
                assert twin_exc.value.code is exc.code
            return [f"error {exc.code.value}: {exc}"]
        if name not in READ_COMMANDS:
            self.twin.apply(cmd, self.now_ms, replies=False, events=False)
        return render_reply(applied.result) + render_events(self.engine.partition, applied.events)


def run_script(text: str) -> str:
    """``text`` with every case's output replaced by what the engine answers now."""
    runner = Runner()
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            out.append(line)
            continue
        out.append(line)
        out.append(SEPARATOR)
        if i < len(lines) and lines[i].strip() == SEPARATOR:
            i += 1
            while i < len(lines) and lines[i].strip():
                i += 1  # the old expected output
        out += runner.run(line)
        if i < len(lines) and lines[i].strip():
            out.append("")  # cases are separated by a blank line
    runner.check_twin()
    return "\n".join(out).rstrip("\n") + "\n"


@pytest.mark.parametrize("path", sorted(SCRIPTS.glob("*.txt")), ids=lambda p: p.stem)
def test_script(path: Path) -> None:
    text = path.read_text()
    got = run_script(text)
    if REWRITE:
        path.write_text(got)
        return
    if got != text:
        diff = "".join(difflib.unified_diff(text.splitlines(True), got.splitlines(True), "expected", "got"))
        pytest.fail(f"{path.name} differs (SHOAL_REWRITE_SCRIPTS=1 rewrites it):\n{diff}")


def test_scripts_exist() -> None:
    assert len(list(SCRIPTS.glob("*.txt"))) >= 10
