"""Next-token choice on the device, one device->host transfer per step.

The reference sampler's rules, in its order (inferd.engine.reference.sampler, itself vLLM's v1 sampler):
grammar mask, logit_bias, penalties, greedy argmax, temperature, min_p, top-k then top-p, one uniform per
random row from the row's own generator; raw log-probabilities of the masked logits. Host work (per-row
parameters, uniforms, penalty token ids, grammar masks) is gathered by `sampling_plan` and uploaded in one
asynchronous copy; the device works on all rows at once (greedy rows by one argmax, random rows by one
pipeline with per-row parameters); tokens and log-probabilities come back packed in one tensor.

A random row is drawn by inverting its cumulative distribution at its uniform, over candidates in the
reference's order (token id, or descending logit with ties by id when top-k or top-p sorts them), so for
the same uniform it picks the reference's token except where the two round a cumulative sum differently
(float32 here, float64 there: a uniform within ~1e-6 of a boundary between two tokens).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from inferd.engine.torch.sampling_plan import SamplingPlan, TokenHistory, plan
from inferd.engine.torch.upload import HostUpload
from inferd.types import TokenLogprob

# Sorted rows whose top-k are all at most this take a top-k selection instead of a full sort of the vocabulary
TOPK_LIMIT = 1024
_LOW_32 = 0xFFFFFFFF


def _to_host(packed: torch.Tensor) -> np.ndarray:
    """The step's one device->host transfer (and so its one wait for the device)."""
    return packed.cpu().numpy()


class TorchSampler:
    """Picks one token per row of a [rows, vocab] logits tensor on `device`."""

    def __init__(self, device: torch.device | str, vocab_size: int) -> None:
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:     # logits say cuda:N, never bare cuda
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.vocab_size = vocab_size
        self._upload = HostUpload(self.device)
        self._history = TokenHistory()
        self._shifts = torch.arange(8, dtype=torch.uint8, device=self.device)

    def sample(self, logits: torch.Tensor, seqs: Sequence) -> tuple[list[int], list[TokenLogprob | None]]:
        """Row r of `logits` is `seqs[r]`'s (an engine Sequence). Returns each row's token and, for rows whose
        `sampling.logprobs` is set, its TokenLogprob (else None). Never calls `grammar.accept`; sets
        `grammar.failed` on a row its grammar leaves no token."""
        self._check(logits, len(seqs))
        if not seqs:
            return [], []
        steps = plan(seqs, self.vocab_size, TOPK_LIMIT, self._history)
        dev = self._upload.send(steps.arrays) if steps.arrays else {}
        x = logits.to(torch.float32, copy=steps.modifies_logits).contiguous()
        if steps.grammar:
            self._mask_grammar(x, dev)
        lp = None
        if steps.logprob_rows:     # raw: of the masked logits, before the bias and penalties change them
            lp = torch.log_softmax(_take(x, dev.get("logprob_rows")), dim=1)
        if steps.adjusts:
            _adjust(x.view(-1), dev, steps)
        tokens = x.argmax(dim=1) if steps.greedy else None
        if steps.random:
            drawn = _draw(x, dev, steps)
            tokens = drawn if tokens is None else tokens.index_put_((dev["random_rows"],), drawn)
        parts = [tokens.to(torch.int32)]
        if lp is not None:
            parts += _logprob_parts(lp, tokens, dev.get("logprob_rows"), max(steps.logprob_ks))
        return _unpack(_to_host(torch.cat(parts)), steps)

    def _check(self, logits: torch.Tensor, rows: int) -> None:
        if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits of shape {tuple(logits.shape)} for {rows} sequences "
                             f"over a vocabulary of {self.vocab_size}")
        if logits.device != self.device:
            raise ValueError(f"logits on {logits.device}, the sampler on {self.device}")
        if not logits.dtype.is_floating_point:
            raise ValueError(f"logits must be floating point, got {logits.dtype}")

    def _mask_grammar(self, x: torch.Tensor, dev: dict[str, torch.Tensor]) -> None:
        rows = dev.get("grammar_rows")
        if rows is not None:
            bits = dev["grammar_bits"]
            allowed = ((bits.unsqueeze(-1) >> self._shifts) & 1).view(bits.shape[0], -1)[:, :x.shape[1]]
            x.index_put_((rows,), x.index_select(0, rows).masked_fill_(allowed == 0, -torch.inf))
        dead = dev.get("dead_rows")
        if dead is not None:
            x.index_fill_(0, dead, 0.0)


