"""LoRA adapters in the simulated engine: which it serves, which are in use, and what they add to a step.

The sim reads no adapter files: an adapter is a name (and one rank for all, `rank`) that requests may
name, loaded on first use at no cost into the engines' shared slots (engine.adapter_slots) and listed
like a real engine's (engine.adapters.AdapterInfo).
Its cost is what a batched multi-LoRA kernel (punica/SGMV style, as TensorRT-LLM and vLLM run) adds to
a step: for each distinct adapter among the step's sequences, its A and B matrices on all seven
projections (q, k, v, o, gate, up, down) of every layer are read once, and its rows do the two
low-rank matmuls, each on its own roofline:

    sum over adapters a:  max(2 bytes * lora_params / BW, 2 * lora_params * tokens_a / FLOPS) + ADAPTER_OVERHEAD_S

lora_params = rank * sum over projections of (in + out) * layers, per GPU of the tensor-parallel group;
adapters are bf16 whatever the base weights are. Profiles carry no intermediate size;
it is derived from the parameter count (embeddings untied, Llama layout), which gives Llama-3's 14336 /
28672 for the 8B / 70B profiles.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

from inferd.engine.adapter_slots import AdapterSlots
from inferd.engine.adapters import AdapterInfo, UnknownAdapter, unknown_adapter_request
from inferd.engine.sim.profiles import SimProfile
from inferd.engine.sim.scheduler import SimSequence

ADAPTER_OVERHEAD_S = 5e-6    # per distinct adapter per step: gathering and scattering its rows
LORA_BYTES_PER_PARAM = 2     # adapters stay bf16 beside fp8 base weights


def intermediate_size(profile: SimProfile) -> float:
    """The MLP width implied by the profile's parameter count (Llama layout, untied embeddings)."""
    h, kv = profile.num_heads * profile.head_dim, profile.num_kv_heads * profile.head_dim
    per_layer = (profile.num_params - 2 * profile.vocab_size * h) / profile.num_layers
    return max(float(h), (per_layer - 2 * h * h - 2 * h * kv) / (3 * h))


def lora_params(profile: SimProfile, rank: int) -> float:
    """Parameters of one adapter of rank `rank` on all seven projections of every layer."""
    h, kv = profile.num_heads * profile.head_dim, profile.num_kv_heads * profile.head_dim
    inter = intermediate_size(profile)
    # q (h->h), k and v (h->kv), o (h->h), gate and up (h->I), down (I->h): sum of in + out
    per_rank = 2 * h + 2 * (h + kv) + 2 * h + 2 * (h + inter) + (inter + h)
    return rank * per_rank * profile.num_layers


class SimAdapters:
    """The adapters a sim engine serves. Event-loop thread only (as the sim engine)."""

    def __init__(self, names: Iterable[str], profile: SimProfile, *, rank: int = 16) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"lora_rank must be a positive integer, got {rank!r}")
        self.names = sorted(set(names))
        if any(not isinstance(n, str) or not n for n in self.names):
            raise ValueError("LoRA adapter names must be non-empty strings")
        self._served = frozenset(self.names)
        self.rank = rank
        self._profile = profile
        self._bytes = lora_params(profile, rank) * LORA_BYTES_PER_PARAM / profile.tensor_parallel
        self._flops_per_token = 2.0 * lora_params(profile, rank) / profile.tensor_parallel
        # which are loaded and held: the engines' shared slots (no limit; the payload is the rank)
        self._slots: AdapterSlots[int] = AdapterSlots(dict.fromkeys(self.names, ""))
        self.in_use_total = 0

    def check(self, lora: str | None) -> None:
        """InvalidRequest (param `model`) for an adapter this engine does not serve."""
        if lora is not None and lora not in self._served:
            raise unknown_adapter_request(lora, self.names)

    @staticmethod
    def output_key(key: int, name: str | None) -> int:
        """A sequence's token key (sim.engine) under adapter `name`: each adapter generates its own text."""
        if name is None:
            return key
        return hash((key, int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")))

    def acquire(self, seq: SimSequence, name: str | None) -> None:
        """seq runs with adapter `name` (None: none); it is loaded now if it was not."""
        if name is not None:
            seq.lora = name
            if self._slots.acquire(name) is None:
                self._slots.install(name, self.rank, pins=1)
            self.in_use_total += 1

    def release(self, seq: SimSequence) -> None:
        """seq ended: its adapter is one holder short."""
        name, seq.lora = seq.lora, None
        if name is not None:
            self._slots.release(name)
            self.in_use_total -= 1

    def step_time(self, scheduled: Iterable[tuple[SimSequence, int]]) -> float:
        """Simulated seconds the LoRA kernels add to a step computing n tokens of each (seq, n)."""
        tokens: dict[str, int] = {}
        for seq, n in scheduled:
            if seq.lora is not None:
                tokens[seq.lora] = tokens.get(seq.lora, 0) + n
        return self.adapter_time(tokens.values())

    def adapter_time(self, tokens_per_adapter: Iterable[int]) -> float:
        """Simulated seconds of the LoRA kernels for distinct adapters computing these many tokens each."""
        p = self._profile
        bw, flops = p.hbm_bandwidth * p.bandwidth_efficiency, p.peak_flops * p.flops_efficiency
        return sum(max(self._bytes / bw, self._flops_per_token * n / flops) + ADAPTER_OVERHEAD_S
                   for n in tokens_per_adapter)

    # -- AdapterHost, for the sim engine's methods of the same names --------------------------------
    def infos(self) -> list[AdapterInfo]:
        return [self.info(name) for name in self.names]

    def info(self, name: str) -> AdapterInfo:
        self._known(name)
        use = self._slots.use(name)
        return AdapterInfo(name=name, source="", loaded=use.payload is not None, in_use=use.pins, rank=use.payload,
                           idle_s=use.idle_s)

    def load(self, name: str) -> AdapterInfo:
        self._known(name)
        if not self._slots.is_loaded(name):
            self._slots.install(name, self.rank)
        return self.info(name)

    def unload(self, name: str) -> bool:
        self._known(name)
        return self._slots.unload(name)

    def _known(self, name: str) -> None:
        if name not in self._served:
            raise UnknownAdapter(f"no LoRA adapter {name!r} is configured", name)

