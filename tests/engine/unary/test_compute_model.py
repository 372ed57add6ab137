"""The compute model: the prior until something is measured, then a roofline-shaped curve through the
measured points: flat below the smallest, interpolated between, extended above the largest."""
from __future__ import annotations

import math

from inferd.engine.unary import ComputeModel


def roofline(tokens: int) -> float:
    return max(0.005, 0.00003 * tokens)     # 5 ms to read the weights; compute-bound above 167 tokens


def test_the_prior_answers_until_something_is_measured():
    model = ComputeModel(prior=lambda requests, tokens: 0.001 * requests)
    assert model.estimate(3, 100) == 0.003
    model.observe(100, 0.02)
    assert model.estimate(3, 100) == 0.02
    assert ComputeModel().estimate(3, 100) == 0.0


def test_measured_shapes_trace_a_roofline_flat_then_rising():
    model = ComputeModel()
    for tokens in (16, 64, 256, 1024, 4096):
        model.observe(tokens, roofline(tokens))
    assert model.estimate(1, 8) == roofline(16)                             # below the smallest: flat
    assert math.isclose(model.estimate(2, 40), 0.005)                       # between two flat points
    assert math.isclose(model.estimate(8, 2048), roofline(2048), rel_tol=1e-9)   # on the rising part
    assert math.isclose(model.estimate(32, 8192), roofline(8192), rel_tol=1e-9)  # extended upward
    assert 0.005 <= model.estimate(4, 200) <= roofline(256)                 # at the bend: between its points


def test_one_shape_alone_scales_with_tokens_above_and_stays_flat_below():
    model = ComputeModel()
    model.observe(100, 0.01)
    assert math.isclose(model.estimate(1, 200), 0.02) and model.estimate(1, 50) == 0.01


def test_the_estimate_follows_a_slower_machine():
    model = ComputeModel()
    for _ in range(10):
        model.observe(100, 0.011)
    for _ in range(20):                 # the hardware got twice as slow
        model.observe(100, 0.022)
    assert model.estimate(1, 100) > 1.9 * 0.011
