"""OpenTelemetry traces (``rerun-scheduler[otel]``): a span per enqueue, and one per job run,
its child.

Used only when the application configured OpenTelemetry: its ``opentelemetry.trace`` is
imported and a tracer provider is set (``trace.set_tracer_provider``, or
``opentelemetry-instrument``). Otherwise every function here does nothing, and OpenTelemetry
is never imported by this package.

``Scheduler.enqueue`` opens a ``PRODUCER`` span, child of the caller's current span, and stores
its W3C ``traceparent`` with the job (only that header: no baggage, no tracestate, so nothing
the caller put in its context travels in the database). The worker runs each attempt under a
``CONSUMER`` span whose parent is that ``traceparent``; spans a handler opens are its children.
A tick that dispatches or reruns jobs opens a ``PRODUCER`` span ``tick`` (:class:`TickTrace`),
and the jobs it queues carry its ``traceparent`` in the same way.
Attributes follow OpenTelemetry's messaging conventions (the queue, the job id, the attempt);
never the payload or an exception message: a failed attempt sets the span's status to ERROR
with the job's error code.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._model.ending import Ending
    from .._model.job import Job
    from .._model.report import TickReport

TRACER_NAME = "scheduler"
SYSTEM = "scheduler"


def _trace() -> Any | None:
    """The ``opentelemetry.trace`` module if the application configured a tracer provider."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return trace


def configured() -> bool:
    """Whether the application configured OpenTelemetry (a tracer provider): spans are made."""
    return _trace() is not None


def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


class Enqueued:
    """The enqueue's span: ``fields`` to store with the job, then :meth:`job_id`."""

    def __init__(self, span: Any = None, traceparent: str | None = None) -> None:
        self._span = span
        self.fields: dict[str, str] = {"traceparent": traceparent} if traceparent else {}

    def job_id(self, job_id: int) -> None:
        if self._span is not None:
            self._span.set_attribute("messaging.message.id", str(job_id))


@contextlib.contextmanager
def enqueue_span(handler: str, queue: str) -> Iterator[Enqueued]:
    """Around one enqueue."""
    trace = _trace()
    if trace is None:
        yield Enqueued()
        return
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
        "scheduler.handler": handler,
    }
    with tracer.start_as_current_span(
        f"enqueue {handler}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        _propagator().inject(carrier)  # the current context is this span's
        yield Enqueued(span, carrier.get("traceparent"))


@contextlib.contextmanager
def enqueue_many_span(count: int) -> Iterator[Enqueued]:
    """Around one ``enqueue_many``: one span for the batch, whose ``traceparent`` every job of
    it carries (a span per job would cost more than the insert)."""
    trace = _trace()
    if trace is None:
        yield Enqueued()
        return
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.batch.message_count": count,
    }
    with tracer.start_as_current_span(
        "enqueue_many", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        _propagator().inject(carrier)
        yield Enqueued(None, carrier.get("traceparent"))


class TickTrace:
    """One tick's span, begun only once the tick dispatches or reruns a job (an idle tick, or
    one whose due rows are all held back, makes none), so that scheduled work is traced like
    enqueued work: each job the tick creates or reruns carries this span's ``traceparent``,
    and its run's span is a child of it. The span starts at the tick's start, is a child of
    the caller's current span (a host app's ``app.tick()`` in a request), and ends with the
    tick, with the counts of what it dispatched and reran."""

    def __init__(self) -> None:
        self._trace = _trace()
        self._started = time.time_ns() if self._trace is not None else 0
        self._span: Any = None
        self.traceparent: str | None = None

    @property
    def wanted(self) -> bool:
        """Whether OpenTelemetry is configured (else this does nothing)."""
        return self._trace is not None

    def begin(self) -> str | None:
        """The span's ``traceparent`` (the span begun at the first call); None untraced."""
        trace = self._trace
        if trace is None or self._span is not None:
            return self.traceparent
        self._span = trace.get_tracer(TRACER_NAME).start_span(
            "tick",
            kind=trace.SpanKind.PRODUCER,
            start_time=self._started,
            attributes={"messaging.system": SYSTEM, "messaging.operation.type": "create"},
        )
        carrier: dict[str, str] = {}
        _propagator().inject(carrier, context=trace.set_span_in_context(self._span))
        self.traceparent = carrier.get("traceparent")
        return self.traceparent

    def end(self, report: TickReport, error: BaseException | None = None) -> None:
        span = self._span
        if span is None:
            return
        span.set_attribute("scheduler.dispatched", len(report.dispatched))
        span.set_attribute("scheduler.rerun", len(report.rerun))
        if error is not None and self._trace is not None:  # its type: a message may carry values
            name = type(error).__name__
            span.set_attribute("error.type", name)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, name))
        span.end()
        self._span = None


class Running:
    """One attempt's span; :meth:`ended` records how it ended."""

    def __init__(self, span: Any = None, trace: Any = None) -> None:
        self._span = span
        self._trace = trace

    def ended(self, outcome: Ending) -> None:
        if self._span is None:
            return
        result = outcome.result
        self._span.set_attribute("scheduler.outcome", result)
        if outcome.code is not None:
            self._span.set_attribute("error.type", outcome.run_code or outcome.code)
        if result != "succeeded":
            status = self._trace.Status(self._trace.StatusCode.ERROR, outcome.code)
            self._span.set_status(status)


_NOT_TRACED = Running()


@contextlib.contextmanager
def run_span(job: Job) -> Iterator[Running]:
    """Around one attempt's handler call: the span is current while the handler runs."""
    trace = _trace()
    if trace is None:
        yield _NOT_TRACED
        return
    tracer = trace.get_tracer(TRACER_NAME)
    parent = _propagator().extract({"traceparent": job.traceparent}) if job.traceparent else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "scheduler.handler": job.handler,
        "scheduler.attempt": job.attempts,
        "scheduler.max_attempts": job.max_attempts,
    }
    if job.task_name is not None:
        attributes["scheduler.task"] = job.task_name
    with tracer.start_as_current_span(
        f"run {job.handler}",
        context=parent if parent is not None else trace.set_span_in_context(trace.INVALID_SPAN),
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield Running(span, trace)
