from __future__ import annotations

import msgspec
import pytest

from inferd.config.root import parse_config
from inferd.artifacts.build.reference import build_synthetic
from inferd.engine.sim.engine import SimEngine
from inferd.models.factory import EngineConfigError, build_engine, missing_synthetic


def model_and_server(model: dict, engines_root="engines", name="m"):
    cfg = parse_config({"server": {"engines_root": str(engines_root)}, "models": {name: model}})
    return name, cfg.models[name], cfg.server


def test_sim_backend_gets_its_section_and_the_model_limits():
    name, model, server = model_and_server({
        "backend": "sim", "max_batch_size": 3, "max_num_tokens": 96, "num_kv_blocks": 40, "block_size": 32,
        "sim": {"profile": "tiny", "time_scale": 0.5, "max_model_len": 300}})
    engine = build_engine(name, model, server)
    assert isinstance(engine, SimEngine)
    info = engine.info
    assert (info.backend, info.simulated, info.model_name) == ("sim", True, "m")
    assert (info.max_batch_size, info.max_num_tokens, info.num_kv_blocks, info.block_size) == (3, 96, 40, 32)
    assert info.max_model_len == 300


def test_sim_without_section_uses_sim_defaults():
    name, model, server = model_and_server({"backend": "sim", "artifact": "llama"})
    engine = build_engine(name, model, server)
    assert engine.info.model_name == "llama"
    assert engine.info.max_model_len == 8192


def test_missing_synthetic_only_for_latest_reference_tiny_or_small(tmp_path):
    assert missing_synthetic(*model_and_server({"artifact": "tiny"}, tmp_path)) == "tiny"
    assert missing_synthetic(*model_and_server({}, tmp_path, name="small")) == "small"
    assert missing_synthetic(*model_and_server({"artifact": "llama"}, tmp_path)) is None
    assert missing_synthetic(*model_and_server({"artifact": "tiny", "version": "abc"}, tmp_path)) is None
    assert missing_synthetic(*model_and_server({"backend": "sim", "artifact": "tiny"}, tmp_path)) is None


def test_missing_synthetic_ignores_leftover_staging_dirs_and_sees_built_versions(tmp_path):
    (tmp_path / "tiny" / ".tmp-abc").mkdir(parents=True)
    assert missing_synthetic(*model_and_server({"artifact": "tiny"}, tmp_path)) == "tiny"
    build_synthetic("tiny", tmp_path, progress=lambda message: None)
    assert missing_synthetic(*model_and_server({"artifact": "tiny"}, tmp_path)) is None


def test_missing_artifact_is_a_typed_error_naming_the_model(tmp_path):
    name, model, server = model_and_server({"artifact": "llama-3-8b"}, tmp_path)
    with pytest.raises(EngineConfigError, match=r"^models\.m: artifact 'llama-3-8b' version 'latest'"):
        build_engine(name, model, server)


def test_trtllm_backend_gets_its_section(tmp_path):
    from inferd.engine.trtllm.engine import TrtllmEngine

    name, model, server = model_and_server({
        "backend": "trtllm", "max_batch_size": 8,
        "trtllm": {"engine_dir": str(tmp_path / "eng"), "scheduler_policy": "max_utilization",
                   "kv_cache_max_tokens": 4096, "lora_adapters": {"a": str(tmp_path / "a")},
                   "gather_generation_logits": True}})
    engine = build_engine(name, model, server)
    assert isinstance(engine, TrtllmEngine)
    assert engine.engine_dir == tmp_path / "eng"
    assert engine._gather_logits            # logprobs answered (docs/trtllm-api.md)
    assert engine.tokenizer_dir == tmp_path / "eng"
    assert (engine.info.backend, engine.info.model_name) == ("trtllm", "m")


def test_trtllm_engine_from_artifact_is_labelled_with_its_version(tmp_path):
    artifact = build_synthetic("tiny", tmp_path, progress=lambda message: None)
    name, model, server = model_and_server({"backend": "trtllm", "artifact": "tiny"}, tmp_path)
    engine = build_engine(name, model, server)
    assert engine.engine_dir == artifact
    assert engine.info.version == artifact.name


def test_reference_and_sim_engines_get_the_models_lora_adapters(tmp_path):
    build_synthetic("tiny", tmp_path, progress=lambda message: None)
    name, model, server = model_and_server({"artifact": "tiny", "lora_adapters": {"a": str(tmp_path / "a")},
                                            "max_loaded_adapters": 2, "adapter_idle_unload_s": 30.0}, tmp_path)
    engine = build_engine(name, model, server)
    assert [(a.name, a.source, a.loaded) for a in engine.adapters()] == [("a", str(tmp_path / "a"), False)]
    assert (engine._adapters.max_loaded, engine._adapters.idle_unload_s) == (2, 30.0)
    name, model, server = model_and_server({"backend": "sim", "lora_adapters": {"sql": "", "chat": ""}})
    assert [a.name for a in build_engine(name, model, server).adapters()] == ["chat", "sql"]


