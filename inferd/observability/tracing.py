"""OpenTelemetry tracing, optional: spans per request stage, W3C trace context honoured.

Off unless the config has a `[tracing]` table; then the daemon builds one `Tracing` and each
completion gets a root span (its parent: the caller's `traceparent`, when sent) with one child per
stage, the same stages as Server-Timing: api, queue, engine_queue, prefill, decode, write. The children are made when the
request ends, from the engine's timestamps, so the hot path pays nothing per token; spans leave for
an OTLP/HTTP collector from the SDK's batch processor thread, never from the event loop.

The SDK is the optional extra `inferd[tracing]` and is imported only here, only when configured:
with tracing off, nothing of OpenTelemetry is loaded. With it off, an incoming `traceparent` is still
passed on to a peer a request is forwarded to (inferd.api.pipeline.spill), as W3C asks of a component that
does not trace itself.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

TRACE_HEADERS = ("traceparent", "tracestate")


class TracingUnavailable(Exception):
    """[tracing] is configured but the OpenTelemetry SDK is not installed."""


class Tracing:
    def __init__(self, *, endpoint: str, service_name: str, sample_ratio: float = 1.0,
                 headers: Mapping[str, str] | None = None, timeout_s: float = 10.0, exporter: Any = None,
                 export_delay_ms: int = 2000) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
            if exporter is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers or {}), timeout=timeout_s)
        except ImportError as exc:
            raise TracingUnavailable(f"[tracing] needs the OpenTelemetry SDK: pip install 'inferd[tracing]' "
                                     f"({exc})") from None
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                        sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        # Bounded: a collector that is down costs dropped spans, never memory or the loop's time.
        self._provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=8192,
                                                             schedule_delay_millis=export_delay_ms))
        self._tracer = self._provider.get_tracer("inferd")
        self._propagator = TraceContextTextMapPropagator()
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()   # monotonic stamps -> span times

    def ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._epoch_offset_ns

    def begin(self, name: str, headers: Mapping[str, str], arrival: float,
              attributes: Mapping[str, Any]) -> RequestTrace:
        """The root span of one request, started at its arrival, a child of the caller's trace if any."""
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract({k: headers[k] for k in TRACE_HEADERS if k in headers})
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, start_time=self.ns(arrival),
                                       attributes=dict(attributes))
        return RequestTrace(self, span)

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        """Export what is queued now (blocking: call off the loop)."""
        return self._provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Export what is left and stop the exporter thread (blocking: call off the loop)."""
        self._provider.shutdown()


class RequestTrace:
    __slots__ = ("_tracing", "_span", "_ended")

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self._tracing = tracing
        self._span = span
        self._ended = False

    def headers(self) -> dict[str, str]:
        """`traceparent` (and `tracestate`) naming this request's span: for a peer it is forwarded to."""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        self._tracing._propagator.inject(carrier, context=set_span_in_context(self._span))
        return carrier

    def end(self, status: int, stages: Mapping[str, tuple[float, float]], attributes: Mapping[str, Any],
            now: float | None = None) -> None:
        """End the root span at `now` with one child span per stage: name -> (start, end), monotonic seconds."""
        if self._ended:
            return
        self._ended = True
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        tracing, root = self._tracing, self._span
        context = set_span_in_context(root)
        for name, (start, end) in stages.items():
            child = tracing._tracer.start_span(name, context=context, start_time=tracing.ns(start))
            child.end(end_time=tracing.ns(max(start, end)))
        root.set_attributes({"http.response.status_code": status, **attributes})
        if status >= 500:
            root.set_status(Status(StatusCode.ERROR))
        root.end(end_time=tracing.ns(time.monotonic() if now is None else now))
