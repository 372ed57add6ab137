"""The Llama-family decoder (transformers' LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) in PyTorch over a
paged KV pool, on CUDA or the CPU, in float32, float16 or bfloat16: the reference NumPy decoder's layers with
its config (LlamaConfig) and checkpoint reader, weights on the device in the model dtype.

Numerics follow transformers in the model dtype: RMSNorm upcasts to float32 and rounds before its weight
(F.rms_norm does exactly LlamaRMSNorm's steps), rotary cos/sin are computed in float32 and rounded to the
model dtype, the residual stream stays in the model dtype; logits are returned in float32. QKV and gate/up
are fused at load, as the reference does.

Three entry points: `forward` (one scheduler step, StepInputs: decode rows and prefill chunks packed
together, LoRA deltas per adapter), `forward_every` (plus every prompt position's logits, for prompt
log-probabilities), and `decode_forward` (DecodeInputs: one token per row, fixed shapes, nothing read back
to the host, so a CUDA graph can capture it).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.reference.lora import LoraWeights
from inferd.engine.reference.weights import Checkpoint
from inferd.engine.torch.attention import DecodeAttention, decode_attention_for, prefill_attention
from inferd.engine.torch.inputs import DecodeInputs, StepInputs
from inferd.engine.torch.int8 import Int8Weight, embedding, linear
from inferd.engine.torch.weights import CheckpointWeights, RandomWeights
from inferd.engine.torch.kv_pool import KVPool
from inferd.engine.torch.lora import TorchLora, torch_lora

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class TorchModelError(ValueError):
    """A device or dtype this decoder cannot run on, or step inputs that do not fit the model or its pool."""


# attend(layer, q [T, heads, D], k [T, kv_heads, D], v) -> [T, heads, D]; q, k rotated, q not yet scaled
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    wqkv: torch.Tensor                 # [(heads + 2 kv_heads) * head_dim, hidden]: q, k, v stacked
    bqkv: torch.Tensor | None
    qk_norm: torch.Tensor | None       # [heads + kv_heads, head_dim]: q_norm's weight per q head, k_norm's per k head
    wo: torch.Tensor                   # [hidden, heads * head_dim]
    bo: torch.Tensor | None
    mlp_norm: torch.Tensor
    wgu: torch.Tensor                  # [2 * intermediate, hidden]: gate then up
    bgu: torch.Tensor | None
    wd: torch.Tensor                   # [hidden, intermediate]
    bd: torch.Tensor | None


def resolve(device: torch.device | str, dtype: torch.dtype | str) -> tuple[torch.device, torch.dtype]:
    """The device and dtype a model runs on, refused with a TorchModelError when this machine cannot."""
    device = torch.device(device)
    dtype = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in DTYPES.values():
        raise TorchModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TorchModelError("device 'cuda' was asked for, but torch sees no CUDA device "
                              f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    if device.type not in ("cuda", "cpu"):
        raise TorchModelError(f"device must be 'cuda' or 'cpu', got {str(device)!r}")
    if device.type == "cuda" and device.index is None:       # "cuda" and "cuda:0" must compare equal later
        device = torch.device("cuda", torch.cuda.current_device())
    return device, dtype


class TorchLlama:
    def __init__(self, config: LlamaConfig, weights, device: torch.device, dtype: torch.dtype) -> None:
        c = self.config = config
        self.device, self.dtype = device, dtype
        hd, heads, kv, hidden, inter = (c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.hidden_size,
                                        c.intermediate_size)
        self.embed = weights.get("model.embed_tokens.weight", (c.vocab_size, hidden))
        self.lm_head = self.embed if c.tie_word_embeddings else weights.get("lm_head.weight", (c.vocab_size, hidden))
        self.final_norm = weights.get("model.norm.weight", (hidden,))
        qkv_sizes = [heads * hd, kv * hd, kv * hd]
        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{n}_proj" for n in "qkv"]
            mlp = [p + "mlp.gate_proj", p + "mlp.up_proj"]
            self.layers.append(_Layer(
                attn_norm=weights.get(p + "input_layernorm.weight", (hidden,)),
                wqkv=weights.fused([n + ".weight" for n in attn], [(s, hidden) for s in qkv_sizes]),
                bqkv=weights.fused([n + ".bias" for n in attn], [(s,) for s in qkv_sizes]) if c.qkv_bias else None,
                qk_norm=self._head_norms(weights, p) if c.qk_norm else None,
                wo=weights.get(p + "self_attn.o_proj.weight", (hidden, heads * hd)),
                bo=weights.get(p + "self_attn.o_proj.bias", (hidden,)) if c.o_bias else None,
                mlp_norm=weights.get(p + "post_attention_layernorm.weight", (hidden,)),
                wgu=weights.fused([n + ".weight" for n in mlp], [(inter, hidden)] * 2),
                bgu=weights.fused([n + ".bias" for n in mlp], [(inter,)] * 2) if c.mlp_bias else None,
                wd=weights.get(p + "mlp.down_proj.weight", (hidden, inter)),
                bd=weights.get(p + "mlp.down_proj.bias", (hidden,)) if c.mlp_bias else None))
        self._inv_freq = torch.from_numpy(c.inv_freq()).to(device)
        self._scale = hd ** -0.5
        # the paged decode attention (Triton on CUDA, SDPA on the CPU); tests may put another in its place
        self.decode_attention: DecodeAttention = decode_attention_for(device)

    def _head_norms(self, weights, prefix: str) -> torch.Tensor:
        c = self.config
        q, k = (weights.get(prefix + f"self_attn.{n}_norm.weight", (c.head_dim,)) for n in "qk")
        return torch.cat((q.expand(c.num_attention_heads, -1), k.expand(c.num_key_value_heads, -1)))

    @classmethod
    def from_pretrained(cls, path: Path | str, *, device: torch.device | str,
                        dtype: torch.dtype | str) -> TorchLlama:
        """An HF-layout directory (config.json + *.safetensors, sharded or not, f32/f16/bf16), as the reference
        loads."""
        device, dtype = resolve(device, dtype)
        path = Path(path)
        config = LlamaConfig.from_json(path / "config.json")
        return cls(config, CheckpointWeights(Checkpoint(path), device, dtype), device, dtype)

    @classmethod
    def dummy(cls, config: LlamaConfig, *, device: torch.device | str, dtype: torch.dtype | str,
              seed: int = 0) -> TorchLlama:
        """Random weights made on the device (vLLM's load_format "dummy"): a model of any shape, for benchmarks."""
        device, dtype = resolve(device, dtype)
        return cls(config, RandomWeights(device, dtype, seed), device, dtype)

    def weight_bytes(self) -> int:
        """Bytes of the weights on the device (a tied LM head counted once)."""
        held = [self.embed, self.lm_head, self.final_norm]
        for layer in self.layers:
            held.extend(t for t in (getattr(layer, f.name) for f in fields(layer)) if t is not None)
        tensors = {}
        for t in held:
            for part in (t.tensors() if isinstance(t, Int8Weight) else (t,)):
                tensors[part.data_ptr()] = part
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def new_kv_pool(self, num_blocks: int, block_size: int) -> KVPool:
        c = self.config
        return KVPool(num_layers=c.num_hidden_layers, num_blocks=num_blocks, block_size=block_size,
                      num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, dtype=self.dtype, device=self.device)

    def lora(self, weights: LoraWeights | None) -> TorchLora | None:
        """An adapter in this model's device and dtype (converted once, cached while `weights` lives)."""
        return None if weights is None else torch_lora(weights, self.config, self.device, self.dtype)

    # -- the forward passes ----------------------------------------------------------------------
    def forward(self, step: StepInputs, pool: KVPool) -> torch.Tensor:
        """One scheduler step (K/V written to `pool`): float32 [num_seqs, vocab], each sequence's last token."""
        x = self._step_hidden(step, pool)
        return self._logits(x.index_select(0, step.last_rows))

    def forward_every(self, step: StepInputs, pool: KVPool,
                      every: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`forward`, plus float32 [query_len, vocab] logits at every new token of the sequences `every`
        (indexes into the step): what prompt log-probabilities need. Only those rows pay the LM head."""
        x = self._step_hidden(step, pool)
        starts = [sum(step.query_lens[:i]) for i in every]
        full = [self._logits(x[s:s + step.query_lens[i]]) for s, i in zip(starts, every)]
        return self._logits(x.index_select(0, step.last_rows)), full

    def decode_forward(self, inputs: DecodeInputs, pool: KVPool) -> torch.Tensor:
        """One decode step over B fixed rows (padding included): float32 [B, vocab]. Graph-capturable: fixed
        shapes, no host sync, no branch on tensor values; padding rows write K/V only where their slot_mapping
        points (the scratch slot) and attend nothing (the decode attention returns zeros for them)."""
        self._check_pool(pool)
        rows = inputs.token_ids.shape[0]
        if any(t.shape[0] != rows for t in (inputs.positions, inputs.slot_mapping, inputs.block_tables,
                                           inputs.context_lens)):
            raise TorchModelError("DecodeInputs' tensors must all have one row per batch row")

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            pool.write(layer, inputs.slot_mapping, k, v)
            return self.decode_attention(q * self._scale, pool.k[layer], pool.v[layer], inputs.block_tables,
                                         inputs.context_lens)

        return self._logits(self._layers(inputs.token_ids, inputs.positions, attend, []))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(hidden, (self.config.hidden_size,), self.final_norm, self.config.rms_norm_eps)
        return linear(normed, self.lm_head).float()

    def _step_hidden(self, step: StepInputs, pool: KVPool) -> torch.Tensor:
        """The layers over one step's packed rows, K/V written to `pool`: the residual stream [T, hidden]."""
        self._check_step(step, pool)
        length = pool.block_size
        masks = [None if span.context_len == span.end - span.start else
                 torch.arange(span.blocks.shape[0] * length, device=self.device)[None, :]
                 <= step.positions[span.start:span.end, None] for span in step.prefill]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            pool.write(layer, step.slot_mapping, k, v)
            k_cache, v_cache = pool.k[layer], pool.v[layer]
            out = torch.empty_like(q)
            if step.decode_block_tables is not None:
                rows = step.decode_rows
                decode_q = (q if rows is None else q.index_select(0, rows)) * self._scale
                found = self.decode_attention(decode_q, k_cache, v_cache, step.decode_block_tables,
                                              step.decode_context_lens)
                if rows is None:
                    return found
                out.index_copy_(0, rows, found)
            for span, mask in zip(step.prefill, masks):
                out[span.start:span.end] = prefill_attention(q[span.start:span.end], k_cache, v_cache,
                                                             span.blocks, mask)
            return out

        return self._layers(step.token_ids, step.positions, attend, step.loras)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim] in the model dtype, computed in float32 as transformers does."""
        angles = positions.float()[:, None] * self._inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)[:, None, :]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _layers(self, token_ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                lora: list[tuple[TorchLora, slice | torch.Tensor]]) -> torch.Tensor:
        """The decoder layers over packed rows; the residual stream [T, hidden] before the final norm."""
        c = self.config
        rows, heads, kv, hd, eps = token_ids.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim, \
            c.rms_norm_eps
        cos, sin = self._rotary(positions)
        x = embedding(token_ids, self.embed)
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, (c.hidden_size,), layer.attn_norm, eps)
            qkv = linear(h, layer.wqkv, layer.bqkv)
            for adapter, at in lora:
                adapter.add(index, "qkv", h, qkv, at)
            qk = qkv[:, :(heads + kv) * hd].view(rows, heads + kv, hd)      # q and k rotated together
            if layer.qk_norm is not None:
                qk = F.rms_norm(qk, (hd,), None, eps) * layer.qk_norm       # as LlamaRMSNorm: round, then weight
            qk = _rotate(qk, cos, sin)
            v = qkv[:, (heads + kv) * hd:].view(rows, kv, hd)
            attn = attend(index, qk[:, :heads], qk[:, heads:], v).reshape(rows, heads * hd)
            out = linear(attn, layer.wo, layer.bo)
            for adapter, at in lora:
                adapter.add(index, "o", attn, out, at)
            x = x + out
            h = F.rms_norm(x, (c.hidden_size,), layer.mlp_norm, eps)
            gate_up = linear(h, layer.wgu, layer.bgu)
            for adapter, at in lora:
                adapter.add(index, "gate_up", h, gate_up, at)
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
            out = linear(act, layer.wd, layer.bd)
            for adapter, at in lora:
                adapter.add(index, "down", act, out, at)
            x = x + out
        return x

    # -- checks (host-side facts only: nothing here waits on the device) ---------------------------
    def _check_pool(self, pool: KVPool) -> None:
        c = self.config
        if (pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype, pool.device) != \
                (c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.device):
            raise TorchModelError("the KV pool was not made for this model (use model.new_kv_pool)")

    def _check_step(self, step: StepInputs, pool: KVPool) -> None:
        self._check_pool(pool)
        if step.max_token_id >= self.config.vocab_size:
            raise TorchModelError(f"token ids must lie in [0, {self.config.vocab_size}), got {step.max_token_id}")
        if step.max_block_id >= pool.num_blocks or step.max_slot >= pool.scratch_slot:
            raise TorchModelError(f"block ids must lie in [0, {pool.num_blocks}) and slots below "
                                  f"{pool.scratch_slot}; got block {step.max_block_id}, slot {step.max_slot}")
        for i, (blocks, context) in enumerate(zip(step.block_counts, step.context_lens)):
            if blocks * pool.block_size < context:
                raise TorchModelError(f"sequence {i}: context_len {context} needs more than its {blocks} blocks")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [T, heads, D] (transformers' rotate_half form, in x's dtype)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
