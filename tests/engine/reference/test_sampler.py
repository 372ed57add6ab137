"""Sampler: greedy rows, seeded reproducibility, top-k and top-p masks; logit_bias, the penalties and min_p
against distributions computed by hand, in vLLM's order."""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from inferd.engine.reference.sampler import (Sampler, adjust_logits, candidate_probs, grammar_masked, make_rng,
                                             sample_one)
from inferd.types import SamplingParams

LN2, LN3 = math.log(2), math.log(3)


@dataclass
class Ctx:
    """A row's tokens so far, as an engine's Sequence carries them."""

    token_ids: list[int]
    num_prompt_tokens: int


def adjusted(logits, params: SamplingParams, prompt: list[int], output: list[int]) -> np.ndarray:
    row = np.asarray(logits, dtype=np.float32)[None, :]
    return adjust_logits(row, [params], [Ctx([*prompt, *output], len(prompt))])[0]


def probs_of(logits, params: SamplingParams, prompt=(0,), output=()) -> np.ndarray:
    """The full distribution (zeros for dropped tokens) a row samples from."""
    row = adjusted(logits, params, list(prompt), list(output))
    ids, probs = candidate_probs(row, params)
    full = np.zeros(row.shape[0])
    full[ids] = probs
    return full


def logits_rows(rows=4, vocab=50, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32) * 3


def test_greedy_rows_take_the_argmax():
    logits = logits_rows()
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1)] * 2
    assert Sampler().sample(logits, params, [None] * 4) == np.argmax(logits, axis=1).tolist()


def test_same_seed_same_tokens_whatever_else_is_in_the_batch():
    logits = logits_rows(rows=3)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    rng = make_rng(1234)
    solo = [Sampler().sample(logits[1:2], [seeded], [rng])[0] for _ in range(20)]
    rng_a, rng_b, rng_c = make_rng(1234), make_rng(None), make_rng(99)
    mixed_params = [SamplingParams(temperature=0.7), seeded, SamplingParams(temperature=0.0)]
    batched = [Sampler().sample(logits, mixed_params, [rng_b, rng_a, rng_c])[1] for _ in range(20)]
    assert solo == batched
    assert len(set(solo)) > 1              # it really samples: not argmax every time


def test_different_seeds_give_different_streams():
    logits = logits_rows(rows=1)
    params = [SamplingParams(temperature=1.5, seed=0)]
    runs = []
    for seed in (1, 2):
        rng = make_rng(seed)
        runs.append([Sampler().sample(logits, params, [rng])[0] for _ in range(30)])
    assert runs[0] != runs[1]


def test_top_k_keeps_only_the_k_most_likely_tokens():
    row = logits_rows(rows=1)[0]
    ids, probs = candidate_probs(row, SamplingParams(temperature=1.0, top_k=5))
    assert set(ids.tolist()) == set(np.argsort(-row)[:5].tolist())
    assert probs.sum() == pytest.approx(1.0) and (np.diff(probs) <= 0).all()
    rng = make_rng(0)
    draws = {sample_one(row, SamplingParams(temperature=2.0, top_k=5), rng) for _ in range(200)}
    assert draws <= set(ids.tolist()) and len(draws) > 1


def test_top_p_keeps_the_smallest_head_reaching_the_mass():
    row = np.log(np.array([0.5, 0.05, 0.3, 0.15], dtype=np.float32))
    ids, probs = candidate_probs(row, SamplingParams(temperature=1.0, top_p=0.8))
    assert ids.tolist() == [0, 2]           # 0.5 + 0.3 reaches 0.8
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8])
    ids, _ = candidate_probs(row, SamplingParams(temperature=1.0, top_p=0.81))
    assert ids.tolist() == [0, 2, 3]
    ids, _ = candidate_probs(row, SamplingParams(temperature=1.0, top_p=0.01))
    assert ids.tolist() == [0]              # never empty


