"""The API over the reference engine (NumPy decoder, HF tokenizer and chat template): the default backend."""
from __future__ import annotations

import pytest

from inferd.engine.reference.engine import ReferenceEngine


@pytest.fixture
async def reference(serve, tiny_artifact):
    engine = ReferenceEngine(tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=64)
    return await serve({"tiny": engine})


async def test_chat_stream_and_completion_over_the_reference_engine(reference):
    sdk = reference.sdk
    messages = [{"role": "user", "content": "hello"}]
    whole = await sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    assert whole.model == f"tiny@{reference.engine.info.version}"
    assert whole.usage.completion_tokens <= 6
    stream = await sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                               stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    raw = await sdk.completions.with_raw_response.create(model="tiny", prompt="abc", max_tokens=3, seed=3)
    assert "X-Inferd-Simulated" not in raw.headers and raw.parse().usage.prompt_tokens > 0
