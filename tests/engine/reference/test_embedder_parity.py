"""Embeddings against Hugging Face transformers' LlamaModel (AutoModel) on the same checkpoint (the `parity` extra).

transformers' side is what decoder embedding models' model cards do: last_hidden_state (after the final
norm), pooled from the last token or as the mean over tokens, then torch.nn.functional.normalize.
"""
from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from inferd.engine.reference import ReferenceEmbedder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5")

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pair(tiny_embed_artifact: Path) -> tuple[ReferenceEmbedder, object]:
    theirs = transformers.AutoModel.from_pretrained(tiny_embed_artifact, dtype=torch.float32).eval()
    assert type(theirs).__name__ == "LlamaModel"
    return ReferenceEmbedder.load(tiny_embed_artifact, verify=True), theirs


def hf_embedding(model, ids: list[int], pooling: str) -> np.ndarray:
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0]
        pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_match_transformers_llama_model_pooled_and_normalized(pair, pooling: str) -> None:
    ours, theirs = pair
    spec = msgspec.structs.replace(ours.manifest.embedding, pooling=pooling)
    ours = ReferenceEmbedder(msgspec.structs.replace(ours.manifest, embedding=spec), ours.model, ours.tokenizer)
    rng = np.random.default_rng(1)
    inputs = [ours.tokenizer.encode("A short sentence to embed, with some words.")]
    inputs += [rng.integers(0, ours.model.config.vocab_size, n).tolist() for n in (1, 4, 17, 60)]

    got = ours.encode(inputs)

    for i, ids in enumerate(inputs):
        assert np.abs(got[i] - hf_embedding(theirs, ids, pooling)).max() <= TOLERANCE, i
    assert np.abs(got[1:] @ got[1:].T - np.eye(4)).max() > 0.05, "embeddings too alike to tell inputs apart"
