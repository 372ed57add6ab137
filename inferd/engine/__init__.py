"""The Engine contract (submit, abort, capacity, stats) and its backends: reference (NumPy), sim, TensorRT-LLM.

Backends are imported from their own subpackages (`inferd.engine.reference`, `.sim`, `.trtllm`, `.unary`)
so that naming the contract does not load a model runtime.
"""
from __future__ import annotations

from inferd.engine.adapter_signing import AdapterSignatureError, check_adapter_signature, resolve_adapter_source
from inferd.engine.adapters import (
    AdapterBusy,
    AdapterError,
    AdapterHost,
    AdapterInfo,
    AdapterLoadError,
    UnknownAdapter,
)
from inferd.engine.base import (
    Capacity,
    Engine,
    EngineError,
    EngineInfo,
    EngineStats,
    EngineUnavailable,
    InvalidRequest,
    SpeculationStats,
)
from inferd.engine.grammar import DEAD_END, GrammarError, Grammars, GrammarState, GrammarUnavailable
from inferd.engine.loading import run_load, startup_loads
from inferd.engine.stream import RequestStream, StreamWrapper, add_logprobs, merge_deltas
from inferd.engine.tokenization import HFTokenizer, TokenizerLoadError
from inferd.engine.validation import LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS, PENALTY_RANGE

__all__ = [
    "AdapterBusy", "AdapterError", "AdapterHost", "AdapterInfo", "AdapterLoadError", "AdapterSignatureError",
    "Capacity", "DEAD_END", "Engine", "EngineError", "EngineInfo", "EngineStats", "EngineUnavailable", "GrammarError",
    "GrammarState", "GrammarUnavailable", "Grammars", "HFTokenizer",
    "InvalidRequest", "LOGIT_BIAS_RANGE", "MAX_LOGIT_BIAS", "PENALTY_RANGE", "RequestStream", "SpeculationStats",
    "StreamWrapper", "TokenizerLoadError", "UnknownAdapter", "add_logprobs", "check_adapter_signature", "merge_deltas",
    "resolve_adapter_source", "run_load", "startup_loads",
]
