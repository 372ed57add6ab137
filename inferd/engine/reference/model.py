"""The Llama-family decoder (HF transformers' LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) in float32
NumPy over a paged KV cache. The families differ only in which projections have biases and in Qwen3's
per-head q/k RMSNorm before RoPE (LlamaConfig's switches).

One `forward` is one engine step over a packed continuous batch: every linear layer runs once over
all T scheduled tokens (QKV and gate/up fused at load), attention reads each sequence's context
through its block table, and the LM head runs only on each sequence's last token.

`encode_hidden` runs the same layers over whole sequences with dense causal attention and no KV
cache, and returns every token's final hidden state (what an embedding model pools).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd.engine.reference.config import LlamaConfig
from inferd.engine.reference.dense_attention import causal_attention
from inferd.engine.reference.int8 import Int8Matrix
from inferd.engine.reference.kv_cache import AttentionPlan, KVCacheError, PagedKVCache, paged_attention
from inferd.engine.reference.lora import LoraWeights, lora_groups
from inferd.engine.reference.weights import Checkpoint


class ForwardBatchError(ValueError):
    """A ForwardBatch (or a batch to encode) is inconsistent (lengths, positions, slots, token ids)."""


# attend(layer index, q [T, heads, D] scaled, k [T, kv_heads, D] rotated, v [T, kv_heads, D]) -> [T, heads, D]
Attend = Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class ForwardBatch:
    """One engine step: the tokens of every scheduled sequence, packed sequence by sequence."""

    token_ids: np.ndarray            # int64 [T]
    positions: np.ndarray            # int64 [T], absolute position of each token in its sequence
    slot_mapping: np.ndarray         # int64 [T], flat KV slot where each token's K/V is written
    query_lens: list[int]            # per sequence: new tokens this step
    context_lens: list[int]          # per sequence: tokens in KV after this step
    block_tables: list[list[int]]    # per sequence: its block ids in order
    loras: list[LoraWeights | None] | None = None   # per sequence: its LoRA adapter (None: the base model)


@dataclass
class _Layer:
    attn_norm: np.ndarray
    wqkv: np.ndarray | Int8Matrix    # [hidden, (heads + 2 kv_heads) * head_dim] (int8: [out, in], see int8)
    bqkv: np.ndarray | None
    qk_norm: np.ndarray | None       # [heads + kv_heads, head_dim]: q_norm's weight per q head, k_norm's per k head
    wo: np.ndarray                   # [heads * head_dim, hidden]
    bo: np.ndarray | None
    mlp_norm: np.ndarray
    wgu: np.ndarray                  # [hidden, 2 * intermediate]: gate then up
    bgu: np.ndarray | None
    wd: np.ndarray                   # [intermediate, hidden]
    bd: np.ndarray | None


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.einsum("ij,ij->i", x, x)[:, None] / np.float32(x.shape[1])
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def _head_rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis of [T, heads, head_dim], a weight row per head (Qwen3's q_norm/k_norm)."""
    variance = np.einsum("thd,thd->th", x, x)[..., None] / np.float32(x.shape[-1])
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def _silu_mul(gate_up: np.ndarray, split: int) -> np.ndarray:
    """silu(gate) * up for the fused [T, 2I] projection, in one scratch array."""
    gate, up = gate_up[:, :split], gate_up[:, split:]
    act = np.negative(gate)
    with np.errstate(over="ignore"):                           # exp overflow -> silu(-big) = -0, as intended
        np.exp(act, out=act)
    act += np.float32(1.0)
    np.divide(gate, act, out=act)
    act *= up
    return act


def _matrix(checkpoint: Checkpoint, name: str, shape: tuple[int, int]) -> np.ndarray | Int8Matrix:
    """A [rows, hidden] matrix as stored: float32, or int8 with per-row scales (the embedding, the LM head)."""
    return checkpoint.get_int8(name, shape) if checkpoint.quantized(name) else checkpoint.get(name, shape)


