"""The torch engine's runner: TorchLlama, its paged KV pool, the decode graphs and the device sampler.

One step: forked blocks copied, then either a decode-only step replayed from the captured batch ladder
(graphs) or the eager forward over the packed step (prefill chunks, mixed steps, LoRA, prompt logprobs,
batches past the ladder), then sampling on the device with one host transfer (TorchSampler). Nothing here
waits on the device except that transfer, and it runs on the engine's step thread, never the event loop.

KV pool size on CUDA without a block count: inferd.engine.torch.memory.
"""
from __future__ import annotations

import contextlib
import gc

import numpy as np
import torch

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.runner import StepResult, prompt_logit_rows
from inferd.engine.scheduler import SchedulerOutput
from inferd.engine.sequence import Sequence
from inferd.engine.speculative.verify import kept_by_argmax, verify_row
from inferd.engine.torch.graphs import DecodeGraphs, batch_ladder
from inferd.engine.torch.inputs import StepInputs, StepInputsError
from inferd.engine.torch.kv_pool import KVPool
from inferd.engine.torch.memory import kv_blocks_from_memory
from inferd.engine.torch.model import TorchLlama
from inferd.engine.torch.sampler import TorchSampler
from inferd.engine.torch.upload import to_device

_NO_CONTEXT = contextlib.nullcontext()
_ACCELERATOR_ERRORS = tuple(e for e in (getattr(torch, "AcceleratorError", None),) if e is not None)


class KVPoolTooSmall(RuntimeError):
    """The memory left for the KV pool holds less than one longest sequence."""


