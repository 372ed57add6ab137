from ..executor import CompletionOutput, LoRARequest, RequestError
from ..sampling_params import GuidedDecodingParams, SamplingParams
from .llm import LLM, RequestOutput
from .llm_args import (BatchingType, BuildConfig, CapacitySchedulerPolicy, ContextChunkingPolicy,
                       DynamicBatchConfig, KvCacheConfig, SchedulerConfig)
from .quant_spec import (CalibConfig, DraftTargetDecodingConfig, EagleDecodingConfig, NGramDecodingConfig, QuantAlgo,
                         QuantConfig)

__all__ = ["LLM", "RequestOutput", "CompletionOutput", "LoRARequest", "RequestError", "SamplingParams",
           "GuidedDecodingParams", "BatchingType", "BuildConfig", "CapacitySchedulerPolicy",
           "ContextChunkingPolicy", "DynamicBatchConfig", "KvCacheConfig", "SchedulerConfig", "CalibConfig",
           "DraftTargetDecodingConfig", "EagleDecodingConfig", "NGramDecodingConfig", "QuantAlgo", "QuantConfig"]
