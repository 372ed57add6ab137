"""Prometheus recording and alerting rules for the configured SLOs (`inferd monitoring rules`).

Multi-window, multi-burn-rate alerts (Google SRE workbook, ch. 5), computed from the counter every
node exports, `inferd_slo_events_total{slo, result}`, summed over the fleet:
- recording rules: the bad fraction of each SLO's events over 5m, 30m, 1h, 2h, 6h, 1d and 3d;
- a page when both windows of 1h/5m burn faster than 14.4x (2% of a 30-day budget in an hour);
- a ticket when both windows of 6h/30m burn faster than 6x (5% in 6 h), of 1d/2h faster than 3x
  (10% in a day) or of 3d/6h faster than 1x (10% in 3 days).
The factors are the workbook's whatever `window_days` is: a burn rate is already relative to the
window, and the slowest ticket at 1x catches any burn that would empty the budget (factors scaled by
the window would fall below 1 for short windows, alerting while the SLO is met, and climb past any
sustained burn for long ones). A pair whose threshold (factor x error budget) is 100% or more could
never fire and is left out, with a note. The short window makes an alert stop soon after the burn
does. Output is YAML (a tiny emitter: the structure is fixed, no dependency needed).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inferd.config import SloConfig
from inferd.slo.burn import WINDOWS

EVENTS = "inferd_slo_events_total"
RATIO = "inferd:slo_error_ratio:rate{window}"
# (severity, long window, short window, burn-rate factor)
ALERT_WINDOWS = (("page", "1h", "5m", 14.4), ("ticket", "6h", "30m", 6.0), ("ticket", "1d", "2h", 3.0),
                 ("ticket", "3d", "6h", 1.0))
_SECONDS = dict(WINDOWS)
ALERT_NAMES = {"page": "InferdSloBurnRatePage", "ticket": "InferdSloBurnRateTicket"}


def budget_share(slo: SloConfig, long_window: str, factor: float) -> float:
    """The share of the SLO window's budget a burn of `factor` spends over `long_window`."""
    return factor * _SECONDS[long_window] / (slo.window_days * 86400.0)


def can_fire(slo: SloConfig, factor: float) -> bool:
    return factor * slo.error_budget < 1.0


def _ratio_rule(name: str, window: str) -> dict[str, Any]:
    sel = f'slo="{name}"'
    return {"record": RATIO.format(window=window),
            "expr": f'sum by (slo) (rate({EVENTS}{{{sel},result="bad"}}[{window}]))\n'
                    f'/\nsum by (slo) (rate({EVENTS}{{{sel}}}[{window}]))',
            "labels": {"slo": name}}


def _alert_rule(name: str, slo: SloConfig, severity: str, long_w: str, short_w: str, factor: float) -> dict[str, Any]:
    share = budget_share(slo, long_w, factor)
    limit = f"{factor:.6g} * {slo.error_budget:.6g}"
    sel = f'{{slo="{name}"}}'
    what = slo.description or f"{slo.sli} of {slo.model}"
    return {
        "alert": ALERT_NAMES[severity],
        "expr": f"{RATIO.format(window=long_w)}{sel} > ({limit})\nand\n{RATIO.format(window=short_w)}{sel} > ({limit})",
        "labels": {"severity": severity, "slo": name, "model": slo.model, "sli": slo.sli,
                   "long_window": long_w, "short_window": short_w},
        "annotations": {
            "summary": f"SLO {name} is burning its error budget {factor:.3g}x too fast",
            "description": (f"{what}: objective {slo.objective:.6g} over {slo.window_days:g} days. Over the last "
                            f"{long_w} and {short_w} the bad fraction is above {factor:.3g}x the budget "
                            f"({share:.0%} of the budget spent in {long_w} if it goes on)."),
        },
    }


def rules_document(slos: Mapping[str, SloConfig]) -> dict[str, Any]:
    """The rules file as data: one group per SLO, its recording rules before its alerts (one
    evaluation then sees the ratios it just recorded)."""
    groups = []
    for name, slo in sorted(slos.items()):
        rules = [_ratio_rule(name, window) for window, _ in WINDOWS]
        rules += [_alert_rule(name, slo, *w) for w in ALERT_WINDOWS if can_fire(slo, w[3])]
        groups.append({"name": f"inferd-slo-{name}", "rules": rules})
    return {"groups": groups}


def render_rules(slos: Mapping[str, SloConfig]) -> str:
    header = ("# Prometheus rules for inferd's SLOs, written by `inferd monitoring rules`. Do not edit:\n"
              "# change [slos.*] in the config and write them again. See docs/slos.md.\n")
    if not slos:
        header += "# The config declares no [slos.*]: there is nothing to alert on.\n"
    for name, slo in sorted(slos.items()):
        for severity, long_w, short_w, factor in ALERT_WINDOWS:
            if not can_fire(slo, factor):
                header += (f"# {name}: no {severity} over {long_w}/{short_w}: {factor:g}x an error budget of "
                           f"{slo.error_budget:.6g} is 100% bad or more, which never happens.\n")
    return header + to_yaml(rules_document(slos))


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists, strings and numbers. Strings are double-quoted JSON strings
    (a valid YAML double-quoted scalar), or `|` blocks when they span lines."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}{key}: {_scalar(item, indent + 2)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            nested = isinstance(item, (dict, list))
            body = to_yaml(item, indent + 2) if nested else f"{pad}  {_scalar(item, indent + 2)}\n"
            out.append(f"{pad}- {body[indent + 2:]}")
        return "".join(out)
    return pad + _scalar(value, indent) + "\n"


def _scalar(value: Any, indent: int) -> str:
    if isinstance(value, str) and "\n" in value:
        lines = "\n".join((" " * indent + line) if line else "" for line in value.split("\n"))
        return "|-\n" + lines
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, list) and not value:
        return "[]"
    return json.dumps(value)
