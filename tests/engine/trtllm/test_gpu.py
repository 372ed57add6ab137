"""The engine conformance suite on a real GPU with real TensorRT-LLM (never runs on CI machines).

Run on a GPU node after building an engine (docs/gpu.md):

    INFERD_TRTLLM_ENGINE_DIR=engines/llama3-8b-trt/<version> python -m pytest -m gpu tests/engine/trtllm/test_gpu.py

Optional: INFERD_TRTLLM_TOKENIZER_DIR (default: the engine directory), INFERD_TRTLLM_KV_TOKENS (default
8192: a small KV pool keeps capacity effects visible). Runtime caps are small for the same reason.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# The checks are the conformance suite's own functions, collected here against the real backend.
from tests.engine.test_conformance import (  # noqa: F401
    test_abort_ends_stream_with_abort_and_frees_capacity,
    test_capacity_goes_down_while_requests_run_and_back_up_after,
    test_close_ends_in_flight_streams_with_abort,
    test_final_delta_carries_usage_and_ordered_timing,
    test_greedy_output_is_reproducible,
    test_idle_capacity_matches_info,
    test_invalid_request_names_its_param_and_leaves_others_running,
    test_max_tokens_ends_with_length,
    test_more_concurrent_requests_than_slots_all_finish,
    test_repeated_prompt_reports_cached_tokens_in_whole_blocks,
    test_seeded_sampling_is_reproducible_whatever_else_is_batched,
    test_stop_string_ends_generation_and_never_leaks,
    test_stop_token_id_ends_generation,
    test_stream_cancel_aborts_the_request,
    test_stream_deltas_assemble_to_final_text_and_decoded_ids,
)

ENGINE_DIR = os.environ.get("INFERD_TRTLLM_ENGINE_DIR")


def _real_tensorrt_llm() -> bool:
    if not ENGINE_DIR or importlib.util.find_spec("tensorrt_llm") is None:
        return False
    import tensorrt_llm
    return not getattr(tensorrt_llm, "IS_TEST_DOUBLE", False)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _real_tensorrt_llm(),
                       reason="needs real tensorrt_llm and INFERD_TRTLLM_ENGINE_DIR (a GPU node; see docs/gpu.md)"),
]


@pytest.fixture
async def engine():
    from inferd.engine.trtllm.engine import TrtllmEngine

    tokenizer_dir = os.environ.get("INFERD_TRTLLM_TOKENIZER_DIR")
    started = TrtllmEngine(Path(ENGINE_DIR), tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None,
                           max_batch_size=4, max_num_tokens=512,
                           kv_cache_max_tokens=int(os.environ.get("INFERD_TRTLLM_KV_TOKENS", "8192")))
    await started.start()
    try:
        await started.warmup()
        yield started
    finally:
        await started.close()
