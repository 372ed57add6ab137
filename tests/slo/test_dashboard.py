"""The shipped dashboard queries only what a running daemon exports (or the shipped rules record)."""
from __future__ import annotations

import re

import aiohttp
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from inferd.config import SloConfig
from inferd.slo.dashboard import dashboard
from inferd.slo.rules import rules_document
from tests.daemon.harness import running, sim_model, write_config

SLOS = {"avail": SloConfig(model="small", sli="availability", objective=0.999),
        "ttft": SloConfig(model="small", sli="ttft", objective=0.99, threshold_ms=500)}
CONFIG = """
[slos.avail]
model = "small"
sli = "availability"
objective = 0.999
[prices.small]
prompt_per_1k = 0.1
"""
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


def queries(board: dict) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])] + \
        [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]


async def exported_names(url: str) -> set[str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
    return names


async def test_every_series_the_dashboard_queries_is_exported_or_recorded(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, CONFIG)
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            await sdk.completions.create(model="small", prompt="hello", max_tokens=4)
        exported = await exported_names(url)
    recorded = {r["record"] for g in rules_document(SLOS)["groups"] for r in g["rules"] if "record" in r}
    board = dashboard(SLOS)
    used = {name for q in queries(board) for name in re.findall(r"\binferd[_:][a-z0-9_:]+", q)}
    assert "inferd_prefill_seconds_bucket" in used and "inferd_slo_burn_rate" in used
    assert sorted(used - exported - recorded) == []


def test_panels_have_unique_ids_and_do_not_overlap():
    panels = dashboard(SLOS)["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))


def test_each_slo_gets_a_burn_rate_panel_with_its_alert_lines():
    panels = {p["title"]: p for p in dashboard(SLOS)["panels"]}
    steps = panels["SLO avail: burn rate"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps[1:]] == [6.0, 14.4]
    assert "SLO ttft: burn rate" in panels
    assert not any(t.startswith("SLO") for t in {p["title"] for p in dashboard({})["panels"]})
