"""The reference engine: a NumPy Llama decoder behind in-flight batching and a paged KV cache; and its embedder."""
from __future__ import annotations

from inferd.engine.reference.adapter_registry import check_adapter
from inferd.engine.reference.embedder import ReferenceEmbedder
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.reference.model import ForwardBatch, LlamaModel
from inferd.engine.reference.quantize import quantize_artifact
from inferd.engine.reference.scoring import compare

__all__ = ["ForwardBatch", "LlamaModel", "ReferenceEmbedder", "ReferenceEngine", "check_adapter", "compare",
           "quantize_artifact"]
