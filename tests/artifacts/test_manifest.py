from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from inferd.artifacts import manifest as artifacts
from inferd.artifacts.manifest import (
    Architecture,
    ArtifactError,
    EmbeddingSpec,
    FileEntry,
    Manifest,
    content_version,
    manifest_to_toml,
    parse_manifest,
    publish_artifact,
    read_manifest,
    resolve_artifact,
    staging_dir,
    template_tool_call_format,
    tool_call_format_of,
    verify_artifact,
)


@pytest.fixture
def engines_root(tiny_artifact: Path, tmp_path: Path) -> Path:
    """A private copy of the session's engines tree, free to tamper with."""
    root = tmp_path / "engines"
    shutil.copytree(tiny_artifact.parent, root / "tiny")
    return root


@pytest.fixture
def artifact(engines_root: Path, tiny_artifact: Path) -> Path:
    return engines_root / "tiny" / tiny_artifact.name


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def arch(**overrides) -> Architecture:
    fields = dict(architecture="LlamaForCausalLM", model_type="llama", vocab_size=10, hidden_size=4, num_layers=1,
                  num_attention_heads=1, num_kv_heads=1, head_dim=4, intermediate_size=8,
                  max_position_embeddings=16, rope_theta=10000.0, tie_word_embeddings=True, dtype="float32",
                  num_parameters=100)
    return Architecture(**{**fields, **overrides})


# --- verify_artifact -------------------------------------------------------------------------

def test_intact_artifact_verifies_and_describes_the_model(artifact: Path) -> None:
    manifest = verify_artifact(artifact)
    config = json.loads((artifact / "config.json").read_text())
    assert (manifest.name, manifest.version, manifest.target) == ("tiny", artifact.name, "reference")
    assert set(manifest.files) == {"config.json", "generation_config.json", "model.safetensors",
                                   "tokenizer.json", "tokenizer_config.json"}
    assert manifest.architecture.hidden_size == config["hidden_size"]
    assert manifest.architecture.num_kv_heads == config["num_key_value_heads"]
    assert manifest.architecture.max_position_embeddings == config["max_position_embeddings"]
    weights = artifact / "model.safetensors"
    assert manifest.files["model.safetensors"] == FileEntry(
        sha256=hashlib.sha256(weights.read_bytes()).hexdigest(), size=weights.stat().st_size)


