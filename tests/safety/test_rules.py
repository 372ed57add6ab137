from inferd.safety import RuleSet


def test_patterns_and_words_find_the_first_match_and_name_the_rule_not_the_text():
    rules = RuleSet(patterns=[r"\d{3}-\d{2}-\d{4}", r"(?i)api[_-]?key"], words=["Secret Sauce", "foo"])
    m = rules.search("the SECRET sauce is 123-45-6789")
    assert (m.start, m.rule) == (4, "word list")
    assert rules.search("my ssn 123-45-6789").rule == "pattern 0"
    assert rules.search("send your API-KEY").rule == "pattern 1"


def test_words_match_whole_words_only():
    rules = RuleSet(words=["foo"])
    assert rules.search("food and fool") is None
    assert rules.search("a FOO!").start == 2


def test_an_empty_rule_set_is_false_and_matches_nothing():
    assert not RuleSet()
    assert RuleSet().search("anything") is None


def test_the_earliest_match_wins_even_when_it_ends_after_a_later_one_starts():
    rules = RuleSet(patterns=[r"b", r"a\w+"])
    assert (rules.search("xabc").start, rules.search("xabc").rule) == (1, "pattern 1")
