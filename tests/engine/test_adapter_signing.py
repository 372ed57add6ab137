"""inferd.engine.adapter_signing: with trusted keys a LoRA adapter loads only when signed by one of them,
through the reference registry and engine, lazily and by the admin method; `inferd engines sign` signs one."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inferd.artifacts import sign_main, verify_main
from inferd.engine import AdapterLoadError, AdapterSignatureError
from inferd.engine.adapter_signing import check_adapter_signature
from inferd.engine.reference.adapter_registry import AdapterRegistry
from inferd.engine.reference.engine import ReferenceEngine
from inferd.engine.reference.config import LlamaConfig
from inferd.artifacts.signing import fingerprint, generate_key_pair, load_private_key, load_public_key, sign_artifact
from inferd.types import FinishReason, GenerationRequest, SamplingParams
from tests.engine.backends import started_engines


@pytest.fixture
def keys(tmp_path) -> dict[str, tuple[Path, Path]]:
    return {name: generate_key_pair(tmp_path, name) for name in ("release", "team")}


def trusted(keys, *names) -> dict[str, str]:
    return {fingerprint(load_public_key(keys[n][1])): str(keys[n][1]) for n in names}


@pytest.fixture
def adapter_copy(tiny_adapters, tmp_path) -> Path:
    """A copy of the "all" adapter's artifact version, free to sign."""
    version = tiny_adapters["all"] / (tiny_adapters["all"] / "LATEST").read_text().strip()
    return Path(shutil.copytree(version, tmp_path / "all" / version.name))


def registry(sources, tiny_artifact, **kwargs) -> AdapterRegistry:
    reg = AdapterRegistry(sources, max_loaded=2, **kwargs)
    reg.bind(LlamaConfig.from_json(tiny_artifact / "config.json"))
    return reg


def test_an_adapter_signed_by_a_trusted_key_loads(adapter_copy, tiny_artifact, keys):
    sign_artifact(adapter_copy, load_private_key(keys["release"][0]))
    reg = registry({"all": adapter_copy}, tiny_artifact, trusted=trusted(keys, "release", "team"))
    assert reg.read("all").rank == 4
    assert check_adapter_signature("all", adapter_copy, trusted(keys, "release")) == \
        fingerprint(load_public_key(keys["release"][1]))


def test_an_unsigned_adapter_artifact_or_peft_directory_is_refused_naming_adapter_file_and_signer(
        adapter_copy, tiny_adapters, tiny_artifact, keys):
    reg = registry({"all": adapter_copy, "qvd": tiny_adapters["qvd"]}, tiny_artifact, trusted=trusted(keys, "release"))
    for name, directory in (("all", adapter_copy), ("qvd", tiny_adapters["qvd"])):
        with pytest.raises(AdapterSignatureError) as caught:
            reg.read(name)
        err = caught.value
        assert isinstance(err, AdapterLoadError) and err.adapter == name and err.signer is None
        assert err.file == str(directory / "manifest.sig")
        assert f"LoRA adapter {name!r}" in str(err) and "unsigned" in str(err) and "(signer: none)" in str(err)
        assert fingerprint(load_public_key(keys["release"][1])) in str(err)      # says which keys would do


def test_an_adapter_signed_by_an_unknown_key_is_refused_naming_the_signer(adapter_copy, tiny_artifact, keys):
    sign_artifact(adapter_copy, load_private_key(keys["team"][0]))
    team = fingerprint(load_public_key(keys["team"][1]))
    with pytest.raises(AdapterSignatureError) as caught:
        registry({"all": adapter_copy}, tiny_artifact, trusted=trusted(keys, "release")).read("all")
    assert caught.value.signer == team and caught.value.file == str(adapter_copy / "manifest.sig")
    assert f"signed by {team}, which is not a trusted key" in str(caught.value)
    assert "'all'" in str(caught.value)


def test_a_manifest_changed_after_signing_is_refused(adapter_copy, tiny_artifact, keys):
    sign_artifact(adapter_copy, load_private_key(keys["release"][0]))
    with open(adapter_copy / "manifest.toml", "a") as fh:
        fh.write("\n# edited\n")
    with pytest.raises(AdapterSignatureError, match="does not match its signature"):
        registry({"all": adapter_copy}, tiny_artifact, trusted=trusted(keys, "release")).read("all")


def test_a_file_changed_after_signing_is_refused_even_when_the_engine_skips_verification(
        adapter_copy, tiny_artifact, keys):
    sign_artifact(adapter_copy, load_private_key(keys["release"][0]))
    weights = adapter_copy / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF                         # one byte of the weights
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterLoadError, match="sha256"):    # the daemon passes verify=False for the base model
        registry({"all": adapter_copy}, tiny_artifact, trusted=trusted(keys, "release"), verify=False).read("all")


def test_without_trusted_keys_unsigned_adapters_load_as_before(adapter_copy, tiny_adapters, tiny_artifact):
    reg = registry({"all": adapter_copy, "qvd": tiny_adapters["qvd"]}, tiny_artifact)
    assert reg.read("all").rank == 4 and reg.read("qvd").rank == 2


def test_engines_sign_and_verify_work_on_an_adapter_artifact(adapter_copy, keys, capsys):
    assert sign_main(adapter_copy, keys["release"][0]) == 0
    assert verify_main(adapter_copy, [str(keys["release"][1])]) == 0
    out = capsys.readouterr().out
    assert f"signed by {fingerprint(load_public_key(keys['release'][1]))}" in out and "  lora  " in out


async def test_the_engine_refuses_the_adapter_lazily_and_by_the_admin_method_and_the_base_serves(
        tiny_artifact, tiny_adapters, adapter_copy, keys):
    sign_artifact(adapter_copy, load_private_key(keys["team"][0]))

    def build() -> ReferenceEngine:
        return ReferenceEngine(tiny_artifact, num_kv_blocks=128, block_size=4,
                               lora_adapters={"foreign": adapter_copy, "qvd": tiny_adapters["qvd"]},
                               adapter_trusted_keys=trusted(keys, "release"))

    async with started_engines(build) as make:
        engine = await make()
        ids = tuple(engine.tokenizer.encode("the quick brown fox"))

        def req(rid: str, lora: str | None) -> GenerationRequest:
            return GenerationRequest(request_id=rid, prompt_token_ids=ids, lora=lora,
                                     sampling=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))

        bad = await engine.submit(req("bad", "foreign")).collect()
        assert bad.finish_reason is FinishReason.ERROR
        assert "'foreign' was refused: it is not signed by a trusted key" in bad.error
        assert fingerprint(load_public_key(keys["team"][1])) in bad.error
        with pytest.raises(AdapterSignatureError):
            await engine.load_adapter("qvd")
        base = await engine.submit(req("base", None)).collect()
        assert base.finish_reason is FinishReason.LENGTH and len(base.token_ids) == 4
        assert not any(info.loaded for info in engine.adapters())
