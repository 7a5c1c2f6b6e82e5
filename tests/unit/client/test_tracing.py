"""The client's OpenTelemetry hooks (``shoal.client._tracing``): spans, the creation context a job
carries, and metrics, with the SDK's in-memory exporter and metric reader.

A global provider can be set only once per process, so these tests hand the hooks providers of
their own; the integration test (``tests/integration/test_client_tracing.py``) sets the global
ones, in a program of its own. The node is a :class:`PartitionEngine` answering in place of one,
so a job's ``traceContext`` goes through the real schema check and store.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from shoal.client import AsyncClient, QueueFull, Worker, _tracing
from shoal.cluster import limits as L
from shoal.cluster.codec import raw_of, unraw
from shoal.cluster.commands import normalize, validate
from shoal.cluster.config import ClusterConfig, NodeSpec
from shoal.cluster.errors import CommandError as WireCommandError
from shoal.client.exceptions import error_from_reply
from shoal.node.state import PartitionEngine

from waiting import eventually_async

WAIT_S = 10.0


class Otel:
    """An SDK tracer provider with an in-memory exporter and a meter provider with an in-memory reader."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("the-application")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        (found,) = self.spans(name)
        return found

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [p for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
                for m in sm.metrics if m.name == metric for p in m.data.data_points]


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Otel]:
    o = Otel()
    monkeypatch.setattr(_tracing, "_on", _tracing._Instruments(o.tracer_provider, o.meter_provider))
    yield o
    o.tracer_provider.shutdown()
    o.meter_provider.shutdown()


@pytest.fixture
def off(monkeypatch: pytest.MonkeyPatch) -> None:
    """No global provider set, whatever other tests of this session did."""
    monkeypatch.setattr(_tracing, "_on", None)
    monkeypatch.setattr(_tracing, "_TRACE_GLOBALS", _tracing._Holds(None))
    monkeypatch.setattr(_tracing, "_METRICS_GLOBALS", _tracing._Holds(None))
    monkeypatch.setattr(_tracing, "_ENV_PROVIDERS", False)


