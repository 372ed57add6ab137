"""When each part of one request happened: the pipeline's own marks plus the engine's stamps.

Server-Timing, the closing `: server-timing` comment of a stream, the stage histogram and the trace
spans are all read from here, so they cannot disagree with each other or with the code's order:
- api:          arrival -> the request enters the fair admission queue (every check before it)
- queue:        in the fair admission queue, until it is released to the engine
- engine_queue: in the engine's own queue, until its first step
- prefill:      first step -> first token
- decode:       first token -> the engine's last
- write:        the engine's last token -> the response written (postprocessing, framing, the ledger)
"""
from __future__ import annotations

import time

from inferd.types import EngineTiming

ADMISSION = "admission"      # the pipeline stage whose start ends `api`


class Timeline:
    """Monotonic marks of one request: its arrival and the start of each pipeline stage it reached."""

    __slots__ = ("arrival", "marks")

    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.marks: dict[str, float] = {}

    def mark(self, stage: str, at: float | None = None) -> None:
        self.marks[stage] = time.monotonic() if at is None else at

    def stages(self, timing: EngineTiming | None, now: float | None = None) -> dict[str, tuple[float, float]]:
        """The stages that happened, as (start, end) monotonic seconds, in order. `now`: when the response
        was written (for `write`); None leaves `write` out."""
        out: dict[str, tuple[float, float]] = {}
        if timing is None:
            return out
        queued = self.marks.get(ADMISSION, timing.submitted)
        out["api"] = (self.arrival, min(queued, timing.submitted))
        out["queue"] = (min(queued, timing.submitted), timing.submitted)
        if timing.first_scheduled is None:
            return out
        out["engine_queue"] = (timing.submitted, timing.first_scheduled)
        if timing.first_token is None:
            return out
        out["prefill"] = (timing.first_scheduled, timing.first_token)
        if timing.finished is None:
            return out
        out["decode"] = (timing.first_token, timing.finished)
        if now is not None:
            out["write"] = (timing.finished, max(now, timing.finished))
        return out

    def server_timing(self, timing: EngineTiming | None, now: float) -> str:
        """`Server-Timing` (milliseconds): the stages above, then total."""
        parts = [f"{name};dur={_ms(end - start)}" for name, (start, end) in self.stages(timing, now).items()]
        parts.append(f"total;dur={_ms(now - self.arrival)}")
        return ", ".join(parts)


def _ms(seconds: float) -> str:
    return f"{max(seconds, 0.0) * 1000:.3f}"
