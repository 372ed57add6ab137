"""ReferenceEngine: the NumPy Llama decoder (reference.runner) behind the shared step engine, on the CPU."""
from __future__ import annotations

from pathlib import Path

from inferd.engine.reference.runner import ReferenceRunner
from inferd.engine.step_engine import StepEngine


class ReferenceEngine(StepEngine):
    """A StepEngine (continuous batching, paged KV, prefix cache, LoRA, grammars) over float32 NumPy.
    `num_kv_blocks` sizes its KV cache (float32 K and V for every layer)."""

    backend = "reference"
    hardware = "cpu"

    def __init__(self, artifact_dir: Path, *, num_kv_blocks: int, **options) -> None:
        if num_kv_blocks is None:
            raise ValueError("num_kv_blocks must be an integer >= 1, got None")
        super().__init__(artifact_dir, num_kv_blocks=num_kv_blocks, **options)

    def _make_runner(self) -> ReferenceRunner:
        draft = self._speculation.draft_dir if self._speculation is not None else None
        return ReferenceRunner.load(self.artifact_dir, self._num_kv_blocks, self._block_size,
                                    Path(draft) if draft is not None else None)
