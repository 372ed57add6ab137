"""The rejection rule: greedy rows keep drafts while they are the argmax; sampled rows keep the target's
distribution whatever was drafted."""
from __future__ import annotations

import numpy as np

from inferd.engine.speculative.verify import verify_greedy, verify_sampled
from inferd.types import SamplingParams


def test_greedy_keeps_drafts_up_to_the_first_mismatch_and_adds_the_targets_token_there():
    logits = np.full((4, 10), -5.0, np.float32)
    for position, best in enumerate([3, 1, 4, 1]):
        logits[position, best] = 5.0
    assert verify_greedy(logits, [3, 1, 4]) == ([3, 1, 4], 1)     # every draft kept, then the bonus token
    assert verify_greedy(logits, [3, 2, 4]) == ([3], 1)           # the second is wrong: the target's 1
    assert verify_greedy(logits, [0, 1, 4]) == ([], 3)


def test_sampled_tokens_follow_the_targets_distribution_whatever_the_draft():
    """A draft of the target's least likely token: the first token still has the target's distribution."""
    target = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    logits = np.stack([target, target])
    rng = np.random.default_rng(0)
    firsts = []
    for _ in range(20000):
        kept, token = verify_sampled(logits, [3], SamplingParams(temperature=1.0), rng)
        firsts.append(kept[0] if kept else token)
    freq = np.bincount(firsts, minlength=4) / len(firsts)
    assert np.abs(freq - np.exp(target)).max() < 0.012, freq


def test_a_draft_models_own_probabilities_enter_the_acceptance_and_the_residual():
    target = np.log(np.array([0.6, 0.4], np.float32))
    draft_probs = np.array([[0.2, 0.8]])            # the drafter over-proposes token 1
    rng = np.random.default_rng(1)
    firsts = []
    for _ in range(20000):
        drafted = int(rng.random() < 0.8)           # drafts drawn from the drafter's distribution
        kept, token = verify_sampled(np.stack([target, target]), [drafted], SamplingParams(), rng, draft_probs)
        firsts.append(kept[0] if kept else token)
    assert abs(np.mean(np.array(firsts) == 0) - 0.6) < 0.012
