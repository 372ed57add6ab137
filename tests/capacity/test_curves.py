from __future__ import annotations

import json

import pytest

from inferd.capacity import CurvesError, SloUnreachable, load_curves

from tests.capacity.helpers import curve, demand

GOOD = {"gpus_per_replica": 2, "prefill_tokens_per_s": 20000,
        "decode": [{"batch": 1, "step_s": 0.01}, {"batch": 64, "step_s": 0.02}]}


def write(tmp_path, profiles):
    path = tmp_path / "curves.json"
    path.write_text(json.dumps({"profiles": profiles}))
    return path


def test_step_time_is_interpolated_linearly_between_measured_batches():
    c = curve()
    assert c.step_s(1) == 0.010 and c.step_s(100) == 0.020
    assert c.step_s(34) == pytest.approx(0.010 + 0.010 * 33 / 99)


def test_the_decode_batch_is_the_largest_whose_step_fits_the_itl_target():
    c = curve()
    assert c.decode_batch_within(None) == 100
    assert c.decode_batch_within(0.015) == 50          # step(50) = 14.95 ms, step(51) = 15.05 ms
    assert c.decode_batch_within(0.015) < c.decode_batch_within(0.018)


def test_no_extrapolation_past_the_last_measured_batch():
    assert curve(max_batch=500).decode_batch_within(1.0) == 100


def test_an_itl_target_below_the_smallest_batch_step_is_unreachable_and_says_the_step():
    with pytest.raises(SloUnreachable, match=r"no batch meets itl_p99_ms=5: the profile's batch-1 step is 10.0 ms"):
        curve().decode_batch_within(0.005)


def test_a_valid_file_loads_with_the_p95_prompt_priced_at_the_prefill_rate(tmp_path):
    (c,) = load_curves(write(tmp_path, {"h100": GOOD}), demand(prompt={"mean": 1000, "p95": 4000}))
    assert (c.name, c.gpus_per_replica, c.max_batch, c.max_batch_reason) == ("h100", 2, 64, "max_batch")
    assert c.prefill_p95_s == pytest.approx(0.2)
    assert c.source == "measured (curves.json)"


@pytest.mark.parametrize(("change", "field"), [
    ({"gpus_per_replica": 0}, "profiles.h100.gpus_per_replica"),
    ({"gpus_per_replica": 1.5}, "profiles.h100.gpus_per_replica"),
    ({"prefill_tokens_per_s": "fast"}, "profiles.h100.prefill_tokens_per_s"),
    ({"decode": []}, "profiles.h100.decode must be a non-empty list"),
    ({"decode": [{"batch": 1, "step_s": 0.01}, {"batch": 8, "step_s": -1}]}, r"profiles.h100.decode\[1\].step_s"),
    ({"decode": [{"batch": 8, "step_s": 0.01}, {"batch": 4, "step_s": 0.02}]}, r"profiles.h100.decode\[1\].batch"),
    ({"decode": [{"batch": 1, "step": 0.01}]}, r"profiles.h100.decode\[0\] must be an object"),
    ({"max_batch": 0}, "profiles.h100.max_batch"),
    ({"prefill_tok_s": 1}, "unknown field.*prefill_tok_s"),
])
def test_a_bad_field_is_refused_by_its_path(tmp_path, change, field):
    with pytest.raises(CurvesError, match=field):
        load_curves(write(tmp_path, {"h100": {**GOOD, **change}}), demand())


def test_a_file_without_profiles_or_not_json_is_refused(tmp_path):
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(CurvesError, match="exactly one key, 'profiles'"):
        load_curves(tmp_path / "empty.json", demand())
    with pytest.raises(CurvesError, match="profiles must be a non-empty object"):
        load_curves(write(tmp_path, {}), demand())
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(CurvesError, match="not valid JSON"):
        load_curves(tmp_path / "broken.json", demand())
