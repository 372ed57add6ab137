"""Grammars and GrammarState (inferd.engine.grammar): compiling, the bounded cache, refusals, the mask."""
from __future__ import annotations

import json

import numpy as np
import pytest

from inferd.engine.grammar import MAX_SPEC_BYTES, GrammarError, Grammars, GrammarState, choice_regex
from inferd.engine.sim.guided import sim_grammars
from inferd.engine.sim.profiles import sim_tokenizer
from inferd.types import GuidedDecoding
from tests.engine.grammar_walk import Walk

TOKENIZER = sim_tokenizer(4096)
WALK = Walk(TOKENIZER)
SCHEMA = GuidedDecoding(kind="json_schema", spec='{"properties":{"a":{"type":"integer"}},"required":["a"],'
                                                 '"type":"object"}')


@pytest.fixture
def grammars() -> Grammars:
    return sim_grammars(TOKENIZER)


def walk(state: GrammarState, seed: int = 0, limit: int = 300) -> list[int]:
    tokens = WALK.tokens(state, seed, limit)
    assert tokens is not None, "the walk did not end"
    return tokens


def test_a_second_compile_of_the_same_grammar_compiles_nothing(grammars):
    first = grammars.compile(SCHEMA)
    assert grammars.compiles == 1
    assert grammars.compile(GuidedDecoding(kind="json_schema", spec=SCHEMA.spec)) is first
    assert grammars.compiles == 1 and grammars.cached(SCHEMA)


def test_refusals_are_grammar_errors_with_xgrammars_reason_and_are_cached(grammars):
    bad = GuidedDecoding(kind="json_schema", spec='{"type":"integer","minimum":5,"maximum":3}')
    for _ in range(2):
        with pytest.raises(GrammarError, match="minimum greater than maximum") as info:
            grammars.compile(bad)
        assert "/project/" not in str(info.value) and "\n" not in str(info.value)
    assert grammars.compiles == 1 and not grammars.cached(bad)


@pytest.mark.parametrize(("guided", "reason"), [
    (GuidedDecoding(kind="json_schema", spec="{not json"), "refused"),
    (GuidedDecoding(kind="json_schema", spec='{"type":"strin"}'), "strin"),
    (GuidedDecoding(kind="regex", spec="(ab"), "parenthesis"),
    (GuidedDecoding(kind="grammar", spec="root ::= missing"), "missing"),
    (GuidedDecoding(kind="choice", spec="[]"), "non-empty list"),
    (GuidedDecoding(kind="choice", spec='["a", 1]'), "list of strings"),
    (GuidedDecoding(kind="choice", spec="nope"), "JSON list"),
])
def test_each_kind_of_bad_grammar_is_a_clean_error(grammars, guided, reason):
    with pytest.raises(GrammarError, match=reason):
        grammars.compile(guided)


def test_a_spec_over_the_size_bound_is_refused_before_compiling(grammars):
    huge = GuidedDecoding(kind="regex", spec="a" * (MAX_SPEC_BYTES + 1))
    with pytest.raises(GrammarError, match="longer than"):
        grammars.compile(huge)
    assert grammars.compiles == 0


def test_the_cache_is_bounded_least_recently_used_first():
    grammars = Grammars.for_pieces(TOKENIZER.token_bytes(), TOKENIZER.eos_token_ids, TOKENIZER.vocab_size,
                                   max_entries=2)
    a, b, c = (GuidedDecoding(kind="regex", spec=s) for s in ("a+", "b+", "c+"))
    grammars.compile(a), grammars.compile(b), grammars.compile(a), grammars.compile(c)
    assert grammars.cached(a) and grammars.cached(c) and not grammars.cached(b)


@pytest.mark.parametrize("look", ["cached", "cached_matcher"])
def test_a_cache_hit_through_the_apis_look_ups_keeps_a_grammar_in_use_from_eviction(look):
    grammars = Grammars.for_pieces(TOKENIZER.token_bytes(), TOKENIZER.eos_token_ids, TOKENIZER.vocab_size,
                                   max_entries=2)
    a, b, c = (GuidedDecoding(kind="regex", spec=s) for s in ("a+", "b+", "c+"))
    grammars.compile(a), grammars.compile(b)
    assert getattr(grammars, look)(a)          # a request using `a` again, as the API and the sim look it up
    grammars.compile(c)
    assert grammars.cached(a) and not grammars.cached(b)


def test_mask_leaves_only_allowed_tokens_and_pads_the_rest(grammars):
    state = GrammarState(grammars.compile(GuidedDecoding(kind="choice", spec='["yes","no"]')), 4096)
    row = np.zeros(4096 + 64, dtype=np.float32)     # a model may have more logits than the tokenizer has ids
    state.mask(row)
    finite = set(np.flatnonzero(np.isfinite(row)).tolist())
    assert finite and all(TOKENIZER.decode([t]) and ("yes".startswith(TOKENIZER.decode([t]))
                                                      or "no".startswith(TOKENIZER.decode([t]))) for t in finite)