def test_flipped_byte_in_weights_is_refused_naming_the_file(artifact: Path) -> None:
    weights = artifact / "model.safetensors"
    flip_byte(weights, weights.stat().st_size // 2)
    with pytest.raises(ArtifactError, match="model.safetensors has changed") as info:
        verify_artifact(artifact)
    assert info.value.file == "model.safetensors"


def test_truncated_file_is_refused_naming_the_file(artifact: Path) -> None:
    config = artifact / "config.json"
    config.write_bytes(config.read_bytes()[:-1])
    with pytest.raises(ArtifactError, match=r"config.json has changed \(size") as info:
        verify_artifact(artifact)
    assert info.value.file == "config.json"


def test_deleted_file_is_named(artifact: Path) -> None:
    (artifact / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer.json is missing") as info:
        verify_artifact(artifact)
    assert info.value.file == "tokenizer.json"


@pytest.mark.parametrize("extra", ["notes.txt", "sub/dir/extra.bin"])
def test_unexpected_extra_file_is_named(artifact: Path, extra: str) -> None:
    (artifact / extra).parent.mkdir(parents=True, exist_ok=True)
    (artifact / extra).write_text("surprise")
    with pytest.raises(ArtifactError, match="unexpected file") as info:
        verify_artifact(artifact)
    assert info.value.file == extra


def test_a_signature_beside_the_manifest_is_not_one_of_the_artifacts_files(artifact: Path) -> None:
    (artifact / "manifest.sig").write_text("whatever: signing checks it, not the hashes")
    assert "manifest.sig" not in verify_artifact(artifact).files


def test_manifest_edited_to_match_a_changed_file_still_fails_on_version(artifact: Path) -> None:
    config = artifact / "config.json"
    config.write_text(config.read_text().replace('"hidden_act": "silu"', '"hidden_act": "gelu"'))
    manifest = read_manifest(artifact)
    files = dict(manifest.files)
    files["config.json"] = FileEntry(sha256=artifacts.sha256_file(config), size=config.stat().st_size)
    (artifact / "manifest.toml").write_text(manifest_to_toml(Manifest(
        **{f: getattr(manifest, f) for f in manifest.__struct_fields__ if f != "files"}, files=files)))
    with pytest.raises(ArtifactError, match="does not match its file list") as info:
        verify_artifact(artifact)
    assert info.value.file == "manifest.toml"


@pytest.mark.parametrize("text, match", [
    (None, "no manifest.toml"),
    ("format = [", "unreadable"),
    ('format = 1\nname = "x"', "missing required field"),
    ('format = 9\nname = "x"\nversion = "v"\ntarget = "t"\nsource = "s"\n[architecture]\n', "architecture"),
])
def test_bad_manifest_is_an_artifact_error(tmp_path: Path, text: str | None, match: str) -> None:
    if text is not None:
        (tmp_path / "manifest.toml").write_text(text)
    with pytest.raises(ArtifactError, match=match):
        verify_artifact(tmp_path)


def test_manifest_toml_round_trips_awkward_strings() -> None:
    manifest = Manifest(name="n", version="v", target="trtllm", source='hf:"quoted" \\ back\nslash ✓\x7f',
                        architecture=arch(rope_theta=5e5), build={"tp_size": 2, "note": "a=b", "fp8": True,
                                                                  "ratio": 0.9},
                        files={"weird name/ü.bin": FileEntry(sha256="ab" * 32, size=3)})
    text = manifest_to_toml(manifest)
    decoded = artifacts.msgspec.convert(artifacts.tomllib.loads(text), Manifest)
    assert decoded == manifest


@pytest.mark.parametrize("embedding", [EmbeddingSpec(pooling="last", matryoshka_min_dimensions=16),
                                       EmbeddingSpec(pooling="mean", normalize=False)])
def test_manifest_with_an_embedding_table_round_trips(embedding: EmbeddingSpec) -> None:
    manifest = Manifest(name="e", version="v", target="reference", source="s", architecture=arch(),
                        embedding=embedding, files={"w": FileEntry(sha256="ab" * 32, size=3)})
    text = manifest_to_toml(manifest)
    assert "\n[embedding]\n" in text
    assert parse_manifest(text.encode(), Path("manifest.toml")) == manifest


def test_a_manifest_without_an_embedding_table_is_a_generative_model_written_as_before(artifact: Path) -> None:
    manifest = read_manifest(artifact)
    assert manifest.embedding is None
    text = manifest_to_toml(manifest)
    assert "[embedding]" not in text
    assert text == (artifact / "manifest.toml").read_text()


def test_an_unknown_pooling_in_the_manifest_is_an_artifact_error_naming_the_field(artifact: Path) -> None:
    text = (artifact / "manifest.toml").read_text() + '\n[embedding]\npooling = "cls"\n'
    with pytest.raises(ArtifactError, match=r"embedding.pooling"):
        parse_manifest(text.encode(), artifact / "manifest.toml")


def test_hashing_streams_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(artifacts, "_CHUNK", 7)
    data = bytes(range(256)) * 3
    (tmp_path / "f").write_bytes(data)
    assert artifacts.sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


# --- resolve_artifact ------------------------------------------------------------------------

def test_resolve_latest_reads_the_latest_file(engines_root: Path, artifact: Path) -> None:
    assert (engines_root / "tiny" / "LATEST").read_text().strip() == artifact.name
    assert resolve_artifact(engines_root, "tiny") == artifact
    assert resolve_artifact(engines_root, "tiny", artifact.name) == artifact


def test_resolve_without_latest_takes_the_only_version(engines_root: Path, artifact: Path) -> None:
    (engines_root / "tiny" / "LATEST").unlink()
    assert resolve_artifact(engines_root, "tiny") == artifact
    shutil.copytree(artifact, engines_root / "tiny" / "other")
    with pytest.raises(ArtifactError, match="2 versions"):
        resolve_artifact(engines_root, "tiny")


@pytest.mark.parametrize("name, version, match", [
    ("nope", "latest", "no LATEST"),
    ("tiny", "000000000000", "tiny@000000000000 not found"),
    ("../tiny", "latest", "invalid artifact name"),
    ("tiny", "../../etc", "invalid artifact version"),
    ("tiny", ".tmp-x", "invalid artifact version"),
])
def test_resolve_refuses_unknown_or_unsafe_names(engines_root: Path, name: str, version: str, match: str) -> None:
    with pytest.raises(ArtifactError, match=match):
        resolve_artifact(engines_root, name, version)


# --- publish_artifact ------------------------------------------------------------------------

def publish_text(root: Path, name: str, text: str, embedding: EmbeddingSpec | None = None) -> Path:
    with staging_dir(root, name) as staging:
        (staging / "weights.bin").write_text(text)
        return publish_artifact(staging, root, name=name, target="reference", source="test", architecture=arch(),
                                embedding=embedding)


def test_publish_derives_version_from_content_and_updates_latest(tmp_path: Path) -> None:
    first = publish_text(tmp_path, "m", "one")
    second = publish_text(tmp_path, "m", "two")
    assert first.name != second.name
    assert first.name == content_version({"weights.bin": FileEntry(
        sha256=hashlib.sha256(b"one").hexdigest(), size=3)})
    assert resolve_artifact(tmp_path, "m") == second
    assert publish_text(tmp_path, "m", "one") == first          # idempotent: same content, same place
    assert resolve_artifact(tmp_path, "m") == first
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted(["LATEST", first.name, second.name])


def test_publish_never_rewrites_an_existing_version(tmp_path: Path) -> None:
    published = publish_text(tmp_path, "m", "one")
    (published / "weights.bin").write_text("two")               # tampered after publishing
    with pytest.raises(ArtifactError, match="weights.bin has changed"):
        publish_text(tmp_path, "m", "one")
    assert (published / "weights.bin").read_text() == "two"
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".tmp-")]


