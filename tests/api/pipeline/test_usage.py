"""inferd.api.pipeline.usage and /admin/usage: the ledger row of every request, through the real daemon."""
from __future__ import annotations

import json
import subprocess
import sys

import aiohttp

from inferd.config.root import load_config
from tests.daemon.harness import running_daemon, sim_model, until, write_config

PRICES = '[prices.sim]\nprompt_per_1k = 1.0\ncompletion_per_1k = 2.0\n'
BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 5, "temperature": 0}


def config_path(tmp_path, time_scale: float = 0.0):
    return write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=time_scale)}, PRICES)


async def rows(http, url, **query) -> list[dict]:
    async with http.get(url + "/admin/usage", params={"rows": "true", "format": "jsonl", **query}) as resp:
        assert resp.status == 200, await resp.text()
        return [json.loads(line) for line in (await resp.text()).splitlines()]


async def test_every_finished_request_is_in_the_ledger_when_its_response_has_ended(tmp_path):
    async with running_daemon(load_config(config_path(tmp_path))) as (_, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            usage = (await resp.json())["usage"]
        [row] = await rows(http, url)           # already committed: the response ended after the commit
        assert row["status"] == 200 and row["tenant"] == "local" and row["model"] == "sim"
        assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
        assert row["cost"] == (usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0) / 1000
        assert row["finish_reason"] == "length" and row["endpoint"] == "completions" and not row["stream"]
        assert row["queue_s"] is not None and row["total_s"] >= row["decode_s"] >= 0
        async with http.post(url + "/v1/chat/completions", json={
                "model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "stream": True}) as resp:
            text = await resp.text()
        assert text.endswith("data: [DONE]\n\n")
        streamed = (await rows(http, url))[-1]
        assert streamed["stream"] and streamed["endpoint"] == "chat.completions"
        assert streamed["completion_tokens"] == 3 and streamed["status"] == 200


async def test_an_abandoned_stream_is_billed_for_the_tokens_it_got_and_refusals_are_rows_too(tmp_path):
    cfg = load_config(config_path(tmp_path, time_scale=1.0))
    async with running_daemon(cfg) as (daemon, _, url), aiohttp.ClientSession() as http:
        long = {**BODY, "max_tokens": 400, "ignore_eos": True, "stream": True}
        async with http.post(url + "/v1/completions", json=long) as resp:
            for _ in range(5):
                await resp.content.readline()   # a few frames, then hang up
        for _ in range(200):
            got = await rows(http, url)
            if got:
                break
            await daemon.state.wait_idle(0.05)
        [row] = got
        assert row["status"] == 499 and 0 < row["completion_tokens"] < 400 and row["prompt_tokens"] > 0


async def test_admin_usage_totals_per_day_as_json_and_csv_and_the_cli_reads_the_same(tmp_path):
    path = config_path(tmp_path)
    async with running_daemon(load_config(path)) as (_, _, url), aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(url + "/v1/completions", json=BODY) as resp:
                assert resp.status == 200
        async with http.get(url + "/admin/usage") as resp:
            [total] = (await resp.json())["data"]
        assert total["requests"] == 3 and total["tenant"] == "local" and total["completion_tokens"] == 15
        async with http.get(url + "/admin/usage", params={"format": "csv", "tenant": "nobody"}) as resp:
            assert (await resp.text()).startswith("tenant,model,day,requests")
        async with http.get(url + "/admin/usage", params={"since": "yesterday"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "since"
        async with http.get(url + "/metrics") as resp:
            metrics = await resp.text()
        assert "inferd_store_rows_written_total" in metrics and 'inferd_tenant_spend_total{tenant="local"}' in metrics
        cli = subprocess.run([sys.executable, "-m", "inferd", "usage", "--config", str(path), "--format", "jsonl"],
                             capture_output=True, text=True, timeout=60)    # beside the running daemon
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout.splitlines()[0])["requests"] == 3


async def test_a_spent_budget_is_429_before_the_body_is_read_and_survives_a_restart(tmp_path):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                        PRICES + "[tenants.local]\nmax_spend = 0.02\nspend_period = \"day\"\n")
    async with running_daemon(load_config(path)) as (_, _, url), aiohttp.ClientSession() as http:
        statuses = []
        for _ in range(5):              # each costs (2 + 5 * 2) / 1000 = 0.012: the second crosses 0.02
            async with http.post(url + "/v1/completions", json=BODY) as resp:
                statuses.append(resp.status)
                body = await resp.json()
        assert statuses == [200, 200, 429, 429, 429]
        assert body["error"]["code"] == "budget_exceeded" and "daily budget of 0.02" in body["error"]["message"]
        assert int(resp.headers["Retry-After"]) > 0
    audit = (tmp_path / "audit.jsonl").read_text()
    assert audit.count('"tenant.budget_warning"') == 1          # crossing 80%: audited once
    async with running_daemon(load_config(path)) as (_, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 429                # the spend came back from the ledger
        async with http.get(url + "/metrics") as resp:
            assert 'inferd_tenant_budget_used_ratio{tenant="local"}' in await resp.text()


async def test_a_full_disk_withholds_what_it_cannot_record_refuses_new_work_and_recovers(tmp_path):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                        PRICES + "[store]\nunavailable_retry_s = 0.3\n")
    async with running_daemon(load_config(path)) as (daemon, _, url), aiohttp.ClientSession() as http:
        async def ready() -> bool:
            async with http.get(url + "/readyz") as resp:
                return resp.status == 200

        store = daemon.state.store
        [(pages,)] = await store.query("PRAGMA page_count")
        await store.execute(f"PRAGMA max_page_count = {pages}")     # the file cannot grow: SQLITE_FULL
        acknowledged = []
        for _ in range(500):                    # streams until the ledger's pages are full
            async with http.post(url + "/v1/completions", json={**BODY, "stream": True}) as resp:
                text = await resp.text()
            if not text.endswith("data: [DONE]\n\n"):
                break
            acknowledged.append(resp.headers["X-Request-Id"])
        assert acknowledged, "the first stream already failed"
        assert '"code":"store_unavailable"' in text.replace(" ", "") and "[DONE]" not in text

        async with http.post(url + "/v1/completions", data=b"not even json") as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1     # refused before the body
            assert (await resp.json())["error"]["code"] == "store_unavailable"
        async with http.get(url + "/readyz") as resp:
            assert resp.status == 503 and any("usage ledger" in r for r in (await resp.json())["reasons"])

        # The disk is still full: the store's ping says so, readiness stays 503 and requests are refused.
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 503 and (await resp.json())["error"]["code"] == "store_unavailable"
        async with http.post(url + "/v1/completions", json=BODY, headers={"Idempotency-Key": "k1"}) as resp:
            assert resp.status == 503 and (await resp.json())["error"]["code"] == "store_unavailable"

        await store.execute("PRAGMA max_page_count = 1073741823")   # room again
        await until(ready, "the refusal period to end")
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 200
            acknowledged.append(resp.headers["X-Request-Id"])
        recorded = {row["request_id"] for row in await rows(http, url)}
        assert set(acknowledged) <= recorded, "an acknowledged response is missing from the ledger"
        assert len(recorded) == len(acknowledged)                   # nothing withheld was recorded
