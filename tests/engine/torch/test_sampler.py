"""TorchSampler against the reference sampler: the same tokens for the same seeds (greedy, every filter, the
bias and penalties, grammar masks and dead ends), the same log-probabilities, one transfer per call."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inferd.engine.reference.sampler import (
    Sampler,
    grammar_masked,
    make_rng,
    token_logprobs,
)
from inferd.engine.sequence import Sequence
from inferd.engine.torch import sampler as torch_sampler
from inferd.engine.torch.sampler import TorchSampler
from inferd.types import SamplingParams

VOCAB = 320
CPU = torch.device("cpu")


class FakeGrammar:
    """What the samplers read of a GrammarState: `allowed()`, `mask(row)` (the reference's), `failed`."""

    def __init__(self, allowed: np.ndarray) -> None:
        self._allowed = allowed
        self.failed = False

    def allowed(self) -> np.ndarray:
        return self._allowed

    def mask(self, row: np.ndarray) -> None:
        n = min(len(row), len(self._allowed))
        np.copyto(row[:n], -np.inf, where=~self._allowed[:n])
        row[n:] = -np.inf


def make_seqs(params: list[SamplingParams], seed: int = 0, grammars: list | None = None) -> list[Sequence]:
    """One sequence per params, row i seeded with seed + i, with a prompt and some output for the penalties."""
    gen = np.random.default_rng(seed)
    seqs = []
    for i, p in enumerate(params):
        seq = Sequence(f"r{i}", gen.integers(0, VOCAB, 12).tolist(), p)
        seq.token_ids += gen.integers(0, 40, 8).tolist()       # repeats among a few ids: counts above 1
        seq.rng = None if p.greedy else make_rng(seed + i)
        seq.grammar = None if grammars is None or grammars[i] is None else FakeGrammar(grammars[i].copy())
        seqs.append(seq)
    return seqs


def reference(logits: np.ndarray, seqs: list[Sequence]) -> tuple[list[int], list]:
    """What the reference engine's step makes of these logits: the grammar mask, the sampler, logprobs."""
    masked = grammar_masked(logits.copy(), seqs)
    tokens = Sampler().sample(masked, [s.sampling for s in seqs], [s.rng for s in seqs], seqs)
    wanted = [j for j, s in enumerate(seqs) if s.sampling.logprobs is not None]
    logprobs = [None] * len(seqs)
    if wanted:
        found = token_logprobs(masked[wanted], [tokens[j] for j in wanted], [seqs[j].sampling.logprobs for j in wanted])
        for j, lp in zip(wanted, found):
            logprobs[j] = lp
    return tokens, logprobs


def random_logits(rows: int, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(rows, VOCAB)) * scale).astype(np.float32)


def both(params: list[SamplingParams], steps: int = 4, seed: int = 0, grammars=None, dtype=torch.float32):
    """Tokens (and logprobs) of the reference and the torch sampler over `steps` steps, twin sequences each."""
    ref_seqs, dev_seqs = make_seqs(params, seed, grammars), make_seqs(params, seed, grammars)
    sampler = TorchSampler(CPU, VOCAB)
    out = []
    for step in range(steps):
        logits = torch.from_numpy(random_logits(len(params), seed * 100 + step)).to(dtype)
        expected = reference(logits.float().numpy(), ref_seqs)
        got = sampler.sample(logits, dev_seqs)
        out.append((expected, got))
    return out, ref_seqs, dev_seqs


def assert_logprobs_match(expected, got) -> None:
    assert (expected is None) == (got is None)
    if expected is None:
        return
    assert got.token_id == expected.token_id
    assert got.logprob == pytest.approx(expected.logprob, abs=1e-4)
    # The reference lists token 0 again for each -inf it reaches (its argmax passes cannot tell a token they
    # masked from one the grammar did); the torch sampler gives the lowest ids not listed yet, as ties go.
    finite = sum(1 for _, v in expected.top if v != -np.inf)
    assert [t for t, _ in got.top[:finite]] == [t for t, _ in expected.top[:finite]]
    np.testing.assert_allclose([v for _, v in got.top], [v for _, v in expected.top], atol=1e-4)
    listed = {t for t, _ in got.top[:finite]}
    assert [t for t, _ in got.top[finite:]] == [t for t in range(VOCAB) if t not in listed][:len(got.top) - finite]


