"""OpenTelemetry spans and metrics of the client, by the messaging semantic conventions.

Nothing to configure: the hooks switch themselves on once the application sets a global
``TracerProvider`` or ``MeterProvider`` (``opentelemetry.trace.set_tracer_provider``, or
``OTEL_PYTHON_TRACER_PROVIDER``), and cost two function calls and a few ``None`` tests per
operation until then. Without ``opentelemetry-api`` installed they are never on. Spans and metrics:

- ``send {queue}``, PRODUCER, for ``add`` (with ``messaging.message.id``) and ``add_bulk``
  (with ``messaging.batch.message_count``). Its context is the jobs' creation context: the
  global propagator writes it (W3C ``traceparent`` and ``tracestate``, and ``baggage``) into
  the job's ``traceContext``, which the node keeps with the job and returns on pull and GetJob.
- ``process {queue}``, CONSUMER, around a ``Worker``'s handler and the settling that follows;
  a child of the job's creation context (the producer's trace continues in the worker) and
  linked to it, as the conventions allow for one message processed alone; when the worker
  runs inside another span, that span is linked. A handler that raises sets the span's
  status to ERROR and ``error.type`` to the exception's class.
- ``ack {queue}``, ``fail {queue}``, ``release {queue}``: CLIENT settle spans (children of
  ``process`` in a worker), linked to the job's creation context when the job carries one.
- ``messaging.client.operation.duration`` (send and settle) and ``messaging.process.duration``
  histograms, in seconds, with the conventions' buckets.

Attributes: ``messaging.system`` = ``shoal``, ``messaging.destination.name`` (the queue as the
application names it; a sharded queue's shard is not named), ``messaging.destination.partition.id``
(when the client knows the topology), ``messaging.operation.name`` / ``.type``,
``messaging.message.id``, ``messaging.batch.message_count``, ``error.type`` (the node's error
code, else the exception's class name).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from shoal.cluster import limits as L
from shoal.cluster.commands import TRACE_CONTEXT_KEY_CHARS

from .exceptions import CommandError

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # the optional dependency is absent: the hooks stay off
    _trace = None  # type: ignore[assignment]

__all__ = ["enabled", "send", "settle", "process", "process_batch", "Operation", "Processing", "SYSTEM",
           "TRACE_CONTEXT_FIELD"]

T = TypeVar("T")

SYSTEM = "shoal"
#: The job field that carries the creation context (``cluster/commands.py`` checks it).
TRACE_CONTEXT_FIELD = "traceContext"
#: The conventions' bucket boundaries for both duration histograms (seconds).
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
_SCOPE = "shoal.client"


class _Instruments:
    """The tracer and histograms, made once a global provider is set (each a proxy of the API
    until its own provider is set, so a meter provider alone gives metrics and no spans); tests
    pass providers of their own."""

    __slots__ = ("tracer", "operation_duration", "process_duration")

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        version = _version()
        self.tracer = _trace.get_tracer(_SCOPE, version, tracer_provider=tracer_provider)
        meter = _metrics.get_meter(_SCOPE, version or "", meter_provider=meter_provider)
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration", unit="s",
            description="Duration of messaging operation initiated by a producer or consumer client.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="Duration of processing operation.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S)


def _version() -> str | None:
    try:
        return version("shoal")
    except PackageNotFoundError:
        return None


class _Holds:
    """Stands in for the API modules' provider globals: always None (no API) or always set."""

    def __init__(self, value: Any) -> None:
        self._TRACER_PROVIDER = self._METER_PROVIDER = value


def _provider_globals() -> tuple[Any, Any]:
    """Where the API keeps its global providers (1.x: module globals), or stand-ins: never set
    without the API, always set for an API that keeps them elsewhere (correct, only not free)."""
    if _trace is None:
        return _Holds(None), _Holds(None)
    metrics_internal = getattr(_metrics, "_internal", None)
    if not hasattr(_trace, "_TRACER_PROVIDER") or not hasattr(metrics_internal, "_METER_PROVIDER"):
        return _Holds(True), _Holds(True)
    return _trace, metrics_internal


_TRACE_GLOBALS, _METRICS_GLOBALS = _provider_globals()
#: Providers named in the environment: OpenTelemetry loads them on the first public getter call.
_ENV_PROVIDERS = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ or "OTEL_PYTHON_METER_PROVIDER" in os.environ
_on: _Instruments | None = None


def _instruments() -> _Instruments | None:
    """The instruments once a global provider is set, else None: the hot path's one test.

    The public getters cost ~1.6 us each when no provider is set (they read ``os.environ``),
    more than a whole add; the API's own globals answer in tens of nanoseconds.
    """
    if _on is not None:
        return _on
    if (_TRACE_GLOBALS._TRACER_PROVIDER is None and _METRICS_GLOBALS._METER_PROVIDER is None
            and not _ENV_PROVIDERS):
        return None
    return _switch_on()


