"""The penalties and filters on the wire: accepted in range on both endpoints, carried into Prepared, and
refused out of range with a 400 naming the field."""
from __future__ import annotations

import msgspec
import pytest

from inferd.api.errors import ApiError
from inferd.api.wire.openai import decode, prepare


def body(kind: str, **fields) -> bytes:
    base = {"model": "m", "prompt": "hi"} if kind == "completion" else {
        "model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return msgspec.json.encode({**base, **fields})


def rejected(kind: str, **fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        prepare(kind, decode(kind, body(kind, **fields)))
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_every_parameter_is_accepted_and_carried_into_prepared(kind):
    p = prepare(kind, decode(kind, body(kind, presence_penalty=0.5, frequency_penalty=-1, top_k=40, min_p=0.05,
                                         repetition_penalty=1.3, logit_bias={"17": -100, "5": 2.5})))
    assert (p.presence_penalty, p.frequency_penalty, p.top_k, p.min_p, p.repetition_penalty) == (
        0.5, -1.0, 40, 0.05, 1.3)
    assert p.logit_bias == ((5, 2.5), (17, -100.0))      # by token id


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_absent_parameters_leave_sampling_unchanged(kind):
    p = prepare(kind, decode(kind, body(kind, presence_penalty=None, logit_bias=None, top_k=None)))
    assert (p.presence_penalty, p.frequency_penalty, p.top_k, p.min_p, p.repetition_penalty, p.logit_bias) == (
        0.0, 0.0, 0, 0.0, 1.0, ())


@pytest.mark.parametrize("top_k", [-1, 0])
def test_top_k_minus_one_and_zero_both_mean_no_filter(top_k):
    assert prepare("completion", decode("completion", body("completion", top_k=top_k))).top_k == 0


@pytest.mark.parametrize("field,value", [
    ("presence_penalty", 2.01), ("presence_penalty", -2.5), ("frequency_penalty", 3), ("frequency_penalty", -2.01),
    ("top_k", -2), ("min_p", -0.1), ("min_p", 1.01), ("repetition_penalty", 0), ("repetition_penalty", -1),
    ("top_k", 1.5), ("presence_penalty", "high")])
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_out_of_range_values_are_a_400_naming_the_field(kind, field, value):
    err = rejected(kind, **{field: value})
    assert err.param == field and field in err.message


@pytest.mark.parametrize("bias,says", [
    ({"5": 100.5}, "in [-100, 100]"), ({"5": -101}, "in [-100, 100]"), ({"five": 1}, "token ids"),
    ({"-1": 1}, "token ids"), ({"05": 1}, "token ids"), ({"1" * 11: 1}, "token ids"), ({"5\n": 1}, "token ids"),
    ({str(i): 1 for i in range(301)}, "at most 300")])
def test_bad_logit_bias_is_a_400_naming_logit_bias(bias, says):
    err = rejected("chat", logit_bias=bias)
    assert err.param == "logit_bias" and says in err.message


def test_logit_bias_values_must_be_numbers():
    assert rejected("completion", logit_bias={"5": "up"}).param.startswith("logit_bias")


def test_three_hundred_logit_bias_entries_are_accepted():
    p = prepare("completion", decode("completion", body("completion", logit_bias={str(i): 1 for i in range(300)})))
    assert len(p.logit_bias) == 300
