"""The reference embedder on the tiny-embed artifact, and the model's dense pass against its paged one."""
from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest

from inferd.artifacts.manifest import ArtifactError, EmbeddingSpec, read_manifest
from inferd.engine.reference import ReferenceEmbedder
from inferd.engine.reference.embedder import EmbeddingInputError, embedding_spec, pool
from inferd.engine.reference.model import ForwardBatch, ForwardBatchError, LlamaModel

BLOCK = 4


@pytest.fixture(scope="module")
def embedder(tiny_embed_artifact: Path) -> ReferenceEmbedder:
    return ReferenceEmbedder.load(tiny_embed_artifact, verify=True)


def with_settings(embedder: ReferenceEmbedder, **settings) -> ReferenceEmbedder:
    """The same model and tokenizer under other [embedding] settings."""
    spec = msgspec.structs.replace(embedder.manifest.embedding, **settings)
    return ReferenceEmbedder(msgspec.structs.replace(embedder.manifest, embedding=spec), embedder.model,
                             embedder.tokenizer)


def random_inputs(lengths: list[int], seed: int, vocab: int = 512) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def paged_prefill(model: LlamaModel, prompts: list[list[int]]) -> np.ndarray:
    """forward() over all prompts as one prefill step, blocks shuffled: each prompt's last-token logits."""
    kv = model.new_kv_cache(num_blocks=256, block_size=BLOCK)
    free = np.random.default_rng(9).permutation(256).tolist()
    tables = [[free.pop() for _ in range(-(-len(p) // BLOCK))] for p in prompts]
    return model.forward(ForwardBatch(
        token_ids=np.concatenate(prompts), positions=np.concatenate([np.arange(len(p)) for p in prompts]),
        slot_mapping=np.concatenate([kv.slots_for_positions(t, np.arange(len(p))) for t, p in zip(tables, prompts)]),
        query_lens=[len(p) for p in prompts], context_lens=[len(p) for p in prompts], block_tables=tables), kv)


# --- what load gives ---------------------------------------------------------------------------

def test_the_embedder_describes_the_artifacts_embedding_settings(embedder: ReferenceEmbedder) -> None:
    assert (embedder.dimensions, embedder.max_model_len) == (64, 512)
    assert (embedder.pooling, embedder.normalize, embedder.matryoshka_min_dimensions) == ("last", True, 16)
    assert embedder.manifest.name == "tiny-embed"
    ids = embedder.tokenizer.encode("embed this")
    assert ids[0] == embedder.tokenizer.bos_token_id and ids[-1] == embedder.tokenizer.eos_token_ids[0]


def test_load_refuses_a_generative_artifact_naming_it(tiny_artifact: Path) -> None:
    with pytest.raises(ArtifactError, match=rf"^artifact tiny@{tiny_artifact.name} is not an embedding model "
                                            r"\(its manifest has no \[embedding\] table\)$") as info:
        ReferenceEmbedder.load(tiny_artifact, verify=False)
    assert info.value.file == "manifest.toml"


def test_load_with_verify_refuses_a_changed_file(tiny_embed_artifact: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_embed_artifact, tmp_path / "copy")
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    with pytest.raises(ArtifactError, match="config.json has changed"):
        ReferenceEmbedder.load(copy, verify=True)
    assert ReferenceEmbedder.load(copy, verify=False).dimensions == 64


def test_a_matryoshka_floor_wider_than_the_model_is_refused(tiny_embed_artifact: Path) -> None:
    manifest = read_manifest(tiny_embed_artifact)
    wide = msgspec.structs.replace(manifest, embedding=EmbeddingSpec(pooling="mean", matryoshka_min_dimensions=65))
    with pytest.raises(ArtifactError, match="matryoshka_min_dimensions 65 exceeds the model's hidden_size 64"):
        embedding_spec(wide)


# --- encode --------------------------------------------------------------------------------------

def test_encode_returns_one_unit_float32_vector_per_input(embedder: ReferenceEmbedder) -> None:
    vectors = embedder.encode(random_inputs([3, 1, 20], seed=1))
    assert vectors.shape == (3, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_an_embedding_is_the_pooled_then_normalized_final_hidden_state(embedder: ReferenceEmbedder,
                                                                       pooling: str) -> None:
    inputs = random_inputs([5, 12, 1], seed=2)
    hidden = [embedder.model.encode_hidden([ids])[0] for ids in inputs]
    pooled = np.stack([h[-1] if pooling == "last" else h.mean(axis=0) for h in hidden])

    got = with_settings(embedder, pooling=pooling).encode(inputs)

    np.testing.assert_allclose(got, pooled / np.linalg.norm(pooled, axis=1, keepdims=True), atol=1e-6)
    raw = with_settings(embedder, pooling=pooling, normalize=False).encode(inputs)
    np.testing.assert_allclose(raw, pooled, atol=1e-5)
    assert np.abs(np.linalg.norm(raw, axis=1) - 1.0).min() > 0.1, "unnormalized states happen to be unit vectors"


def test_last_and_mean_pooling_give_different_embeddings(embedder: ReferenceEmbedder) -> None:
    inputs = random_inputs([6, 9], seed=3)
    last, mean = (with_settings(embedder, pooling=p).encode(inputs) for p in ("last", "mean"))
    assert np.abs(last - mean).max() > 0.1


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_an_input_embeds_the_same_alone_and_batched_with_others_of_other_lengths(embedder: ReferenceEmbedder,
                                                                               pooling: str) -> None:
    embedder = with_settings(embedder, pooling=pooling)
    inputs = random_inputs([7, 1, 64, 3, 130, 7], seed=4)
    batched = embedder.encode(inputs)
    for i, ids in enumerate(inputs):
        assert np.abs(batched[i] - embedder.encode([ids])[0]).max() <= 1e-5, i


@pytest.mark.parametrize("batch, match", [
    ([], "the batch is empty"),
    ([[1, 2], []], "input 1 is empty"),
    ([[1, 512]], r"input 0 has a token id outside \[0, 512\)"),
    ([[3], [-1, 4]], r"input 1 has a token id outside \[0, 512\)"),
    ([[0.5]], r"input 0 has a token id outside"),
    ([[1] * 513], "input 0 has 513 tokens; this model takes at most 512"),
])
def test_inputs_the_model_cannot_take_are_refused_naming_the_input(embedder: ReferenceEmbedder, batch,
                                                                   match: str) -> None:
    with pytest.raises(EmbeddingInputError, match=match):
        embedder.encode(batch)
    assert issubclass(EmbeddingInputError, ValueError)


def test_the_longest_input_the_model_takes_is_encoded(embedder: ReferenceEmbedder) -> None:
    (vector,) = embedder.encode(random_inputs([512], seed=5))
    assert np.isfinite(vector).all()


# --- pool ------------------------------------------------------------------------------------------

def test_pool_leaves_a_zero_vector_zero_and_refuses_an_unknown_pooling() -> None:
    hidden = [np.zeros((3, 4), np.float32), np.array([[3.0, 4.0, 0.0, 0.0]], np.float32)]
    np.testing.assert_allclose(pool(hidden, "mean", True), [[0, 0, 0, 0], [0.6, 0.8, 0, 0]], atol=1e-7)
    with pytest.raises(ValueError, match="'cls'"):
        pool(hidden, "cls", True)


# --- the model's dense pass -------------------------------------------------------------------------

def test_dense_last_hidden_states_times_the_lm_head_are_the_paged_prefill_logits(embedder: ReferenceEmbedder) -> None:
    model = embedder.model
    prompts = random_inputs([1, 6, 13, 29], seed=6)
    hidden = model.encode_hidden(prompts)
    logits = paged_prefill(model, prompts)
    for i, h in enumerate(hidden):
        assert h.shape == (len(prompts[i]), 64)
        assert np.abs(h[-1] @ model.lm_head.T - logits[i]).max() <= 1e-4, i
    assert np.abs(logits).max() > 0.1, "logits too flat to tell positions apart"


def test_dense_hidden_states_at_every_position_match_the_paged_prefill_of_that_prefix(
        embedder: ReferenceEmbedder) -> None:
    model = embedder.model
    (prompt,) = random_inputs([17], seed=7)
    (hidden,) = model.encode_hidden([prompt])
    logits = paged_prefill(model, [prompt[:n] for n in range(1, 18)])
    assert np.abs(hidden @ model.lm_head.T - logits).max() <= 1e-4


@pytest.mark.parametrize("batch", [[], [[1], []], [[512]], [[-1]], [[0.5]]])
def test_encode_hidden_refuses_a_batch_it_cannot_run(embedder: ReferenceEmbedder, batch) -> None:
    with pytest.raises(ForwardBatchError):
        embedder.model.encode_hidden(batch)