def _adjust(flat: torch.Tensor, dev: dict[str, torch.Tensor], steps: SamplingPlan) -> None:
    """logit_bias, then the repetition penalty, then frequency and presence, on the flat logits in place. Sums
    in float64 as the reference's numpy does (a float32 logit plus a float64 bias, rounded once)."""
    at = dev.get("bias_at")
    if at is not None:
        flat[at] = (flat[at].double() + dev["bias"]).float()
    if not (steps.repeats or steps.counts):
        return
    lens = dev["pen_lens"]
    owner = torch.repeat_interleave(torch.arange(lens.shape[0], device=flat.device), lens,
                                    output_size=steps.penalty_tokens)      # each token's row; sized, so no sync
    at = dev["pen_rows"][owner] * steps.vocab + dev["pen_tokens"].to(torch.int64)
    if steps.repeats:
        # a token seen twice is written twice with the same value, computed from the logit before either write
        values, penalty = flat[at], dev["pen_repeat"][owner]
        flat[at] = torch.where(values > 0, values / penalty, values * penalty)
    if steps.counts:
        position = (torch.arange(steps.penalty_tokens, device=flat.device) - (lens.cumsum(0) - lens)[owner]
                    + dev["pen_first"][owner])
        output = position >= dev["pen_prompt"][owner]
        _subtract_counts(flat, at, output, dev["pen_freq"][owner], dev["pen_presence"][owner])


def _subtract_counts(flat: torch.Tensor, at: torch.Tensor, output: torch.Tensor, frequency: torch.Tensor,
                     presence: torch.Tensor) -> None:
    """At each flat index, frequency x its occurrences in the output + presence once if it occurs there at all.
    Sorted by index (output occurrences first), so each index's run sums into one slot without a sync."""
    keys, order = torch.sort(at * 2 + (~output).to(torch.int64))
    at, output = keys // 2, output[order]
    first = torch.ones_like(output)
    first[1:] = at[1:] != at[:-1]
    slot = first.cumsum(0) - 1
    zero = torch.zeros((), dtype=torch.float64, device=flat.device)
    amount = torch.where(output, frequency[order], zero) + torch.where(first & output, presence[order], zero)
    total = torch.zeros(at.shape[0], dtype=torch.float64, device=flat.device).index_add_(0, slot, amount)
    flat[at] = (flat[at].double() - total[slot]).float()


def _draw(x: torch.Tensor, dev: dict[str, torch.Tensor], steps: SamplingPlan) -> torch.Tensor:
    """The random rows' tokens (int64, in their row order)."""
    scaled = _take(x, dev.get("random_rows")) / dev["temperature"].unsqueeze(1)
    kept = None
    if steps.min_p:
        keep = torch.exp(scaled - scaled.amax(dim=1, keepdim=True)) >= dev["min_p"].unsqueeze(1)
        scaled.masked_fill_(~keep, -torch.inf)
        kept = keep.sum(dim=1)
    plain = None
    if steps.plain:
        plain = _draw_in_id_order(_take(scaled, dev.get("plain_rows")), dev["plain_u"])
    if not steps.sorted:
        return plain
    sub = dev.get("sorted_rows")
    scaled = _take(scaled, sub)
    if kept is None:
        kept = torch.full((scaled.shape[0],), scaled.shape[1], dtype=torch.int64, device=scaled.device)
    else:
        kept = _take(kept, sub)
    top_k = dev["sorted_top_k"]
    ranked = _draw_sorted(scaled, dev["sorted_u"], top_k, dev["sorted_top_p"], kept, steps.sorted_width)
    if plain is None:
        return ranked
    tokens = _put(torch.empty(steps.random, dtype=torch.int64, device=x.device), dev.get("plain_rows"), plain)
    maybe = dev.get("sorted_maybe")
    if maybe is not None:        # top-k sorts only if min_p left more than k: else the id-order draw stands
        ranked = torch.where(maybe & (top_k >= kept), _take(tokens, sub), ranked)
    return _put(tokens, sub, ranked)


