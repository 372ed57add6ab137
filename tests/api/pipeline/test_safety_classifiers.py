"""Classifier plugins through the real daemon: an `inferd.safety` entry point (a package installed on the
path for this test) judges input and, chunk by chunk, output."""
from __future__ import annotations

import sys

import openai
import pytest
from openai import AsyncOpenAI

from tests.daemon.harness import running, sim_model, write_config

PLUGIN = '''
FLAG = set()

class Guard:
    async def check(self, text, *, stage, tenant):
        return "S9: test" if any(word in text for word in FLAG | {"flagme"}) else None
'''
POLICY = """
[tenants.local]
policy = "guarded"
[policies.guarded.input]
classifiers = ["guard"]
[policies.guarded.output]
classifiers = ["guard"]
classify_every_chars = 16
"""


@pytest.fixture
def guard(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    (plugins / "inferd_test_guard-1.0.dist-info").mkdir(parents=True)
    (plugins / "inferd_test_guard.py").write_text(PLUGIN)
    (plugins / "inferd_test_guard-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: inferd-test-guard\nVersion: 1.0\n")
    (plugins / "inferd_test_guard-1.0.dist-info" / "entry_points.txt").write_text(
        "[inferd.safety]\nguard = inferd_test_guard:Guard\n")
    monkeypatch.syspath_prepend(str(plugins))
    yield
    sys.modules.pop("inferd_test_guard", None)


async def test_a_classifier_plugin_refuses_input_and_stops_output_chunk_by_chunk(tmp_path, guard):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, POLICY)
    request = {"model": "small", "prompt": "tell me", "max_tokens": 40, "temperature": 0,
               "extra_body": {"ignore_eos": True}}
    async with running(path) as (_, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.completions.create(model="small", prompt="please flagme now", max_tokens=2)
            chunks = [c async for c in await sdk.completions.create(**request, stream=True)]
            full = "".join(c.choices[0].text for c in chunks if c.choices)
            assert chunks[-1].choices[0].finish_reason == "length"      # nothing flagged: all of it, judged
            banned = full.split()[len(full.split()) // 2]
            sys.modules["inferd_test_guard"].FLAG.add(banned)
            chunks = [c async for c in await sdk.completions.create(**request, stream=True)]
    assert refused.value.body["code"] == "content_filter" and "classifier guard: S9" in refused.value.body["message"]
    sent = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    assert full.startswith(sent) and banned not in sent
