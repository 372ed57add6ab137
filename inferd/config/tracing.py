"""`[tracing]`: OpenTelemetry spans per request stage, sent to an OTLP/HTTP collector (docs/slos.md)."""
from __future__ import annotations

import math
from urllib.parse import urlsplit

from inferd.config.walk import ConfigTable


class TracingConfig(ConfigTable):
    """Absent = no tracing (the default, at no cost). Needs the extra: pip install 'inferd[tracing]'."""

    endpoint: str = "http://127.0.0.1:4318/v1/traces"   # the collector's OTLP/HTTP traces URL
    service_name: str = "inferd"
    sample_ratio: float = 1.0             # of traces started here; a caller's sampled flag is followed
    headers: dict[str, str] = {}          # sent with every export (a collector's auth token, say)
    timeout_s: float = 10.0


def tracing_errors(t: TracingConfig, path: str = "tracing") -> list[str]:
    errors = []
    url = urlsplit(t.endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        errors.append(f"{path}.endpoint: expected an http(s) URL such as http://127.0.0.1:4318/v1/traces, "
                      f"got {t.endpoint!r}")
    if not 0 <= t.sample_ratio <= 1:
        errors.append(f"{path}.sample_ratio: must be between 0 and 1, got {t.sample_ratio}")
    if not 0 < t.timeout_s < math.inf:
        errors.append(f"{path}.timeout_s: must be a positive number of seconds, got {t.timeout_s}")
    if not t.service_name:
        errors.append(f"{path}.service_name: must not be empty")
    return errors
