"""Test double of tensorrt_llm 1.2.x (see ../README.md). Not the real package."""
from .llmapi import LLM, BuildConfig, KvCacheConfig, SamplingParams, SchedulerConfig

__version__ = "1.2.1"
IS_TEST_DOUBLE = True

__all__ = ["LLM", "BuildConfig", "KvCacheConfig", "SamplingParams", "SchedulerConfig", "__version__"]
