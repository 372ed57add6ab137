"""A unary engine's compute time per batch shape, measured: seconds as a function of the batch's tokens.

The shape is a roofline's: flat while reading the weights dominates (small batches cost about the same
whatever their size), then rising with the tokens once the dense layers' FLOPs do (on a CPU the flat
part is short). A straight line fitted to whatever batches happened to run gets both ends wrong, so the
model keeps one point per power-of-two range of token counts, each an exponentially weighted mean of the
(tokens, seconds) measured there, and interpolates between neighbouring points. Below the smallest
point it answers that point's time (flat: a small batch costs no less than the weights' read); above
the largest it extends the slope of the two largest (or, with one point, scales it by tokens): both err
towards longer estimates. Before anything is measured it uses the backend's prior (the sim profile's
roofline; none for the reference engine, whose warmup measures several shapes before the first request).
"""
from __future__ import annotations

import bisect
from collections.abc import Callable

ALPHA = 0.2             # weight of a new measurement in its range's mean


class ComputeModel:
    """Loop-thread only (the engine records measurements on the loop)."""

    def __init__(self, prior: Callable[[int, int], float] | None = None) -> None:
        self._prior = prior
        self._ranges: dict[int, list[float]] = {}     # tokens.bit_length() -> [mean tokens, mean seconds]
        self._xs: list[float] = []
        self._ys: list[float] = []
        self.measured = 0

    def observe(self, tokens: int, seconds: float) -> None:
        point = self._ranges.get(tokens.bit_length())
        if point is None:
            self._ranges[tokens.bit_length()] = [float(tokens), seconds]
        else:
            point[0] += ALPHA * (tokens - point[0])
            point[1] += ALPHA * (seconds - point[1])
        points = sorted(self._ranges.values())
        self._xs, self._ys = [p[0] for p in points], [p[1] for p in points]
        self.measured += 1

    def estimate(self, requests: int, tokens: int) -> float:
        """Seconds a batch of `requests` inputs holding `tokens` tokens is expected to take."""
        xs, ys = self._xs, self._ys
        if not xs:
            return self._prior(requests, tokens) if self._prior is not None else 0.0
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            if len(xs) == 1:
                return ys[0] * tokens / xs[0]
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) if xs[-1] > xs[-2] else 0.0
            return ys[-1] + slope * (tokens - xs[-1])
        k = bisect.bisect_right(xs, tokens)
        x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0) if x1 > x0 else max(y0, y1)

    @property
    def points(self) -> list[tuple[float, float]]:
        """The measured (tokens, seconds) points, by tokens."""
        return list(zip(self._xs, self._ys))
