from __future__ import annotations

import filecmp
import importlib.util
import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from inferd.artifacts.manifest import ArtifactError, EmbeddingSpec, read_manifest, resolve_artifact, verify_artifact
from inferd.artifacts.build.reference import SYNTHETIC_SPECS, build_synthetic, num_parameters, pack_hf, random_weights
from inferd.artifacts.signing import fingerprint, generate_key_pair, load_public_key, verify_signed_artifact
from inferd.engine.tokenization import HFTokenizer

ARTIFACT_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json"]


def quiet(message: str) -> None:
    pass


def load_build_engines() -> types.ModuleType:
    path = Path(__file__).resolve().parents[3] / "build_engines.py"
    spec = importlib.util.spec_from_file_location("build_engines_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rebuilding_tiny_gives_byte_identical_files_and_the_same_version(tiny_artifact: Path, tmp_path: Path) -> None:
    rebuilt = build_synthetic("tiny", tmp_path, progress=quiet)
    assert rebuilt.name == tiny_artifact.name
    match, mismatch, errors = filecmp.cmpfiles(tiny_artifact, rebuilt, ARTIFACT_FILES + ["manifest.toml"],
                                               shallow=False)
    assert (mismatch, errors) == ([], [])


def test_building_an_existing_version_is_idempotent(tmp_path: Path) -> None:
    messages: list[str] = []
    first = build_synthetic("tiny", tmp_path, progress=messages.append)
    weights_stat = (first / "model.safetensors").stat()
    second = build_synthetic("tiny", tmp_path, progress=messages.append)
    assert second == first
    assert (first / "model.safetensors").stat().st_mtime_ns == weights_stat.st_mtime_ns  # never rewritten
    assert any("already exists" in m for m in messages)
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == sorted(["LATEST", first.name])  # any version id


def test_tiny_checkpoint_is_consistent_hf_llama(tiny_artifact: Path, tiny_tokenizer: HFTokenizer) -> None:
    config = json.loads((tiny_artifact / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["vocab_size"] == tiny_tokenizer.vocab_size
    tensors = load_file(str(tiny_artifact / "model.safetensors"))
    hidden, kv_dim = config["hidden_size"], config["num_key_value_heads"] * config["head_dim"]
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], hidden)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (kv_dim, hidden)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (hidden, config["intermediate_size"])
    assert ("lm_head.weight" in tensors) == (not config["tie_word_embeddings"])
    assert all(t.dtype == np.float32 for t in tensors.values())
    assert sum(t.size for t in tensors.values()) == read_manifest(tiny_artifact).architecture.num_parameters
    generation = json.loads((tiny_artifact / "generation_config.json").read_text())
    assert tuple(generation["eos_token_id"]) == tiny_tokenizer.eos_token_ids


def test_random_weights_are_seeded_per_tensor_with_small_scale() -> None:
    weights = random_weights(SYNTHETIC_SPECS["tiny"])
    embed = weights["model.embed_tokens.weight"]
    assert 0.015 < float(embed.std()) < 0.025
    assert not np.array_equal(weights["model.layers.0.mlp.up_proj.weight"], weights["model.layers.1.mlp.up_proj.weight"])
    assert np.all(weights["model.norm.weight"] == 1.0)


def test_small_spec_is_a_20_to_50m_llama3_shaped_model() -> None:
    spec = SYNTHETIC_SPECS["small"]
    assert 20e6 < num_parameters(spec) < 50e6
    assert spec.hidden_size // spec.num_heads == 64 and spec.tie_word_embeddings
    assert (spec.vocab_size, spec.max_position_embeddings, spec.rope_theta) == (8192, 2048, 500000.0)


def test_rebuilding_tiny_embed_gives_byte_identical_files_and_the_same_version(tiny_embed_artifact: Path,
                                                                              tmp_path: Path) -> None:
    rebuilt = build_synthetic("tiny-embed", tmp_path, progress=quiet)
    assert rebuilt.name == tiny_embed_artifact.name
    match, mismatch, errors = filecmp.cmpfiles(tiny_embed_artifact, rebuilt, ARTIFACT_FILES + ["manifest.toml"],
                                               shallow=False)
    assert (mismatch, errors) == ([], [])


def test_tiny_embed_is_a_last_token_embedding_model_whose_tokenizer_ends_inputs_with_eos(
        tiny_embed_artifact: Path, tiny_artifact: Path) -> None:
    manifest = verify_artifact(tiny_embed_artifact)
    assert manifest.embedding == EmbeddingSpec(pooling="last", normalize=True, matryoshka_min_dimensions=16)
    assert manifest.architecture.hidden_size == 64 and read_manifest(tiny_artifact).embedding is None
    tokenizer = HFTokenizer.from_dir(tiny_embed_artifact)
    ids = tokenizer.encode("hello world")
    assert (ids[0], ids[-1]) == (tokenizer.bos_token_id, tokenizer.eos_token_ids[0])
    assert ids[1:-1] == HFTokenizer.from_dir(tiny_artifact).encode("hello world")[1:]


def test_embed_spec_is_a_384_wide_mean_pooled_model() -> None:
    spec = SYNTHETIC_SPECS["embed"]
    assert 10e6 < num_parameters(spec) < 15e6
    assert (spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (
        8192, 384, 6, 6, 2)
    assert (spec.intermediate_size, spec.max_position_embeddings, spec.rope_theta) == (1024, 512, 10000.0)
    assert spec.tie_word_embeddings
    assert spec.embedding == EmbeddingSpec(pooling="mean", matryoshka_min_dimensions=64)


def test_cli_builds_the_embed_model_with_its_embedding_table(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """About a second on 2 cores: the tokenizer trains on the same corpus as small's."""
    assert load_build_engines().main(["--engines-root", str(tmp_path), "--synthetic", "embed"]) == 0
    path = Path(capsys.readouterr().out.strip())
    manifest = verify_artifact(path)
    assert (manifest.name, manifest.embedding.pooling, manifest.embedding.matryoshka_min_dimensions) == (
        "embed", "mean", 64)
    assert manifest.architecture.num_parameters == num_parameters(SYNTHETIC_SPECS["embed"])
    tokenizer = HFTokenizer.from_dir(path)
    assert tokenizer.encode("hello world")[-1] not in tokenizer.eos_token_ids     # mean pooling: no EOS added


def test_unknown_synthetic_kind_is_rejected_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'huge'.*tiny"):
        build_synthetic("huge", tmp_path)


# --- pack_hf ------------------------------------------------------------------------------------

@pytest.fixture
def hf_dir(tiny_artifact: Path, tmp_path: Path) -> Path:
    """An HF checkpoint directory as downloaded: the model files plus things we do not copy."""
    directory = tmp_path / "hf-tiny"
    directory.mkdir()
    for name in ARTIFACT_FILES:
        shutil.copy(tiny_artifact / name, directory / name)
    (directory / "README.md").write_text("model card")
    (directory / "original").mkdir()
    return directory


def test_pack_hf_copies_the_checkpoint_into_a_verified_artifact(hf_dir: Path, tiny_artifact: Path,
                                                                tmp_path: Path) -> None:
    packed = pack_hf(hf_dir, "packed", tmp_path / "engines", progress=quiet)
    manifest = verify_artifact(packed)
    assert sorted(manifest.files) == ARTIFACT_FILES
    assert packed.name == tiny_artifact.name                 # same content, same version
    assert (manifest.name, manifest.source) == ("packed", "hf:hf-tiny")
    assert manifest.architecture.num_parameters == read_manifest(tiny_artifact).architecture.num_parameters
    assert resolve_artifact(tmp_path / "engines", "packed") == packed


def test_pack_hf_refuses_other_architectures_by_name(hf_dir: Path, tmp_path: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ArtifactError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        pack_hf(hf_dir, "gpt2", tmp_path / "engines", progress=quiet)
    assert not (tmp_path / "engines").exists()


@pytest.mark.parametrize("missing, match", [("model.safetensors", "no \\*.safetensors"),
                                            ("tokenizer.json", "no tokenizer.json"),
                                            ("config.json", "no config.json")])
def test_pack_hf_names_what_is_missing(hf_dir: Path, tmp_path: Path, missing: str, match: str) -> None:
    (hf_dir / missing).unlink()
    with pytest.raises(ArtifactError, match=match):
        pack_hf(hf_dir, "x", tmp_path / "engines", progress=quiet)


# --- build_engines.py ---------------------------------------------------------------------------

def test_cli_builds_synthetic_and_prints_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_engines = load_build_engines()
    assert build_engines.main(["--engines-root", str(tmp_path), "--synthetic", "tiny"]) == 0
    captured = capsys.readouterr()
    assert Path(captured.out.strip()) == resolve_artifact(tmp_path, "tiny")
    assert "[build] tiny: training byte-level BPE tokenizer" in captured.err


def test_cli_reports_a_refused_checkpoint_with_exit_1(hf_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (hf_dir / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    build_engines = load_build_engines()
    assert build_engines.main(["--hf-dir", str(hf_dir), "--name", "m", "--engines-root", str(tmp_path)]) == 1
    assert "MambaForCausalLM" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--hf-dir", "x"], ["--synthetic", "tiny", "--hf-dir", "x"]])
def test_cli_argument_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_build_engines().main(argv)
    assert info.value.code == 2


def test_cli_trtllm_without_its_builder_fails_clearly(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    build_engines = load_build_engines()
    monkeypatch.setattr(build_engines, "_trtllm_builder", lambda: None)
    assert build_engines.main(["--target", "trtllm"]) == 2
    assert "inferd/artifacts/build/trtllm.py is missing" in capsys.readouterr().err


def test_cli_trtllm_delegates_with_its_own_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fake = types.SimpleNamespace(
        add_arguments=lambda group: group.add_argument("--tp-size", type=int, default=1),
        main=lambda args: calls.append(args) or 0,
    )
    build_engines = load_build_engines()
    monkeypatch.setattr(build_engines, "_trtllm_builder", lambda: fake)
    assert build_engines.main(["--target", "trtllm", "--hf-dir", "ckpt", "--name", "m", "--tp-size", "2"]) == 0
    (args,) = calls
    assert (args.tp_size, args.name, args.hf_dir) == (2, "m", Path("ckpt"))


def test_cli_sign_signs_what_it_built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = generate_key_pair(tmp_path, "release")
    assert load_build_engines().main(["--engines-root", str(tmp_path / "e"), "--synthetic", "tiny",
                                      "--sign", str(private)]) == 0
    captured = capsys.readouterr()
    path = Path(captured.out.strip())
    signer = fingerprint(load_public_key(public))
    assert verify_signed_artifact(path, {signer: str(public)})[1] == signer
    assert f"signed {path} by {signer}" in captured.err


def test_cli_sign_with_a_bad_key_exits_2_before_building(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, public = generate_key_pair(tmp_path, "release")
    assert load_build_engines().main(["--engines-root", str(tmp_path / "e"), "--synthetic", "tiny",
                                      "--sign", str(public)]) == 2
    assert f"--sign {public}: this is a public key" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_cli_trtllm_sign_signs_the_artifact_its_builder_published(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  tiny_artifact: Path) -> None:
    def publish(args) -> int:          # what the real builder leaves: engines/<name>/<version> and LATEST
        shutil.copytree(tiny_artifact, args.engines_root / args.name / tiny_artifact.name)
        (args.engines_root / args.name / "LATEST").write_text(tiny_artifact.name + "\n")
        return 0

    private, _ = generate_key_pair(tmp_path, "release")
    build_engines = load_build_engines()
    monkeypatch.setattr(build_engines, "_trtllm_builder", lambda: types.SimpleNamespace(main=publish))
    assert build_engines.main(["--target", "trtllm", "--hf-dir", "ckpt", "--name", "m",
                               "--engines-root", str(tmp_path / "e"), "--sign", str(private)]) == 0
    assert verify_signed_artifact(tmp_path / "e" / "m" / tiny_artifact.name)[1] is not None


def test_pack_hf_copies_only_the_shards_the_index_names(hf_dir: Path, tmp_path: Path) -> None:
    (hf_dir / "model.safetensors").rename(hf_dir / "model-00001-of-00001.safetensors")
    (hf_dir / "consolidated.safetensors").write_bytes(b"original-format duplicate")
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    manifest = verify_artifact(pack_hf(hf_dir, "sharded", tmp_path / "engines", progress=quiet))
    assert "consolidated.safetensors" not in manifest.files
    assert {"model-00001-of-00001.safetensors", "model.safetensors.index.json"} <= set(manifest.files)
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ArtifactError, match="model-00002-of-00002.safetensors is named by the index but missing"):
        pack_hf(hf_dir, "sharded", tmp_path / "engines", progress=quiet)


@pytest.mark.parametrize("broken", ["config.json", "generation_config.json"])
def test_pack_hf_names_a_malformed_json_file(hf_dir: Path, tmp_path: Path, broken: str) -> None:
    (hf_dir / broken).write_text("{not json")
    with pytest.raises(ArtifactError, match=f"{broken}: not valid JSON") as info:
        pack_hf(hf_dir, "x", tmp_path / "engines", progress=quiet)
    assert info.value.file == broken
