"""What speculative decoding does to the sim's step times, from an acceptance rate (a model's [speculative]).

The sim has no text to draft from, so it models the outcome: each decoding sequence verifies k drafts with
its last token in one step (k + 1 query tokens, priced by the roofline like any others), and each draft is
kept with probability `acceptance_rate` until the first rejection, so a verifying step yields on average

    E = (1 - a^(k+1)) / (1 - a)      tokens per sequence (the kept drafts and the model's own token)

(Leviathan et al. 2023, eq. 1). The sim still emits one token per sequence per step, so a step that only
decodes is shortened to its roofline time / E: throughput and mean inter-token latency are what speculation
would give, while a real engine's tokens arrive E at a time. A step that also prefills is priced in full
with the drafts and credited nothing (a conservative choice: its prefill sets its length). The counters
(draft tokens verified, kept, verifications) are the expected values, for the same metrics as a real engine.
"""
from __future__ import annotations

import threading

from inferd.engine.base import SpeculationStats


class SimSpeculation:
    def __init__(self, num_tokens: int, acceptance_rate: float) -> None:
        if not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
        if not 0.0 <= acceptance_rate < 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1), got {acceptance_rate!r}")
        self.k, self.rate = num_tokens, acceptance_rate
        self.tokens_per_step = (1 - acceptance_rate ** (num_tokens + 1)) / (1 - acceptance_rate)
        self._lock = threading.Lock()
        self._drafted = self._kept = 0.0
        self._verifications = 0

    def step_time(self, profile, num_tokens: int, kv_tokens: int, pairs: int, decodes: int, prefill: bool) -> float:
        """The simulated seconds of a step with `decodes` decoding sequences among its `num_tokens`."""
        if decodes == 0:
            return profile.step_time(num_tokens, kv_tokens, pairs)
        extra = decodes * self.k
        # each draft token reads its sequence's context like the last token does (pairs ~ kv per query)
        per_query = kv_tokens / max(num_tokens, 1)
        seconds = profile.step_time(num_tokens + extra, kv_tokens + extra, pairs + int(extra * per_query))
        with self._lock:
            self._drafted += extra
            self._kept += decodes * (self.tokens_per_step - 1)
            self._verifications += decodes
        return seconds if prefill else seconds / self.tokens_per_step

    def stats(self) -> SpeculationStats:
        with self._lock:
            return SpeculationStats(draft_tokens=round(self._drafted), accepted_tokens=round(self._kept),
                                    verifications=self._verifications)