def test_a_walk_under_the_mask_yields_schema_output(grammars):
    text = TOKENIZER.decode(walk(grammars.matcher(SCHEMA)))
    assert isinstance(json.loads(text)["a"], int)


def test_json_object_yields_an_object(grammars):
    for seed in range(3):
        text = TOKENIZER.decode(walk(grammars.matcher(GuidedDecoding(kind="json_object")), seed))
        assert isinstance(json.loads(text), dict)


def test_choice_escapes_regex_syntax():
    choices = ["a.b", "c|d (x)", "e\\f", "[g]{2}", "h-i/j"]
    regex = choice_regex(json.dumps(choices))
    grammars = sim_grammars(TOKENIZER)
    seen = {TOKENIZER.decode(walk(grammars.matcher(GuidedDecoding(kind="choice", spec=json.dumps(choices))), s))
            for s in range(20)}
    assert seen <= set(choices) and len(seen) > 1 and regex.startswith("(")


def test_accepting_a_token_the_grammar_forbids_marks_it_failed(grammars):
    state = grammars.matcher(GuidedDecoding(kind="regex", spec="abc"))
    assert not state.accept(TOKENIZER.token_to_id("z"))
    assert state.failed and not state.terminated


def test_verdict_and_cached_matcher_never_compile(grammars):
    bad = GuidedDecoding(kind="regex", spec="[")
    assert grammars.verdict(SCHEMA) is None and grammars.cached_matcher(SCHEMA) is None
    grammars.compile(SCHEMA)
    with pytest.raises(GrammarError):
        grammars.compile(bad)
    assert grammars.verdict(SCHEMA) == "" and "refused" in grammars.verdict(bad)
    assert grammars.cached_matcher(SCHEMA) is not None and grammars.cached_matcher(bad) is None
    assert grammars.compiles == 2


def test_json_never_allows_a_control_character(grammars):
    state = grammars.matcher(GuidedDecoding(kind="json_schema", spec='{"type":"string"}'))
    state.accept(TOKENIZER.token_to_id('"'))
    allowed = state.allowed()
    (control,) = TOKENIZER.encode("\x15", add_special_tokens=False)     # a byte token
    assert not allowed[control] and not allowed[TOKENIZER.token_to_id("\n")]
    assert allowed[TOKENIZER.token_to_id("a")]
    regex = grammars.matcher(GuidedDecoding(kind="regex", spec="a\\nb"))
    regex.accept(TOKENIZER.token_to_id("a"))
    assert regex.allowed()[TOKENIZER.token_to_id("\n")]          # other grammars may ask for one


def _gated_compiles(grammars, monkeypatch):
    """Make grammars' compiles wait for `release`; `second` is set when a second caller either compiles too
    or waits for the first's flight (whichever it does)."""
    import threading

    from inferd.engine import grammar as grammar_module

    entered, release, second = threading.Event(), threading.Event(), threading.Event()
    runs: list[str] = []
    real = grammars._run_compiler

    def gated(compiler, guided):
        runs.append(guided.spec)
        if len(runs) > 1:
            second.set()
        entered.set()
        assert release.wait(30)
        return real(compiler, guided)

    class WatchedFlight(grammar_module._Flight):
        def result(self, timeout=None):
            second.set()
            return super().result(timeout)

    monkeypatch.setattr(grammars, "_run_compiler", gated)
    monkeypatch.setattr(grammar_module, "_Flight", WatchedFlight)
    return entered, release, second, runs


def test_concurrent_compiles_of_one_grammar_compile_once(grammars, monkeypatch):
    import threading

    entered, release, second, runs = _gated_compiles(grammars, monkeypatch)
    results: list = [None, None]

    def call(i: int) -> None:
        results[i] = grammars.compile(SCHEMA)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert entered.wait(30)
    assert grammars.in_flight(SCHEMA) is not None
    other = threading.Thread(target=call, args=(1,))
    other.start()
    assert second.wait(30)        # the second caller waits for the first (or, wrongly, compiles too)
    release.set()
    first.join(30), other.join(30)
    assert runs == [SCHEMA.spec] and results[0] is results[1] is not None
    assert grammars.in_flight(SCHEMA) is None


def test_a_refusal_reaches_every_caller_waiting_on_its_compile(grammars, monkeypatch):
    import threading

    bad = GuidedDecoding(kind="regex", spec="(")
    entered, release, second, runs = _gated_compiles(grammars, monkeypatch)
    errors: list = []

    def call() -> None:
        try:
            grammars.compile(bad)
        except GrammarError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call)]
    threads[0].start()
    assert entered.wait(30)
    threads.append(threading.Thread(target=call))
    threads[1].start()
    assert second.wait(30)
    release.set()
    for t in threads:
        t.join(30)
    assert len(runs) == 1 and len(errors) == 2 and str(errors[0]) == str(errors[1])
