"""bench/gpu_check.py's parity phase: the torch engine against Hugging Face transformers on the same device.

A random Llama-3-shaped checkpoint (transformers' own model, saved and packed as an artifact):
1. Logits of every prompt position, TorchLlama's prefill against transformers': in float32 (relative error
   ||engine - hf|| / ||hf|| within 1e-3) and in bfloat16, where both sides round: the engine's bf16 error
   against the float32 reference must stay within twice transformers' own bf16 error (or 2e-2).
2. Greedy continuations through the whole TorchEngine (scheduler, paged pool, the decode graphs and the
   Triton kernel on CUDA, the device sampler), all prompts in one batch, in float32: every token equal to
   transformers' greedy loop. In bfloat16 the agreement is reported (near-ties may differ legitimately).
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from gpu_models import Shape, parity_checkpoint

PROMPT_LENS = (7, 33, 64, 100)
FLOAT32_TOLERANCE = 1e-3
BF16_FLOOR = 2e-2


def _relative_error(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def engine_prefill_logits(model, ids: list[int], device):
    """Every position's float32 logits from TorchLlama's prefill of `ids` into a fresh pool."""
    import torch

    from inferd.engine.scheduler import SchedulerOutput
    from inferd.engine.sequence import Sequence
    from inferd.engine.torch.inputs import StepInputs

    n = len(ids)
    blocks = -(-n // 16)
    pool = model.new_kv_pool(blocks, 16)
    out = SchedulerOutput(seqs=[Sequence("parity", list(ids))], num_new_tokens=[n],
                          token_ids=np.asarray(ids, dtype=np.int64), positions=np.arange(n, dtype=np.int64),
                          slot_mapping=np.arange(n, dtype=np.int64), context_lens=[n],
                          block_tables=[list(range(blocks))], sample_rows=[0])
    with torch.no_grad():
        _, full = model.forward_every(StepInputs.build(out, device, [None]), pool, [0])
    return full[0].float()


def hf_greedy(model, ids: list[int], steps: int, device) -> list[int]:
    import torch

    tokens = torch.tensor([ids], device=device)
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(tokens).logits[0, -1].argmax()
            tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return tokens[0, len(ids):].tolist()


async def engine_greedy(artifact: Path, prompts: list[list[int]], steps: int, device: str, dtype: str,
                        graphs: bool) -> list[list[int]]:
    from inferd.engine.torch.engine import TorchEngine
    from inferd.types import GenerationRequest, SamplingParams

    engine = TorchEngine(artifact, num_kv_blocks=256, device=device, dtype=dtype, cuda_graphs=graphs,
                         max_batch_size=8, max_num_tokens=512, max_model_len=1024)
    await engine.start()
    try:
        sampling = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
        streams = [engine.submit(GenerationRequest(request_id=f"parity-{dtype}-{i}", prompt_token_ids=tuple(p),
                                                   sampling=sampling)) for i, p in enumerate(prompts)]
        finals = await asyncio.gather(*(s.collect() for s in streams))
    finally:
        await engine.close()
    for final in finals:
        if final.error:
            raise RuntimeError(f"engine request failed: {final.error}")
    return [list(f.token_ids) for f in finals]


def _agreement(got: list[list[int]], want: list[list[int]]) -> float:
    """Share of tokens equal up to each sequence's first difference."""
    same = 0
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            if a != b:
                break
            same += 1
    return same / max(1, sum(len(w) for w in want))


async def parity(args, shape: Shape, work: Path) -> dict:
    import torch

    from inferd.engine.torch.model import TorchLlama

    device = torch.device(args.device)
    hf, artifact = parity_checkpoint(work / "parity-hf", work / "engines", "parity", shape)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(1, shape.vocab - 257, size=n).tolist() for n in PROMPT_LENS]
    result: dict = {"shape": shape.describe()}
    hf32 = hf.to(device)
    with torch.no_grad():
        ref = [hf32(torch.tensor([p], device=device)).logits[0].float() for p in prompts]
    want32 = [hf_greedy(hf32, p, args.parity_tokens, device) for p in prompts]
    errors = {}
    for dtype in ("float32", "bfloat16"):
        model = TorchLlama.from_pretrained(artifact, device=device, dtype=dtype)
        got = [engine_prefill_logits(model, p, device) for p in prompts]
        errors[dtype] = max(_relative_error(g, r) for g, r in zip(got, ref))
        del model
    hf16 = hf32.to(torch.bfloat16)
    with torch.no_grad():
        hf_bf16_error = max(_relative_error(hf16(torch.tensor([p], device=device)).logits[0].float(), r)
                            for p, r in zip(prompts, ref))
    want16 = [hf_greedy(hf16, p, args.parity_tokens, device) for p in prompts]
    del hf16, hf32, hf
    graphs = args.device != "cpu" and not args.enforce_eager
    got32 = await engine_greedy(artifact, prompts, args.parity_tokens, args.device, "float32", graphs)
    got16 = await engine_greedy(artifact, prompts, args.parity_tokens, args.device, "bfloat16", graphs)
    bf16_bound = max(2 * hf_bf16_error, BF16_FLOOR)
    result.update({"logits_rel_err_float32": errors["float32"], "logits_rel_err_bfloat16": errors["bfloat16"],
                   "hf_bf16_rel_err": hf_bf16_error, "bf16_bound": bf16_bound,
                   "greedy_float32_equal": got32 == want32, "greedy_float32_agreement": _agreement(got32, want32),
                   "greedy_bfloat16_agreement": _agreement(got16, want16)})
    result["ok"] = (errors["float32"] <= FLOAT32_TOLERANCE and errors["bfloat16"] <= bf16_bound
                    and got32 == want32)
    return result
