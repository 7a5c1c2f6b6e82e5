"""A job's ``traceContext`` (the trace it was added in): checked, kept, returned on pull and
GetJob, and carried through a snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.cluster import limits as L
from shoal.cluster.codec import raw_of, unraw
from shoal.cluster.commands import normalize, validate
from shoal.cluster.errors import CommandError
from shoal.node.state import PartitionEngine

CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "congo=t61rcWkgMzE"}


def run(e: PartitionEngine, cmd: dict[str, Any], now: int) -> Any:
    normalize(cmd)  # as the node does before it replicates a command
    validate(cmd)
    return unraw(e.apply(cmd, now).result)


def test_a_pushed_trace_context_comes_back_on_pull_get_job_and_after_a_snapshot() -> None:
    e = PartitionEngine(0)
    job_id = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of({"a": 1}), "traceContext": dict(CARRIER)},
                 1_000)["id"]
    batch = run(e, {"cmd": "PUSHB", "queue": "q", "jobs": [
        {"data": raw_of(i), "traceContext": dict(CARRIER)} for i in range(3)] + [{"data": raw_of("plain")}]}, 1_000)
    assert run(e, {"cmd": "GetJob", "id": job_id}, 1_500)["job"]["traceContext"] == CARRIER
    pulled = run(e, {"cmd": "PULLB", "queue": "q", "count": 5, "ttr": 60_000}, 2_000)["jobs"]
    assert [j.get("traceContext") for j in pulled] == [CARRIER] * 4 + [None]
    restored = PartitionEngine.restore(e.snapshot())
    assert restored.digest() == e.digest()
    for jid in [job_id, *batch["ids"][:3]]:
        assert run(restored, {"cmd": "GetJob", "id": jid}, 3_000)["job"]["traceContext"] == CARRIER
    assert "traceContext" not in run(restored, {"cmd": "GetJob", "id": batch["ids"][3]}, 3_000)["job"]


def test_a_job_without_a_trace_context_shows_none() -> None:
    e = PartitionEngine(0)
    job_id = run(e, {"cmd": "PUSH", "queue": "q", "data": raw_of(1), "priority": 2}, 1_000)["id"]
    assert "traceContext" not in run(e, {"cmd": "GetJob", "id": job_id}, 1_500)["job"]
    assert "traceContext" not in run(e, {"cmd": "PULL", "queue": "q"}, 2_000)["job"]


@pytest.mark.parametrize("value, why", [
    ({}, "non-empty map"),
    ("00-abc", "non-empty map"),
    ({"traceparent": 7}, "must be a string"),
    ({"trace parent": "x"}, "characters of"),
    ({"k" * 65: "x"}, "characters of"),
    ({f"k{i}": "x" for i in range(L.trace_context_entries_max + 1)}, "at most 8 entries"),
    ({"baggage": "x" * L.trace_context_chars_max}, f"at most {L.trace_context_chars_max} characters"),
])
def test_a_bad_trace_context_is_refused_naming_the_field(value: Any, why: str) -> None:
    with pytest.raises(CommandError) as err:
        validate({"cmd": "PUSH", "queue": "q", "data": 1, "traceContext": value})
    assert err.value.code.value == "INVALID"
    assert str(err.value).startswith("traceContext") and why in str(err.value)
    with pytest.raises(CommandError, match=r"^jobs\[0\]\.traceContext"):
        validate({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 1, "traceContext": value}]})
