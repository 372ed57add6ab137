"""The TensorRT-LLM backend (LLM API 1.2.x): the engine, each request's stream, executor stats."""
from __future__ import annotations

from inferd.engine.trtllm.engine import INSTALL_HINT, TrtllmEngine
from inferd.engine.trtllm.loras import check_trtllm_adapter

__all__ = ["INSTALL_HINT", "TrtllmEngine", "check_trtllm_adapter"]
