"""The reference engine: a NumPy Llama decoder behind in-flight batching and a paged KV cache."""
from __future__ import annotations

from inferd.engine.reference.adapter_registry import check_adapter
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.reference.model import ForwardBatch, LlamaModel

__all__ = ["ForwardBatch", "LlamaModel", "ReferenceEngine", "check_adapter"]
