"""OpenTelemetry traces (``telemetry.tracingEnabled``): one SERVER span per client request
(its parent the client's ``traceparent``, when it sends one) and a CLIENT span per HTTP
exchange with a backend under it, with W3C ``traceparent`` sent on (the HTTP header, and
``_meta.traceparent`` for a 2026-07-28 backend). Exported with OTLP over HTTP in batches,
off the request threads. Off by default: then every call here is a no-op that costs an
attribute read.

The tracer provider is this module's own (not the process-global one), so a process that
starts several gateways (the tests) configures each without warnings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from vmcp_actors.config import TelemetryConfig

_tracer: Any = None  # an opentelemetry Tracer when tracing is on
_provider: Any = None


def configure(telemetry: TelemetryConfig, exporter: Any = None) -> None:
    """Turn tracing on for this process as ``telemetry`` says (``exporter``: a test's
    span exporter, used synchronously instead of OTLP)."""
    global _tracer, _provider
    shutdown()
    if not telemetry.tracing_enabled:
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    attributes = {"service.name": telemetry.service_name}
    if telemetry.service_version:
        attributes["service.version"] = telemetry.service_version
    provider = TracerProvider(resource=Resource.create(attributes),
                              sampler=ParentBased(TraceIdRatioBased(telemetry.sampling_rate)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        assert telemetry.endpoint is not None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=telemetry.endpoint.rstrip("/") + "/v1/traces", headers=dict(telemetry.headers))))
    _provider = provider
    _tracer = provider.get_tracer("vmcp_actors")


def shutdown() -> None:
    """Send what is batched and stop (at worker exit)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def tracing_on() -> bool:
    """Whether spans are made: callers skip building a span's attributes when not."""
    return _tracer is not None


@contextlib.contextmanager
def request_span(method: str | None, headers: Mapping[str, str], attributes: Mapping[str, Any]) -> Iterator[None]:
    """The SERVER span of one client request, current while the view runs (tracing on)."""
    tracer = _tracer
    if tracer is None:
        yield
        return
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    parent = TraceContextTextMapPropagator().extract({k.lower(): v for k, v in headers.items()})
    with tracer.start_as_current_span(f"mcp {method or 'request'}", context=parent, kind=trace.SpanKind.SERVER,
                                      attributes={k: v for k, v in attributes.items() if v is not None}):
        yield


@contextlib.contextmanager
def backend_span(backend: str, method: str | None, headers: MutableMapping[str, str]) -> Iterator[Any]:
    """The CLIENT span of one exchange with ``backend`` (tracing on); ``traceparent`` goes
    into ``headers``. Yields the span for the status."""
    tracer = _tracer
    if tracer is None:  # turned off since the caller asked tracing_on()
        yield None
        return
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    with tracer.start_as_current_span(f"backend {backend}", kind=trace.SpanKind.CLIENT,
                                      attributes={"vmcp.backend": backend, "mcp.method.name": method or ""}) as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        headers.update(carrier)
        yield span


def current_context() -> Any:
    """The trace context of this thread (None when tracing is off): for work that goes on
    on other threads (a composite tool's steps)."""
    if _tracer is None:
        return None
    from opentelemetry import context

    return context.get_current()


def start_span(name: str, parent: Any, attributes: Mapping[str, Any]) -> Any:
    """A span under ``parent`` (a context from ``current_context``), not made current; None
    when tracing is off."""
    if _tracer is None or parent is None:
        return None
    return _tracer.start_span(name, context=parent, attributes=dict(attributes))


def within(span: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with ``span`` current, so what it starts (pooled jobs copy the context)
    is under it."""
    if span is None:
        return fn(*args)
    from opentelemetry import context, trace

    token = context.attach(trace.set_span_in_context(span))
    try:
        return fn(*args)
    finally:
        context.detach(token)


def end(span: Any, error: BaseException | None = None) -> None:
    if span is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end()
