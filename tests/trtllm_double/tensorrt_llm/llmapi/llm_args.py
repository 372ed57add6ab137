"""Mirrors tensorrt_llm/llmapi/llm_args.py: strict config models and TrtLlmArgs validation."""
from __future__ import annotations

import enum
from typing import List, Optional

from pydantic import BaseModel, ConfigDict


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacitySchedulerPolicy(str, enum.Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(str, enum.Enum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class BatchingType(str, enum.Enum):
    STATIC = "STATIC"
    INFLIGHT = "INFLIGHT"


class DynamicBatchConfig(StrictBaseModel):
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    max_attention_window: Optional[List[int]] = None
    sink_token_length: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = 0.9
    host_cache_size: Optional[int] = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: Optional[float] = None
    secondary_offload_min_priority: Optional[int] = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: int = 0
    dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    tokens_per_block: int = 32


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: Optional[ContextChunkingPolicy] = None
    dynamic_batch_config: Optional[DynamicBatchConfig] = None


class BuildConfig(StrictBaseModel):
    """The numeric part of tensorrt_llm.builder.BuildConfig the LLM API build uses."""

    max_input_len: int = 1024
    max_seq_len: Optional[int] = None
    max_batch_size: int = 2048
    max_beam_width: int = 1
    max_num_tokens: int = 8192
    opt_num_tokens: Optional[int] = None


# BaseLlmArgs + TrtLlmArgs field names (llm_args.py@7b437aaa). Anything else is rejected.
TRT_LLM_ARG_NAMES = frozenset("""
model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code tensor_parallel_size dtype revision
tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node moe_cluster_parallel_size
moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp cp_config load_format
kv_cache_config scheduler_config enable_chunked_prefill max_batch_size max_num_tokens max_seq_len
max_input_len max_beam_width enable_lora lora_config peft_cache_config iter_stats_max_iterations
request_stats_max_iterations return_perf_metrics gather_generation_logits num_postprocess_workers
postprocess_tokenizer_dir guided_decoding_backend batched_logits_processor speculative_config
cache_transceiver_config reasoning_parser orchestrator_type decoding_config mpi_session backend
enable_tqdm workspace enable_build_cache extended_runtime_perf_knob_config calib_config quant_config
embedding_parallel_mode fast_build build_config enable_prompt_adapter max_prompt_adapter_token
batching_type normalize_log_probs
""".split())


def validate_trt_llm_args(kwargs: dict) -> None:
    for key in kwargs:
        if key not in TRT_LLM_ARG_NAMES:
            raise ValueError(f"TrtLlmArgs got invalid argument: {key}")
    for key, cls in (("kv_cache_config", KvCacheConfig), ("scheduler_config", SchedulerConfig),
                     ("build_config", BuildConfig)):
        value = kwargs.get(key)
        if value is not None and not isinstance(value, cls):
            raise ValueError(f"{key} must be a {cls.__name__}, got {type(value).__name__}")
    kv = kwargs.get("kv_cache_config")
    if kv is not None:
        if kv.dtype != "auto":
            raise ValueError("KvCacheConfig.dtype is not supported by the TensorRT backend")
        if kv.free_gpu_memory_fraction is not None and not 0.0 < kv.free_gpu_memory_fraction < 1.0:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: freeGpuMemoryFraction must be in (0, 1)")
        if kv.max_tokens is not None and kv.max_tokens <= 0:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: maxTokens must be > 0")
