"""Engines: reference (NumPy), sim (timed simulator), trtllm (TensorRT-LLM LLM API)."""
