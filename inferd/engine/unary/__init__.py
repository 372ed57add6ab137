"""Unary (one-shot) engines: embeddings batched by a deadline-aware dynamic batcher."""
from __future__ import annotations

from inferd.engine.unary.compute_model import ComputeModel
from inferd.engine.unary.engine import BatchRecord, Encoder, LoadedEncoder, Policy, UnaryEngine
from inferd.engine.unary.policy import DeadlineAware, FixedWindow, Limits, NoBatching, Pending, Plan

__all__ = ["BatchRecord", "ComputeModel", "DeadlineAware", "Encoder", "FixedWindow", "Limits", "LoadedEncoder",
           "NoBatching", "Pending", "Plan", "Policy", "UnaryEngine"]
