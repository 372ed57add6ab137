"""pack_hf on checkpoints of each family the reference engine runs (tests/hf_checkpoints.py), and a packed
Qwen2.5-shaped checkpoint served through the real daemon, its greedy answer the one transformers generates."""
from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.daemon.harness import running_daemon
from tests.hf_checkpoints import FAMILIES, IM_END, save_checkpoint, torch

from inferd.artifacts.build.reference import pack_hf
from inferd.artifacts.manifest import resolve_artifact, verify_artifact
from inferd.config.root import parse_config
from inferd.engine.tokenization import HFTokenizer

# family -> (architecture, model_type, head_dim, rope_theta, tied) the manifest records
EXPECTED = {
    "tinyllama": ("LlamaForCausalLM", "llama", 16, 10000.0, False),
    "smollm2": ("LlamaForCausalLM", "llama", 16, 100000.0, True),
    "llama3": ("LlamaForCausalLM", "llama", 16, 500000.0, True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", 16, 10000.0, False),
    "qwen2.5": ("Qwen2ForCausalLM", "qwen2", 16, 1e6, True),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", 32, 1e6, True),
}


def quiet(message: str) -> None:
    pass


def test_every_family_is_covered():
    assert sorted(EXPECTED) == sorted(FAMILIES)


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_pack_hf_packs_each_family_with_its_architecture_in_the_manifest(family: str, tmp_path: Path):
    hf = save_checkpoint(tmp_path / "hf", family)
    packed = pack_hf(tmp_path / "hf", "m", tmp_path / "engines", progress=quiet)
    arch = verify_artifact(packed).architecture
    assert (arch.architecture, arch.model_type, arch.head_dim, arch.rope_theta, arch.tie_word_embeddings) == \
        EXPECTED[family]
    assert arch.num_parameters == sum(p.numel() for p in hf.parameters())   # a tied head counted once


@pytest.fixture(scope="module")
def served_qwen(tmp_path_factory) -> tuple[Path, object]:
    """engines/qwen/<version>: a packed Qwen2.5-shaped checkpoint; and the transformers model it was saved from."""
    root = tmp_path_factory.mktemp("qwen")
    hf = save_checkpoint(root / "hf", "qwen2.5", seed=1)
    pack_hf(root / "hf", "qwen", root / "engines", progress=quiet)
    return root / "engines", hf


def served_config(engines_root: Path):
    return parse_config({"server": {"port": 0, "engines_root": str(engines_root)},
                         "models": {"qwen": {"max_batch_size": 2, "max_num_tokens": 64, "num_kv_blocks": 32}}})


async def test_a_packed_qwen_checkpoint_answers_a_chat_through_the_daemon_as_transformers_generates(served_qwen):
    engines_root, hf = served_qwen
    messages = [{"role": "user", "content": "Bonjour, ça va?"}]
    tokenizer = HFTokenizer.from_dir(resolve_artifact(engines_root, "qwen"))
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages))
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16, output_logits=True,
                          return_dict_in_generate=True, eos_token_id=tokenizer.token_to_id(IM_END), pad_token_id=256)
    expected_ids = out.sequences[0, len(prompt):].tolist()
    expected_logprobs = [float(torch.log_softmax(step[0].double(), -1)[i]) for step, i in zip(out.logits, expected_ids)]
    body = {"model": "qwen", "messages": messages, "max_tokens": 16, "temperature": 0, "logprobs": True}
    async with running_daemon(served_config(engines_root)) as (daemon, _, url):
        assert daemon.state.engines["qwen"].info.backend == "reference"
        async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
    choice = answer["choices"][0]
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), len(expected_ids))
    # the fixture's token id b is byte b: each served token's bytes name its id
    assert [bytes(e["bytes"]) for e in choice["logprobs"]["content"]] == [bytes([i]) for i in expected_ids]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(expected_logprobs, abs=1e-4)
    assert choice["message"]["content"] == tokenizer.decode(expected_ids)
    assert len(set(expected_ids)) > 4 and max(expected_ids) < 256, "pick a seed whose answer says more"
