"""bunqueue's dialect of an add: a job's name in its data (bunqueue's Python SDK), and the
legacy ``repeat`` option read as a job scheduler."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest

from shoal.cluster.codec import PlainPush, Raw
from shoal.cluster.commands import normalize, validate
from shoal.cluster.errors import CommandError, ErrorCode
from shoal.node.bunqueue import open_envelope, open_envelopes, push_repeating


def raw(value: Any) -> Raw:
    return Raw(msgpack.packb(value))


def value(data: Raw | msgspec.Raw) -> Any:
    return msgpack.unpackb(data.packed if type(data) is Raw else bytes(data), strict_map_key=False)


# --- the name in the data ------------------------------------------------------------------------

@pytest.mark.parametrize("data, name, rest", [
    ({"name": "send", "to": "a"}, "send", {"to": "a"}),
    ({"name": "plain", "payload": 5}, "plain", {"payload": 5}),  # the SDK's envelope of a non-map
    ({"name": "none"}, "none", {}),                               # ... and of None
])
def test_a_name_in_the_data_becomes_the_jobs_name(data: Any, name: str, rest: Any) -> None:
    frame = {"cmd": "PUSH", "queue": "q", "data": raw(data)}
    open_envelope(frame)
    assert frame["name"] == name and value(frame["data"]) == rest


@pytest.mark.parametrize("data", [{"to": "a"}, {"name": 7, "to": "a"}, ["name", "x"], "name", 5, None, {1: "x"}])
def test_data_that_is_no_envelope_is_left_as_sent(data: Any) -> None:
    frame = {"cmd": "PUSH", "queue": "q", "data": raw(data)}
    open_envelope(frame)
    assert "name" not in frame and value(frame["data"]) == data


def test_a_named_add_keeps_its_data_whole() -> None:
    frame = {"cmd": "PUSH", "queue": "q", "name": "greet", "data": raw({"name": "alice"})}
    open_envelope(frame)
    assert frame["name"] == "greet" and value(frame["data"]) == {"name": "alice"}


def test_each_job_of_a_bulk_add_is_opened() -> None:
    frame = {"cmd": "PUSHB", "queue": "q", "jobs": [
        {"data": raw({"name": "b1", "x": 1})}, {"data": raw({"x": 2})}, {"name": "b3", "data": raw({"name": "k"})}]}
    open_envelope(frame)
    jobs = frame["jobs"]
    assert [j.get("name") for j in jobs] == ["b1", None, "b3"]
    assert [value(j["data"]) for j in jobs] == [{"x": 1}, {"x": 2}, {"name": "k"}]


def test_a_block_of_plain_pushes_is_opened() -> None:
    block = [PlainPush("q", msgspec.Raw(msgpack.packb({"name": "a", "n": 1})), reqId=1),
             PlainPush("q", msgspec.Raw(msgpack.packb(2)), reqId=2),
             PlainPush("q", msgspec.Raw(msgpack.packb({"name": "x"})), reqId=3, name="named")]
    open_envelopes(block)
    assert [p.name for p in block] == ["a", None, "named"]
    assert [value(p.data) for p in block] == [{"n": 1}, 2, {"name": "x"}]


def test_an_empty_name_is_refused_by_the_schema() -> None:
    frame = {"cmd": "PUSH", "queue": "q", "data": raw({"name": ""})}
    open_envelope(frame)
    with pytest.raises(CommandError, match="^name:"):
        validate(normalize(frame))


# --- legacy repeat ---------------------------------------------------------------------------------

def push(repeat: Any, **more: Any) -> dict[str, Any]:
    return {"cmd": "PUSH", "queue": "q", "name": "tick", "data": raw({"n": 1}), "repeat": repeat, "reqId": 4, **more}


def test_repeat_every_is_a_cron_that_starts_at_once_and_waits_for_completions() -> None:
    frame = normalize(push({"every": 300, "limit": 3}))
    validate(frame)
    assert frame["cmd"] == "Cron" and frame["name"].startswith("repeat:")
    assert {k: v for k, v in frame.items() if k not in ("name", "data")} == {
        "cmd": "Cron", "queue": "q", "repeatEvery": 300, "limit": 4, "jobName": "tick", "reqId": 4,
        "immediately": True, "afterCompletion": True}
    assert value(frame["data"]) == {"n": 1}


def test_each_repeating_add_is_a_schedule_of_its_own() -> None:
    assert normalize(push({"every": 300}))["name"] != normalize(push({"every": 300}))["name"]


@pytest.mark.parametrize("repeat, fields", [
    ({"every": 300.0}, {"repeatEvery": 300}),                       # a JavaScript number
    ({"pattern": "0 3 * * *", "limit": 0}, {"schedule": "0 3 * * *", "limit": 1}),
    ({"pattern": "*/5 * * * * *"}, {"schedule": "* * * * * */5"}),  # seconds first, as bunqueue writes it
    ({"every": 300, "limit": 5, "count": 2}, {"repeatEvery": 300, "limit": 4}),
    ({"every": 300, "limit": 1, "count": 3}, {"repeatEvery": 300, "limit": 1}),
    ({"every": 300, "tz": "UTC", "immediately": False, "jobId": "r"}, {"repeatEvery": 300}),
])
def test_repeat_fields(repeat: dict[str, Any], fields: dict[str, Any]) -> None:
    frame = normalize(push(repeat))
    validate(frame)
    assert {k: frame.get(k) for k in fields} == fields
    assert "limit" in frame or "limit" not in fields


@pytest.mark.parametrize("repeat, more, field", [
    ({"every": 300, "pattern": "* * * * *"}, {}, "repeat"),
    ({}, {}, "repeat"),
    ({"pattern": "  "}, {}, "repeat"),
    ("often", {}, "repeat"),
    ({"every": 0.5}, {}, "repeat.every"),
    ({"every": 300, "startDate": 5}, {}, "repeat.startDate"),
    ({"every": 300, "endDate": 5}, {}, "repeat.endDate"),
    ({"every": 300, "tz": "Europe/Rome"}, {}, "repeat.tz"),
    ({"every": 300, "often": True}, {}, "repeat.often"),
    ({"every": 300, "limit": -1}, {}, "repeat.limit"),
    ({"every": 300}, {"jobId": "x"}, "jobId"),
    ({"every": 300}, {"maxAttempts": 3}, "attempts"),
    ({"every": 300}, {"delay": 50}, "delay"),
    ({"pattern": "not a pattern"}, {}, "schedule"),
])
def test_what_a_repeating_add_cannot_carry_is_refused_by_name(repeat: Any, more: dict[str, Any], field: str) -> None:
    with pytest.raises(CommandError) as err:
        validate(normalize(push(repeat, **more)))
    assert err.value.code == ErrorCode.INVALID and str(err.value).startswith(f"{field}:")


def test_repeat_in_a_bulk_add_of_shoals_own_dialect_is_refused() -> None:
    with pytest.raises(CommandError, match=r"^jobs\[0\]\.repeat:"):
        normalize({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw(1), "repeat": {"every": 5}, "name": "x"}]})


class Link:
    """What push_repeating answers through (the connection)."""

    def __init__(self) -> None:
        self.replies: list[tuple[Any, Any]] = []
        self.bunqueue_envelope = True
        self.wants_forwarding = True

    def reply(self, req_id: Any, body: dict[str, Any]) -> None:
        self.replies.append((req_id, body))

    def reply_error(self, req_id: Any, exc: CommandError) -> None:
        self.replies.append((req_id, exc))


def test_a_bulk_add_with_repeating_jobs_is_split_and_answered_in_order() -> None:
    sent: list[dict[str, Any]] = []

    def submit(replier: Any, frame: dict[str, Any]) -> None:
        sent.append(frame)
        if frame["cmd"] == "PUSHB":
            replier.reply(None, {"ids": [f"0-{len(sent)}{i}" for i in range(len(frame["jobs"]))]})
        else:
            replier.reply(None, {"id": f"0-{len(sent)}", "name": frame["name"]})

    link = Link()
    frame = {"cmd": "PUSHB", "queue": "q", "reqId": 9, "jobs": [
        {"name": "a", "data": raw(1)}, {"name": "b", "data": raw(2), "maxAttempts": 2},
        {"name": "r", "data": raw(3), "repeat": {"every": 100}}, {"name": "c", "data": raw(4)}]}
    assert push_repeating(submit, link, frame)
    assert [f["cmd"] for f in sent] == ["PUSHB", "Cron", "PUSHB"]
    assert sent[0]["jobs"][1]["attempts"] == 2  # each job read as a PUSH would be
    assert link.replies == [(9, {"ids": ["0-10", "0-11", "0-2", "0-30"]})]


def test_a_bulk_add_with_a_bad_repeating_job_adds_nothing() -> None:
    sent: list[dict[str, Any]] = []
    frame = {"cmd": "PUSHB", "queue": "q", "jobs": [
        {"name": "a", "data": raw(1)}, {"name": "r", "data": raw(3), "repeat": {"every": 100, "offset": 5}}]}
    with pytest.raises(CommandError, match=r"^jobs\[1\]\.repeat\.offset:"):
        push_repeating(lambda r, f: sent.append(f), Link(), frame)
    assert sent == []


def test_the_first_error_of_the_parts_answers_the_bulk_add() -> None:
    def submit(replier: Any, frame: dict[str, Any]) -> None:
        if frame["cmd"] == "Cron":
            raise CommandError(ErrorCode.NO_LEADER, "elections")
        replier.reply(None, {"ids": ["0-1"]})

    link = Link()
    frame = {"cmd": "PUSHB", "queue": "q", "reqId": 3, "jobs": [
        {"name": "a", "data": raw(1)}, {"name": "r", "data": raw(3), "repeat": {"every": 100}}]}
    push_repeating(submit, link, frame)
    [(req_id, error)] = link.replies
    assert req_id == 3 and error.code == ErrorCode.NO_LEADER


def test_a_bulk_add_without_repeat_is_left_to_the_usual_path() -> None:
    frame = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw(1)}, {"data": raw(2), "repeat": None}]}
    assert not push_repeating(lambda r, f: None, Link(), frame)


def test_a_schedule_whose_jobs_have_no_name_takes_it_from_the_data() -> None:
    frame = {"cmd": "Cron", "name": "s", "queue": "q", "repeatEvery": 300, "data": raw({"name": "tick", "a": 1})}
    open_envelope(frame)
    assert frame["jobName"] == "tick" and frame["name"] == "s" and value(frame["data"]) == {"a": 1}
    named = {"cmd": "Cron", "name": "s", "queue": "q", "jobName": "j", "data": raw({"name": "tick"})}
    open_envelope(named)
    assert named["jobName"] == "j" and value(named["data"]) == {"name": "tick"}


@pytest.mark.parametrize("odd", [5, None, "repeat", ["repeat"], {"data": 5}, {}])
def test_a_bulk_add_with_an_odd_job_is_looked_at_whole(odd: Any) -> None:
    # The cheap looks over every job (no job's data a map, no job holding ``repeat``) give way to
    # the job-by-job look when a job is not what they expect; the schema names what is wrong.
    frame = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw({"name": "a", "n": 1})}, odd]}
    open_envelope(frame)
    assert frame["jobs"][0]["name"] == "a" and frame["jobs"][1] is odd
    assert not push_repeating(lambda r, f: None, Link(), {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw(1)}, odd]})


def test_one_repeating_job_among_plain_ones_is_found() -> None:
    jobs: list[Any] = [{"data": raw(i)} for i in range(50)]
    jobs.insert(30, {"name": "r", "data": raw(3), "repeat": {"every": 100}})
    sent: list[dict[str, Any]] = []
    assert push_repeating(lambda r, f: sent.append(f), Link(), {"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert [f["cmd"] for f in sent] == ["PUSHB", "Cron", "PUSHB"]


def test_one_envelope_among_plain_jobs_is_opened() -> None:
    frame = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw(i)} for i in range(50)]}
    frame["jobs"].insert(40, {"data": raw({"name": "e", "x": 1})})
    open_envelope(frame)
    assert [j.get("name") for j in frame["jobs"]].count("e") == 1
