"""Per-tenant and admission-queue series, built at scrape time from the tenancy's tallies.

Quota and admission keep cumulative counts; summing them per scrape costs nothing between scrapes.
`inferd.observability.metrics.Metrics` registers this collector; every series name it yields is declared here.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

TENANT = ("tenant",)
QUEUE = ("model", "version")   # one admission queue per loaded engine version


class TenancyCollector:
    """Scrape-time per-tenant and per-queue series from Tenancy.metrics_snapshot() (quota and admission
    keep cumulative tallies; summing them here costs nothing between scrapes). Tenant labels are already
    bounded there: configured tenants and `local`, everything else `other`."""

    def __init__(self, tenancy: Callable[[], Any]) -> None:
        """`tenancy()` returns the live Tenancy (or None), read at every scrape."""
        self._tenancy = tenancy

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        tenancy = self._tenancy()
        if tenancy is None:
            return
        snap = tenancy.metrics_snapshot()
        yield from (*_tenant_series(snap), *_queue_series(snap))
        yield from _pacing_series(snap["paced"])
        yield _keys_reload_series(snap.get("keys_reloads", {}))
        yield _budget_series(snap.get("budgets", {}))


def _tenant_tallies(snap: dict[str, Any]) -> tuple[dict[str, dict[str, float]], dict[tuple[str, str], int]]:
    """Each tenant's counts summed over its quota, the front's refusals and every queue, and its refusals
    by (tenant, reason) summed the same way."""
    rows: dict[str, dict[str, float]] = {}
    refused: dict[tuple[str, str], int] = {}

    def add(label: str, **values: float) -> None:
        row = rows.setdefault(label, {})
        for k, v in values.items():
            row[k] = row.get(k, 0) + v

    def refuse(label: str, reasons: dict[str, int]) -> None:
        for reason, n in reasons.items():
            refused[(label, reason)] = refused.get((label, reason), 0) + n

    for label, row in snap["quota"].items():
        refuse(label, row["rejections"])
        add(label, in_flight=row["in_flight"])
    for label, reasons in snap["rejections"].items():
        refuse(label, reasons)
    for _model, _version, q in snap["queues"]:
        for label, row in q["tenants"].items():
            refuse(label, row["rejections"])
            add(label, admitted=row["admitted"], prompt=row["prompt_tokens"], output=row["output_tokens"],
                wait_sum=row["queue_wait_sum_s"], wait_n=row["queue_wait_count"], ttft_sum=row["ttft_sum_s"],
                ttft_n=row["ttft_count"], queued=row["queued"], queued_tokens=row["queued_tokens"])
    return rows, refused


def _tenant_series(snap: dict[str, Any]) -> tuple[Metric, ...]:
    """Per tenant, over all queues: refusals, admitted work, waits, what is queued and in flight, rate-limit room."""
    rejections = CounterMetricFamily("inferd_tenant_rejections", "Requests refused, by tenant and reason "
                                     "(quota_rpm, quota_tpm, concurrency, queue_full, node_full, deadline, "
                                     "ttl, draining, limit, model_not_allowed, budget_exceeded, "
                                     "refusals_paced)",
                                     labels=(*TENANT, "reason"))
    admitted = CounterMetricFamily("inferd_tenant_admitted", "Requests released to an engine", labels=TENANT)
    prompt = CounterMetricFamily("inferd_tenant_prompt_tokens", "Prompt tokens of admitted requests", labels=TENANT)
    output = CounterMetricFamily("inferd_tenant_generation_tokens", "Tokens generated", labels=TENANT)
    wait = SummaryMetricFamily("inferd_admission_queue_wait_seconds",
                               "Time from entering the admission queue to release to the engine", labels=TENANT)
    ttft = SummaryMetricFamily("inferd_tenant_time_to_first_token_seconds",
                               "Admission queue entry to first token", labels=TENANT)
    queued = GaugeMetricFamily("inferd_tenant_queued_requests", "Requests waiting in admission", labels=TENANT)
    queued_tok = GaugeMetricFamily("inferd_tenant_queued_tokens",
                                   "Prompt + max_tokens of requests waiting in admission", labels=TENANT)
    in_flight = GaugeMetricFamily("inferd_tenant_in_flight_requests",
                                  "Requests holding a concurrency slot (queued + running)", labels=TENANT)
    remaining = GaugeMetricFamily("inferd_tenant_ratelimit_remaining",
                                  "Room left in the tenant's rate-limit bucket", labels=(*TENANT, "limit"))
    for label, row in snap["quota"].items():
        for kind in ("requests", "tokens"):
            level = row[f"remaining_{kind}"]
            if level is not None:
                remaining.add_metric((label, kind), level)
    rows, refused = _tenant_tallies(snap)
    for (label, reason), n in refused.items():
        rejections.add_metric((label, reason), n)
    for label, row in rows.items():
        admitted.add_metric((label,), row.get("admitted", 0))
        prompt.add_metric((label,), row.get("prompt", 0))
        output.add_metric((label,), row.get("output", 0))
        wait.add_metric((label,), row.get("wait_n", 0), row.get("wait_sum", 0.0))
        ttft.add_metric((label,), row.get("ttft_n", 0), row.get("ttft_sum", 0.0))
        queued.add_metric((label,), row.get("queued", 0))
        queued_tok.add_metric((label,), row.get("queued_tokens", 0))
        in_flight.add_metric((label,), row.get("in_flight", 0))
    return rejections, admitted, prompt, output, wait, ttft, queued, queued_tok, in_flight, remaining


def _queue_series(snap: dict[str, Any]) -> tuple[Metric, ...]:
    """Per admission queue (model version): each tenant's VTC, what waits by class, what runs, the service rate."""
    vtc = GaugeMetricFamily("inferd_tenant_vtc", "Virtual token counter (weighted served cost) per queue",
                            labels=(*QUEUE, *TENANT))
    class_queued = GaugeMetricFamily("inferd_admission_queued_requests", "Requests waiting, by class",
                                     labels=(*QUEUE, "class"))
    class_age = GaugeMetricFamily("inferd_admission_oldest_wait_seconds", "How long the longest-waiting "
                                  "request of the class has been queued (0: none queued)", labels=(*QUEUE, "class"))
    class_tokens = GaugeMetricFamily("inferd_admission_queued_tokens", "Tokens waiting, by class",
                                     labels=(*QUEUE, "class"))
    running = GaugeMetricFamily("inferd_admission_running_requests", "Requests admission released that "
                                "have not finished", labels=QUEUE)
    throughput = GaugeMetricFamily("inferd_admission_throughput_cost_per_second",
                                   "Measured served cost per second (drives Retry-After and early refusal)",
                                   labels=QUEUE)
    for model, version, q in snap["queues"]:
        for label, row in q["tenants"].items():
            vtc.add_metric((model, version, label), row["vtc"])
        for cls, row in q["classes"].items():
            class_queued.add_metric((model, version, cls), row["queued"])
            class_tokens.add_metric((model, version, cls), row["queued_tokens"])
            class_age.add_metric((model, version, cls), row.get("oldest_wait_s", 0.0))
        running.add_metric((model, version), q["running"])
        if q["throughput_cost_per_s"] is not None:
            throughput.add_metric((model, version), q["throughput_cost_per_s"])
    return vtc, class_queued, class_tokens, class_age, running, throughput