def test_greedy_rows_take_the_argmax_of_the_biased_and_penalised_logits():
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1),
              SamplingParams(temperature=0.0, logit_bias=((5, 30.0), (7, -2.5))),
              SamplingParams(temperature=0.0, repetition_penalty=1.8),
              SamplingParams(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5)] * 3
    for (expected, _), (tokens, logprobs) in both(params)[0]:
        assert tokens == expected
        assert logprobs == [None] * len(params)


FILTERS = {
    "temperature": {"temperature": 0.8},
    "min_p": {"temperature": 1.0, "min_p": 0.05},
    "top_k": {"temperature": 1.2, "top_k": 7},
    "top_k_over_vocab": {"temperature": 1.0, "top_k": VOCAB + 5},
    "top_p": {"temperature": 1.0, "top_p": 0.7},
    "top_k_top_p": {"temperature": 0.9, "top_k": 20, "top_p": 0.8},
    "min_p_top_k_top_p": {"temperature": 1.0, "min_p": 0.02, "top_k": 30, "top_p": 0.9},
    "logit_bias": {"temperature": 1.0, "logit_bias": ((3, 4.0), (9, -100.0), (11, 2.5))},
    "repetition": {"temperature": 1.0, "repetition_penalty": 1.5},
    "frequency_presence": {"temperature": 1.0, "frequency_penalty": 0.7, "presence_penalty": 0.4},
    "everything": {"temperature": 0.7, "min_p": 0.01, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.2,
                       "frequency_penalty": 0.3, "presence_penalty": 0.2, "logit_bias": ((1, 1.0),)},
}


@pytest.mark.parametrize("name", FILTERS)
def test_each_filter_draws_the_references_token_for_the_same_seed(name):
    params = [SamplingParams(**FILTERS[name])] * 16
    draws = set()
    for (expected, _), (tokens, _) in both(params, seed=3)[0]:
        assert tokens == expected
        draws.update(tokens)
    assert len(draws) > 1                  # really random: not one token for every seed


def test_a_mixed_batch_draws_what_the_reference_draws_row_by_row():
    params = [SamplingParams(**kwargs) for kwargs in FILTERS.values()] + [SamplingParams(temperature=0.0)] * 3
    for (expected, _), (tokens, _) in both(params[::-1] + params, steps=6, seed=5)[0]:
        assert tokens == expected


def test_min_p_leaving_fewer_tokens_than_top_k_draws_in_token_id_order():
    # min_p keeps about a handful of tokens, fewer than top_k: the reference does not sort them (candidate_probs),
    # while a batchmate whose min_p keeps more than top_k does
    params = [SamplingParams(temperature=1.0, min_p=0.3, top_k=40), SamplingParams(temperature=1.0, min_p=0.3, top_k=2),
              SamplingParams(temperature=1.0, top_k=5)] * 8
    for (expected, _), (tokens, _) in both(params, steps=8, seed=11)[0]:
        assert tokens == expected


def test_a_top_k_past_the_selection_limit_sorts_the_vocabulary(monkeypatch):
    monkeypatch.setattr(torch_sampler, "TOPK_LIMIT", 4)
    params = [SamplingParams(temperature=1.0, top_k=9), SamplingParams(temperature=1.0, top_k=3, top_p=0.9)] * 8
    for (expected, _), (tokens, _) in both(params, seed=2)[0]:
        assert tokens == expected


def test_logprobs_are_the_references_raw_values_with_the_same_top_ids():
    narrow = np.zeros(VOCAB, dtype=bool)
    narrow[[4, 90, 200]] = True                 # fewer allowed tokens than k: the rest tie at -inf, lowest ids first
    params = [SamplingParams(temperature=0.0, logprobs=5), SamplingParams(temperature=0.9, logprobs=0, seed=1),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, logprobs=20, repetition_penalty=2.0),
              SamplingParams(temperature=0.0, logprobs=6), SamplingParams(temperature=0.0, logprobs=3)]
    grammars = [None, None, None, None, narrow, np.zeros(VOCAB, dtype=bool)]     # the last: a dead end
    for (expected, expected_lp), (tokens, logprobs) in both(params, seed=4, grammars=grammars)[0]:
        assert tokens == expected
        for e, g in zip(expected_lp, logprobs):
            assert_logprobs_match(e, g)