class TorchRunner:
    """A ModelRunner (inferd.engine.runner) in PyTorch on one device."""

    def __init__(self, model: TorchLlama) -> None:
        self.model = model
        self.config: LlamaConfig = model.config
        self.device = model.device
        self.sampler = TorchSampler(model.device, model.config.vocab_size)
        self.pool: KVPool | None = None
        self.graphs: DecodeGraphs | None = None
        self.drafter = None        # a DraftModel over a TorchDraft: guesses the drafts the scheduler made room for

    # -- set-up (loader thread) ------------------------------------------------------------
    def allocate(self, num_blocks: int | None, block_size: int, *, gpu_memory_utilization: float,
                 max_num_tokens: int, max_batch_size: int, max_model_len: int, graph_max_batch: int = 0) -> int:
        """Make the KV pool: `num_blocks` of them, or (None, CUDA only, under memory.device_lock) what this
        engine's share of the GPU leaves (inferd.engine.torch.memory). Returns the count made."""
        if num_blocks is None:
            if self.device.type != "cuda":
                raise ValueError("the KV pool is sized from GPU memory on CUDA only; give num_kv_blocks on the CPU")
            num_blocks = kv_blocks_from_memory(
                self.model, block_size=block_size, utilization=gpu_memory_utilization, max_num_tokens=max_num_tokens,
                max_batch_size=max_batch_size, max_model_len=max_model_len, graph_max_batch=graph_max_batch)
            needed = -(-max_model_len // block_size)
            if num_blocks < needed:
                raise KVPoolTooSmall(
                    f"gpu_memory_utilization {gpu_memory_utilization} leaves room for {max(num_blocks, 0)} KV blocks "
                    f"of {block_size} tokens, fewer than one {max_model_len}-token sequence needs ({needed}); "
                    f"raise it, lower max_model_len, or free the GPU of other work")
        self.pool = self.model.new_kv_pool(num_blocks, block_size)
        return num_blocks

    def compile_kernels(self) -> None:
        """CUDA: the decode kernel's variants compiled at load, not in a step (inferd.engine.torch.triton_attention)."""
        if self.device.type != "cuda":
            return
        from inferd.engine.torch.triton_attention import paged_decode_attention, precompile

        if self.model.decode_attention is paged_decode_attention:
            c = self.config
            q = torch.zeros((1, c.num_attention_heads, c.head_dim), dtype=self.model.dtype, device=self.device)
            with torch.no_grad():
                precompile(q, self.pool.k[0], self.pool.v[0])

    def capture(self, max_batch_size: int, max_model_len: int, block_size: int) -> None:
        """Decode graphs for the batch ladder up to `max_batch_size` (captured on CUDA; static buffers on CPU)."""
        pool = self.pool
        self.graphs = DecodeGraphs(lambda inputs: self.model.decode_forward(inputs, pool),
                                   batch_sizes=batch_ladder(max_batch_size),
                                   max_blocks_per_seq=-(-max_model_len // block_size),
                                   vocab_size=self.config.vocab_size, scratch_slot=pool.scratch_slot,
                                   device=self.device)
        with torch.no_grad():
            self.graphs.capture()

    def release(self) -> None:
        """Drop the weights, pool and graphs (a closed engine's memory goes back to the device)."""
        self.graphs = self.pool = None
        self.model = None
        if self.device.type == "cuda":
            gc.collect()            # tensors held only by reference cycles (a closed engine's) go first
            torch.cuda.empty_cache()

    def fatal(self, exc: Exception) -> bool:
        """A CUDA fault (a device-side assert, an illegal address) poisons the context for good; running out
        of memory does not."""
        if isinstance(exc, torch.OutOfMemoryError):
            return False
        return isinstance(exc, _ACCELERATOR_ERRORS) or (isinstance(exc, RuntimeError) and "CUDA error" in str(exc))

    def memory_bytes(self) -> int:
        if self.model is None:
            return 0
        drafter = self.drafter.memory_bytes() if self.drafter is not None else 0
        return self.model.weight_bytes() + (self.pool.nbytes if self.pool is not None else 0) + drafter

    # -- a step (step thread) --------------------------------------------------------------
    def execute(self, out: SchedulerOutput) -> StepResult:
        # the step thread's current CUDA device is its own: Triton launches on the current one
        with torch.no_grad(), (torch.cuda.device(self.device) if self.device.type == "cuda" else _NO_CONTEXT):
            return self._execute(out)

    def _execute(self, out: SchedulerOutput) -> StepResult:
        pool = self.pool
        for src, dst in out.block_copies:       # forked sequences' partial blocks, before they are read
            pool.copy_block(src, dst)
        every = prompt_logit_rows(out)
        prompt_logits: list[tuple[Sequence, int, np.ndarray]] = []
        draft_logits: dict[int, torch.Tensor] = {}
        draft_probs = self.drafter.guess(out) if out.draft_rows and self.drafter is not None else None
        logits = None if every else self._replay_decode(out)     # a draft row computes > 1 token: not replayed
        if logits is None:
            loras = [self.model.lora(seq.lora) for seq in out.seqs]
            step = StepInputs.build(out, self.device, loras)
            if every or out.draft_rows:
                logits, full = self.model.forward_every(step, pool, every + out.draft_rows)
                # rare (prompt logprobs): a transfer of its own, read by the host as NumPy
                prompt_logits = [(out.seqs[i], out.seqs[i].num_computed_tokens, chunk.float().cpu().numpy())
                                 for i, chunk in zip(every, full)]
                draft_logits = dict(zip(out.draft_rows, full[len(every):]))
            else:
                logits = self.model.forward(step, pool)
        rows = out.sample_rows
        if len(rows) != len(out.seqs):
            logits = logits.index_select(0, to_device(np.asarray(rows, dtype=np.int64), logits.device))
        picked = [out.seqs[r] for r in rows]
        if draft_logits:
            return self._verify(logits, rows, picked, draft_logits, prompt_logits, draft_probs)
        tokens, logprobs = self.sampler.sample(logits, picked)
        return StepResult(tokens, logprobs, prompt_logits)

    def _verify(self, logits: torch.Tensor, rows: list[int], picked: list[Sequence],
                draft_logits: dict[int, torch.Tensor], prompt_logits, draft_probs=None) -> StepResult:
        """A step with drafts: rows without one sampled on the device as usual; a greedy draft row verified
        from its argmax ids, a sampled one from its logits on the host (inferd.engine.speculative.verify)."""
        plain = [j for j, row in enumerate(rows) if row not in draft_logits]
        tokens = [0] * len(rows)
        logprobs: list = [None] * len(rows)
        if plain:
            index = to_device(np.asarray(plain, dtype=np.int64), logits.device)
            found, found_lp = self.sampler.sample(logits.index_select(0, index), [picked[j] for j in plain])
            for j, token, logprob in zip(plain, found, found_lp):
                tokens[j], logprobs[j] = token, logprob
        kept: list[list[int]] = []
        for j, (row, seq) in enumerate(zip(rows, picked)):
            chunk = draft_logits.get(row)
            if chunk is None:
                kept.append([])
            elif seq.sampling.greedy:
                drafts, tokens[j] = kept_by_argmax(chunk.argmax(dim=1).tolist(), seq.draft)
                kept.append(drafts)
            else:
                q = draft_probs.get(row) if draft_probs else None
                drafts, tokens[j] = verify_row(chunk.float().cpu().numpy(), seq.draft, seq.sampling, seq.rng, q)
                kept.append(drafts)
        return StepResult(tokens, logprobs, prompt_logits, kept)

    def _check_decode(self, out: SchedulerOutput) -> None:
        """What the eager path's StepInputs checks, for the graphs: on CUDA an id out of range would be a
        device-side assert, fatal to every engine in the process."""
        pool = self.pool
        blocks = max(max(t, default=0) for t in out.block_tables)
        if (int(out.token_ids.max()) >= self.config.vocab_size or int(out.token_ids.min()) < 0
                or int(out.slot_mapping.max()) >= pool.scratch_slot or int(out.slot_mapping.min()) < 0
                or blocks >= pool.num_blocks):
            raise StepInputsError(f"a decode step's token, slot or block id is out of range "
                                  f"(vocab {self.config.vocab_size}, {pool.num_blocks} blocks)")

    def _replay_decode(self, out: SchedulerOutput) -> torch.Tensor | None:
        """The logits of a decode-only step from the graphs, or None when it is not one they can run."""
        graphs = self.graphs
        if graphs is None or any(n != 1 for n in out.num_new_tokens) or any(s.lora is not None for s in out.seqs):
            return None
        width = max(len(t) for t in out.block_tables)
        if not graphs.fits(len(out.seqs), width):
            return None
        self._check_decode(out)
        # the graphs pack the ragged tables into their own pinned buffer: no padded copy here first
        return graphs.run(out.token_ids, out.positions, out.slot_mapping, out.block_tables, out.context_lens)
