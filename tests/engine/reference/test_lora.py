"""LoRA adapters in the NumPy decoder: reading and checking PEFT files, and the per-adapter deltas of a batch."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from inferd.engine.adapters import AdapterLoadError
from inferd.artifacts.build.lora import adapter_key
from inferd.engine.reference.adapter_registry import resolve_source
from inferd.engine.reference.lora import LoraWeights, load_lora, lora_groups
from inferd.engine.reference.model import ForwardBatch, LlamaModel
from inferd.engine.reference.weights import Checkpoint

WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
BLOCK = 4


@pytest.fixture(scope="module")
def model(tiny_artifact: Path) -> LlamaModel:
    return LlamaModel.from_pretrained(tiny_artifact)


@pytest.fixture(scope="module")
def adapters(tiny_adapters, model) -> dict[str, LoraWeights]:
    return {name: load_lora(name, resolve_source(path), model.config) for name, path in tiny_adapters.items()}


@pytest.fixture
def qvd_copy(tiny_adapters, tmp_path) -> Path:
    """A writable copy of the plain PEFT adapter (q/v/down_proj, r 2)."""
    return Path(shutil.copytree(tiny_adapters["qvd"], tmp_path / "qvd"))


def edit_tensors(directory: Path, change) -> None:
    tensors = load_file(str(directory / WEIGHTS))
    change(tensors)
    save_file(tensors, str(directory / WEIGHTS))


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / CONFIG).read_text())
    config.update(changes)
    (directory / CONFIG).write_text(json.dumps(config))


def load_error(directory: Path, model: LlamaModel) -> AdapterLoadError:
    with pytest.raises(AdapterLoadError) as caught:
        load_lora("qvd", directory, model.config)
    assert caught.value.adapter == "qvd" and "'qvd'" in str(caught.value)
    return caught.value


# -- reading and checking -------------------------------------------------------------------------

def test_an_adapter_loads_with_its_rank_targets_and_scaling(adapters):
    everything, qvd = adapters["all"], adapters["qvd"]
    assert (everything.rank, everything.scaling) == (4, 2.0)
    assert everything.targets == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    assert (qvd.rank, qvd.scaling, qvd.targets) == (2, 2.0, ("down_proj", "q_proj", "v_proj"))
    assert set(qvd.layers[0]) == {"qkv", "down"} and everything.nbytes > qvd.nbytes > 0


def test_a_tensor_of_the_wrong_shape_is_named_with_its_file(qvd_copy, model):
    key = adapter_key(1, "v_proj", "B")
    edit_tensors(qvd_copy, lambda t: t.update({key: np.zeros((7, 2), np.float32)}))

    error = load_error(qvd_copy, model)

    assert (error.file, error.tensor) == (WEIGHTS, key)
    assert key in str(error) and "(7, 2)" in str(error) and "(32, 2)" in str(error)


@pytest.mark.parametrize("key, why", [
    ("base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight", "layer 9"),
    ("base_model.model.lm_head.lora_A.weight", "is not a LoRA A/B matrix"),
    ("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight", "is not a LoRA A/B matrix"),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", "is not a LoRA A/B matrix"),
])
def test_a_tensor_the_engine_cannot_place_is_named(qvd_copy, model, key, why):
    edit_tensors(qvd_copy, lambda t: t.update({key: np.zeros((2, 64), np.float32)}))

    error = load_error(qvd_copy, model)

    assert error.tensor == key and why in str(error)


def test_a_lora_a_without_its_lora_b_is_named(qvd_copy, model):
    edit_tensors(qvd_copy, lambda t: t.pop(adapter_key(0, "down_proj", "B")))

    assert load_error(qvd_copy, model).tensor == adapter_key(0, "down_proj", "B")


@pytest.mark.parametrize("changes, why", [
    ({"r": 0}, "r must be a positive integer"),
    ({"r": 3}, "with r = 3 and this base model it must be (3, "),   # the tensors say 2
    ({"lora_alpha": -1}, "lora_alpha must be a positive number"),
    ({"peft_type": "IA3"}, "peft_type 'IA3' is not supported"),
    ({"use_dora": True}, "use_dora = True is not supported"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": ["q_proj", "k_proj", "v_proj", "down_proj"]}, "targets k_proj"),
])
def test_adapter_config_settings_the_engine_cannot_apply_are_refused(qvd_copy, model, changes, why):
    edit_config(qvd_copy, **changes)

    error = load_error(qvd_copy, model)

    assert why in str(error)
    assert error.file == (WEIGHTS if changes.keys() == {"r"} and changes["r"] == 3 else CONFIG)


def test_settings_that_mean_unused_and_module_paths_are_accepted(qvd_copy, model):
    edit_config(qvd_copy, bias="none", use_dora=False, rank_pattern={}, modules_to_save=None,
                target_modules=["model.layers.0.self_attn.q_proj", "v_proj", "down_proj"])
    assert load_lora("qvd", qvd_copy, model.config).targets == ("down_proj", "q_proj", "v_proj")


def test_rslora_scales_by_alpha_over_the_square_root_of_r(qvd_copy, model):
    edit_config(qvd_copy, use_rslora=True, lora_alpha=8)
    assert load_lora("qvd", qvd_copy, model.config).scaling == pytest.approx(8 / 2 ** 0.5)


def test_missing_files_are_named(qvd_copy, model):
    (qvd_copy / WEIGHTS).rename(qvd_copy / "adapter_model.bin")
    error = load_error(qvd_copy, model)
    assert error.file == WEIGHTS and "safe_serialization" in str(error)
    (qvd_copy / CONFIG).unlink()
    assert load_error(qvd_copy, model).file == CONFIG


def test_half_precision_tensors_are_read_as_float32(qvd_copy, model, adapters):
    edit_tensors(qvd_copy, lambda t: t.update({k: v.astype(np.float16) for k, v in t.items()}))
    half = load_lora("qvd", qvd_copy, model.config)
    site, full = half.layers[1]["down"], adapters["qvd"].layers[1]["down"]
    assert site.a.dtype == np.float32
    np.testing.assert_allclose(site.a, full.a, rtol=1e-3, atol=1e-3)


# -- the batched deltas -----------------------------------------------------------------------

def test_rows_are_grouped_per_adapter_as_slices_when_contiguous(adapters):
    a, b = adapters["all"], adapters["qvd"]
    assert lora_groups(None, [3]) == [] and lora_groups([None, None], [3, 1]) == []
    assert lora_groups([a, a, None], [3, 2, 4]) == [(a, slice(0, 5))]
    groups = lora_groups([a, b, None, a], [3, 2, 4, 1])
    assert [g[0] for g in groups] == [a, b]
    np.testing.assert_array_equal(groups[0][1], [0, 1, 2, 9])
    assert groups[1][1] == slice(3, 5)


def prefill(model: LlamaModel, prompts: list[list[int]], loras: list[LoraWeights | None]) -> np.ndarray:
    """One step computing every prompt whole, each in its own blocks: the last-token logits of each."""
    kv = model.new_kv_cache(num_blocks=64, block_size=BLOCK)
    tables, slots, free = [], [], list(range(64))
    for p in prompts:
        tables.append([free.pop() for _ in range(-(-len(p) // BLOCK))])
        slots.append(kv.slots_for_positions(tables[-1], np.arange(len(p))))
    batch = ForwardBatch(token_ids=np.concatenate(prompts), positions=np.concatenate([np.arange(len(p)) for p in prompts]),
                         slot_mapping=np.concatenate(slots), query_lens=[len(p) for p in prompts],
                         context_lens=[len(p) for p in prompts], block_tables=tables, loras=loras)
    return model.forward(batch, kv)


PROMPTS = [list(range(5, 16)), [7, 3, 9], list(range(100, 121)), [42] * 6, [1, 2, 3, 4, 5]]


def test_each_sequence_of_a_mixed_batch_gets_what_it_gets_alone(model, adapters):
    a, b = adapters["all"], adapters["qvd"]
    loras = [a, None, b, a, None]

    batched = prefill(model, PROMPTS, loras)

    for i, (prompt, lora) in enumerate(zip(PROMPTS, loras)):
        np.testing.assert_allclose(batched[i], prefill(model, [prompt], [lora])[0], atol=2e-5, rtol=0)
    base = prefill(model, PROMPTS, [None] * 5)
    assert np.abs(batched[0] - base[0]).max() > 0.05 and np.abs(batched[2] - base[2]).max() > 0.05
    np.testing.assert_allclose(batched[[1, 4]], base[[1, 4]], atol=2e-5, rtol=0)


class MergedCheckpoint:
    """The base checkpoint with an adapter's deltas merged into its weights: W + scaling * B @ A."""

    def __init__(self, base: Path, adapter: Path, scaling: float):
        self.base, self.lora, self.scaling = Checkpoint(base), load_file(str(adapter / WEIGHTS)), scaling

    def get(self, name: str, shape=None) -> np.ndarray:
        weight = self.base.get(name, shape)
        a_key = "base_model.model." + name.replace(".weight", ".lora_A.weight")
        if a_key in self.lora:
            b = self.lora[a_key.replace("lora_A", "lora_B")]
            weight += np.float32(self.scaling) * (b.astype(np.float64) @ self.lora[a_key]).astype(np.float32)
        return weight

    def quantized(self, name: str) -> bool:
        return False            # a float checkpoint with float deltas merged in


@pytest.mark.parametrize("name", ["all", "qvd"])
def test_an_adapter_computes_what_its_merged_weights_compute(model, adapters, tiny_artifact, tiny_adapters, name):
    merged = LlamaModel(model.config, MergedCheckpoint(tiny_artifact, resolve_source(tiny_adapters[name]),
                                                       adapters[name].scaling))

    expected = prefill(merged, PROMPTS, [None] * 5)

    np.testing.assert_allclose(prefill(model, PROMPTS, [adapters[name]] * 5), expected, atol=1e-4, rtol=0)