def test_grammar_rows_sample_only_allowed_tokens_and_a_dead_end_fails_its_grammar_alone():
    short = np.zeros(VOCAB - 64, dtype=bool)    # a grammar over fewer ids than the logits: the rest are banned
    short[[3, 17, 250]] = True
    wide = np.zeros(VOCAB + 64, dtype=bool)     # and over more
    wide[[8, VOCAB + 1]] = True
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=1.0)]
    grammars = [short, wide, np.zeros(VOCAB, dtype=bool), None]
    results, _, seqs = both(params, steps=6, seed=9, grammars=grammars)
    for (expected, _), (tokens, _) in results:
        assert tokens == expected
        assert tokens[0] in {3, 17, 250} and tokens[1] == 8
    assert [s.grammar.failed if s.grammar else None for s in seqs] == [False, False, True, None]


def test_a_real_grammar_state_masks_as_the_reference_does():
    from inferd.engine.sim.guided import sim_grammars
    from inferd.engine.sim.profiles import sim_tokenizer
    from inferd.types import GuidedDecoding

    tokenizer = sim_tokenizer(4096)
    grammars = sim_grammars(tokenizer)
    compiled = grammars.compile(GuidedDecoding(kind="choice", spec='["yes","no","maybe"]'))
    sampler = TorchSampler(CPU, 4096)
    for seed in range(4):
        seqs = []
        for _ in range(2):
            seq = Sequence("g", [1, 2, 3], SamplingParams(temperature=1.0, logprobs=2))
            seq.rng, seq.grammar = make_rng(seed), grammars.matcher(GuidedDecoding(kind="choice",
                                                                                   spec='["yes","no","maybe"]'))
            seqs.append(seq)
        assert compiled is not None
        logits = np.random.default_rng(seed).normal(size=(1, 4096)).astype(np.float32)
        expected, expected_lp = reference(logits, seqs[:1])
        tokens, logprobs = sampler.sample(torch.from_numpy(logits), seqs[1:])
        assert tokens == expected
        assert_logprobs_match(expected_lp[0], logprobs[0])


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_its_batch():
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    row = random_logits(1, seed=8)
    sampler = TorchSampler(CPU, VOCAB)
    alone = make_seqs([seeded], seed=50)
    solo = [sampler.sample(torch.from_numpy(row), alone)[0][0] for _ in range(20)]
    others = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0), seeded,
              SamplingParams(temperature=1.3, top_k=3), SamplingParams(temperature=1.0, min_p=0.1)]
    batch = make_seqs(others, seed=1)
    batch[2].rng = make_rng(50)
    logits = np.concatenate([random_logits(2, seed=1), row, random_logits(2, seed=2)])
    mixed = [sampler.sample(torch.from_numpy(logits), batch)[0][2] for _ in range(20)]
    assert solo == mixed and len(set(solo)) > 1


def test_one_transfer_to_the_host_and_one_upload_per_call(monkeypatch):
    """Every result comes back through `_to_host`, once; nothing outside it and the upload reads a tensor's value
    on the host (on CUDA each of those would be one more wait for the device); the host's data goes up in one copy."""
    transfers, uploads, stray, inside = [], [], [], [False]
    real_to_host, real_send = torch_sampler._to_host, torch_sampler.HostUpload.send

    def to_host(packed):
        transfers.append(packed.shape)
        inside[0] = True
        try:
            return real_to_host(packed)
        finally:
            inside[0] = False

    def send(self, arrays):         # host work on its staging buffer, which is host memory on CUDA too
        uploads.append(sorted(arrays))
        inside[0] = True
        try:
            return real_send(self, arrays)
        finally:
            inside[0] = False

    def guarded(name: str):
        real = getattr(torch.Tensor, name)

        def guard(self, *args, **kwargs):
            if not inside[0]:
                stray.append(name)
            return real(self, *args, **kwargs)
        return guard

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, guarded(name))
    monkeypatch.setattr(torch_sampler, "_to_host", to_host)
    monkeypatch.setattr(torch_sampler.HostUpload, "send", send)
    allowed = np.zeros(VOCAB, dtype=bool)
    allowed[[1, 2]] = True
    params = [SamplingParams(**kwargs, logprobs=3) for kwargs in FILTERS.values()] + [SamplingParams(temperature=0.0)]
    seqs = make_seqs(params, grammars=[allowed] + [None] * (len(params) - 2) + [np.zeros(VOCAB, dtype=bool)])
    sampler = TorchSampler(CPU, VOCAB)
    tokens, _ = sampler.sample(torch.from_numpy(random_logits(len(params))), seqs)
    assert len(tokens) == len(params) and len(transfers) == 1 and len(uploads) == 1 and stray == []
    sampler.sample(torch.from_numpy(random_logits(3)), make_seqs([SamplingParams(temperature=0.0)] * 3))
    assert len(transfers) == 2 and len(uploads) == 1 and stray == []       # all greedy: nothing to upload


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_are_sampled_as_their_float32_values(dtype):
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=1.0, top_p=0.9),
              SamplingParams(temperature=1.0, repetition_penalty=1.3)]
    for (expected, expected_lp), (tokens, logprobs) in both(params, dtype=dtype)[0]:
        assert tokens == expected
        assert_logprobs_match(expected_lp[0], logprobs[0])