def engine_client() -> tuple[AsyncClient, list[dict[str, Any]]]:
    """An ``AsyncClient`` whose commands an in-process engine answers (1 partition), and the frames sent."""
    engine = PartitionEngine(0)
    client = AsyncClient(["127.0.0.1:1"])
    client.topology = ClusterConfig(nodes=(NodeSpec("n1", "127.0.0.1", 21000),), partitions=1).initial_topology()
    sent: list[dict[str, Any]] = []
    clock = itertools.count(1_000)

    async def call(frame: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        await asyncio.sleep(0.001 if frame["cmd"] in ("PULL", "PULLB") else 0)  # a worker's idle poll yields
        sent.append(frame)
        cmd = dict(frame)
        if "data" in cmd:
            cmd["data"] = raw_of(cmd["data"])
        if "jobs" in cmd:
            cmd["jobs"] = [{**job, "data": raw_of(job["data"])} for job in cmd["jobs"]]
        try:
            validate(normalize(cmd))
            result = engine.apply(cmd, next(clock)).result
        except WireCommandError as exc:
            raise error_from_reply({"ok": False, "code": exc.code.value, "error": str(exc)}) from exc
        return {"ok": True, **unraw(result)}

    client.call = call  # type: ignore[method-assign]  # the engine answers in place of nodes
    return client, sent


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# --- off ------------------------------------------------------------------------------------------

def test_without_a_provider_the_hooks_are_off_and_a_job_carries_nothing(off: None) -> None:
    client, sent = engine_client()
    assert not _tracing.enabled()
    run(client.queue("q").add({"a": 1}))
    run(client.queue("q").add_bulk([1, 2]))
    assert [f["cmd"] for f in sent] == ["PUSH", "PUSHB"]
    assert "traceContext" not in sent[0] and all("traceContext" not in j for j in sent[1]["jobs"])


def test_a_provider_set_later_switches_the_hooks_on(off: None, monkeypatch: pytest.MonkeyPatch) -> None:
    globals_ = _tracing._Holds(None)
    monkeypatch.setattr(_tracing, "_TRACE_GLOBALS", globals_)
    assert _tracing._instruments() is None
    globals_._TRACER_PROVIDER = TracerProvider()  # what set_tracer_provider does
    assert _tracing._instruments() is not None and _tracing.enabled()


def test_without_opentelemetry_installed_the_client_works_unchanged() -> None:
    program = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # import opentelemetry fails, as when it is not installed
from shoal.client import AsyncQueue, _tracing
sent = []
class Client:
    _shards = {}
    new_idempotency_key = staticmethod(lambda: "k")
    async def call(self, frame, timeout=None):
        sent.append(frame)
        return {"ok": True, "id": "0-1", "ids": ["0-1"], "state": "delayed"}
q = AsyncQueue(Client(), "q")
assert asyncio.run(q.add(1)) == "0-1" and asyncio.run(q.add_bulk([1])) == ["0-1"]
asyncio.run(q.ack("0-1")); asyncio.run(q.fail("0-1"))
assert not _tracing.enabled() and _tracing.send(q, "q") is None and _tracing.process("q", None, None) is None
assert all("traceContext" not in f for f in sent) and "traceContext" not in sent[1]["jobs"][0]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


# --- producing ------------------------------------------------------------------------------------

def test_add_inside_a_span_sends_a_producer_span_whose_context_travels_with_the_job(otel: Otel) -> None:
    client, sent = engine_client()

    async def scenario() -> tuple[str, Any]:
        with otel.tracer.start_as_current_span("handle request") as request:
            job_id = await client.queue("emails").add({"to": "a"}, priority=3)
        job = await client.queue("emails").pull()
        return job_id, request, job

    job_id, request, job = run(scenario())
    send = otel.span("send emails")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes) == {  # type: ignore[arg-type]
        "messaging.system": "shoal", "messaging.operation.name": "send", "messaging.operation.type": "send",
        "messaging.destination.name": "emails", "messaging.destination.partition.id": "0",
        "messaging.message.id": job_id}
    assert sent[0]["traceContext"] == {"traceparent": traceparent_of(send)}
    assert job.raw["traceContext"] == {"traceparent": traceparent_of(send)}  # kept by the engine, returned on pull
    (point,) = otel.points("messaging.client.operation.duration")
    assert point.count == 1 and point.attributes["messaging.operation.name"] == "send"
    assert "error.type" not in point.attributes


def test_add_bulk_is_one_send_span_counting_its_jobs_each_carrying_its_context(otel: Otel) -> None:
    client, sent = engine_client()
    ids = run(client.queue("q").add_bulk(["a", "b", "c"], batch_size=2))
    send = otel.span("send q")
    assert send.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in send.attributes
    carriers = [job["traceContext"] for frame in sent for job in frame["jobs"]]
    assert len(ids) == 3 and carriers == [{"traceparent": traceparent_of(send)}] * 3


def test_a_refused_add_ends_its_span_in_error_with_the_nodes_code(otel: Otel) -> None:
    client, _ = engine_client()

    async def scenario() -> None:
        q = client.queue("capped")
        await q.create("limfifottl", capacity=1)
        await q.add(1)
        with pytest.raises(QueueFull):
            await q.add(2)

    run(scenario())
    refused = otel.spans("send capped")[1]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.attributes["error.type"] == "QUEUE_FULL"
    errors = [p for p in otel.points("messaging.client.operation.duration") if "error.type" in p.attributes]
    assert len(errors) == 1 and errors[0].attributes["error.type"] == "QUEUE_FULL"


def test_the_carrier_keeps_the_trace_and_drops_what_does_not_fit(otel: Otel) -> None:
    client, sent = engine_client()

    async def scenario() -> None:
        token = otel_context.attach(baggage.set_baggage("big", "x" * L.trace_context_chars_max))
        try:
            await client.queue("q").add(1)
        finally:
            otel_context.detach(token)
        token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
        try:
            await client.queue("q").add(2)
        finally:
            otel_context.detach(token)

    run(scenario())
    assert set(sent[0]["traceContext"]) == {"traceparent"}  # the oversized baggage stayed behind
    assert sent[1]["traceContext"]["baggage"] == "tenant=acme"


# --- consuming ------------------------------------------------------------------------------------

