"""Embeddings from a Llama-family checkpoint, as decoder embedding models (e5-mistral, gte-Qwen) make them.

Each input's final hidden states (after the last RMSNorm) are pooled, from the last token or as the mean
over all tokens, then L2-normalized when the manifest's `[embedding]` table says so. Every input of a
batch goes through the model in one packed pass; each attends only to itself, so an input's embedding
does not depend on what it was batched with.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from inferd.artifacts import (
    MANIFEST_FILE,
    ArtifactError,
    EmbeddingSpec,
    Manifest,
    read_manifest,
    verify_artifact,
)
from inferd.engine.reference.model import LlamaModel
from inferd.engine.tokenization import HFTokenizer


class EmbeddingInputError(ValueError):
    """A batch to encode that the model cannot take (empty, a token id out of range, too long)."""


def pool(hidden_states: Sequence[np.ndarray], pooling: str, normalize: bool) -> np.ndarray:
    """One vector per sequence from its hidden states ([len_i, dim] each): float32 [num_seqs, dim].

    `pooling` "last" takes the last token's state, "mean" the mean over all tokens; `normalize` scales
    each vector to unit L2 norm (a zero vector stays zero).
    """
    if pooling == "last":
        pooled = np.stack([h[-1] for h in hidden_states])
    elif pooling == "mean":
        pooled = np.stack([h.mean(axis=0, dtype=np.float32) for h in hidden_states])
    else:
        raise ValueError(f"pooling must be 'last' or 'mean', not {pooling!r}")
    pooled = pooled.astype(np.float32, copy=False)
    if normalize:
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled = pooled / np.maximum(norms, np.float32(1e-12))
    return pooled


def embedding_spec(manifest: Manifest) -> EmbeddingSpec:
    """The manifest's `[embedding]` table; ArtifactError when there is none or it does not fit the model."""
    spec, who = manifest.embedding, f"artifact {manifest.name}@{manifest.version}"
    if spec is None:
        raise ArtifactError(f"{who} is not an embedding model (its manifest has no [embedding] table)", MANIFEST_FILE)
    floor, hidden = spec.matryoshka_min_dimensions, manifest.architecture.hidden_size
    if floor is not None and floor > hidden:
        raise ArtifactError(f"{who}: embedding.matryoshka_min_dimensions {floor} exceeds the model's hidden_size "
                            f"{hidden}", MANIFEST_FILE)
    return spec


class ReferenceEmbedder:
    """An embedding artifact loaded for encoding. Blocking: call `encode` from a worker thread, one at a time."""

    def __init__(self, manifest: Manifest, model: LlamaModel, tokenizer: HFTokenizer) -> None:
        spec, config = embedding_spec(manifest), model.config
        self.manifest = manifest
        self.model = model
        self.tokenizer = tokenizer
        self.dimensions: int = config.hidden_size
        self.max_model_len: int = config.max_position_embeddings
        self.pooling: str = spec.pooling
        self.normalize: bool = spec.normalize
        self.matryoshka_min_dimensions: int | None = spec.matryoshka_min_dimensions

    @classmethod
    def load(cls, artifact_dir: Path, *, verify: bool) -> ReferenceEmbedder:
        """The artifact's manifest (every file checked against it when `verify`), weights and tokenizer.
        ArtifactError when it is not an embedding model (checked before any weight is read)."""
        manifest = verify_artifact(artifact_dir) if verify else read_manifest(artifact_dir)
        embedding_spec(manifest)
        return cls(manifest, LlamaModel.from_pretrained(artifact_dir), HFTokenizer.from_dir(artifact_dir))

    def encode(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [len(batch), dimensions]: each input's pooled (and, per the manifest, normalized) embedding."""
        self.check(batch)
        return pool(self.model.encode_hidden(batch), self.pooling, self.normalize)

    def check(self, batch: Sequence[Sequence[int]]) -> None:
        """EmbeddingInputError naming the first input the model cannot take."""
        if len(batch) == 0:
            raise EmbeddingInputError("nothing to encode: the batch is empty")
        vocab = self.model.config.vocab_size
        for i, ids in enumerate(batch):
            if len(ids) == 0:
                raise EmbeddingInputError(f"input {i} is empty: an embedding needs at least one token")
            if len(ids) > self.max_model_len:
                raise EmbeddingInputError(f"input {i} has {len(ids)} tokens; this model takes at most "
                                          f"{self.max_model_len}")
            arr = np.asarray(ids)
            if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() >= vocab:
                raise EmbeddingInputError(f"input {i} has a token id outside [0, {vocab})")
