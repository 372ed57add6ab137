"""The simulated embedding model: a batch costs what the profile's roofline says one prefill step of all
its tokens costs, and each vector is a deterministic function of its input's tokens.

An encoder batch is one forward pass over every input (no decode): the dense layers read the weights
once and do 2 * params FLOPs per token, and attention pairs each token with those before it in its own
input. The worker thread sleeps that long (times `time_scale`), as the GPU would be busy; vectors are
unit-length Gaussian draws seeded by the input, so the same input gives the same vector alone or
batched. It is a simulator (engine info says so), for benchmarks of batching and admission.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import msgspec
import numpy as np

from inferd.engine.sim.profiles import SimProfile, get_profile, sim_tokenizer
from inferd.engine.unary import LoadedEncoder, Policy, UnaryEngine

SIM_MIN_DIMENSIONS = 32     # the simulated model allows truncation (Matryoshka) down to this width


class SimEncoder:
    def __init__(self, profile: str | SimProfile, *, time_scale: float, max_model_len: int, seed: int = 0) -> None:
        self.profile = get_profile(profile)
        self.time_scale = time_scale
        self.max_model_len = max_model_len
        self.seed = seed
        self.tokenizer = sim_tokenizer(self.profile.vocab_size)
        self.dimensions = self.profile.num_heads * self.profile.head_dim
        self.matryoshka_min_dimensions: int | None = min(SIM_MIN_DIMENSIONS, self.dimensions)

    def batch_time(self, lengths: Sequence[int]) -> float:
        """Simulated seconds for one batch of inputs of these lengths."""
        tokens = sum(lengths)
        pairs = sum(n * (n + 1) // 2 for n in lengths)
        return self.profile.step_time(tokens, tokens, pairs)

    def estimate(self, requests: int, tokens: int) -> float:
        """The prior for the batcher's compute line (inputs of equal length assumed), in wall seconds."""
        per = tokens / max(1, requests)
        return self.batch_time([per] * requests) * self.time_scale if tokens else 0.0

    def encode(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        seconds = self.batch_time([len(ids) for ids in batch]) * self.time_scale
        out = np.empty((len(batch), self.dimensions), dtype=np.float32)
        for row, ids in zip(out, batch):
            digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8,
                                     key=self.seed.to_bytes(8, "little", signed=True)).digest()
            v = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(self.dimensions)
            row[:] = v / np.linalg.norm(v)
        if seconds > 0:
            time.sleep(seconds)     # the worker thread: the loop keeps serving meanwhile
        return out

    def loaded(self, model_name: str) -> LoadedEncoder:
        digest = hashlib.sha256(msgspec.json.encode(self.profile)).hexdigest()[:12]
        return LoadedEncoder(self, model_name, f"sim-embed-{digest}")


def sim_embedding_engine(profile: str | SimProfile, policy: Policy, *, model_name: str, time_scale: float = 1.0,
                         max_model_len: int = 8192, seed: int = 0, max_batch_size: int = 32,
                         max_batch_tokens: int = 8192) -> UnaryEngine:
    """A UnaryEngine over a SimEncoder; its compute line starts from the roofline."""
    if not time_scale >= 0:
        raise ValueError(f"time_scale must be >= 0, got {time_scale!r}")
    encoder = SimEncoder(profile, time_scale=time_scale, max_model_len=max_model_len, seed=seed)
    engine = UnaryEngine(lambda: encoder.loaded(model_name), policy, backend="sim", max_batch_size=max_batch_size,
                         max_batch_tokens=max_batch_tokens, hardware=encoder.profile.name, simulated=True,
                         prior=encoder.estimate)
    engine.adopt(encoder.loaded(model_name))
    return engine