def test_top_k_then_top_p():
    row = np.log(np.array([0.4, 0.1, 0.3, 0.2], dtype=np.float32))
    ids, probs = candidate_probs(row, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    # top-2 renormalised: 0.4/0.7 = 0.57 alone reaches 0.5
    assert ids.tolist() == [0] and probs.tolist() == pytest.approx([1.0])


def test_temperature_sharpens_the_distribution():
    row = logits_rows(rows=1)[0]
    _, hot = candidate_probs(row, SamplingParams(temperature=2.0))
    _, cold = candidate_probs(row, SamplingParams(temperature=0.2))
    assert cold.max() > hot.max()


def test_sampling_follows_the_distribution():
    row = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    rng = make_rng(7)
    draws = np.array([sample_one(row, SamplingParams(temperature=1.0), rng) for _ in range(3000)])
    freqs = np.bincount(draws, minlength=3) / draws.size
    assert freqs == pytest.approx([0.7, 0.2, 0.1], abs=0.03)


def test_rows_must_match_params():
    with pytest.raises(ValueError):
        Sampler().sample(logits_rows(rows=2), [SamplingParams(temperature=0.0)], [None])


def test_any_signed_64_bit_seed_makes_a_generator_and_maps_onto_64_bits():
    # the API accepts OpenAI's signed seeds; PCG64 itself refuses negative ones
    assert make_rng(-1).random(4).tolist() == make_rng(2 ** 64 - 1).random(4).tolist()
    assert make_rng(-(2 ** 63)).random(4).tolist() == make_rng(2 ** 63).random(4).tolist()
    assert make_rng(-1).random(4).tolist() != make_rng(1).random(4).tolist()


# -- logit_bias, penalties, min_p: hand-computed distributions ---------------------------------------------

def test_logit_bias_is_added_to_the_logit():
    # flat logits; +ln 3 on token 2 makes it 3 times as likely as each other token
    p = probs_of([0, 0, 0, 0], SamplingParams(logit_bias=((2, LN3),)))
    assert p.tolist() == pytest.approx([1 / 6, 1 / 6, 3 / 6, 1 / 6])


def test_a_bias_of_minus_100_all_but_removes_a_token():
    p = probs_of([0, 0], SamplingParams(logit_bias=((0, -100.0),)))
    assert p[0] == pytest.approx(math.exp(-100) / (1 + math.exp(-100)))


def test_presence_penalty_counts_output_tokens_once_and_not_the_prompt():
    # prompt [0], output [1, 1]: token 1 loses ln 2 once (e/2), token 0 (prompt only) nothing
    p = probs_of([1, 1, 1], SamplingParams(presence_penalty=LN2), prompt=[0], output=[1, 1])
    assert p.tolist() == pytest.approx([0.4, 0.2, 0.4])


def test_frequency_penalty_counts_each_output_occurrence():
    # output [1, 1, 2]: token 1 loses 2 ln 2 (e/4), token 2 ln 2 (e/2), token 0 (prompt) nothing
    p = probs_of([1, 1, 1], SamplingParams(frequency_penalty=LN2), prompt=[0], output=[1, 1, 2])
    assert p.tolist() == pytest.approx([4 / 7, 1 / 7, 2 / 7])


def test_presence_and_frequency_penalties_add_up_and_negative_ones_encourage():
    row = adjusted([1, 1, 1], SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [0], [1, 1])
    assert row.tolist() == pytest.approx([1, 0, 1])
    row = adjusted([1, 1, 1], SamplingParams(presence_penalty=-1.0), [0], [2])
    assert row.tolist() == pytest.approx([1, 1, 2])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_prompt_and_output():
    # prompt [0, 1], output [2]: 2 -> 1, -1 -> -2, 3 -> 1.5; token 3 (unseen) keeps 0.5
    row = adjusted([2.0, -1.0, 3.0, 0.5], SamplingParams(repetition_penalty=2.0), [0, 1], [2])
    assert row.tolist() == pytest.approx([1.0, -2.0, 1.5, 0.5])
    # below 1 it encourages: 2 / 0.5 = 4, -1 * 0.5 = -0.5
    row = adjusted([2.0, -1.0, 0.0], SamplingParams(repetition_penalty=0.5), [0, 1, 2], [])
    assert row.tolist() == pytest.approx([4.0, -0.5, 0.0])


def test_repetition_comes_before_presence_and_frequency():
    # token 0 is in the output: 2 / 2 - 0.5 = 0.5 (the other order would give (2 - 0.5) / 2 = 0.75)
    row = adjusted([2.0, 0.0], SamplingParams(repetition_penalty=2.0, presence_penalty=0.5), [1], [0])
    assert row.tolist() == pytest.approx([0.5, 0.0])


def test_logit_bias_comes_before_the_repetition_penalty():
    # 1 + 3 = 4, then / 2 = 2 (the other order would give 1 / 2 + 3 = 3.5)
    row = adjusted([1.0, 0.0], SamplingParams(logit_bias=((0, 3.0),), repetition_penalty=2.0), [0], [])
    assert row.tolist() == pytest.approx([2.0, 0.0])


def test_penalties_come_before_temperature():
    # (1 - 1) / 0.5 = 0 against 0: even odds (temperature first would give 1 / 0.5 - 1 = 1 against 0)
    p = probs_of([1, 0], SamplingParams(temperature=0.5, presence_penalty=1.0), prompt=[1], output=[0])
    assert p.tolist() == pytest.approx([0.5, 0.5])


def test_min_p_drops_tokens_below_its_share_of_the_most_likely():
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    # cutoff 0.2 x 0.5 = 0.1: token 3 goes, the rest renormalise
    p = probs_of(logits, SamplingParams(min_p=0.2))
    assert p.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    assert probs_of(logits, SamplingParams(min_p=1.0)).tolist() == pytest.approx([1, 0, 0, 0])


def test_min_p_applies_after_temperature():
    # temperature 2 takes square roots: ratios to the largest are 1, .775, .548, .316; min_p 0.5 keeps three
    # (before temperature 0.15 / 0.5 = 0.3 would have dropped token 2)
    p = probs_of(np.log([0.5, 0.3, 0.15, 0.05]), SamplingParams(temperature=2.0, min_p=0.5))
    kept = np.sqrt([0.5, 0.3, 0.15])
    assert p.tolist() == pytest.approx([*(kept / kept.sum()), 0.0])


def test_min_p_then_top_k_then_top_p():
    # min_p 0.2 keeps [.5, .3, .15] (/.95: .526, .316, .158); top_k 2 keeps [.5, .3]; top_p 0.6 keeps .625 alone
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    assert probs_of(logits, SamplingParams(min_p=0.2, top_k=2)).tolist() == pytest.approx([0.625, 0.375, 0, 0])
    assert probs_of(logits, SamplingParams(min_p=0.2, top_k=2, top_p=0.6)).tolist() == pytest.approx([1, 0, 0, 0])


def test_greedy_rows_take_the_argmax_after_bias_and_penalties():
    logits = np.array([[3.0, 1.0, 0.0], [3.0, 1.0, 0.0], [3.0, 1.0, 0.0]], dtype=np.float32)
    params = [SamplingParams(temperature=0.0, logit_bias=((2, 10.0),)),
              SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=1.0),
              SamplingParams(temperature=0.0)]
    ctxs = [Ctx([1], 1), Ctx([1, 0], 1), Ctx([0, 0], 1)]
    assert Sampler().sample(logits, params, [None] * 3, ctxs) == [2, 1, 0]   # 3 - 2 - 1 = 0 < 1


