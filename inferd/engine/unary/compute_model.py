"""A unary engine's compute time per batch shape, measured: seconds ~ a + b * tokens.

Batched encoders cost a fixed part per batch (reading the weights, launching kernels) plus a part
per token (the dense layers' FLOPs); attention's quadratic share is small at embedding lengths and is
absorbed by the fit. The line is an exponentially weighted least-squares fit over measured batches,
so it follows the hardware as it warms, throttles or shares the machine. Before anything is measured
it uses the backend's prior (the sim profile's roofline; zero for the reference engine, whose warmup
measures it before the first request).
"""
from __future__ import annotations

from collections.abc import Callable

DECAY = 0.97            # weight of the past per new measurement (about the last 30 batches count)


class ComputeModel:
    """Loop-thread only (the engine records measurements on the loop)."""

    def __init__(self, prior: Callable[[int, int], float] | None = None) -> None:
        self._prior = prior
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.measured = 0
        self._fixed = 0.0       # a: seconds per batch
        self._per_token = 0.0   # b: seconds per token

    def observe(self, tokens: int, seconds: float) -> None:
        d = DECAY
        self._w = self._w * d + 1.0
        self._x = self._x * d + tokens
        self._y = self._y * d + seconds
        self._xx = self._xx * d + tokens * tokens
        self._xy = self._xy * d + tokens * seconds
        self.measured += 1
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if var > 1e-9 * max(1.0, mx * mx):
            slope = (self._xy / self._w - mx * my) / var
        else:               # one shape seen so far: all of it per token (errs towards longer estimates)
            slope = my / mx if mx > 0 else 0.0
        slope = max(0.0, slope)
        self._per_token, self._fixed = slope, max(0.0, my - slope * mx)

    def estimate(self, requests: int, tokens: int) -> float:
        """Seconds a batch of `requests` inputs holding `tokens` tokens is expected to take."""
        if not self.measured:
            return self._prior(requests, tokens) if self._prior is not None else 0.0
        return self._fixed + self._per_token * tokens

    @property
    def line(self) -> tuple[float, float]:
        """(seconds per batch, seconds per token) as fitted (zeros before any measurement)."""
        return self._fixed, self._per_token
