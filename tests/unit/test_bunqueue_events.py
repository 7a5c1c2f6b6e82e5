"""bunqueue's event frames for the node's job events (``node.bunqueue``: ``events_of`` and the
batch encoder ``EventFrames``), from a real engine's recorded events."""

from __future__ import annotations

from typing import Any

from shoal.cluster.codec import FrameDecoder, Raw, decode_response, raw_of
from shoal.node.bunqueue import EventFrames, encode_event, events_of
from shoal.node.partition.pushes import replicated_form
from shoal.node.partition import PartitionView
from shoal.node.state import Event, PartitionEngine, SessionPull

T0 = 1_000


class Jobs:
    """What a partition's view tells of a job for an event: wire id, result, error."""

    def __init__(self, jobs: dict[str, tuple[str, Any, Any]]) -> None:
        self.jobs = jobs
        self.lookups = 0

    def event_job(self, job_id: str) -> tuple[str, Any, Any] | None:
        self.lookups += 1
        return self.jobs.get(job_id)


def frames(ev: dict[str, Any], jobs: Jobs) -> list[dict[str, Any]]:
    return [f["event"] for f in events_of({"event": "job", "queue": "q", "partition": 0, **ev}, jobs, T0)]


def test_a_pull_names_the_job_without_looking_it_up() -> None:
    jobs = Jobs({})
    assert frames({"id": "order-7", "state": "active", "prev": "waiting"}, jobs) == [
        {"queue": "q", "jobId": "order-7", "timestamp": 1000.0, "eventType": "pulled"}]
    assert frames({"id": "0-3", "state": "waiting", "prev": None}, jobs)[0]["eventType"] == "pushed"
    assert jobs.lookups == 0


def test_a_completion_carries_the_result_and_a_retry_the_error() -> None:
    jobs = Jobs({"0-1": ("0-1", b"\x2a", None), "0-2": ("0-2", None, "boom")})
    done = frames({"id": "0-1", "state": "completed", "prev": "active"}, jobs)
    assert done == [{"queue": "q", "jobId": "0-1", "timestamp": 1000.0, "eventType": "completed",
                     "data": Raw(b"\x2a")}]
    retried = frames({"id": "0-2", "state": "waiting", "prev": "active"}, jobs)
    assert [f["eventType"] for f in retried] == ["failed", "retried"] and retried[0]["error"] == "boom"
    gone = frames({"id": "0-9", "state": "completed", "prev": "active"}, jobs)  # a segment's plain job
    assert gone == [{"queue": "q", "jobId": "0-9", "timestamp": 1000.0, "eventType": "completed", "data": None}]


def test_only_a_job_removed_before_it_ended_is_announced() -> None:
    jobs = Jobs({})
    assert frames({"id": "0-4", "state": "removed", "prev": "waiting"}, jobs) == [
        {"queue": "q", "jobId": "0-4", "timestamp": 1000.0, "eventType": "removed", "prev": "waiting"}]
    for ended in ("completed", "failed", "cancelled"):  # history trimmed or cleaned
        assert frames({"id": "0-5", "state": "removed", "prev": ended}, jobs) == []
    assert jobs.lookups == 0


def _recorded(engine: PartitionEngine, cmd: Any) -> list[Event]:
    return list(engine.apply(cmd, T0).events)


def test_a_batchs_frames_are_the_frames_of_the_events_as_published() -> None:
    """Every kind of move a worker causes, on segment jobs and on jobs held as objects (a custom
    id, a result, an error): the batch encoder's bytes decode to what events_of makes of the
    event as the node publishes it."""
    engine = PartitionEngine(0)
    view = PartitionView(lambda: engine)
    events: list[Event] = []
    # a history of one finished job: the acks trim it (removed after completed)
    engine.apply({"cmd": "CreateQueue", "queue": "q", "options": {"historyMax": 1}}, T0)
    events += _recorded(engine, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(4)]})
    events += _recorded(engine, {"cmd": "PUSH", "queue": "q", "data": raw_of(9), "customId": "invoice-9",
                                 "attempts": 2, "backoff": 0})
    events += _recorded(engine, {"cmd": "PUSH", "queue": "other", "data": raw_of(8), "priority": 3})
    pulled = engine.apply(SessionPull({"cmd": "PULLB", "queue": "q", "count": 5}, "s"), T0)
    events += list(pulled.events)
    ids = [j["id"] for j in pulled.result["jobs"]]
    events += _recorded(engine, {"cmd": "ACKB", "ids": ids[:2], "tokens": pulled.result["tokens"][:2]})
    events += _recorded(engine, {"cmd": "ACK", "id": ids[2], "result": raw_of({"total": 7})})
    custom = [i for i in ids if not i.startswith("0-")] or ["invoice-9"]
    events += _recorded(engine, {"cmd": "FAIL", "id": custom[0], "error": "boom"})
    events += _recorded(engine, {"cmd": "Cancel", "id": ids[3]})
    waiting = engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(7)}, T0)
    events += list(waiting.events)
    events += _recorded(engine, {"cmd": "Cancel", "id": waiting.result["id"]})  # before it ran
    assert {(state, prev) for _, _, state, prev in events} >= {
        ("waiting", None), ("active", "waiting"), ("completed", "active"), ("removed", "completed"),
        ("waiting", "active"), ("removed", "waiting")}
    batch = EventFrames(view, 0, T0)
    for ev in events:
        expected = [decode_response(encode_event(f)[4:]) for f in events_of(view.event_dicts(0, [ev])[0], view, T0)]
        got = batch.of(ev)
        assert [decode_response(b[4:]) for b in got] == expected, ev
        assert all(int.from_bytes(b[:4], "big") == len(b) - 4 for b in got)


