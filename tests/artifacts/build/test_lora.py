"""LoRA adapter artifacts: synthetic adapters for the tiny model, and PEFT directories packed into the store."""
from __future__ import annotations

import json

import pytest
from safetensors.numpy import load_file

from inferd.artifacts.manifest import ArtifactError, read_manifest, resolve_artifact, verify_artifact
from inferd.artifacts.build.lora import ALL_TARGETS, adapter_key, build_synthetic_adapter, pack_peft


def test_a_synthetic_adapter_is_a_verified_peft_artifact_for_its_base_model(tiny_artifact, tmp_path):
    path = build_synthetic_adapter(tiny_artifact, "style", tmp_path, rank=3, alpha=6, targets=("q_proj", "up_proj"))

    manifest = verify_artifact(path)
    assert (manifest.name, manifest.target) == ("style", "lora")
    assert manifest.architecture == read_manifest(tiny_artifact).architecture
    assert sorted(manifest.files) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["target_modules"]) == \
        ("LORA", 3, 6, ["q_proj", "up_proj"])
    tensors = load_file(str(path / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 2 * 2                  # layers x targets x (A, B)
    assert tensors[adapter_key(1, "up_proj", "A")].shape == (3, 64)
    assert tensors[adapter_key(1, "up_proj", "B")].shape == (128, 3)


def test_rebuilding_a_synthetic_adapter_gives_the_same_version_and_another_seed_another(tiny_artifact, tmp_path):
    first = build_synthetic_adapter(tiny_artifact, "a", tmp_path, seed=5)
    assert build_synthetic_adapter(tiny_artifact, "a", tmp_path, seed=5) == first
    assert build_synthetic_adapter(tiny_artifact, "a", tmp_path, seed=6) != first
    assert resolve_artifact(tmp_path, "a").name != first.name      # LATEST follows the newest build
    assert len(load_file(str(first / "adapter_model.safetensors"))) == 2 * len(ALL_TARGETS) * 2


def test_a_peft_directory_is_packed_with_only_its_adapter_files(tiny_artifact, tiny_adapters, tmp_path):
    path = pack_peft(tiny_adapters["qvd"], tiny_artifact, "qvd", tmp_path / "engines")

    assert sorted(verify_artifact(path).files) == ["adapter_config.json", "adapter_model.safetensors"]
    assert read_manifest(path).source == "peft:qvd"


def test_packing_a_directory_without_safetensors_names_the_missing_file(tiny_artifact, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ArtifactError) as caught:
        pack_peft(tmp_path, tiny_artifact, "x", tmp_path / "engines")
    assert caught.value.file == "adapter_model.safetensors"
