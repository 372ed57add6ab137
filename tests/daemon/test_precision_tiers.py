"""Precision tiers through the real daemon: an alias sends interactive tenants to the float version of a model
and batch traffic to its int8 version, each priced per version, and the ledger shows each tier's cost."""
from __future__ import annotations

import asyncio
import json
import shutil
import sys

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from inferd.engine.reference import quantize_artifact
from inferd.config.root import ConfigError, parse_config
from inferd.tenancy.keys import KeyHasher, create_key
from tests.daemon.harness import running, running_daemon, sim_model, until, write_config


@pytest.fixture(scope="module")
def tiers_root(tiny_artifact, tmp_path_factory):
    """An engines tree with tiny's float version (LATEST) and its int8 version."""
    root = tmp_path_factory.mktemp("engines")
    shutil.copytree(tiny_artifact.parent, root / "tiny")
    int8 = quantize_artifact(root / "tiny" / tiny_artifact.name, root)
    return root, tiny_artifact.name, int8.name


def raw_config(tmp_path, tiers_root, **alias) -> dict:
    root, float_version, int8_version = tiers_root
    return {
        "server": {"port": 0, "engines_root": str(root), "drain_grace_s": 0},
        "models": {"tiny": {"version": float_version, "versions": [int8_version], "num_kv_blocks": 64,
                            "max_batch_size": 4}},
        "aliases": {"chat": {"split": {"tiny": 1.0}, "tiers": {"batch": f"tiny@{int8_version}"}, **alias}},
        "prices": {f"tiny@{float_version}": {"prompt_per_1k": 1.0, "completion_per_1k": 4.0},
                   f"tiny@{int8_version}": {"prompt_per_1k": 0.25, "completion_per_1k": 1.0}},
        "auth": {"mode": "api_key", "keys_file": "keys.jsonl"},
        "tenants": {"app": {"priority": "interactive"}, "bulk": {"priority": "batch"}, "audit": {}},
        "audit": {"path": "audit.jsonl"},
    }