def test_a_long_custom_id_keeps_its_frame_whole() -> None:
    engine = PartitionEngine(0)
    long_id = "x" * 300  # past MessagePack's short strings: another length prefix
    engine.apply({"cmd": "PUSH", "queue": "q", "data": raw_of(1), "customId": long_id}, T0)
    pulled = engine.apply({"cmd": "PULL", "queue": "q"}, T0)
    (frame,) = EventFrames(PartitionView(lambda: engine), 0, T0).of(list(pulled.events)[0])
    assert decode_response(frame[4:])["event"] == {"queue": "q", "jobId": long_id, "timestamp": 1000.0,
                                                   "eventType": "pulled"}


def test_a_batchs_chunks_are_its_events_frames_in_order() -> None:
    """Runs of pulls and acks of a segment's plain jobs come out in one piece each (a piece per
    length of their ids: 999 to 1000), with the same bytes as the events' own frames; a run
    through a job held as an object, event by event; a queue nobody wants gets nothing. Each
    batch is published right after it is applied, as the node does."""
    engine = PartitionEngine(0)
    view = PartitionView(lambda: engine)
    pieces: list[int] = []

    def published(events: list[Event]) -> None:
        batch = EventFrames(view, 0, T0)
        chunks = list(batch.chunks(events, lambda queue: True))
        expected = [(ev[0], b"".join(batch.of(ev))) for ev in events]
        assert b"".join(data for _, data in chunks) == b"".join(data for _, data in expected)
        for queue, data in chunks:
            assert all(frame["event"]["queue"] == queue for frame in FrameDecoder(requests=False).drain(data))
        only_q = b"".join(data for _, data in batch.chunks(events, lambda queue: queue == "q"))
        assert only_q == b"".join(data for queue, data in expected if queue == "q")
        pieces.append(len(chunks))

    (segment,), _ = replicated_form([{"cmd": "PUSHB", "queue": "q", "jobs": [{"data": raw_of(i)} for i in range(1010)]}], 0)
    published(_recorded(engine, segment))
    published(_recorded(engine, {"cmd": "PUSH", "queue": "other", "data": raw_of(1)}))
    pulled = engine.apply(SessionPull({"cmd": "PULLB", "queue": "q", "count": 1005}, "s"), T0)
    ids, tokens = [j["id"] for j in pulled.result["jobs"]], pulled.result["tokens"]
    published(list(pulled.events))
    published(_recorded(engine, {"cmd": "ACKB", "ids": ids[990:1005], "tokens": tokens[990:1005]}))
    published(_recorded(engine, {"cmd": "ACKB", "ids": ids[:500], "tokens": tokens[:500]}))
    # an ack with a result (the job becomes an object), then a batch whose run goes through it
    published(_recorded(engine, {"cmd": "ACK", "id": ids[500], "token": tokens[500], "result": raw_of(5)}))
    published(_recorded(engine, {"cmd": "ACKB", "ids": ids[501:990], "tokens": tokens[501:990]})
              + [("q", seq, "completed", "active") for seq in range(499, 504)])
    published(list(engine.apply({"cmd": "PULL", "queue": "other"}, T0).events))
    assert pieces[2:5] == [1, 1, 1]  # a pull's run (ids of 1 to 4 digits), an ack's: one piece each
    assert pieces[6] == 1 + 5  # the ack's run, then the made-up run through the object, event by event