def _head(x: np.ndarray, lm_head: np.ndarray | Int8Matrix) -> np.ndarray:
    return lm_head.linear(x) if isinstance(lm_head, Int8Matrix) else x @ lm_head.T


def _linear(x: np.ndarray, w: np.ndarray | Int8Matrix, b: np.ndarray | None) -> np.ndarray:
    y = w.linear(x) if isinstance(w, Int8Matrix) else x @ w
    if b is not None:
        y += b
    return y


class LlamaModel:
    """LlamaForCausalLM's forward pass, float32, weights pre-transposed and fused at load."""

    def __init__(self, config: LlamaConfig, checkpoint: Checkpoint) -> None:
        c = config
        self.config = c
        hd, heads, kv_heads, hidden, inter = (c.head_dim, c.num_attention_heads, c.num_key_value_heads,
                                              c.hidden_size, c.intermediate_size)
        self.embed = _matrix(checkpoint, "model.embed_tokens.weight", (c.vocab_size, hidden))
        if c.tie_word_embeddings:
            self.lm_head = self.embed                     # used as embed.T: BLAS reads it transposed, no copy
        else:
            self.lm_head = _matrix(checkpoint, "lm_head.weight", (c.vocab_size, hidden))
        self.final_norm = checkpoint.get("model.norm.weight", (hidden,))

        def fused(names: list[str], shapes: list[tuple[int, ...]]) -> np.ndarray | Int8Matrix:
            if checkpoint.quantized(names[0]):
                return Int8Matrix.stack([checkpoint.get_int8(n, s) for n, s in zip(names, shapes)])
            return np.ascontiguousarray(np.concatenate([checkpoint.get(n, s) for n, s in zip(names, shapes)]).T)

        def projection(name: str, shape: tuple[int, int]) -> np.ndarray | Int8Matrix:
            if checkpoint.quantized(name):
                return checkpoint.get_int8(name, shape)
            return np.ascontiguousarray(checkpoint.get(name, shape).T)

        def fused_bias(names: list[str], sizes: list[int]) -> np.ndarray:
            return np.concatenate([checkpoint.get(n, (s,)) for n, s in zip(names, sizes)])

        def head_norms(p: str) -> np.ndarray:
            q, k = (checkpoint.get(p + f"self_attn.{n}_norm.weight", (hd,)) for n in "qk")
            return np.concatenate([np.broadcast_to(q, (heads, hd)), np.broadcast_to(k, (kv_heads, hd))])

        self.layers: list[_Layer] = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{n}_proj" for n in "qkv"]
            qkv_sizes = [heads * hd, kv_heads * hd, kv_heads * hd]
            mlp = [p + "mlp.gate_proj", p + "mlp.up_proj"]
            self.layers.append(_Layer(
                attn_norm=checkpoint.get(p + "input_layernorm.weight", (hidden,)),
                wqkv=fused([n + ".weight" for n in attn], [(s, hidden) for s in qkv_sizes]),
                bqkv=fused_bias([n + ".bias" for n in attn], qkv_sizes) if c.qkv_bias else None,
                qk_norm=head_norms(p) if c.qk_norm else None,
                wo=projection(p + "self_attn.o_proj.weight", (hidden, heads * hd)),
                bo=checkpoint.get(p + "self_attn.o_proj.bias", (hidden,)) if c.o_bias else None,
                mlp_norm=checkpoint.get(p + "post_attention_layernorm.weight", (hidden,)),
                wgu=fused([n + ".weight" for n in mlp], [(inter, hidden)] * 2),
                bgu=fused_bias([n + ".bias" for n in mlp], [inter] * 2) if c.mlp_bias else None,
                wd=projection(p + "mlp.down_proj.weight", (hidden, inter)),
                bd=checkpoint.get(p + "mlp.down_proj.bias", (hidden,)) if c.mlp_bias else None))
        self._inv_freq = c.inv_freq()
        self._scale = np.float32(hd ** -0.5)

    def weight_bytes(self) -> int:
        """Bytes of the arrays this model holds (a tied LM head counted once)."""
        arrays = {id(a): a for a in (self.embed, self.lm_head, self.final_norm)}
        for layer in self.layers:
            arrays.update((id(a), a) for a in vars(layer).values() if a is not None)
        return sum(a.nbytes for a in arrays.values())

    @classmethod
    def from_pretrained(cls, path: Path) -> "LlamaModel":
        """Load an HF-layout directory: config.json + *.safetensors (sharded or not, f32/f16/bf16)."""
        path = Path(path)
        return cls(LlamaConfig.from_json(path / "config.json"), Checkpoint(path))

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        c = self.config
        return PagedKVCache(num_layers=c.num_hidden_layers, num_blocks=num_blocks, block_size=block_size,
                            num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim)

    def forward(self, batch: ForwardBatch, kv: PagedKVCache) -> np.ndarray:
        """Run one step; returns float32 [num_seqs, vocab]: the logits of each sequence's last token."""
        x, plan = self._step_hidden(batch, kv)
        last = _rms_norm(x[plan.last_rows], self.final_norm, self.config.rms_norm_eps)
        return _head(last, self.lm_head)

    def forward_every(self, batch: ForwardBatch, kv: PagedKVCache,
                      every: Sequence[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """`forward`, plus the logits at every new token of the sequences `every` (indexes into the batch),
        float32 [query_len, vocab] each: what prompt log-probabilities need. Only those rows pay the LM head."""
        x, plan = self._step_hidden(batch, kv)
        eps = self.config.rms_norm_eps
        last = _head(_rms_norm(x[plan.last_rows], self.final_norm, eps), self.lm_head)
        ends = np.cumsum(batch.query_lens)
        full = [_head(_rms_norm(x[ends[i] - batch.query_lens[i]:ends[i]], self.final_norm, eps), self.lm_head)
                for i in every]
        return last, full

    def _step_hidden(self, batch: ForwardBatch, kv: PagedKVCache):
        """The decoder layers over one step's packed tokens (K/V written to `kv`): residual [T, hidden], plan."""
        plan = self._plan(batch, kv)

        def attend(index: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            kv.write(index, batch.slot_mapping, k, v)
            return paged_attention(kv, index, q, plan)

        x = self._layers(np.asarray(batch.token_ids, dtype=np.int64), batch.positions, attend,
                         lora_groups(batch.loras, batch.query_lens))   # base matmuls for all rows, deltas per adapter
        return x, plan

    def encode_hidden(self, batch: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each sequence's final hidden states (after the last RMSNorm, as transformers' LlamaModel returns
        them): float32 [len_i, hidden] per sequence. One packed pass, causal attention within each sequence."""
        c = self.config
        if not batch or any(len(ids) == 0 for ids in batch):
            raise ForwardBatchError("a batch to encode needs at least one sequence, each of at least one token")
        lengths = [len(ids) for ids in batch]
        token_ids = np.concatenate([np.asarray(ids) for ids in batch])
        if not np.issubdtype(token_ids.dtype, np.integer) or token_ids.min() < 0 or token_ids.max() >= c.vocab_size:
            raise ForwardBatchError(f"token ids must be integers in [0, {c.vocab_size})")
        positions = np.concatenate([np.arange(n) for n in lengths])

        def attend(index: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            return causal_attention(q, k, v, lengths)

        x = _rms_norm(self._layers(token_ids.astype(np.int64), positions, attend, []), self.final_norm, c.rms_norm_eps)
        return np.split(x, np.cumsum(lengths)[:-1])

    def _layers(self, token_ids: np.ndarray, positions: np.ndarray, attend: Attend,
                lora: list[tuple[LoraWeights, slice | np.ndarray]]) -> np.ndarray:
        """The decoder layers over packed tokens; returns the residual stream [T, hidden] before the final norm."""
        c = self.config
        tokens = token_ids.size
        heads, kv_heads, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_end, k_end = heads * hd, (heads + kv_heads) * hd
        angles = np.asarray(positions, dtype=np.float32)[:, None] * self._inv_freq
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]   # [T, 1, D/2]
        half = hd // 2

        embed = self.embed
        x = embed.rows(token_ids) if isinstance(embed, Int8Matrix) else embed[token_ids]
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.attn_norm, c.rms_norm_eps)
            qkv = _linear(h, layer.wqkv, layer.bqkv)
            for adapter, rows in lora:
                adapter.add(index, "qkv", h, qkv, rows)
            qk = qkv[:, :k_end].reshape(tokens, heads + kv_heads, hd)
            if layer.qk_norm is not None:
                qk = _head_rms_norm(qk, layer.qk_norm, c.rms_norm_eps)
            x1, x2 = qk[..., :half], qk[..., half:]
            rotated = np.concatenate((x1 * cos - x2 * sin, x2 * cos + x1 * sin), axis=-1)
            q = rotated[:, :heads]
            q *= self._scale
            attn = attend(index, q, rotated[:, heads:], qkv[:, k_end:].reshape(tokens, kv_heads, hd))
            attn = attn.reshape(tokens, q_end)
            out = _linear(attn, layer.wo, layer.bo)
            for adapter, rows in lora:
                adapter.add(index, "o", attn, out, rows)
            x += out

            h = _rms_norm(x, layer.mlp_norm, c.rms_norm_eps)
            gate_up = _linear(h, layer.wgu, layer.bgu)
            for adapter, rows in lora:
                adapter.add(index, "gate_up", h, gate_up, rows)
            act = _silu_mul(gate_up, c.intermediate_size)
            out = _linear(act, layer.wd, layer.bd)
            for adapter, rows in lora:
                adapter.add(index, "down", act, out, rows)
            x += out
        return x

    def _plan(self, batch: ForwardBatch, kv: PagedKVCache) -> AttentionPlan:
        c = self.config
        if kv.num_layers != c.num_hidden_layers or kv.num_kv_heads != c.num_key_value_heads \
                or kv.head_dim != c.head_dim:
            raise ForwardBatchError("kv cache was not made for this model (use model.new_kv_cache)")
        arrays = {name: np.asarray(getattr(batch, name)) for name in ("token_ids", "positions", "slot_mapping")}
        for name, arr in arrays.items():
            if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
                raise ForwardBatchError(f"{name} must be a 1-D integer array")
        if not batch.query_lens:
            raise ForwardBatchError("query_lens is empty: a step needs at least one sequence")
        if batch.loras is not None and len(batch.loras) != len(batch.query_lens):
            raise ForwardBatchError(f"loras has {len(batch.loras)} entries for {len(batch.query_lens)} sequences")
        try:
            plan = AttentionPlan(kv, batch.query_lens, batch.context_lens, batch.block_tables)
        except KVCacheError as exc:
            raise ForwardBatchError(str(exc)) from exc
        for name, arr in arrays.items():
            if arr.size != plan.num_tokens:
                raise ForwardBatchError(f"{name} has {arr.size} entries, sum(query_lens) is {plan.num_tokens}")
        ids = arrays["token_ids"]
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ForwardBatchError(f"token_ids must lie in [0, {c.vocab_size})")
        q_lens = np.asarray(batch.query_lens, dtype=np.int64)
        first = np.repeat(np.asarray(batch.context_lens, dtype=np.int64) - q_lens, q_lens)
        offsets = np.arange(plan.num_tokens) - np.repeat(np.cumsum(q_lens) - q_lens, q_lens)
        if not np.array_equal(arrays["positions"], first + offsets):
            raise ForwardBatchError("positions must run context_len - query_len .. context_len - 1 per sequence")
        if not np.array_equal(arrays["slot_mapping"], plan.token_slots):
            raise ForwardBatchError("slot_mapping disagrees with block_tables at the new tokens' positions")
        return plan
