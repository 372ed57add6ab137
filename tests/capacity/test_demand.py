from __future__ import annotations

import re

import pytest

from inferd.capacity import DemandError, build_demand
from inferd.capacity.demand import read_demand_file, with_overrides

from tests.capacity.helpers import demand


def test_p95_defaults_to_the_mean_and_targets_to_none():
    d = demand()
    assert (d.prompt.p95, d.output.p95) == (500, 500)
    assert (d.ttft_p95_ms, d.itl_p99_ms, d.target_utilisation, d.zones) == (None, None, 0.8, 1)


def test_buckets_give_the_weighted_mean_and_the_length_where_95_percent_is_reached():
    d = demand(prompt={"buckets": [[1000, 0.2], [100, 0.7], [8000, 0.1]]})
    assert d.prompt.mean == pytest.approx(100 * 0.7 + 1000 * 0.2 + 8000 * 0.1)
    assert d.prompt.p95 == 8000        # 0.7 + 0.2 = 0.9 < 0.95 at 1000


def test_decode_context_is_the_prompt_plus_half_the_output():
    assert demand(prompt={"mean": 1000}, output={"mean": 400}).decode_context == 1200


def test_the_kv_footprint_of_a_sequence_is_sized_on_the_p95s():
    assert demand(prompt={"mean": 1000, "p95": 3000}, output={"mean": 100, "p95": 700}).sequence_tokens_p95 == 3700


@pytest.mark.parametrize(("raw", "names"), [
    ({"prompt": {"mean": 1}, "output": {"mean": 1}}, "requests_per_s is required (--rate"),
    ({"requests_per_s": 0, "prompt": {"mean": 1}, "output": {"mean": 1}}, "requests_per_s (--rate) must be > 0"),
    ({"requests_per_s": 1, "output": {"mean": 1}}, "prompt.mean is required"),
    ({"requests_per_s": 1, "prompt": {"mean": "long"}, "output": {"mean": 1}}, "prompt.mean (--prompt-mean)"),
    ({"requests_per_s": 1, "prompt": {"mean": 1}, "output": {"mean": 1}, "zones": 0}, "zones (--zones)"),
    ({"requests_per_s": 1, "prompt": {"mean": 1}, "output": {"mean": 1}, "target_utilisation": 1.5},
     "target_utilisation"),
    ({"requests_per_s": 1, "prompt": {"mean": 1}, "output": {"mean": 1}, "slo": {"itl_p99_ms": -1}},
     "slo.itl_p99_ms"),
    ({"requests_per_s": 1, "prompt": {"mean": 1}, "output": {"mean": 1}, "slo": {"ttft_p50_ms": 5}},
     "slo.ttft_p50_ms"),
    ({"requests_per_s": 1, "prompt": {"mean": 1, "buckets": [[1, 1]]}, "output": {"mean": 1}}, "either buckets"),
    ({"requests_per_s": 1, "prompt": {"buckets": [[0, 1]]}, "output": {"mean": 1}}, "prompt.buckets[0]"),
])
def test_invalid_demand_is_refused_naming_the_field(raw, names):
    with pytest.raises(DemandError, match=re.escape(names)):
        build_demand(raw)


def test_flags_override_the_file_and_replace_its_buckets(tmp_path):
    path = tmp_path / "demand.toml"
    path.write_text('requests_per_s = 5\nzones = 2\n[prompt]\nbuckets = [[100, 1]]\n[output]\nmean = 50\n'
                    '[slo]\nitl_p99_ms = 40\n')
    d = build_demand(with_overrides(read_demand_file(path), {"requests_per_s": 7.0, "prompt.mean": 300.0,
                                                             "slo.itl_p99_ms": None}))
    assert (d.requests_per_s, d.prompt.mean, d.output.mean, d.itl_p99_ms, d.zones) == (7.0, 300.0, 50, 40, 2)


def test_a_json_demand_file_is_read_as_json_and_a_broken_one_is_named(tmp_path):
    good = tmp_path / "d.json"
    good.write_text('{"requests_per_s": 3, "prompt": {"mean": 10}, "output": {"mean": 20}}')
    assert build_demand(read_demand_file(good)).requests_per_s == 3
    bad = tmp_path / "d.toml"
    bad.write_text("requests_per_s = = 3")
    with pytest.raises(DemandError, match="d.toml is not valid TOML"):
        read_demand_file(bad)
