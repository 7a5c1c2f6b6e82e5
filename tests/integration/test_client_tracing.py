"""OpenTelemetry through real node processes: a program that only sets the global tracer and
meter providers adds a job inside its own span and runs a Worker; its trace holds the PRODUCER
``send`` span and the CONSUMER ``process`` span, and the dashboard's job detail names the trace.

The program runs in a process of its own: a global provider can be set once per process, and
one set in the test process would trace every later test of the session.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from conftest import follower_url
from shoal.client import Client
from shoal.cluster.launcher import LocalCluster

pytestmark = pytest.mark.integration
PROGRAM_TIMEOUT_S = 120

#: The application: global providers with in-memory exporters, one job added in its own span with
#: the blocking client (a plain-function handler), one with the async client (an async handler).
#: It prints what it recorded as JSON.
PROGRAM = r'''
import asyncio, json, sys, threading

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from shoal.client import AsyncClient, BatchOptions, BatchWorker, Client, Worker

seeds, sync_queue, async_queue, batch_queue = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
app = trace.get_tracer("shop")
handled = threading.Event()
ids = {}


def ship(job):
    with app.start_as_current_span("ship order"):
        handled.set()
        return "shipped"


with Client(seeds) as client:
    with app.start_as_current_span("checkout sync"):
        ids["sync"] = client.queue(sync_queue).add({"order": 1})
    with Worker(client, sync_queue, ship, poll_timeout=0.2):
        assert handled.wait(60), "the handler never ran"


async def main():
    done = asyncio.Event()

    async def bill(job):
        with app.start_as_current_span("bill order"):
            done.set()

    async with AsyncClient(seeds) as client:
        with app.start_as_current_span("checkout async"):
            ids["async"] = await client.queue(async_queue).add({"order": 2})
        async with Worker(client, async_queue, bill, poll_timeout=0.2):
            await asyncio.wait_for(done.wait(), 60)

        batched = asyncio.Event()

        async def print_labels(batch):
            with app.start_as_current_span("print labels"):
                batched.set()

        with app.start_as_current_span("checkout batch"):
            ids["batch"] = await client.queue(batch_queue).add_bulk([{"order": n} for n in range(3)])
        async with BatchWorker(client, batch_queue, print_labels, poll_timeout=0.2,
                               batch=BatchOptions(size=3, min_size=3, timeout=30)):
            await asyncio.wait_for(batched.wait(), 60)

asyncio.run(main())

spans = [{"name": s.name, "kind": s.kind.name, "trace": f"{s.context.trace_id:032x}",
          "span": f"{s.context.span_id:016x}", "parent": f"{s.parent.span_id:016x}" if s.parent else None,
          "links": [f"{l.context.span_id:016x}" for l in s.links], "status": s.status.status_code.name,
          "attributes": dict(s.attributes)} for s in exporter.get_finished_spans()]
data = reader.get_metrics_data()
recorded = sorted({m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics})
print(json.dumps({"ids": ids, "spans": spans, "metrics": recorded}))
'''


def run_program(cluster: LocalCluster, sync_queue: str, async_queue: str, batch_queue: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROGRAM, ",".join(cluster.addresses), sync_queue, async_queue,
                          batch_queue],
                         capture_output=True, text=True, timeout=PROGRAM_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [s for s in spans if s["name"] == name]
    return found


def test_a_job_added_in_a_span_is_processed_in_that_trace(cluster: LocalCluster) -> None:
    got = run_program(cluster, "tr-orders", "tr-invoices", "tr-labels")
    spans = got["spans"]
    for queue, checkout, work in (("tr-orders", "checkout sync", "ship order"),
                                  ("tr-invoices", "checkout async", "bill order")):
        user, send = one(spans, checkout), one(spans, f"send {queue}")
        process, ack, handler = one(spans, f"process {queue}"), one(spans, f"ack {queue}"), one(spans, work)
        assert send["kind"] == "PRODUCER" and send["parent"] == user["span"]
        assert process["kind"] == "CONSUMER"
        assert user["trace"] == send["trace"] == process["trace"] == handler["trace"] == ack["trace"]
        assert process["parent"] == send["span"] and process["links"] == [send["span"]]
        assert handler["parent"] == process["span"] and ack["parent"] == process["span"]
        for span in (send, process, ack):
            assert span["attributes"]["messaging.system"] == "shoal"
            assert span["attributes"]["messaging.destination.name"] == queue
            assert span["attributes"]["messaging.destination.partition.id"].isdigit()
            assert span["status"] == "UNSET"
        job_id = got["ids"]["sync" if queue == "tr-orders" else "async"]
        assert send["attributes"]["messaging.message.id"] == process["attributes"]["messaging.message.id"] == job_id
    assert {"messaging.client.operation.duration", "messaging.process.duration"} <= set(got["metrics"])

    # A batch worker's batch: one CONSUMER span that counts the batch and links the jobs' creation
    # (one bulk add: three links to its one send span); the handler's span and the ACKB's are its children.
    user, send = one(spans, "checkout batch"), one(spans, "send tr-labels")
    process, ack, handler = one(spans, "process tr-labels"), one(spans, "ack tr-labels"), one(spans, "print labels")
    assert send["parent"] == user["span"] and send["attributes"]["messaging.batch.message_count"] == 3
    assert process["kind"] == "CONSUMER" and process["attributes"]["messaging.batch.message_count"] == 3
    assert process["links"] == [send["span"]] * 3
    assert handler["parent"] == process["span"] and ack["parent"] == process["span"]
    assert ack["attributes"]["messaging.batch.message_count"] == 3

    # The node kept the creation context: GetJob returns it, and the dashboard's job detail (asked of
    # a node that does not lead the job's partition) names the trace.
    sync_send = one(spans, "send tr-orders")
    with Client(cluster.addresses) as client:
        job = client.queue("tr-orders").get_job(got["ids"]["sync"])
    assert job is not None and job.state == "completed"
    assert job.raw["traceContext"]["traceparent"].split("-")[1:3] == [sync_send["trace"], sync_send["span"]]
    url = f"{follower_url(cluster, 'tr-orders')}/jobs/{got['ids']['sync']}/detail"
    with urllib.request.urlopen(url, timeout=30) as resp:
        detail = json.loads(resp.read())
    assert detail["traceId"] == sync_send["trace"]
    assert detail["job"]["traceContext"] == job.raw["traceContext"]