def _switch_on() -> _Instruments:
    global _on
    if _ENV_PROVIDERS:
        _trace.get_tracer_provider()  # loads the providers the environment names
        _metrics.get_meter_provider()
    _on = _Instruments()  # a global provider is set once per process: from now on, always on
    return _on


def enabled() -> bool:
    """Are the hooks on (``opentelemetry-api`` installed and a global provider set)?"""
    return _instruments() is not None


# --- attributes and the creation context ---------------------------------------------------------

def _partition_of_queue(client: Any, queue: str) -> int | None:
    topology = getattr(client, "topology", None)
    return None if topology is None else int(topology.partition_of_queue(queue))


def _partition_of_job(client: Any, job: Any) -> int | None:
    job_id = getattr(job, "id", job)
    head, sep, tail = job_id.partition("-") if isinstance(job_id, str) else ("", "", "")
    if sep and head.isdigit() and tail.isdigit():
        return int(head)
    queue = getattr(job, "queue", None)  # a custom id: route by the job's queue, when known
    return _partition_of_queue(client, queue) if isinstance(queue, str) else None


def _attributes(operation: str, operation_type: str, queue: str, partition: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.name": operation,
                                  "messaging.operation.type": operation_type,
                                  "messaging.destination.name": queue}
    if partition is not None:
        attributes["messaging.destination.partition.id"] = str(partition)
    return attributes


def carrier_of(span: Any) -> dict[str, str]:
    """What the global propagator writes for ``span`` (and the current baggage), cut to what a
    job may carry: entries in the propagator's order while they fit the wire's limits."""
    written: dict[str, str] = {}
    _propagate.inject(written, context=_trace.set_span_in_context(span))
    carrier: dict[str, str] = {}
    size = 0
    for key, value in written.items():
        if (len(carrier) == L.trace_context_entries_max or not 1 <= len(key) <= L.trace_context_key_chars_max
                or not TRACE_CONTEXT_KEY_CHARS.issuperset(key) or not isinstance(value, str)):
            continue
        if size + len(key) + len(value) > L.trace_context_chars_max:
            continue  # e.g. a large baggage: the trace itself still travels
        carrier[key] = value
        size += len(key) + len(value)
    return carrier


