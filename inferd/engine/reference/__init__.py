"""The reference engine: a NumPy Llama decoder behind in-flight batching and a paged KV cache."""
