"""Mirrors tensorrt_llm/sampling_params.py (fields @a98a9061): a kw_only, slots dataclass.

Tensor-typed fields are typed `object` here (no torch dependency); names and defaults are the real ones.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Union


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: Optional[object] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    json_object: bool = False
    structural_tag: Optional[str] = None

    def _validate(self):
        num_guides = sum(bool(getattr(self, name)) for name in ("json", "regex", "grammar", "json_object",
                                                                "structural_tag"))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    bad: Optional[Union[str, List[str]]] = None
    bad_token_ids: Optional[List[int]] = None
    _bad_word_ids: Optional[List[List[int]]] = field(default=None, init=False, repr=False)
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: bool = False
    _stop_word_ids: Optional[List[List[int]]] = field(default=None, init=False, repr=False)

    embedding_bias: Optional[object] = None
    logits_processor: Optional[object] = None
    apply_batched_logits_processor: bool = False

    n: int = 1
    best_of: Optional[int] = None
    use_beam_search: bool = False

    top_k: Optional[int] = None
    top_p: Optional[float] = None
    top_p_min: Optional[float] = None
    top_p_reset_ids: Optional[int] = None
    top_p_decay: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    min_tokens: Optional[int] = None
    beam_search_diversity_rate: Optional[float] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    length_penalty: Optional[float] = None
    early_stopping: Optional[int] = None
    no_repeat_ngram_size: Optional[int] = None
    min_p: Optional[float] = None
    beam_width_array: Optional[List[int]] = None

    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: Optional[List[object]] = None

    _context_logits_auto_enabled: bool = False
    _generation_logits_auto_enabled: bool = False
    _return_log_probs: bool = False

    lookahead_config: Optional[object] = None
    guided_decoding: Optional[GuidedDecodingParams] = None

    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    _stream_interval: Optional[int] = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self):
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.best_of > 1 and self._greedy_decoding and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING"):
            raise ValueError(f"Greedy decoding in the LLM API does not allow multiple returns. "
                             f"Please set to best_of=1, got best_of={self.best_of}.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @property
    def _greedy_decoding(self) -> bool:
        return (not self.use_beam_search and (self.top_k is None or self.top_k == 1)
                and (self.top_p is None or self.top_p == 0.0))

    def _setup(self, tokenizer, add_special_tokens: bool = False) -> "SamplingParams":
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id
            if self.pad_id is None:
                self.pad_id = self.end_id
        if self.stop is not None:
            strs = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in strs]
        if self.bad is not None:
            strs = [self.bad] if isinstance(self.bad, str) else self.bad
            self._bad_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in strs]
        return self

    def _get_stop_reasons_and_words(self):
        reasons: list = list(self.stop_token_ids or [])
        words: list = [[i] for i in (self.stop_token_ids or [])]
        if self.stop is not None:
            strs = [self.stop] if isinstance(self.stop, str) else list(self.stop)
            if self._stop_word_ids is None:
                raise RuntimeError(f"{type(self).__name__}.stop ({self.stop}) is not processed by tokenizer, "
                                   "please call the setup method.")
            reasons.extend(strs)
            words.extend(self._stop_word_ids)
        return list(zip(reasons, words))

    # C++ SamplingConfig checks (samplingConfig.cpp): a violation fails at enqueue.
    def _check_sampling_config(self) -> None:
        checks = [
            (self.top_k is None or self.top_k >= 0, "topK >= 0"),
            (self.top_p is None or 0.0 < self.top_p <= 1.0, "topP in (0, 1]"),
            (self.temperature is None or self.temperature >= 0.0, "temperature >= 0"),
            (self.min_p is None or 0.0 <= self.min_p <= 1.0, "minP in [0, 1]"),
            (self.repetition_penalty is None or self.repetition_penalty > 0.0, "repetitionPenalty > 0"),
        ]
        for ok, what in checks:
            if not ok:
                raise RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: {what}")
        # The C++ SamplingConfig takes randomSeed as uint64: pybind11 refuses anything outside it
        # when the worker builds the request, so the request fails at enqueue.
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise RuntimeError("__init__(): incompatible constructor arguments (randomSeed must be an "
                               f"unsigned 64-bit integer, got {self.seed})")