def test_the_callers_logits_are_left_as_they_were():
    logits = torch.from_numpy(random_logits(2))
    before = logits.clone()
    allowed = np.zeros(VOCAB, dtype=bool)
    allowed[5] = True
    seqs = make_seqs([SamplingParams(temperature=0.0, logit_bias=((3, 50.0),)), SamplingParams(temperature=1.0)],
                     grammars=[None, allowed])
    TorchSampler(CPU, VOCAB).sample(logits, seqs)
    assert torch.equal(logits, before)


def test_an_empty_batch_samples_nothing():
    assert TorchSampler(CPU, VOCAB).sample(torch.zeros(0, VOCAB), []) == ([], [])


@pytest.mark.parametrize("case", ["rows", "width", "no_rng", "token_outside_vocab"])
def test_bad_inputs_are_clear_errors(case):
    sampler = TorchSampler(CPU, VOCAB)
    params = [SamplingParams(temperature=1.0, repetition_penalty=1.2)]
    seqs = make_seqs(params)
    logits = torch.from_numpy(random_logits(1))
    if case == "rows":
        logits = torch.from_numpy(random_logits(2))
    elif case == "width":
        logits = torch.zeros(1, VOCAB + 1)
    elif case == "no_rng":
        seqs[0].rng = None
    else:
        seqs[0].token_ids.append(VOCAB)
    with pytest.raises(ValueError):
        sampler.sample(logits, seqs)


def test_bias_and_penalties_give_the_references_logits_exactly_as_contexts_grow():
    from inferd.engine.reference.sampler import adjust_logits
    from inferd.engine.torch.sampling_plan import TokenHistory, plan
    from inferd.engine.torch.upload import HostUpload

    params = [SamplingParams(temperature=1.0, repetition_penalty=1.7), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, frequency_penalty=0.9, presence_penalty=-0.6),
              SamplingParams(temperature=1.0, logit_bias=((0, -3.3), (319, 7.1)), repetition_penalty=0.8,
                             frequency_penalty=-1.1, presence_penalty=1.9),
              SamplingParams(temperature=1.0, frequency_penalty=0.5)]
    seqs = make_seqs(params)
    seqs[4].token_ids = seqs[4].token_ids[:seqs[4].num_prompt_tokens]        # no output yet: nothing to count
    history, upload = TokenHistory(), HostUpload(CPU)
    for step in range(4):
        logits = random_logits(len(params), seed=step)
        steps = plan(seqs, VOCAB, torch_sampler.TOPK_LIMIT, history)
        flat = torch.from_numpy(logits.copy()).view(-1)
        torch_sampler._adjust(flat, upload.send(steps.arrays), steps)
        assert np.array_equal(flat.view(len(params), VOCAB).numpy(), adjust_logits(logits, params, seqs))
        for seq in seqs:
            seq.token_ids += [step, 3 * step + 1, 300]                         # the history extends, not rebuilds


def test_each_random_row_draws_exactly_one_uniform_and_greedy_rows_none():
    params = [SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, min_p=0.2, top_k=3)]
    seqs = make_seqs(params)
    seqs[1].rng = make_rng(7)                       # a greedy row's generator is never touched
    sampler = TorchSampler(CPU, VOCAB)
    for _ in range(3):
        sampler.sample(torch.from_numpy(random_logits(3)), seqs)
    twins = [make_rng(0), make_rng(7), make_rng(2)]
    for rng in (twins[0], twins[2]):
        rng.random(3)
    assert [s.rng.random() for s in seqs] == [t.random() for t in twins]
