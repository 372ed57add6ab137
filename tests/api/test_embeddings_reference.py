"""/v1/embeddings on the reference engine (the synthetic tiny-embed Llama checkpoint) through the real
daemon: what the SDK gets equals the model's own pooled embedding, alone or batched with others."""
from __future__ import annotations

import asyncio

import numpy as np
from openai import AsyncOpenAI

from inferd.engine.reference import ReferenceEmbedder
from tests.daemon.harness import running


async def test_vectors_are_the_models_pooled_embeddings_alone_or_batched(tmp_path, tiny_embed_artifact):
    path = tmp_path / "c.toml"
    path.write_text(f'[server]\nport = 0\nengines_root = "{tiny_embed_artifact.parent.parent}"\n'
                    f'[audit]\npath = "audit.jsonl"\n[models.emb]\nartifact = "tiny-embed"\ntask = "embed"\n'
                    f'max_batch_size = 8\nmax_num_tokens = 512\n[models.emb.batching]\nlatency_target_ms = 200\n')
    texts = ["a short one", "a somewhat longer input about nothing much", "x"]
    async with running(path) as (daemon, url):
        engine = daemon.state.engines["emb"]
        assert (engine.info.backend, engine.info.task, engine.info.dimensions) == ("reference", "embed", 64)
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            alone = [(await sdk.embeddings.create(model="emb", input=t)).data[0].embedding for t in texts]
            together = await sdk.embeddings.create(model="emb", input=texts)
            crowd = await asyncio.gather(*[sdk.embeddings.create(model="emb", input=[t, f"noise {i}"])
                                           for i, t in enumerate(texts)])
    embedder = ReferenceEmbedder.load(tiny_embed_artifact, verify=False)
    expected = embedder.encode([embedder.tokenizer.encode(t) for t in texts])
    np.testing.assert_allclose(np.array(alone), expected, atol=1e-5)
    np.testing.assert_allclose(np.array([d.embedding for d in together.data]), expected, atol=1e-5)
    np.testing.assert_allclose(np.array([c.data[0].embedding for c in crowd]), expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(expected, axis=1), 1.0, atol=1e-5)