def creation_context(job: Any) -> Any:
    """The span context a job was created in (from its ``traceContext``), or None."""
    raw = getattr(job, "raw", None)
    carrier = raw.get(TRACE_CONTEXT_FIELD) if isinstance(raw, Mapping) else None
    if not isinstance(carrier, Mapping):
        return None
    span_context = _trace.get_current_span(_propagate.extract(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


def _error_type(exc: BaseException) -> str:
    """The node's error code for a refused command (``QUEUE_FULL``), else the exception's class."""
    if isinstance(exc, CommandError) and exc.code:
        return str(exc.code)
    return type(exc).__qualname__


# --- client operations: send and settle ----------------------------------------------------------

class Operation:
    """One client operation (``send``, ``ack``, ``fail``, ``release``): its span, current
    while it runs, and its duration."""

    __slots__ = ("_instruments", "span", "_attributes", "_start_ns", "_id_from_reply", "carrier")

    def __init__(self, instruments: _Instruments, operation: str, operation_type: str, kind: Any, queue: str,
                 partition: int | None, *, batch: bool = False, count: int | None = None,
                 message_id: str | None = None, links: list[Any] | None = None) -> None:
        self._instruments = instruments
        self._attributes = _attributes(operation, operation_type, queue, partition)
        span_attributes = dict(self._attributes)
        if count is not None:
            span_attributes["messaging.batch.message_count"] = count
        if message_id is not None:
            span_attributes["messaging.message.id"] = message_id
        self.span = instruments.tracer.start_span(f"{operation} {queue}", kind=kind, attributes=span_attributes,
                                                  links=links)
        self._id_from_reply = not batch and message_id is None  # one job sent: its id comes back
        #: The job field that carries this span as the creation context (send only), or empty.
        self.carrier: dict[str, str] = {}
        self._start_ns = time.perf_counter_ns()

    async def run(self, call: Awaitable[T]) -> T:
        """Await the operation's command with the span current; end both on its outcome."""
        token = _context.attach(_trace.set_span_in_context(self.span))
        try:
            reply = await call
        except BaseException as exc:
            self._end(exc)
            raise
        finally:
            _context.detach(token)
        if self._id_from_reply and isinstance(reply, Mapping) and isinstance(reply.get("id"), str):
            self.span.set_attribute("messaging.message.id", reply["id"])
        self._end(None)
        return reply

    def _end(self, exc: BaseException | None) -> None:
        attributes = self._attributes
        if exc is not None:
            attributes = {**attributes, "error.type": _error_type(exc)}
            self.span.set_attribute("error.type", attributes["error.type"])
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
        self._instruments.operation_duration.record((time.perf_counter_ns() - self._start_ns) / 1e9, attributes)
        self.span.end()


def send(queue: Any, target: str | None, count: int | None = None) -> Operation | None:
    """A ``send`` operation of ``queue`` (an ``AsyncQueue``) to its (sub-)queue ``target`` (None: to
    several), with ``.carrier`` to add to each job; None while the hooks are off. ``count``: the
    jobs of a batch."""
    instruments = _instruments()
    if instruments is None:
        return None
    partition = _partition_of_queue(queue.client, target) if target is not None else None
    op = Operation(instruments, "send", "send", SpanKind.PRODUCER, queue.name, partition,
                   batch=count is not None, count=count)
    if op.span.get_span_context().is_valid:
        op.carrier = carrier_of(op.span)
    return op


def settle(queue: Any, operation: str, job: Any, count: int | None = None) -> Operation | None:
    """A settle operation (``ack``, ``fail``, ``release``) of ``job`` (a ``Job`` or its id), or of a
    batch of ``count`` jobs (``job`` None); None while the hooks are off."""
    instruments = _instruments()
    if instruments is None:
        return None
    if count is not None:
        return Operation(instruments, operation, "settle", SpanKind.CLIENT, queue.name, None, batch=True,
                         count=count)
    created = creation_context(job)
    return Operation(instruments, operation, "settle", SpanKind.CLIENT, queue.name,
                     _partition_of_job(queue.client, job), message_id=str(getattr(job, "id", job)),
                     links=[Link(created)] if created is not None else None)


# --- processing ------------------------------------------------------------------------------------

class Processing:
    """A worker's ``process`` span of one job, or of a batch: current inside ``with`` (the handler's
    own spans and the settle spans are its children); ``failed(exc)`` marks a handler that raised.

    One job's span is a child of the job's creation context and links it; a batch's span links
    each job's creation context (a span has one parent) and counts the batch.
    """

    __slots__ = ("_instruments", "span", "_attributes", "_start_ns", "_token", "_error")

    def __init__(self, instruments: _Instruments, queue: str, jobs: list[Any], client: Any) -> None:
        self._instruments = instruments
        partitions = {_partition_of_job(client, job) for job in jobs}
        self._attributes = _attributes("process", "process", queue, partitions.pop() if len(partitions) == 1 else None)
        created = [c for c in map(creation_context, jobs) if c is not None]
        links = [Link(c) for c in created]
        attributes = dict(self._attributes)
        parent = None
        if len(jobs) == 1:
            attributes["messaging.message.id"] = str(getattr(jobs[0], "id", ""))
            if created:
                parent = _trace.set_span_in_context(_trace.NonRecordingSpan(created[0]))
                ambient = _trace.get_current_span().get_span_context()
                if ambient.is_valid:
                    links.append(Link(ambient))  # the worker's own span stays correlated
        else:
            attributes["messaging.batch.message_count"] = len(jobs)
        self.span = instruments.tracer.start_span(f"process {queue}", context=parent, kind=SpanKind.CONSUMER,
                                                  links=links, attributes=attributes)
        self._start_ns = 0
        self._token: object = None
        self._error: str | None = None

    def __enter__(self) -> "Processing":
        self._start_ns = time.perf_counter_ns()
        self._token = _context.attach(_trace.set_span_in_context(self.span))
        return self

    def failed(self, exc: BaseException) -> None:
        """The handler raised ``exc``: the processing failed."""
        self._error = _error_type(exc)
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        _context.detach(self._token)
        if exc is not None and self._error is None:
            self.failed(exc)  # the slot itself was cancelled or broke: the job was not processed
        attributes = self._attributes
        if self._error is not None:
            attributes = {**attributes, "error.type": self._error}
            self.span.set_attribute("error.type", self._error)
        self._instruments.process_duration.record((time.perf_counter_ns() - self._start_ns) / 1e9, attributes)
        self.span.end()


def process(queue: str, job: Any, client: Any) -> Processing | None:
    """The ``process`` span of ``job`` taken from ``queue`` by a worker of ``client``; None while
    the hooks are off."""
    instruments = _instruments()
    if instruments is None:
        return None
    return Processing(instruments, queue, [job], client)


def process_batch(queue: str, jobs: list[Any], client: Any) -> Processing | None:
    """The ``process`` span of a batch of ``jobs`` handled together; None while the hooks are off."""
    instruments = _instruments()
    if instruments is None:
        return None
    return Processing(instruments, queue, jobs, client)