async def test_each_class_is_served_by_its_tiers_precision_and_billed_at_its_price(tmp_path, tiers_root):
    _, float_version, int8_version = tiers_root
    raw = raw_config(tmp_path, tiers_root, tenants={"audit": f"tiny@{int8_version}"})
    keys = {t: create_key(tmp_path / "keys.jsonl", KeyHasher(None), t, ("inference", "admin", "metrics"))[1]
            for t in ("app", "bulk", "audit")}
    async with running_daemon(parse_config(raw, base_dir=tmp_path)) as (daemon, _, url):
        served = {}
        for tenant, key in keys.items():
            async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as sdk:
                done = await sdk.completions.create(model="chat", prompt="hello there", max_tokens=5,
                                                    temperature=0, extra_body={"ignore_eos": True})
            served[tenant] = done.model
        assert served == {"app": f"tiny@{float_version}", "bulk": f"tiny@{int8_version}",
                          "audit": f"tiny@{int8_version}"}             # a tenant rule, though its class is standard
        assert daemon.state.registry.table.engine(
            next(k for k in daemon.state.registry.table.versions if k.version == int8_version)).info.precision == "int8"
        async with aiohttp.ClientSession() as http, http.get(
                url + "/admin/usage", params={"rows": "true", "format": "jsonl"},
                headers={"Authorization": f"Bearer {keys['app']}"}) as resp:
            rows = {r["tenant"]: r for r in map(json.loads, (await resp.text()).splitlines())}
        async with aiohttp.ClientSession() as http, http.get(
                url + "/metrics", headers={"Authorization": f"Bearer {keys['app']}"}) as resp:
            assert resp.status == 200
            text = await resp.text()
        spend = {line.split('version="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                 for line in text.splitlines() if line.startswith("inferd_spend_total{")}
    for tenant, (prompt_price, completion_price) in (("app", (1.0, 4.0)), ("bulk", (0.25, 1.0))):
        row = rows[tenant]
        assert row["version"] == (float_version if tenant == "app" else int8_version)
        assert row["cost"] == pytest.approx((row["prompt_tokens"] * prompt_price
                                             + row["completion_tokens"] * completion_price) / 1000)
    assert rows["bulk"]["cost"] < rows["app"]["cost"]
    assert spend[float_version] == pytest.approx(rows["app"]["cost"])                # each tier's spend, per version
    assert spend[int8_version] == pytest.approx(rows["bulk"]["cost"] + rows["audit"]["cost"])


@pytest.mark.parametrize("alias, message", [
    ({"tiers": {"premium": "tiny"}}, "aliases.chat.tiers.premium: not a priority class"),
    ({"tiers": {"batch": "other@v1"}}, "aliases.chat.tiers.batch: target 'other@v1' is not a version of a model"),
    ({"tenants": {"acme": "nope"}}, "aliases.chat.tenants.acme: target 'nope': 'nope' is not a configured model"),
])
def test_a_tier_rule_that_cannot_route_is_refused_naming_its_key(tmp_path, tiers_root, alias, message):
    with pytest.raises(ConfigError) as info:
        parse_config(raw_config(tmp_path, tiers_root, **alias), base_dir=tmp_path)
    assert any(e.startswith(message) for e in info.value.errors), info.value.errors


async def test_the_model_listing_shows_the_precision_of_each_loaded_version(tmp_path, tiers_root):
    _, float_version, int8_version = tiers_root
    key = create_key(tmp_path / "keys.jsonl", KeyHasher(None), "app", ("inference",))[1]
    async with running_daemon(parse_config(raw_config(tmp_path, tiers_root), base_dir=tmp_path)) as (_, _, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as sdk:
            listing = await sdk.models.list()
    [row] = [m.model_dump() for m in listing.data if m.id == "tiny"]
    assert row["precision"] == "float32"                                   # the default version's, as its backend
    assert {v["version"]: v["precision"] for v in row["versions"]} == {float_version: "float32", int8_version: "int8"}


# One sim model at two precisions (labels of two simulated instances), the tiers and a price for each.
SIM_TIERS = """
[aliases.chat]
split = { "llama" = 1.0 }
[aliases.chat.tiers]
interactive = "llama@bf16"
batch = "llama@int8"
[prices."llama@bf16"]
prompt_per_1k = 2.0
completion_per_1k = 8.0
[prices."llama@int8"]
prompt_per_1k = 0.5
completion_per_1k = 2.0
[auth]
mode = "api_key"
keys_file = "keys.jsonl"
[tenants.app]
priority = "interactive"
[tenants.ops]
priority = "standard"
[tenants.bulk]
priority = "batch"
"""


def sim_tiers_config(tmp_path, extra: str = "", **model_kw):
    path = write_config(tmp_path / "c.toml", {"llama": sim_model(["int8"], version="bf16", time_scale=0.0,
                                                                 **model_kw)}, SIM_TIERS + extra)
    keys = {t: create_key(tmp_path / "keys.jsonl", KeyHasher(None), t, ("inference", "admin", "metrics"))[1]
            for t in ("app", "ops", "bulk")}
    return path, keys


async def usage_rows(url: str, key: str, **params) -> list[dict]:
    """The ledger's rows (default) or, with by_version="true", its daily totals per version."""
    async with aiohttp.ClientSession() as http, http.get(
            url + "/admin/usage", params={"format": "jsonl", **(params or {"rows": "true"})},
            headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status == 200
        return [json.loads(line) for line in (await resp.text()).splitlines()]


async def test_a_batch_jobs_lines_go_to_the_batch_tier_and_each_tier_is_billed_at_its_versions_price(tmp_path):
    path, keys = sim_tiers_config(tmp_path)
    lines = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": "chat", "prompt": "hi", "max_tokens": 3}}) + "\n" for i in range(3))
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key=keys["app"], max_retries=0) as sdk:
            raw = await sdk.completions.with_raw_response.create(model="chat", prompt="hi", max_tokens=3)
            assert raw.headers["X-Inferd-Model-Version"] == "bf16+simulated"   # the interactive tenant's tier
        async with AsyncOpenAI(base_url=url + "/v1", api_key=keys["ops"], max_retries=0) as sdk:
            live = await sdk.completions.create(model="chat", prompt="hi", max_tokens=3)
            assert live.model.startswith("llama@bf16")     # a standard tenant's own requests: no tier, the split
            made = await sdk.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
            batch = await sdk.batches.create(input_file_id=made.id, endpoint="/v1/completions",
                                             completion_window="24h")

            async def finished():
                nonlocal batch
                batch = await sdk.batches.retrieve(batch.id)
                return batch.status in ("completed", "failed", "expired", "cancelled")

            await until(finished, "the batch job", timeout_s=30)
            assert batch.status == "completed" and batch.request_counts.completed == 3
            out = [json.loads(line) for line in (await sdk.files.content(batch.output_file_id)).text.splitlines()]
        rows = await usage_rows(url, keys["app"])
        totals = await usage_rows(url, keys["app"], by_version="true")
        async with aiohttp.ClientSession() as http, http.get(
                url + "/metrics", headers={"Authorization": f"Bearer {keys['app']}"}) as resp:
            families = list(text_string_to_metric_families(await resp.text()))
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferd", "usage", "--by-version", "--config", str(path), "--format", "jsonl",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)      # beside the running daemon
        out_cli, err_cli = await cli.communicate()
        assert cli.returncode == 0, err_cli.decode()
    assert {line["response"]["body"]["model"].partition("+")[0] for line in out} == {"llama@int8"}
    prices = {"bf16": (2.0, 8.0), "int8": (0.5, 2.0)}
    by_tier: dict[str, float] = {}
    for row in rows:
        version = row["version"].partition("+")[0]
        prompt_price, completion_price = prices[version]
        assert row["cost"] == pytest.approx((row["prompt_tokens"] * prompt_price
                                             + row["completion_tokens"] * completion_price) / 1000)
        by_tier[version] = by_tier.get(version, 0.0) + row["cost"]
    assert sorted((r["tenant"], r["version"].partition("+")[0]) for r in rows) == \
        [("app", "bf16"), ("ops", "bf16"), ("ops", "int8"), ("ops", "int8"), ("ops", "int8")]
    spend = {s.labels["version"].partition("+")[0]: s.value for f in families if f.name == "inferd_spend"
             for s in f.samples if s.name == "inferd_spend_total"}
    assert spend == pytest.approx(by_tier)
    for listed in (totals, [json.loads(line) for line in out_cli.decode().splitlines()]):   # daily totals, per tier
        per_version: dict[str, float] = {}
        for total in listed:
            version = total["version"].partition("+")[0]
            per_version[version] = per_version.get(version, 0.0) + total["cost"]
        assert per_version == pytest.approx(by_tier)


async def served_version(url: str, key: str, **body) -> str:
    async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as sdk:
        raw = await sdk.completions.with_raw_response.create(model="chat", prompt="hi", max_tokens=2, **body)
        return raw.headers["X-Inferd-Model-Version"].partition("+")[0]


BREAKER = """
[models.llama.breaker]
min_requests = 3
error_rate = 0.5
slow_ttft_s = 0.000001
cooldown_s = 60
"""


async def test_while_a_tiers_version_breaker_is_open_its_requests_follow_the_split(tmp_path):
    path, keys = sim_tiers_config(tmp_path, BREAKER)       # every first token is "too slow": a failing version
    async with running(path) as (daemon, url):
        assert [await served_version(url, keys["bulk"]) for _ in range(3)] == ["int8"] * 3
        assert [k.partition("@")[2] for k in daemon.state.control.breakers.open_versions()] == ["int8"]
        assert await served_version(url, keys["bulk"]) == "bf16"       # not a 503, nor another model


async def test_a_tiers_requests_are_not_evidence_for_a_rollout_of_the_split(tmp_path):
    path, keys = sim_tiers_config(tmp_path)
    async with running(path) as (_, url), aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {keys['app']}"}) as http:
        async with http.post(f"{url}/admin/rollouts/chat/start",
                             json={"stable": "llama@bf16", "candidate": "llama@int8", "steps": [0.5, 1.0]}) as resp:
            assert resp.status == 200
        tiered = [await served_version(url, keys["app"]) for _ in range(4)]         # interactive: its tier
        split = [await served_version(url, keys["ops"], user=f"u{i}") for i in range(12)]
        async with http.get(f"{url}/admin/rollouts/chat") as resp:
            state = await resp.json()
    assert tiered == ["bf16"] * 4 and set(split) == {"bf16", "int8"}
    assert state["stable_window"]["requests"] == split.count("bf16")
    assert state["candidate_window"]["requests"] == split.count("int8")


async def test_a_reload_moves_a_tier_and_a_bad_tier_is_refused_naming_its_key(tmp_path):
    path, keys = sim_tiers_config(tmp_path)
    async with running(path) as (daemon, url):
        assert await served_version(url, keys["bulk"]) == "int8"
        text = path.read_text()
        path.write_text(text.replace('batch = "llama@int8"', 'batch = "llama@fp8"'))
        refused = await daemon.reload()
        assert not refused.ok and any(e.startswith("aliases.chat.tiers.batch: target 'llama@fp8': version 'fp8' "
                                                   "is not configured") for e in refused.errors), refused.errors
        assert await served_version(url, keys["bulk"]) == "int8"
        path.write_text(text.replace('batch = "llama@int8"', 'batch = { "llama@int8" = 0, "llama@bf16" = 1 }'))
        assert (await daemon.reload()).ok
        assert await served_version(url, keys["bulk"]) == "bf16"


async def test_under_a_memory_budget_a_tiers_version_loads_when_its_first_request_comes(tmp_path):
    path, keys = sim_tiers_config(tmp_path)
    text = path.read_text().replace("[server]\n", "[server]\nmodel_memory_bytes = 200\nmin_residency_s = 0\n", 1)
    path.write_text(text.replace('backend = "sim"', 'backend = "sim"\nmemory_bytes = 100', 1))
    async with running(path) as (daemon, url):
        assert not daemon.state.registry.table.versions                     # nothing loads before it is asked for
        assert await served_version(url, keys["ops"]) == "bf16"            # the split's version loads
        assert await served_version(url, keys["bulk"]) == "int8"           # then the batch tier's, not the split's
        assert sorted(k.version for k in daemon.state.registry.table.versions) == ["bf16", "int8"]
