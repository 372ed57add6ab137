"""Config -> engine. The only place that knows both the config structs and the engine constructors.

Backends are imported lazily, so a reference-only node never imports tensorrt_llm and the
simulator exists in a process only when a model says backend = "sim".
"""
from __future__ import annotations

from pathlib import Path

import math

from inferd.config import (
    DEFAULT_LATENCY_TARGET_MS,
    DEFAULT_REFERENCE_KV_BLOCKS,
    BatchingConfig,
    ModelConfig,
    ServerConfig,
    TrtllmConfig,
    artifact_name,
    served_adapters,
)
from inferd.engine import Engine

# Artifacts `inferd.artifacts.build.reference.build_synthetic` can make offline; `serve` builds these itself
# when they are missing, so a new user's first `inferd serve` works.
SYNTHETIC_KINDS = ("tiny", "small", "tiny-embed", "embed")


class EngineConfigError(Exception):
    """A model's config cannot become an engine (artifact missing, backend not installed...)."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(f"models.{model}: {message}")
        self.model = model


def missing_synthetic(name: str, model: ModelConfig, server: ServerConfig) -> str | None:
    """The synthetic kind to build when this model's artifact was never built, else None.

    Only a reference model asking for the latest `tiny`/`small` qualifies, and only when no version
    of it exists at all (leftover staging directories don't count): a broken artifact is
    reported by the engine's verify, never silently rebuilt.
    """
    from inferd.artifacts import MANIFEST_FILE

    kind = artifact_name(name, model)
    if model.backend != "reference" or kind not in SYNTHETIC_KINDS or model.version != "latest":
        return None
    directory = Path(server.engines_root) / kind
    if directory.is_dir() and any((p / MANIFEST_FILE).is_file() for p in directory.iterdir()
                                  if not p.name.startswith(".")):
        return None
    return kind


def _artifact_dir(name: str, model: ModelConfig, server: ServerConfig) -> Path:
    from inferd.artifacts import ArtifactError, resolve_artifact

    try:
        return resolve_artifact(Path(server.engines_root), artifact_name(name, model), model.version)
    except (ArtifactError, OSError) as exc:
        raise EngineConfigError(name, f"artifact {artifact_name(name, model)!r} version {model.version!r} "
                                      f"under {server.engines_root}: {exc}") from None


def adapter_trusted_keys(name: str, model: ModelConfig, server: ServerConfig) -> dict[str, str]:
    """Fingerprint -> .pub path of the keys a model's LoRA adapters must be signed by: its own
    `trusted_keys`, else `[server]`'s (none: adapters need no signature)."""
    from inferd.artifacts import SigningKeyError, load_trusted_keys

    try:
        return load_trusted_keys(model.trusted_keys or server.trusted_keys)
    except SigningKeyError as exc:
        raise EngineConfigError(name, f"trusted_keys: {exc}") from None


def batch_policy(model: ModelConfig):
    """The unary batcher's policy for an embedding model's [batching] table (inferd.config.embeddings)."""
    from inferd.engine.unary import DeadlineAware, FixedWindow, NoBatching

    b = model.batching or BatchingConfig()
    if b.policy == "none":
        return NoBatching()
    if b.policy == "window":
        return FixedWindow(b.window_ms / 1000)
    return DeadlineAware((b.latency_target_ms or DEFAULT_LATENCY_TARGET_MS) / 1000, b.margin_ms / 1000,
                         b.min_wait_ms / 1000, math.inf if b.max_wait_ms is None else b.max_wait_ms / 1000)


def _reference_embedding_engine(name: str, model: ModelConfig, artifact_dir: Path) -> Engine:
    from inferd.engine.reference import ReferenceEmbedder
    from inferd.engine.unary import LoadedEncoder, UnaryEngine

    def load() -> LoadedEncoder:
        embedder = ReferenceEmbedder.load(artifact_dir, verify=model.verify)
        return LoadedEncoder(embedder, embedder.manifest.name, embedder.manifest.version)

    return UnaryEngine(load, batch_policy(model), backend="reference", max_batch_size=model.max_batch_size,
                       max_batch_tokens=model.max_num_tokens, hardware=model.hardware or "cpu")


def _is_embedding_artifact(name: str, model: ModelConfig, artifact_dir: Path) -> bool:
    """The artifact's manifest says (an [embedding] table); checked against the model's `task`."""
    from inferd.artifacts import ArtifactError, read_manifest

    try:
        embeds = read_manifest(artifact_dir).embedding is not None
    except (ArtifactError, OSError) as exc:
        raise EngineConfigError(name, f"artifact {artifact_dir}: {exc}") from None
    if model.task is not None and embeds != (model.task == "embed"):
        kind = "an embedding model" if embeds else "a generation model"
        raise EngineConfigError(name, f"task = {model.task!r}, but artifact {artifact_dir.parent.name!r} is {kind}")
    return embeds


def _step_engine_options(name: str, model: ModelConfig, server: ServerConfig) -> dict:
    """What the reference and torch engines (both StepEngines) take from a model's table alike."""
    return dict(block_size=model.block_size, max_batch_size=model.max_batch_size,
                max_num_tokens=model.max_num_tokens, verify=model.verify, max_model_len=model.max_model_len,
                lora_adapters=dict(model.lora_adapters), max_loaded_adapters=model.max_loaded_adapters,
                adapter_idle_unload_s=model.adapter_idle_unload_s,
                adapter_trusted_keys=adapter_trusted_keys(name, model, server) if model.lora_adapters else {},
                speculative=_speculation(name, model, server))


def _speculation(name: str, model: ModelConfig, server: ServerConfig):
    """A step engine's speculative settings from the model's [speculative] table (None: none); a draft
    model's artifact is resolved here, so a missing one fails the load naming it."""
    table = model.speculative
    if table is None:
        return None
    from inferd.engine.speculative import Speculation

    draft_dir = None
    if table.draft_model is not None:
        from inferd.artifacts import ArtifactError, resolve_artifact

        draft, _, version = table.draft_model.partition("@")
        try:
            draft_dir = str(resolve_artifact(Path(server.engines_root), draft, version or "latest"))
        except (ArtifactError, OSError) as exc:
            raise EngineConfigError(name, f"speculative.draft_model {table.draft_model!r} under "
                                          f"{server.engines_root}: {exc}") from None
    return Speculation(method=table.method, num_tokens=table.num_speculative_tokens,
                       min_n=table.prompt_lookup_min, max_n=table.prompt_lookup_max, draft_dir=draft_dir)


def _sim_speculation(model: ModelConfig):
    table = model.speculative
    if table is None:
        return None
    from inferd.engine.sim import SimSpeculation

    return SimSpeculation(table.num_speculative_tokens, table.acceptance_rate)


def _torch_engine(name: str, model: ModelConfig, server: ServerConfig) -> Engine:
    from inferd.config import TorchConfig

    artifact_dir = _artifact_dir(name, model, server)
    if _is_embedding_artifact(name, model, artifact_dir):
        raise EngineConfigError(name, f"artifact {artifact_dir.parent.name!r} is an embedding model; backend "
                                      f"'torch' serves generation only (use backend 'reference')")
    try:
        from inferd.engine.torch import TorchEngine
    except ImportError as exc:       # torch: the `torch` extra (`parity` brings it too)
        raise EngineConfigError(name, f"backend 'torch' is not available here: {exc}") from None
    t = model.torch or TorchConfig()
    default_blocks = DEFAULT_REFERENCE_KV_BLOCKS if t.device == "cpu" else None   # CUDA: from free memory
    return TorchEngine(artifact_dir, num_kv_blocks=model.num_kv_blocks or default_blocks, device=t.device,
                       dtype=t.dtype, gpu_memory_utilization=t.gpu_memory_utilization,
                       # on the CPU the fixed-size decode buffers only cost padding: eager steps there
                       cuda_graphs=t.cuda_graphs and t.device != "cpu",
                       cuda_graph_max_batch_size=t.cuda_graph_max_batch_size, load_format=t.load_format,
                       seed=t.seed, **_step_engine_options(name, model, server))


def build_engine(name: str, model: ModelConfig, server: ServerConfig) -> Engine:
    """Construct (not start) the engine for one [models.<name>] table."""
    if model.backend == "reference":
        artifact_dir = _artifact_dir(name, model, server)  # first: a missing artifact is the likelier error
        if _is_embedding_artifact(name, model, artifact_dir):
            if model.speculative is not None:       # never ignored: the table asks for what cannot be
                raise EngineConfigError(name, f"artifact {artifact_dir.parent.name!r} is an embedding model; "
                                              f"[speculative] needs a generative one")
            return _reference_embedding_engine(name, model, artifact_dir)
        from inferd.engine.reference import ReferenceEngine

        return ReferenceEngine(artifact_dir, num_kv_blocks=model.num_kv_blocks or DEFAULT_REFERENCE_KV_BLOCKS,
                               **_step_engine_options(name, model, server))
    if model.backend == "torch":
        return _torch_engine(name, model, server)
    if model.backend == "sim":
        from inferd.config import SimConfig
        from inferd.engine.sim import SimEngine

        sim = model.sim or SimConfig()
        if model.task == "embed":
            from inferd.engine.sim import sim_embedding_engine

            return sim_embedding_engine(sim.profile, batch_policy(model), model_name=artifact_name(name, model),
                                        time_scale=sim.time_scale, max_model_len=sim.max_model_len, seed=sim.seed,
                                        max_batch_size=model.max_batch_size, max_batch_tokens=model.max_num_tokens)
        return SimEngine(
            sim.profile,
            num_kv_blocks=model.num_kv_blocks,
            block_size=model.block_size,
            max_batch_size=model.max_batch_size,
            max_num_tokens=model.max_num_tokens,
            time_scale=sim.time_scale,
            model_name=artifact_name(name, model),
            max_model_len=sim.max_model_len,
            seed=sim.seed,
            lora_adapters=tuple(model.lora_adapters),
            simulate_load=sim.simulate_load,
            speculation=_sim_speculation(model),
        )
    if model.backend == "trtllm":
        try:
            from inferd.engine.trtllm import TrtllmEngine
        except ImportError as exc:
            raise EngineConfigError(name, f"backend 'trtllm' is not available here: {exc}") from None
        t = model.trtllm or TrtllmConfig()
        if t.engine_dir:
            engine_dir, version = Path(t.engine_dir), None
        else:  # an artifact's directory name is its content-derived version
            engine_dir = _artifact_dir(name, model, server)
            version = engine_dir.name
        return TrtllmEngine(
            engine_dir,
            tokenizer_dir=Path(t.tokenizer_dir) if t.tokenizer_dir else None,
            max_batch_size=model.max_batch_size,
            max_num_tokens=model.max_num_tokens,
            kv_cache_free_gpu_memory_fraction=t.kv_cache_free_gpu_memory_fraction,
            kv_cache_max_tokens=t.kv_cache_max_tokens,
            enable_block_reuse=t.enable_block_reuse,
            scheduler_policy=t.scheduler_policy,
            enable_chunked_prefill=t.enable_chunked_prefill,
            gather_generation_logits=t.gather_generation_logits,
            eagle=((model.speculative.draft_model, model.speculative.num_speculative_tokens)
                   if model.speculative is not None else None),
            lora_adapters=dict(served_adapters(model)),
            model_name=artifact_name(name, model),
            version=version,
            verify=model.verify,
            adapter_trusted_keys=adapter_trusted_keys(name, model, server) if served_adapters(model) else {},
        )
    raise EngineConfigError(name, f"unknown backend {model.backend!r}")  # config validation prevents it
