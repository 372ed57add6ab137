"""How many KV blocks a torch engine on CUDA gets: vLLM's `gpu_memory_utilization`, per engine.

The engine may hold `utilization x total` bytes of the GPU: its weights (already loaded), the activations of
its largest step, the sampler's scratch, its decode graphs' logits, and the KV pool, which takes the rest.
The activations are measured by a profiling forward of a whole `max_num_tokens` prefill (the scheduler's
largest step) plus what that profile cannot see, added from the shapes: a prefill chunk after a cached
prefix gathers the whole context's K/V and a mask over it; prompt log-probabilities take float32 logits at
every position of a chunk. The pool also never takes more than the device has free, less those needs and a
margin, so engines sharing a GPU (several models, or a new version loading beside the old one) each get
their own share, and a share set too high fails at load rather than at the first long request.

Loads on one device take `device_lock`: the profile reads device-wide peak counters, and a graph capture
must not run beside another engine's profile.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from inferd.engine.scheduler import SchedulerOutput
from inferd.engine.sequence import Sequence
from inferd.engine.torch.inputs import StepInputs
from inferd.engine.torch.kv_pool import KVPool, blocks_for_budget
from inferd.engine.torch.model import TorchLlama

# Sampling at full batch holds a few [rows, vocab] float32 copies (the logits, sorted values, their cumsum)
SAMPLER_COPIES = 6
# Left free beyond every estimate: the CUDA context's growth, allocator fragmentation, cuBLAS workspaces
MARGIN_BYTES = 512 << 20

_locks: dict[int, threading.Lock] = {}
_locks_guard = threading.Lock()


def device_lock(device: torch.device) -> threading.Lock:
    """The lock one device's loads (profile, pool, graph capture) hold one at a time."""
    with _locks_guard:
        return _locks.setdefault(device.index or 0, threading.Lock())


def kv_blocks_from_memory(model: TorchLlama, *, block_size: int, utilization: float, max_num_tokens: int,
                          max_batch_size: int, max_model_len: int, graph_max_batch: int) -> int:
    """Blocks the KV pool may have on `model`'s CUDA device (call under `device_lock`)."""
    c, device = model.config, model.device
    per_block = KVPool.bytes_per_block(c.num_hidden_layers, block_size, c.num_key_value_heads, c.head_dim,
                                       model.dtype)
    activations = profile_activations(model, max_num_tokens, block_size)
    width = model.dtype.itemsize
    group = c.num_attention_heads // c.num_key_value_heads
    # a chunk after a cached prefix: K and V of the whole context gathered, a bool mask and SDPA's additive one
    cached_prefix = (2 * max_model_len * c.num_key_value_heads * c.head_dim * width
                     + group * max_num_tokens * max_model_len * (1 + width))
    prompt_logits = max_num_tokens * c.vocab_size * 4
    sampler = SAMPLER_COPIES * max_batch_size * c.vocab_size * 4
    # the graphs' shared logits buffer, and the largest graph's own logits inside their pool
    graphs = 2 * graph_max_batch * c.vocab_size * 4 if graph_max_batch else 0
    needs = activations + cached_prefix + prompt_logits + sampler + graphs
    free, total = torch.cuda.mem_get_info(device)
    share = int(total * utilization) - model.weight_bytes() - needs
    return blocks_for_budget(min(share, free - needs - MARGIN_BYTES), per_block)


def profile_activations(model: TorchLlama, num_tokens: int, block_size: int) -> int:
    """Peak bytes one prefill of `num_tokens` tokens allocates beyond what is already held (its scratch KV
    pool left out): what the largest step the scheduler makes needs while it runs."""
    device = model.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    blocks = -(-num_tokens // block_size)
    scratch = model.new_kv_pool(blocks, block_size)
    ids = np.arange(num_tokens, dtype=np.int64) % model.config.vocab_size
    out = SchedulerOutput(seqs=[Sequence("__profile__", ids.tolist())], num_new_tokens=[num_tokens],
                          token_ids=ids, positions=np.arange(num_tokens, dtype=np.int64),
                          slot_mapping=np.arange(num_tokens, dtype=np.int64), context_lens=[num_tokens],
                          block_tables=[list(range(blocks))], sample_rows=[0])
    with torch.no_grad():
        model.forward(StepInputs.build(out, device, [None]), scratch)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before - scratch.nbytes
    del scratch
    torch.cuda.empty_cache()
    return max(0, peak)

