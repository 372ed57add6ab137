"""What inferd tells operators: Prometheus metrics, JSON log lines, the audit log."""
from __future__ import annotations

from inferd.observability.audit import SYSTEM_ACTOR, AuditLog, audit_verify_main
from inferd.observability.garbage import tune_collector
from inferd.observability.log import configure_logging, get_logger, request_context, request_id_var, truncated_path
from inferd.observability.metrics import ITL_BUCKETS, WRITE_DELAY_BUCKETS, Metrics, RequestObservation
from inferd.observability.slo_metrics import SloSnapshot
from inferd.observability.tracing import TRACE_HEADERS, RequestTrace, Tracing, TracingUnavailable

__all__ = [
    "AuditLog", "ITL_BUCKETS", "Metrics", "RequestObservation", "RequestTrace", "SYSTEM_ACTOR", "SloSnapshot", "TRACE_HEADERS", "Tracing", "TracingUnavailable", "WRITE_DELAY_BUCKETS", "configure_logging", "get_logger", "request_context",
    "audit_verify_main", "request_id_var", "truncated_path", "tune_collector",
]
