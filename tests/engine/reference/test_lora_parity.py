"""LoRA in the NumPy decoder against PEFT on Hugging Face's LlamaForCausalLM (the `parity` extra).

Each adapter is made and saved by PEFT itself (random A and B: `init_lora_weights=False`), read back by
the engine's loader, and compared logit by logit, alone and in one batch with another adapter and the
base model.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from inferd.engine.reference.adapter_registry import resolve_source
from inferd.engine.reference.kv_cache import PagedKVCache
from inferd.engine.reference.lora import LoraWeights, load_lora
from inferd.engine.reference.model import ForwardBatch, LlamaModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5")
peft = pytest.importorskip("peft")

VOCAB, BLOCK = 128, 4
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15, rms_norm_eps=1e-5)
ADAPTERS = {
    "everything": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"]),
    "rslora-qv": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"]),
    "mlp-last-layer": dict(r=2, lora_alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"],
                           layers_to_transform=[1]),
}
TOLERANCE = 1e-4


def hf_base(directory: Path):
    return transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[LlamaModel, dict[str, LoraWeights], dict[str, object]]:
    """The base model (ours), each adapter (ours) and each PEFT model (theirs; "base" = no adapter)."""
    root = tmp_path_factory.mktemp("lora-parity")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**BASE)).save_pretrained(root / "base")
    ours = LlamaModel.from_pretrained(root / "base")
    theirs: dict[str, object] = {"base": hf_base(root / "base")}
    adapters = {}
    for seed, (name, settings) in enumerate(sorted(ADAPTERS.items()), start=1):
        torch.manual_seed(seed)
        with warnings.catch_warnings():   # peft 0.21 asks transformers 5 a deprecated question
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = peft.get_peft_model(hf_base(root / "base"), peft.LoraConfig(init_lora_weights=False, **settings))
        model.eval().save_pretrained(root / name)
        theirs[name] = model
        adapters[name] = load_lora(name, root / name, ours.config)
    return ours, adapters, theirs


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def prefill(model: LlamaModel, prompts: list[list[int]], loras: list[LoraWeights | None]) -> np.ndarray:
    """One step computing every prompt whole: the last-token logits of each."""
    kv = PagedKVCache(num_layers=2, num_blocks=128, block_size=BLOCK, num_kv_heads=2, head_dim=16)
    tables, slots, free = [], [], list(range(128))
    for p in prompts:
        tables.append([free.pop() for _ in range(-(-len(p) // BLOCK))])
        slots.append(kv.slots_for_positions(tables[-1], np.arange(len(p))))
    return model.forward(ForwardBatch(
        token_ids=np.concatenate(prompts), positions=np.concatenate([np.arange(len(p)) for p in prompts]),
        slot_mapping=np.concatenate(slots), query_lens=[len(p) for p in prompts],
        context_lens=[len(p) for p in prompts], block_tables=tables, loras=loras), kv)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_logits_at_every_prompt_position_match_peft(setup, name):
    """Every prefix of the prompt is its own sequence in one step: its logits are PEFT's at that position."""
    ours, adapters, theirs = setup
    prompt = np.random.default_rng(2).integers(0, VOCAB, 13).tolist()

    got = prefill(ours, [prompt[:n] for n in range(1, 14)], [adapters[name]] * 13)

    expected = hf_logits(theirs[name], prompt)
    assert np.abs(got - expected).max() <= TOLERANCE
    assert np.abs(expected - hf_logits(theirs["base"], prompt)).max() > 0.1, "the adapter changes nothing"


def test_one_batch_of_three_adapters_and_the_base_model_matches_peft_row_by_row(setup):
    ours, adapters, theirs = setup
    rng = np.random.default_rng(3)
    names = ["everything", "base", "rslora-qv", "mlp-last-layer", "everything", "base"]
    prompts = [rng.integers(0, VOCAB, n).tolist() for n in (9, 4, 17, 6, 1, 12)]

    got = prefill(ours, prompts, [adapters.get(n) for n in names])

    for i, (name, prompt) in enumerate(zip(names, prompts)):
        assert np.abs(got[i] - hf_logits(theirs[name], prompt)[-1]).max() <= TOLERANCE, (i, name)


def test_a_synthetic_adapter_built_here_loads_in_peft_and_computes_the_same(tiny_artifact, tiny_adapters):
    """The other direction: our builder's files are a PEFT adapter PEFT itself accepts, and agrees with."""
    directory = resolve_source(tiny_adapters["all"])
    ours = LlamaModel.from_pretrained(tiny_artifact)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        theirs = peft.PeftModel.from_pretrained(hf_base(tiny_artifact), directory).eval()
    prompt = np.random.default_rng(4).integers(0, ours.config.vocab_size, 9).tolist()
    kv = ours.new_kv_cache(num_blocks=8, block_size=BLOCK)
    slots = kv.slots_for_positions([0, 1, 2], np.arange(9))

    got = ours.forward(ForwardBatch(token_ids=np.array(prompt), positions=np.arange(9), slot_mapping=slots,
                                    query_lens=[9], context_lens=[9], block_tables=[[0, 1, 2]],
                                    loras=[load_lora("all", directory, ours.config)]), kv)

    assert np.abs(got[0] - hf_logits(theirs, prompt)[-1]).max() <= TOLERANCE
