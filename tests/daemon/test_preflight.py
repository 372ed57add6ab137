"""inferd.daemon.preflight: check-config reports what serve would refuse, beyond the config's own keys."""
from __future__ import annotations

from inferd.__main__ import main
from inferd.config.root import load_config
from inferd.daemon.preflight import preflight_errors


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
