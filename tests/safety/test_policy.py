"""A policy's input check: rules first, then classifiers bounded by the deadline, failing closed."""
import asyncio

import pytest

from inferd.config import InputRules, PolicyConfig
from inferd.safety import ClassifierFailed, Policy


class Flags:
    async def check(self, text, *, stage, tenant):
        return "S1: something" if "bad" in text else None


class Hangs:
    async def check(self, text, *, stage, tenant):
        await asyncio.sleep(60)


class Raises:
    async def check(self, text, *, stage, tenant):
        raise RuntimeError(f"could not judge {text!r}")


def policy(**classifiers) -> Policy:
    return Policy("p", PolicyConfig(input=InputRules(words=["forbidden"], classifiers=tuple(classifiers))),
                  classifiers)


async def test_words_then_a_classifiers_label_refuse_and_name_what_matched():
    p = policy(guard=Flags())
    assert p.match_input("a forbidden word").rule == "word list"
    assert (await p.classify_input("a bad one", "t", 5.0)).rule == "classifier guard: S1: something"
    assert await p.classify_input("fine", "t", 5.0) is None


async def test_a_classifier_past_the_deadline_or_raising_fails_closed_without_the_text():
    with pytest.raises(ClassifierFailed) as late:
        await policy(slow=Hangs()).classify_input("x", "t", 0.05)
    assert late.value.timed_out
    with pytest.raises(ClassifierFailed) as broken:
        await policy(broken=Raises()).classify_input("secret text", "t", 5.0)
    assert broken.value.error_type == "RuntimeError" and "secret" not in str(broken.value)