def test_a_batch_without_penalties_needs_no_contexts_and_one_with_them_does():
    logits = logits_rows(rows=2)
    assert Sampler().sample(logits, [SamplingParams(temperature=0.0)] * 2, [None] * 2) == \
        np.argmax(logits, axis=1).tolist()
    with pytest.raises(ValueError, match="token ids"):
        Sampler().sample(logits, [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, min_p=0.1,
                                                                                    repetition_penalty=1.1)],
                         [None] * 2)


def test_adjusting_leaves_the_callers_logits_and_other_rows_alone():
    logits = logits_rows(rows=3)
    before = logits.copy()
    params = [SamplingParams(), SamplingParams(repetition_penalty=3.0, logit_bias=((4, 5.0),)), SamplingParams()]
    ctxs = [Ctx([1, 2], 1), Ctx([1, 2], 1), Ctx([1, 2], 1)]
    out = adjust_logits(logits, params, ctxs)
    assert (logits == before).all()
    assert out[0].tolist() == pytest.approx(before[0].tolist()) and out[2].tolist() == pytest.approx(before[2].tolist())
    assert out[1, 4] == pytest.approx(before[1, 4] + 5.0) and out[1].tolist() != pytest.approx(before[1].tolist())


def test_a_seeded_penalised_request_draws_the_same_whatever_else_is_batched():
    logits = logits_rows(rows=3)
    seeded = SamplingParams(temperature=1.0, seed=42, presence_penalty=1.5, repetition_penalty=1.2, min_p=0.01)
    ctx = Ctx([3, 4, 5, 5, 9], 2)
    rng = make_rng(42)
    solo = [Sampler().sample(logits[1:2], [seeded], [rng], [ctx])[0] for _ in range(20)]
    others = [SamplingParams(temperature=0.8, frequency_penalty=2.0, logit_bias=((7, 50.0),)), seeded,
              SamplingParams(temperature=0.0)]
    rngs = [make_rng(None), make_rng(42), None]
    batched = [Sampler().sample(logits, others, rngs, [Ctx([7, 7, 1], 1), ctx, Ctx([0], 1)])[1] for _ in range(20)]
    assert solo == batched and len(set(solo)) > 1


class _DeadGrammar:
    """A grammar that allows no token now (a dead end: inferd.engine.grammar.DEAD_END)."""

    failed = False

    def allowed(self):
        return np.zeros(8, dtype=bool)

    def mask(self, row):
        row[:] = -np.inf


def test_a_row_whose_grammar_allows_nothing_fails_its_sequence_and_stays_finite_for_the_batch():
    dead, free = SimpleNamespace(grammar=_DeadGrammar()), SimpleNamespace(grammar=None)
    logits = np.arange(16, dtype=np.float32).reshape(2, 8)
    grammar_masked(logits, [dead, free])
    assert dead.grammar.failed and np.isfinite(logits).all()
    assert logits[1].tolist() == list(range(8, 16))
