"""The torch engine's runner: TorchLlama, its paged KV pool, the decode graphs and the device sampler.

One step: forked blocks copied, then either a decode-only step replayed from the captured batch ladder
(graphs) or the eager forward over the packed step (prefill chunks, mixed steps, LoRA, prompt logprobs,
batches past the ladder), then sampling on the device with one host transfer (TorchSampler). Nothing here
waits on the device except that transfer, and it runs on the engine's step thread, never the event loop.

KV pool size on CUDA (`allocate` without a block count), as vLLM's gpu_memory_utilization: a profiling
forward of a whole `max_num_tokens` prefill measures the activations' peak; the pool gets
`utilization x total - (what the device already holds) - that peak - the sampler's scratch - the decode
graphs' logits`.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.runner import StepResult, prompt_logit_rows
from inferd.engine.scheduler import SchedulerOutput
from inferd.engine.sequence import Sequence
from inferd.engine.torch.graphs import DecodeGraphs, batch_ladder
from inferd.engine.torch.inputs import StepInputs
from inferd.engine.torch.kv_pool import KVPool, blocks_for_budget
from inferd.engine.torch.model import TorchLlama
from inferd.engine.torch.sampler import TorchSampler

_MiB = 1 << 20
# Sampling at full batch holds a few [rows, vocab] float32 copies (the logits, sorted values, their cumsum)
_SAMPLER_COPIES = 6


_NO_CONTEXT = contextlib.nullcontext()


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

    # -- set-up (loader thread) ------------------------------------------------------------
    def allocate(self, num_blocks: int | None, block_size: int, *, gpu_memory_utilization: float,
                 max_num_tokens: int, max_batch_size: int, min_blocks: int, graph_max_batch: int = 0) -> int:
        """Make the KV pool: `num_blocks` of them, or (None, CUDA only) as many as the memory left allows
        once the decode graphs up to `graph_max_batch` rows (0: none) have their logits. Returns the count made."""
        if num_blocks is None:
            graph_rows = sum(batch_ladder(graph_max_batch)) if graph_max_batch else 0
            num_blocks = self._blocks_from_memory(block_size, gpu_memory_utilization, max_num_tokens,
                                                  max_batch_size, graph_rows)
            if num_blocks < min_blocks:
                raise KVPoolTooSmall(
                    f"gpu_memory_utilization {gpu_memory_utilization} leaves room for {num_blocks} KV blocks of "
                    f"{block_size} tokens, fewer than one {min_blocks * block_size}-token sequence needs; raise it, "
                    f"lower max_model_len or use a smaller dtype")
        self.pool = self.model.new_kv_pool(num_blocks, block_size)
        return num_blocks

    def _blocks_from_memory(self, block_size: int, utilization: float, max_num_tokens: int,
                            max_batch_size: int, graph_rows: int) -> int:
        if self.device.type != "cuda":
            raise ValueError("the KV pool is sized from free memory on CUDA only; give num_kv_blocks on the CPU")
        c = self.config
        per_block = KVPool.bytes_per_block(c.num_hidden_layers, block_size, c.num_key_value_heads, c.head_dim,
                                           self.model.dtype)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self._profile_forward(max_num_tokens, block_size)
        torch.cuda.synchronize(self.device)
        activations = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        sampler = _SAMPLER_COPIES * max_batch_size * c.vocab_size * 4
        # each captured size keeps its own float32 [size, vocab] logits in the graphs' pool; the pool's
        # activations are a decode batch's, below the profiled prefill's (kept free by `activations`)
        graph_logits = graph_rows * c.vocab_size * 4
        budget = int(total * utilization) - (total - free) - activations - sampler - graph_logits
        return blocks_for_budget(budget, per_block)

    def _profile_forward(self, num_tokens: int, block_size: int) -> None:
        """One prefill of `num_tokens` tokens through a scratch pool: the largest step the scheduler makes."""
        blocks = -(-num_tokens // block_size)
        scratch = self.model.new_kv_pool(blocks, block_size)
        ids = np.arange(num_tokens, dtype=np.int64) % self.config.vocab_size
        out = SchedulerOutput(seqs=[Sequence("__profile__", ids.tolist())], num_new_tokens=[num_tokens],
                              token_ids=ids, positions=np.arange(num_tokens, dtype=np.int64),
                              slot_mapping=np.arange(num_tokens, dtype=np.int64), context_lens=[num_tokens],
                              block_tables=[list(range(blocks))], sample_rows=[0])
        with torch.no_grad():
            self.model.forward(StepInputs.build(out, self.device, [None]), scratch)
        del scratch

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
            torch.cuda.empty_cache()

    def memory_bytes(self) -> int:
        if self.model is None:
            return 0
        return self.model.weight_bytes() + (self.pool.nbytes if self.pool is not None else 0)

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
        logits = None if every else self._replay_decode(out)
        if logits is None:
            loras = [self.model.lora(seq.lora) for seq in out.seqs]
            step = StepInputs.build(out, self.device, loras)
            if every:
                logits, full = self.model.forward_every(step, pool, every)
                # rare (prompt logprobs): a transfer of its own, read by the host as NumPy
                prompt_logits = [(out.seqs[i], out.seqs[i].num_computed_tokens, chunk.float().cpu().numpy())
                                 for i, chunk in zip(every, full)]
            else:
                logits = self.model.forward(step, pool)
        rows = out.sample_rows
        if len(rows) != len(out.seqs):
            logits = logits[torch.as_tensor(rows, dtype=torch.long, device=logits.device)]
        picked = [out.seqs[r] for r in rows]
        tokens, logprobs = self.sampler.sample(logits, picked)
        return StepResult(tokens, logprobs, prompt_logits)

    def _replay_decode(self, out: SchedulerOutput) -> torch.Tensor | None:
        """The logits of a decode-only step from the graphs, or None when it is not one they can run."""
        graphs = self.graphs
        if graphs is None or any(n != 1 for n in out.num_new_tokens) or any(s.lora is not None for s in out.seqs):
            return None
        width = max(len(t) for t in out.block_tables)
        if not graphs.fits(len(out.seqs), width):
            return None
        tables = np.zeros((len(out.seqs), width), dtype=np.int32)
        for i, table in enumerate(out.block_tables):
            tables[i, :len(table)] = table
        return graphs.run(out.token_ids, out.positions, out.slot_mapping, tables,
                          np.asarray(out.context_lens, dtype=np.int32))
