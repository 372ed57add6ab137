"""Run by test_engine_on_triton.py in a subprocess with TRITON_INTERPRET=1 (set before triton is imported):
the whole TorchEngine on the CPU with its decode attention swapped for the Triton kernel (what CUDA runs),
decode steps through the graph ladder's buffers. Prints each request's greedy token ids as one JSON line."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from inferd.engine.base import Engine
from inferd.types import GenerationRequest, SamplingParams

# the engines compared: the same pool and batch shape
SHAPE = dict(num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=32)


async def greedy_outputs(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation, all submitted at once (batched), on a started engine."""
    streams = [engine.submit(GenerationRequest(
        request_id=f"g{i}", prompt_token_ids=tuple(ids), tenant=f"g{i}",
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))
        for i, ids in enumerate(prompts)]
    return [list((await s.collect()).token_ids) for s in streams]


async def main(artifact: Path, dtype: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from inferd.engine.torch.engine import TorchEngine
    from inferd.engine.torch.triton_attention import paged_decode_attention    # under TRITON_INTERPRET=1

    engine = TorchEngine(artifact, device="cpu", dtype=dtype, cuda_graphs=True, **SHAPE)
    await engine.start()
    try:
        engine._runner.model.decode_attention = paged_decode_attention
        return await greedy_outputs(engine, prompts, max_tokens)
    finally:
        await engine.close()


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(main(Path(request["artifact"]), request["dtype"], request["prompts"],
                                      request["max_tokens"]))))