def test_failed_build_leaves_no_staging_directory(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with staging_dir(tmp_path, "m") as staging:
            (staging / "half-written").write_text("x")
            raise RuntimeError("build failed")
    assert list((tmp_path / "m").iterdir()) == []


def test_publish_records_the_embedding_settings_and_refuses_other_ones_for_the_same_files(tmp_path: Path) -> None:
    spec = EmbeddingSpec(pooling="mean", matryoshka_min_dimensions=2)
    published = publish_text(tmp_path, "m", "one", embedding=spec)
    assert read_manifest(published).embedding == spec
    assert publish_text(tmp_path, "m", "one", embedding=spec) == published
    with pytest.raises(ArtifactError, match="already exists with embedding settings") as info:
        publish_text(tmp_path, "m", "one", embedding=EmbeddingSpec(pooling="last"))
    assert info.value.file == "manifest.toml"
    assert read_manifest(published).embedding == spec


# --- tool_call_format --------------------------------------------------------------------------

def test_the_synthetic_models_manifest_says_their_template_writes_hermes_tool_calls(artifact: Path) -> None:
    assert verify_artifact(artifact).tool_call_format == "hermes"
    assert tool_call_format_of(artifact) == "hermes"


def test_an_artifact_without_a_template_has_no_tool_call_format(tmp_path: Path) -> None:
    assert read_manifest(publish_text(tmp_path, "m", "one")).tool_call_format is None


@pytest.mark.parametrize(("template", "fmt"), [
    ("{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>", "hermes"),
    ("{% if tools %}<|start_header_id|>ipython<|end_header_id|>{% endif %}", "llama3_json"),
    ("{{ '<|python_tag|>' }}{% if tools %}{% endif %}", "llama3_json"),
    ("<|start_header_id|>user<|end_header_id|>", None),       # Llama 3 without tools in its template
    ("<|im_start|>", None), (None, None)])
def test_the_tool_call_format_is_judged_from_the_templates_own_markers(template, fmt) -> None:
    assert template_tool_call_format(template) == fmt
