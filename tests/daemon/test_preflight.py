"""inferd.daemon.preflight: check-config reports what serve would refuse, beyond the config's own keys."""
from __future__ import annotations

import json
import shutil

from inferd.__main__ import main
from inferd.config.root import load_config
from inferd.daemon.preflight import preflight_errors
from inferd.artifacts.signing import generate_key_pair, load_private_key, sign_artifact
from tests.trtllm_double.harness import make_lora_dir


def write(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_a_missing_artifact_and_a_malformed_keys_file_are_reported_together(tmp_path):
    (tmp_path / "keys.jsonl").write_text('{"key_id": "trunc')
    path = write(tmp_path, '[models.llama]\nbackend = "reference"\n'
                           '[auth]\nmode = "api_key"\nkeys_file = "keys.jsonl"\n')
    errors = preflight_errors(load_config(path))
    assert len(errors) == 2
    assert errors[0].startswith("models.llama: artifact 'llama'")
    assert "build it with: python build_engines.py --target reference --hf-dir" in errors[0]
    assert errors[1].startswith("auth.keys_file: ") and "keys.jsonl:1" in errors[1]


def test_sim_models_and_a_synthetic_model_serve_builds_itself_need_nothing_on_disk(tmp_path):
    path = write(tmp_path, '[models.tiny]\nbackend = "reference"\n'
                           '[models.s]\nbackend = "sim"\n[models.s.sim]\nprofile = "tiny"\n')
    assert preflight_errors(load_config(path)) == []


def test_a_missing_synthetic_version_names_the_synthetic_build(tmp_path):
    path = write(tmp_path, '[models.tiny]\nbackend = "reference"\nversion = "0123456789ab"\n')
    (error,) = preflight_errors(load_config(path))
    assert "--synthetic tiny" in error


def test_check_config_exits_1_naming_what_serve_would_refuse(tmp_path, capsys):
    path = write(tmp_path, '[models.llama]\nbackend = "reference"\n')
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "1 error(s)" in err and "models.llama: artifact 'llama'" in err
    assert main(["check-config", str(write(tmp_path, '[models.tiny]\nbackend = "reference"\n'))]) == 0



# -- trusted keys and signatures ------------------------------------------------------------------

def tiny_copy(tmp_path, tiny_artifact):
    """engines/tiny/<version> under tmp_path: a copy of the session's artifact, free to sign."""
    return shutil.copytree(tiny_artifact, tmp_path / "engines" / "tiny" / tiny_artifact.name)


def test_a_trusted_key_that_does_not_parse_is_named_with_its_path(tmp_path, tiny_artifact):
    tiny_copy(tmp_path, tiny_artifact)
    (tmp_path / "bad.pub").write_text("ssh-rsa AAAAB3NzaC1yc2E x\n")
    path = write(tmp_path, '[server]\ntrusted_keys = ["bad.pub"]\n'
                           '[models.tiny]\nbackend = "reference"\n'
                           '[models.other]\nbackend = "reference"\nartifact = "tiny"\ntrusted_keys = ["missing.pub"]\n')
    assert preflight_errors(load_config(path)) == [
        f"server.trusted_keys[0]: {tmp_path / 'bad.pub'}: not an OpenSSH ed25519 public key "
        "(expected a line `ssh-ed25519 AAAA...`)",
        f"models.other.trusted_keys[0]: {tmp_path / 'missing.pub'}: cannot read the public key: "
        "No such file or directory",
    ]


def test_an_artifact_unsigned_or_signed_by_another_key_is_named_and_a_trusted_one_passes(tmp_path, tiny_artifact):
    release, _ = generate_key_pair(tmp_path, "release")
    team, _ = generate_key_pair(tmp_path, "team")
    artifact = tiny_copy(tmp_path, tiny_artifact)
    path = write(tmp_path, '[server]\ntrusted_keys = ["release.pub"]\n[models.tiny]\nbackend = "reference"\n')
    (error,) = preflight_errors(load_config(path))
    assert error.startswith(f"models.tiny: {artifact}: unsigned, and trusted_keys requires a signature")
    sign_artifact(artifact, load_private_key(team))
    (error,) = preflight_errors(load_config(path))
    assert "which is not a trusted key" in error
    sign_artifact(artifact, load_private_key(release))
    assert preflight_errors(load_config(path)) == []
    with open(artifact / "model.safetensors", "ab") as fh:     # the files' hashes are the load's to check
        fh.write(b"\0")
    assert preflight_errors(load_config(path)) == []


def test_trusted_keys_with_a_synthetic_artifact_serve_would_build_unsigned_is_reported(tmp_path):
    generate_key_pair(tmp_path, "release")
    path = write(tmp_path, '[models.tiny]\nbackend = "reference"\ntrusted_keys = ["release.pub"]\n')
    (error,) = preflight_errors(load_config(path))
    assert "serve would build the missing tiny artifact unsigned and refuse it" in error
    assert error.endswith(f"--synthetic tiny --engines-root {tmp_path / 'engines'} --sign PRIVATE_KEY_FILE")


def test_check_config_names_a_bad_trusted_key(tmp_path, capsys):
    (tmp_path / "release.pub").write_text("-----BEGIN PRIVATE KEY-----\n")
    path = write(tmp_path, '[server]\ntrusted_keys = ["release.pub"]\n[models.s]\nbackend = "sim"\n'
                           '[models.s.sim]\nprofile = "tiny"\n')
    assert main(["check-config", str(path)]) == 1
    assert f"server.trusted_keys[0]: {tmp_path / 'release.pub'}: this is a private key" in capsys.readouterr().err


# -- LoRA adapters --------------------------------------------------------------------------------

def test_an_adapter_that_does_not_fit_or_is_missing_is_named_by_key_and_file_and_a_fitting_one_passes(
        tmp_path, tiny_engines_root, tiny_artifact, capsys):
    from inferd.artifacts.build.lora import build_synthetic_adapter, synthetic_adapter_tensors, write_peft_adapter

    build_synthetic_adapter(tiny_artifact, "good", tmp_path / "loras")     # an artifact: its name directory
    base = json.loads((tiny_artifact / "config.json").read_text())
    write_peft_adapter(tmp_path / "loras" / "wide", synthetic_adapter_tensors(
        {**base, "hidden_size": 2 * base["hidden_size"]}, rank=2, targets=("o_proj",)), rank=2, alpha=4.0,
        targets=("o_proj",))
    path = write(tmp_path, f'[server]\nengines_root = "{tiny_engines_root}"\n'
                           '[models.small]\nbackend = "reference"\nartifact = "tiny"\n'
                           'lora_adapters = { good = "loras/good", wide = "loras/wide", gone = "loras/gone" }\n'
                           '[models.s]\nbackend = "sim"\nlora_adapters = { sql = "" }\n')
    wide, gone = preflight_errors(load_config(path))
    assert wide.startswith("models.small.lora_adapters.wide: LoRA adapter 'wide': adapter_model.safetensors: "
                           "tensor 'base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight' has shape")
    assert wide.endswith(f"(file {tmp_path / 'loras' / 'wide' / 'adapter_model.safetensors'})")
    assert gone == f"models.small.lora_adapters.gone: {tmp_path / 'loras' / 'gone'} does not exist"
    assert main(["check-config", str(path)]) == 1
    assert "models.small.lora_adapters.wide: " in capsys.readouterr().err


def test_trtllm_adapters_under_either_key_must_exist(tmp_path):
    make_lora_dir(tmp_path / "support")
    model = '[models.t]\nbackend = "trtllm"\nartifact = "x"\n[models.t.trtllm]\nengine_dir = "eng"\n'
    path = write(tmp_path, model + 'lora_adapters = { support = "support", gone = "gone" }\n')
    assert preflight_errors(load_config(path)) == [f"models.t.trtllm.lora_adapters.gone: {tmp_path / 'gone'} does not exist"]
    path = write(tmp_path, model.replace("[models.t.trtllm]", 'lora_adapters = { gone = "gone" }\n[models.t.trtllm]'))
    assert preflight_errors(load_config(path)) == [f"models.t.lora_adapters.gone: {tmp_path / 'gone'} does not exist"]


def test_with_trusted_keys_an_unsigned_or_foreign_adapter_is_named_by_key_and_a_signed_one_passes(
        tmp_path, tiny_engines_root, tiny_artifact, capsys):
    from inferd.artifacts.build.lora import build_synthetic_adapter, synthetic_adapter_tensors, write_peft_adapter

    release, release_pub = generate_key_pair(tmp_path, "release")
    team, _ = generate_key_pair(tmp_path, "team")
    artifact = tiny_copy(tmp_path, tiny_artifact)
    sign_artifact(artifact, load_private_key(release))
    good = build_synthetic_adapter(tiny_artifact, "good", tmp_path / "loras")
    foreign = build_synthetic_adapter(tiny_artifact, "foreign", tmp_path / "loras", seed=3)
    sign_artifact(good, load_private_key(release))
    sign_artifact(foreign, load_private_key(team))
    base = json.loads((tiny_artifact / "config.json").read_text())
    write_peft_adapter(tmp_path / "loras" / "plain", synthetic_adapter_tensors(base, rank=2, targets=("q_proj",)),
                       rank=2, alpha=4.0, targets=("q_proj",))
    path = write(tmp_path, '[models.tiny]\nbackend = "reference"\ntrusted_keys = ["release.pub"]\n'
                           'lora_adapters = { good = "loras/good", foreign = "loras/foreign", plain = "loras/plain" }\n')
    path.write_text(path.read_text().replace("[models.tiny]", f'[server]\nengines_root = "{tmp_path / "engines"}"\n'
                                                               "[models.tiny]"))
    foreign_error, plain_error = preflight_errors(load_config(path))
    assert foreign_error.startswith("models.tiny.lora_adapters.foreign: LoRA adapter 'foreign': ")
    assert "which is not a trusted key" in foreign_error and foreign_error.endswith(f"(file {foreign / 'manifest.sig'})")
    assert plain_error.startswith("models.tiny.lora_adapters.plain: LoRA adapter 'plain': ")
    assert "is unsigned (signer: none)" in plain_error
    assert main(["check-config", str(path)]) == 1
    assert "models.tiny.lora_adapters.foreign: " in capsys.readouterr().err


def test_a_trtllm_adapter_that_is_not_an_hf_lora_directory_is_named_with_its_file(tmp_path):
    (tmp_path / "empty").mkdir()
    path = write(tmp_path, '[models.t]\nbackend = "trtllm"\nartifact = "x"\nlora_adapters = { empty = "empty" }\n'
                           '[models.t.trtllm]\nengine_dir = "eng"\n')
    (error,) = preflight_errors(load_config(path))
    assert error.startswith("models.t.lora_adapters.empty: LoRA adapter 'empty': ")
    assert "no adapter_config.json (not an HF/PEFT LoRA directory)" in error
    assert error.endswith(f"(file {tmp_path / 'empty' / 'adapter_config.json'})")
