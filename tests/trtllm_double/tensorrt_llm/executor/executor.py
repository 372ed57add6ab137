"""Mirrors the error type of tensorrt_llm/executor/executor.py."""
from __future__ import annotations


class CppExecutorError(RuntimeError):
    """Fatal error of the C++ executor (trtllm-serve exits on it)."""