def _take(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """`t`'s rows `rows` (None: all of them, no copy)."""
    return t if rows is None else t.index_select(0, rows)


def _put(t: torch.Tensor, rows: torch.Tensor | None, values: torch.Tensor) -> torch.Tensor:
    """`t` with its rows `rows` (None: all of them) set to `values`, in place."""
    return t.copy_(values) if rows is None else t.index_put_((rows,), values)


def _draw_in_id_order(scaled: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = torch.exp(scaled - scaled.amax(dim=1, keepdim=True)).cumsum(dim=1)
    return _invert(cdf, cdf[:, -1], u)


def _draw_sorted(scaled: torch.Tensor, u: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 kept: torch.Tensor, width: int) -> torch.Tensor:
    """Candidates by descending logit (ties by id); the top-k head (when k < the candidates min_p kept), then
    the smallest head whose probability reaches top_p."""
    if width < scaled.shape[1]:
        values, ids = _top_by_value(scaled, width)
    else:
        values, ids = torch.sort(scaled, dim=1, descending=True, stable=True)
    head = torch.where((top_k > 0) & (top_k < kept), top_k, kept)
    in_head = torch.arange(width, device=scaled.device) < head.unsqueeze(1)
    cdf = (torch.exp(values - values[:, :1]) * in_head).cumsum(dim=1)
    reaching = ((cdf / cdf[:, -1:] < top_p.unsqueeze(1)) & in_head).sum(dim=1) + 1
    head = torch.where(top_p < 1.0, torch.minimum(reaching, head), head)
    picked = _invert(cdf, cdf.gather(1, (head - 1).unsqueeze(1)).squeeze(1), u)
    return ids.gather(1, picked.unsqueeze(1)).squeeze(1)


def _invert(cdf: torch.Tensor, total: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative mass exceeds u * total: never past the last index with mass
    (the target is kept below `total`, which a float32 u close to 1 would round up to)."""
    target = (u * total.double()).float()
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)


def _top_by_value(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k largest values and their ids, largest first, ties by lowest id, as the reference orders
    them: one top-k over int64 keys (the float's order-preserving bits above the inverted id), so equal
    values cannot come back in whatever order the selection met them."""
    bits = (values + 0.0).view(torch.int32)          # a copy; + 0.0: -0.0 becomes 0.0, equal as floats are
    bits ^= (bits >> 31) & 0x7FFFFFFF                # a negative float's magnitude bits count down
    last = values.shape[1] - 1
    keys = bits.to(torch.int64).mul_(1 << 32).add_(last - torch.arange(values.shape[1], device=values.device))
    ids = last - (keys.topk(k, dim=1).values & _LOW_32)
    return values.gather(1, ids), ids


def _logprob_parts(lp: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor | None,
                   k: int) -> list[torch.Tensor]:
    """int32 pieces for the packed result: each row's own logprob (float bits), then its top k ids and values."""
    chosen = _take(tokens, rows)
    parts = [lp.gather(1, chosen.unsqueeze(1)).view(torch.int32).view(-1)]
    k = min(k, lp.shape[1])
    if k > 0:
        values, ids = _top_by_value(lp, k)
        parts += [ids.to(torch.int32).view(-1), values.view(torch.int32).view(-1)]
    return parts


def _unpack(host: np.ndarray, steps: SamplingPlan) -> tuple[list[int], list[TokenLogprob | None]]:
    rows = steps.rows
    tokens = host[:rows].tolist()
    logprobs: list[TokenLogprob | None] = [None] * rows
    if not steps.logprob_rows:
        return tokens, logprobs
    n = len(steps.logprob_rows)
    own = host[rows:rows + n].view(np.float32).tolist()
    k = min(max(steps.logprob_ks), steps.vocab)
    top_ids = host[rows + n:rows + n + n * k].reshape(n, k).tolist()
    top_values = host[rows + n + n * k:].view(np.float32).reshape(n, k).tolist()
    for i, r in enumerate(steps.logprob_rows):
        want = steps.logprob_ks[i]
        logprobs[r] = TokenLogprob(tokens[r], own[i], tuple(zip(top_ids[i][:want], top_values[i][:want])))
    return tokens, logprobs