def test_trtllm_takes_the_models_lora_adapters_too(tmp_path):
    name, model, server = model_and_server({"backend": "trtllm", "lora_adapters": {"a": str(tmp_path / "a")},
                                            "trtllm": {"engine_dir": str(tmp_path / "eng")}})
    engine = build_engine(name, model, server)
    assert [(a.name, a.source, a.loaded) for a in engine.adapters()] == [("a", str(tmp_path / "a"), False)]


def test_adapters_must_be_signed_by_the_models_trusted_keys_else_the_servers(tmp_path):
    from inferd.artifacts.signing import fingerprint, generate_key_pair, load_public_key

    keys = {n: generate_key_pair(tmp_path, n)[1] for n in ("release", "team")}
    fp = {n: fingerprint(load_public_key(p)) for n, p in keys.items()}
    for extra, expected in (({}, {fp["release"]: str(keys["release"])}),
                            ({"trusted_keys": [str(keys["team"])]}, {fp["team"]: str(keys["team"])})):
        name, model, server = model_and_server({"backend": "trtllm", "lora_adapters": {"a": str(tmp_path / "a")},
                                                "trtllm": {"engine_dir": str(tmp_path / "eng")}, **extra}, tmp_path)
        server = msgspec.structs.replace(server, trusted_keys=(str(keys["release"]),))
        assert build_engine(name, model, server)._loras._trusted == expected


def test_a_sim_embedding_model_is_a_unary_engine_with_the_configured_policy():
    from inferd.engine.unary import DeadlineAware, FixedWindow, UnaryEngine

    name, model, server = model_and_server({"backend": "sim", "task": "embed", "max_batch_size": 5,
                                            "max_num_tokens": 300, "batching": {"latency_target_ms": 40},
                                            "sim": {"profile": "tiny", "max_model_len": 128}})
    engine = build_engine(name, model, server)
    assert isinstance(engine, UnaryEngine) and isinstance(engine.policy, DeadlineAware)
    assert engine.policy.target_s == pytest.approx(0.040) and engine.limits.max_requests == 5
    assert (engine.info.task, engine.info.max_model_len, engine.info.simulated) == ("embed", 128, True)
    name, model, server = model_and_server({"backend": "sim", "task": "embed",
                                            "batching": {"policy": "window", "window_ms": 7}})
    assert build_engine(name, model, server).policy.window_s == pytest.approx(0.007)
    assert isinstance(build_engine(name, model, server).policy, FixedWindow)


def test_torch_backend_gets_its_section_and_what_every_step_engine_takes(tmp_path):
    from inferd.engine.torch.engine import TorchEngine

    build_synthetic("tiny", tmp_path, progress=lambda message: None)
    name, model, server = model_and_server({
        "backend": "torch", "artifact": "tiny", "max_batch_size": 8, "num_kv_blocks": 64, "block_size": 32,
        "lora_adapters": {"a": str(tmp_path / "a")},
        "torch": {"device": "cpu", "dtype": "float32", "load_format": "dummy", "seed": 7}}, tmp_path)
    engine = build_engine(name, model, server)
    assert isinstance(engine, TorchEngine)
    assert (engine._device, engine._dtype, engine._load_format, engine._seed) == ("cpu", "float32", "dummy", 7)
    assert (engine._num_kv_blocks, engine._block_size, engine._max_batch_size) == (64, 32, 8)
    assert not engine._graphs                 # CUDA graphs are for CUDA: the CPU runs its steps eagerly
    assert [a.name for a in engine.adapters()] == ["a"]


def test_torch_pool_defaults_to_2048_blocks_on_the_cpu_and_to_free_memory_on_cuda(tmp_path):
    build_synthetic("tiny", tmp_path, progress=lambda message: None)
    on_cpu = build_engine(*model_and_server({"backend": "torch", "artifact": "tiny", "torch": {"device": "cpu"}},
                                            tmp_path))
    on_cuda = build_engine(*model_and_server({"backend": "torch", "artifact": "tiny"}, tmp_path))
    assert (on_cpu._num_kv_blocks, on_cuda._num_kv_blocks) == (2048, None)
    assert on_cuda._graphs and on_cuda._utilization == 0.9


def test_a_torch_embedding_artifact_is_refused_naming_the_backend(tmp_path):
    build_synthetic("tiny-embed", tmp_path, progress=lambda message: None)
    with pytest.raises(EngineConfigError, match="backend 'torch' serves generation only"):
        build_engine(*model_and_server({"backend": "torch", "artifact": "tiny-embed"}, tmp_path))
