"""The compute line: prior before any measurement, a fit of fixed + per-token cost after."""
from __future__ import annotations

import math

from inferd.engine.unary import ComputeModel


def test_the_prior_answers_until_something_is_measured():
    model = ComputeModel(prior=lambda requests, tokens: 0.001 * requests)
    assert model.estimate(3, 100) == 0.003
    model.observe(100, 0.02)
    assert model.estimate(3, 100) != 0.003
    assert ComputeModel().estimate(3, 100) == 0.0


def test_two_shapes_recover_the_fixed_and_per_token_costs():
    model = ComputeModel()
    for _ in range(5):
        model.observe(10, 0.005 + 10 * 0.0002)
        model.observe(500, 0.005 + 500 * 0.0002)
    fixed, per_token = model.line
    assert math.isclose(fixed, 0.005, rel_tol=1e-6) and math.isclose(per_token, 0.0002, rel_tol=1e-6)
    assert math.isclose(model.estimate(4, 200), 0.045, rel_tol=1e-6)


def test_one_shape_alone_is_charged_per_token():
    model = ComputeModel()
    model.observe(100, 0.01)
    assert math.isclose(model.estimate(1, 200), 0.02)


def test_the_fit_follows_a_slower_machine():
    model = ComputeModel()
    for _ in range(10):
        model.observe(10, 0.002)
        model.observe(100, 0.011)
    before = model.estimate(1, 100)
    for _ in range(60):                 # the hardware got twice as slow
        model.observe(10, 0.004)
        model.observe(100, 0.022)
    assert model.estimate(1, 100) > 1.8 * before
