"""Prompt lookup: the longest matching suffix, its latest earlier occurrence, bounded proposals."""
from __future__ import annotations

import pytest

from inferd.engine.speculative import NgramProposer


def test_the_tokens_after_the_latest_earlier_occurrence_of_the_suffix_are_proposed():
    p = NgramProposer(min_n=1, max_n=3)
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert p.propose(tokens, 3) == [4, 5, 6]           # [1, 2, 3] last seen before 4, 5, 6
    assert p.propose(tokens, 10) == [4, 5, 6, 7, 1, 2, 3]       # no further than the sequence goes


def test_a_longer_match_wins_over_a_later_shorter_one():
    p = NgramProposer(min_n=1, max_n=3)
    assert p.propose([5, 6, 7, 8, 0, 7, 9, 5, 6, 7], 2) == [8, 0]      # [5, 6, 7], not the later [7]


def test_nothing_is_proposed_without_a_match_of_at_least_min_n():
    p = NgramProposer(min_n=2, max_n=4)
    assert p.propose([1, 2, 3, 4, 5, 3], 4) == []       # only a 1-token suffix ([3]) occurred before
    assert p.propose([1, 2], 4) == [] and p.propose([1, 2, 1, 2], 0) == []


def test_the_search_looks_back_a_bounded_number_of_tokens():
    p = NgramProposer(min_n=2, max_n=2, max_lookback=8)
    tokens = [1, 2, 3] + [0, 4] * 10 + [1, 2]
    assert p.propose(tokens, 1) == []
    assert NgramProposer(min_n=2, max_n=2).propose(tokens, 1) == [3]


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(min_n=3, max_n=2)
