"""A Grafana dashboard for inferd (`inferd monitoring dashboard`): SLOs, latency stages, engines, refusals.

Every query names only series the daemon exports (tests/slo/test_dashboard.py checks them against a
running daemon's /metrics) or the recording rules of inferd.slo.rules. Variables pick the model and
version; latency panels show p50/p95/p99 from the histograms, per version, so a canary is visible
beside its stable version. One panel per SLO shows its burn rates against the page and ticket lines.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferd.config import SloConfig
from inferd.slo.rules import ALERT_WINDOWS, RATIO

SEL = 'model=~"$model",version=~"$version"'
_WIDTH, _HEIGHT = 12, 8


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr, "legendFormat": legend,
            "refId": ref}


def _panel(title: str, targets: list[tuple[str, str]], unit: str, description: str = "",
           thresholds: list[float] = ()) -> dict[str, Any]:
    steps = [{"color": "green", "value": None}] + [{"color": c, "value": v}
                                                  for c, v in zip(("orange", "red"), thresholds)]
    return {"type": "timeseries", "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "targets": [_target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps},
                                         "custom": {"thresholdsStyle": {"mode": "line" if thresholds else "off"}}},
                            "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}}


def _quantiles(histogram: str) -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q}, sum by (le, model, version) (rate({histogram}_bucket{{{SEL}}}[5m])))",
             f"p{round(q * 100)} {{{{model}}}}@{{{{version}}}}") for q in (0.5, 0.95, 0.99)]


def _row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def _slo_panels(slos: Mapping[str, SloConfig]) -> list[dict[str, Any]]:
    panels = []
    for name, slo in sorted(slos.items()):
        page, ticket = ALERT_WINDOWS[0][3], ALERT_WINDOWS[1][3]
        budget = f"{slo.error_budget:.6g}"
        targets = [(f'{RATIO.format(window=w)}{{slo="{name}"}} / {budget}', f"fleet {w}")
                   for w in ("5m", "1h", "6h", "3d")]
        targets.append((f'max by (window) (inferd_slo_burn_rate{{slo="{name}"}})', "node {{window}}"))
        panels.append(_panel(
            f"SLO {name}: burn rate", targets, "none",
            f"{slo.sli} of {slo.model}, objective {slo.objective:.6g} over {slo.window_days:g} d. Lines: ticket "
            f"({ticket:.3g}x over 6h/30m) and page ({page:.3g}x over 1h/5m). `fleet` series come from the recording "
            f"rules of `inferd monitoring rules`; `node` from the daemons' own gauges.", thresholds=[ticket, page]))
    if slos:
        panels.append(_panel("SLO error budget remaining (per node, since its start)",
                             [("min by (slo) (inferd_slo_error_budget_remaining)", "{{slo}}")], "percentunit"))
    return panels


def dashboard(slos: Mapping[str, SloConfig]) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (import it, or provision it from a file)."""
    latency = [
        _panel("Time to first token", _quantiles("inferd_time_to_first_token_seconds"), "s",
               "Arrival to the first token written to the client."),
        _panel("Inter-token latency", _quantiles("inferd_inter_token_latency_seconds"), "s",
               "Gap between tokens at the client (one observation per frame, divided by its tokens)."),
        _panel("Queue wait", _quantiles("inferd_queue_wait_seconds"), "s",
               "Arrival to the first engine step: admission queue and engine queue."),
        _panel("Prefill", _quantiles("inferd_prefill_seconds"), "s", "First engine step to first token."),
        _panel("Decode", _quantiles("inferd_decode_seconds"), "s", "First token to the last."),
        _panel("End to end", _quantiles("inferd_e2e_request_latency_seconds"), "s",
               "Arrival to the last byte of the response."),
    ]
    engines = [
        _panel("Batch fill", [(f"inferd_engine_batch_fill_ratio{{{SEL}}}", "{{model}}@{{version}} {{hardware}}")],
               "percentunit", "Running sequences / max_batch_size: an autoscaling signal (docs/slos.md)."),
        _panel("KV cache in use", [(f"inferd_engine_kv_usage_ratio{{{SEL}}}", "{{model}}@{{version}} {{hardware}}")],
               "percentunit", "KV blocks in use / all blocks: pressure before preemption."),
        _panel("Engine tokens/s", [(f"inferd_engine_tokens_per_second{{{SEL}}}", "{{model}}@{{version}}"),
                                   (f"sum by (model, version) "
                                    f"(rate(inferd_engine_generated_tokens_total{{{SEL}}}[1m]))",
                                    "generated {{model}}@{{version}}")], "none"),
        _panel("Oldest queued request, by class",
               [(f"max by (class) (inferd_admission_oldest_wait_seconds{{{SEL}}})", "{{class}}")], "s"),
        _panel("Requests running and waiting", [
            (f"sum by (model, version) (inferd_requests_running{{{SEL}}})", "running {{model}}@{{version}}"),
            (f"sum by (model, version) (inferd_requests_waiting{{{SEL}}})", "in engine queue {{model}}@{{version}}"),
            (f"sum by (class) (inferd_admission_queued_requests{{{SEL}}})", "admission {{class}}")], "none"),
        _panel("Deadline misses (504) / s",
               [(f'sum by (model, version) (rate(inferd_requests_total{{{SEL},status="504"}}[5m]))',
                 "{{model}}@{{version}}")], "reqps"),
    ]
    refusals = [
        _panel("Responses by status", [(f"sum by (status) (rate(inferd_requests_total{{{SEL}}}[5m]))", "{{status}}")],
               "reqps"),
        _panel("Refusals by reason", [("sum by (reason) (rate(inferd_tenant_rejections_total[5m]))", "{{reason}}")],
               "reqps", "Quota, queue-full, TTL, deadline and budget refusals."),
    ]
    tenants = [
        _panel("Tokens per tenant", [
            ("sum by (tenant) (rate(inferd_tenant_prompt_tokens_total[5m]))", "prompt {{tenant}}"),
            ("sum by (tenant) (rate(inferd_tenant_generation_tokens_total[5m]))", "generated {{tenant}}")], "none"),
        _panel("Spend per tenant", [("sum by (tenant) (rate(inferd_tenant_spend_total[1h])) * 3600", "{{tenant}}")],
               "none", "Cost per hour, in the currency of [prices]."),
    ]
    panels: list[dict[str, Any]] = []
    for title, group in (("SLOs", _slo_panels(slos)), ("Latency by stage", latency), ("Engines", engines),
                         ("Refusals", refusals), ("Tenants", tenants)):
        if group:
            panels.append(_row(title))
            panels.extend(group)
    y = col = 0
    for i, p in enumerate(panels):        # a 2-column grid, rows full width
        p["id"] = i + 1
        if p["type"] == "row":
            y += _HEIGHT if col else 0    # a half-filled line of panels above
            p["gridPos"] = {"x": 0, "y": y, "w": 24, "h": 1}
            y += 1
            col = 0
        else:
            p["gridPos"] = {"x": col * _WIDTH, "y": y, "w": _WIDTH, "h": _HEIGHT}
            col ^= 1
            if col == 0:
                y += _HEIGHT
    return {
        "title": "inferd", "uid": "inferd-overview", "schemaVersion": 39, "version": 1, "editable": True,
        "tags": ["inferd", "llm"], "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "model", "type": "query", "label": "model", "includeAll": True, "multi": True, "allValue": ".*",
             "datasource": {"type": "prometheus", "uid": "${datasource}"}, "refresh": 2,
             "query": {"query": "label_values(inferd_model_info, model)", "refId": "model"}},
            {"name": "version", "type": "query", "label": "version", "includeAll": True, "multi": True,
             "allValue": ".*", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "refresh": 2,
             "query": {"query": 'label_values(inferd_model_info{model=~"$model"}, version)', "refId": "version"}},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }
