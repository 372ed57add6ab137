"""Mirrors the pybind module tensorrt_llm.bindings (only what the double needs)."""
