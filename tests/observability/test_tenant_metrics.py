from __future__ import annotations

import pytest

from inferd.observability.metrics import Metrics
from tests.observability.harness import scrape, value


def queue_tenant(**overrides) -> dict:
    row = {"rejections": {}, "admitted": 0, "prompt_tokens": 0, "output_tokens": 0, "queue_wait_sum_s": 0.0,
           "queue_wait_count": 0, "ttft_sum_s": 0.0, "ttft_count": 0, "queued": 0, "queued_tokens": 0, "vtc": 0.0}
    return {**row, **overrides}


class SnapshotTenancy:
    """What the collector reads of a Tenancy: `metrics_snapshot()`."""

    def __init__(self, snapshot: dict) -> None:
        self.snapshot = snapshot

    def metrics_snapshot(self) -> dict:
        return self.snapshot


def two_queue_snapshot() -> dict:
    return {
        "quota": {"acme": {"rejections": {"quota_rpm": 2}, "in_flight": 3, "remaining_requests": 5.0,
                           "remaining_tokens": None}},
        "rejections": {"acme": {"model_not_allowed": 1}, "other": {"queue_full": 4}},
        "paced": {"refused_bytes": {"acme": 900_000}, "delayed": {"acme": 2}},
        "queues": [
            ("small", "v1", {"tenants": {"acme": queue_tenant(rejections={"quota_rpm": 1}, admitted=2,
                                                              prompt_tokens=10, queue_wait_sum_s=0.5,
                                                              queue_wait_count=2, queued=1, vtc=7.0)},
                             "classes": {"interactive": {"queued": 1, "queued_tokens": 30}},
                             "running": 2, "throughput_cost_per_s": 100.0}),
            ("small", "v2", {"tenants": {"acme": queue_tenant(admitted=1, prompt_tokens=5, queue_wait_sum_s=0.25,
                                                              queue_wait_count=1)},
                             "classes": {}, "running": 0, "throughput_cost_per_s": None}),
        ],
    }


def test_tenant_series_sum_quota_tenancy_and_every_queue_per_tenant():
    metrics = Metrics()
    metrics.watch_tenancy(lambda: SnapshotTenancy(two_queue_snapshot()))
    f = scrape(metrics)
    rejections = f["inferd_tenant_rejections"]
    assert value(rejections, "inferd_tenant_rejections_total", tenant="acme", reason="quota_rpm") == 3
    assert value(rejections, "inferd_tenant_rejections_total", tenant="acme", reason="model_not_allowed") == 1
    assert value(rejections, "inferd_tenant_rejections_total", tenant="other", reason="queue_full") == 4
    assert value(f["inferd_tenant_admitted"], "inferd_tenant_admitted_total", tenant="acme") == 3
    bytes_ = f["inferd_tenant_refused_body_bytes"]
    assert value(bytes_, "inferd_tenant_refused_body_bytes_total", tenant="acme") == 900_000
    assert value(f["inferd_tenant_paced_requests"], "inferd_tenant_paced_requests_total", tenant="acme") == 2
    assert value(f["inferd_tenant_prompt_tokens"], "inferd_tenant_prompt_tokens_total", tenant="acme") == 15
    wait = f["inferd_admission_queue_wait_seconds"]
    assert value(wait, "inferd_admission_queue_wait_seconds_count", tenant="acme") == 3
    assert value(wait, "inferd_admission_queue_wait_seconds_sum", tenant="acme") == pytest.approx(0.75)
    assert value(f["inferd_tenant_in_flight_requests"], "inferd_tenant_in_flight_requests", tenant="acme") == 3
    remaining = f["inferd_tenant_ratelimit_remaining"]
    assert value(remaining, "inferd_tenant_ratelimit_remaining", tenant="acme", limit="requests") == 5.0
    assert not [s for s in remaining if s.labels["limit"] == "tokens"]     # no token limit: no series
    assert value(f["inferd_tenant_vtc"], "inferd_tenant_vtc", model="small", version="v1", tenant="acme") == 7.0
    assert value(f["inferd_admission_queued_tokens"], "inferd_admission_queued_tokens", model="small",
                 version="v1", **{"class": "interactive"}) == 30
    throughput = f["inferd_admission_throughput_cost_per_second"]
    assert [s.labels["version"] for s in throughput] == ["v1"]          # not measured yet on v2: absent


def test_no_tenancy_exports_no_tenant_series():
    f = scrape(Metrics())
    assert "inferd_tenant_admitted" not in f and "inferd_admission_queue_wait_seconds" not in f
