"""Throughput curves derived from the sim profiles' roofline (docs/sim.md), so the planner works out of the box.

The figures are what the simulated engine would do with the same settings (token budget, batch slots,
block size): prefill priced as the scheduler prices chunks, decode as `SimProfile.decode_step_time`.
"""
from __future__ import annotations

import math

from inferd.capacity.curves import ThroughputCurve
from inferd.capacity.demand import Demand
from inferd.capacity.errors import CapacityError, SloUnreachable

# Test-only profiles: not what anyone provisions, so not planned for unless named.
TOY_PROFILES = frozenset({"tiny"})
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_MAX_BATCH_SIZE = 256


def sim_profile_names() -> list[str]:
    """The sim profiles planned for by default (every shipped one but the toys)."""
    from inferd.engine.sim import PROFILES   # here, not at the top: the CLI's parser must not pay for the engine
    return sorted(set(PROFILES) - TOY_PROFILES)


def sim_curve(name: str, demand: Demand, *, block_size: int = DEFAULT_BLOCK_SIZE,
              max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
              max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> ThroughputCurve:
    """One replica of sim profile `name` at `demand`'s lengths.

    Raises CapacityError for an unknown name, SloUnreachable when one p95 sequence cannot fit the KV pool."""
    from inferd.engine.sim import PROFILES
    for label, value in (("block size", block_size), ("max_num_tokens", max_num_tokens),
                         ("max_batch_size", max_batch_size)):
        if value < 1:
            raise CapacityError(f"{label} must be >= 1, got {value}")
    try:
        profile = PROFILES[name]
    except KeyError:
        raise CapacityError(f"unknown sim profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None

    total_blocks = profile.num_kv_blocks(block_size)
    blocks_per_sequence = math.ceil(demand.sequence_tokens_p95 / block_size)
    kv_batch = total_blocks // blocks_per_sequence
    if kv_batch < 1:
        raise SloUnreachable(name, f"one p95 sequence ({demand.sequence_tokens_p95} tokens, {blocks_per_sequence} "
                                   f"blocks) does not fit the KV pool ({total_blocks} blocks of {block_size})")
    if kv_batch < max_batch_size:
        max_batch, reason = kv_batch, "KV"     # total blocks // blocks of one p95 sequence
    else:
        max_batch, reason = max_batch_size, "slots"
    context = round(demand.decode_context)
    return ThroughputCurve(
        name=name, source="sim roofline", gpus_per_replica=profile.tensor_parallel,
        prefill_tokens_per_s=full_budget_prefill_rate(profile, demand.prompt.mean, max_num_tokens),
        prefill_p95_s=prefill_seconds(profile, math.ceil(demand.prompt.p95), max_num_tokens),
        decode=tuple((b, profile.decode_step_time(b, context)) for b in range(1, max_batch + 1)),
        max_batch=max_batch, max_batch_reason=reason)


def prefill_seconds(profile, prompt_tokens: int, max_num_tokens: int) -> float:
    """One prompt prefilled alone, in chunks of the token budget, each step priced as the sim scheduler
    prices it: a chunk of n tokens after `start` reads and writes start + n KV entries and scores
    n * start + n(n+1)/2 causal (query, key) pairs."""
    seconds, start = 0.0, 0
    while start < prompt_tokens:
        n = min(max_num_tokens, prompt_tokens - start)
        seconds += profile.step_time(n, start + n, n * start + n * (n + 1) // 2)
        start += n
    return seconds


def full_budget_prefill_rate(profile, mean_prompt: float, max_num_tokens: int) -> float:
    """Prompt tokens/s when every step's token budget is full of prefill (a busy replica).

    Prompts shorter than the budget share a step (budget / length of them, so the weights are read once
    for all of them); longer ones fill steps on their own, chunk by chunk."""
    length = max(1, round(mean_prompt))
    if length >= max_num_tokens:
        return length / prefill_seconds(profile, length, max_num_tokens)
    pairs = round(max_num_tokens / length * length * (length + 1) / 2)
    return max_num_tokens / profile.step_time(max_num_tokens, max_num_tokens, pairs)