def _pacing_series(paced: dict[str, dict[str, int]]) -> tuple[Metric, ...]:
    """The refusal pacer, per tenant: the refused bytes it counts against the tenant, the requests it delayed."""
    refused_bytes = CounterMetricFamily("inferd_tenant_refused_body_bytes", "Body bytes of requests refused "
                                        "as invalid (400/403/404/413/415/422): the refusal pacer's debt",
                                        labels=TENANT)
    delayed = CounterMetricFamily("inferd_tenant_paced_requests", "Requests that waited for their turn "
                                  "because their tenant was over its refused-bytes burst", labels=TENANT)
    for label, n in paced["refused_bytes"].items():
        refused_bytes.add_metric((label,), n)
    for label, n in paced["delayed"].items():
        delayed.add_metric((label,), n)
    return refused_bytes, delayed


def _keys_reload_series(reloads: dict[str, int]) -> Metric:
    keys = CounterMetricFamily("inferd_keys_reload", "Keys-file re-reads (1 s poll or SIGHUP) that changed "
                               "keys (success) or found the file malformed, old keys kept (error)",
                               labels=("result",))
    for result, n in reloads.items():
        keys.add_metric((result,), n)
    return keys


def _budget_series(budgets: dict[str, float]) -> Metric:
    budget = GaugeMetricFamily("inferd_tenant_budget_used_ratio", "Share of the tenant's budget spent "
                               "(the larger of max_spend and max_tokens_per_day; 1 = refused)", labels=TENANT)
    for label, used in budgets.items():
        budget.add_metric((label,), used)
    return budget
