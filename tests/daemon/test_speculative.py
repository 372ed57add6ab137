"""Speculative decoding through the real daemon: a model's [speculative] table, the official SDK's requests
(with and without the per-request opt-out) and the Prometheus series an operator reads."""
from __future__ import annotations

import shutil

import aiohttp
import pytest
from openai import AsyncOpenAI

from inferd.config.root import parse_config
from tests.daemon.harness import running_daemon
from tests.engine.speculative.copying import copying_prompts


def config(copying_model, speculative: dict | None):
    artifact, _ = copying_model
    model = {"artifact": artifact.parent.name, "max_batch_size": 4, "max_num_tokens": 64, "num_kv_blocks": 64}
    if speculative is not None:
        model["speculative"] = speculative
    return parse_config({"server": {"port": 0, "engines_root": str(artifact.parent.parent)},
                         "models": {"copy": model}})


async def completions(url: str, prompts: list[list[int]], **extra) -> list[str]:
    async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        texts = []
        for prompt in prompts:
            stream = await sdk.completions.create(model="copy", prompt=prompt, max_tokens=24, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True, **extra})
            texts.append("".join([c.choices[0].text async for c in stream if c.choices]))
        return texts


async def test_a_speculating_model_streams_the_same_text_and_reports_its_acceptance(copying_model):
    prompts = copying_prompts(copying_model[1])[:3]
    async with running_daemon(config(copying_model, None)) as (_, _, url):
        expected = await completions(url, prompts)
    async with running_daemon(config(copying_model, {"num_speculative_tokens": 3, "prompt_lookup_min": 1})) as (
            daemon, _, url):
        assert await completions(url, prompts, speculative=False) == expected
        assert daemon.state.engines["copy"].stats().speculation.draft_tokens == 0       # opted out: no drafts
        assert await completions(url, prompts) == expected
        async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
            metrics = await resp.text()
    series = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("inferd_spec_decode_")}
    assert series["inferd_spec_decode_accepted_tokens_total"] > 0
    assert series["inferd_spec_decode_draft_tokens_total"] == (
        series["inferd_spec_decode_accepted_tokens_total"] + series["inferd_spec_decode_wasted_tokens_total"])
    assert 0 < series["inferd_spec_decode_acceptance_ratio"] <= 1
    assert series["inferd_spec_decode_tokens_per_verification"] > 1


async def test_the_opt_out_must_be_a_boolean(copying_model):
    async with running_daemon(config(copying_model, {})) as (_, _, url):
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json={
                "model": "copy", "prompt": "x", "max_tokens": 2, "speculative": "no"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "speculative"


async def test_a_draft_model_named_in_the_config_is_loaded_from_engines_root_and_used(copying_model, tmp_path):
    from inferd.artifacts.build.copying import build_copying

    artifact, successor = copying_model
    root = tmp_path / "engines"
    shutil.copytree(artifact.parent, root / artifact.parent.name)
    draft = build_copying("tiny", root, draft=True)[0]
    cfg = parse_config({"server": {"port": 0, "engines_root": str(root)},
                        "models": {"copy": {"artifact": artifact.parent.name, "num_kv_blocks": 64, "max_batch_size": 4,
                                            "speculative": {"method": "draft_model", "num_speculative_tokens": 3,
                                                            "draft_model": f"{draft.parent.name}@{draft.name}"}}}})
    prompts = copying_prompts(successor)[:2]
    async with running_daemon(config(copying_model, None)) as (_, _, url):
        expected = await completions(url, prompts)
    async with running_daemon(cfg) as (daemon, _, url):
        assert await completions(url, prompts) == expected
        stats = daemon.state.engines["copy"].stats().speculation
        assert stats.accepted_tokens > 0.8 * stats.draft_tokens > 0


async def test_the_sim_reports_modelled_speculation_in_the_same_series(tmp_path):
    cfg = parse_config({"server": {"port": 0}, "models": {"sim": {
        "backend": "sim", "sim": {"profile": "tiny", "time_scale": 0.0},
        "speculative": {"num_speculative_tokens": 4, "acceptance_rate": 0.6}}}})
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 20,
                                                            "ignore_eos": True}) as resp:
            assert resp.status == 200
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
    ratio = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("inferd_spec_decode_acceptance_ratio{"))
    assert ratio == pytest.approx(0.6 * (1 - 0.6 ** 4) / (1 - 0.6) / 4, rel=0.05)      # (E - 1) / k