def test_a_worker_processes_in_the_producers_trace_and_settles_inside_its_process_span(otel: Otel) -> None:
    client, _ = engine_client()
    app = otel.tracer

    async def handler(job: Any) -> str:
        with app.start_as_current_span("send the email"):
            return "sent"

    async def scenario() -> None:
        with app.start_as_current_span("handle request"):
            await client.queue("emails").add({"to": "a"})
        async with Worker(client, "emails", handler, poll_timeout=0.01) as worker:
            await eventually_async(lambda: worker.processed == 1 and otel.spans("ack emails"), "the job acked",
                                   timeout_s=WAIT_S / 2)

    run(scenario())
    send, process, ack = otel.span("send emails"), otel.span("process emails"), otel.span("ack emails")
    work = otel.span("send the email")
    assert process.kind is SpanKind.CONSUMER and ack.kind is SpanKind.CLIENT
    assert process.context.trace_id == send.context.trace_id  # one trace from the request to the worker
    assert process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert work.parent.span_id == process.context.span_id and ack.parent.span_id == process.context.span_id
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.message.id"] == ack.attributes["messaging.message.id"]
    assert ack.attributes["messaging.operation.type"] == "settle"
    assert process.status.status_code is StatusCode.UNSET
    (point,) = otel.points("messaging.process.duration")
    assert point.count == 1 and point.attributes["messaging.destination.name"] == "emails"


def test_a_handler_that_raises_sets_the_process_span_in_error_and_fails_the_job(otel: Otel) -> None:
    client, _ = engine_client()

    async def handler(job: Any) -> None:
        raise ValueError("no such mailbox")

    async def scenario() -> None:
        await client.queue("emails").add({"to": "b"})
        async with Worker(client, "emails", handler, poll_timeout=0.01) as worker:
            await eventually_async(lambda: worker.failed == 1 and otel.spans("fail emails"), "the job failed",
                                   timeout_s=WAIT_S / 2)

    run(scenario())
    process, fail = otel.span("process emails"), otel.span("fail emails")
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes["error.type"] == "ValueError"
    assert any(e.name == "exception" for e in process.events)
    assert fail.parent.span_id == process.context.span_id
    assert fail.status.status_code is StatusCode.UNSET  # failing the job worked
    (point,) = otel.points("messaging.process.duration")
    assert point.attributes["error.type"] == "ValueError"


def test_a_plain_function_handler_runs_in_its_jobs_process_span(otel: Otel) -> None:
    client, _ = engine_client()
    seen: list[int] = []

    def handler(job: Any) -> None:  # runs in the worker's thread pool
        seen.append(trace.get_current_span().get_span_context().span_id)

    async def scenario() -> None:
        await client.queue("q").add(1)
        async with Worker(client, "q", handler, poll_timeout=0.01) as worker:
            await eventually_async(lambda: worker.processed == 1, "the job processed", timeout_s=WAIT_S / 2)

    run(scenario())
    assert seen == [otel.span("process q").context.span_id]


def test_settling_outside_a_worker_links_the_jobs_creation_context(otel: Otel) -> None:
    client, _ = engine_client()

    async def scenario() -> None:
        q = client.queue("q")
        await q.add_bulk([1, 2, 3])
        first, *rest = await q.pull_many(3)
        await q.release(first)
        await q.ack_many(rest)

    run(scenario())
    send, release, ack = otel.span("send q"), otel.span("release q"), otel.span("ack q")
    assert [link.context.span_id for link in release.links] == [send.context.span_id]
    assert release.attributes["messaging.operation.name"] == "release"
    assert ack.attributes["messaging.batch.message_count"] == 2 and "messaging.message.id" not in ack.attributes


def test_a_batchs_process_span_links_every_jobs_creation_context(otel: Otel) -> None:
    client, _ = engine_client()

    async def scenario() -> list[Any]:
        q = client.queue("rows")
        for n in range(3):
            with otel.tracer.start_as_current_span(f"request {n}"):
                await q.add(n)
        return await q.pull_many(3)

    jobs = run(scenario())
    consumer = _tracing.process_batch("rows", jobs, client)
    assert consumer is not None
    with consumer:
        pass
    process = otel.span("process rows")
    assert process.parent is None and process.attributes["messaging.batch.message_count"] == 3
    assert [link.context.span_id for link in process.links] == [s.context.span_id for s in otel.spans("send rows")]
    assert "messaging.message.id" not in process.attributes
