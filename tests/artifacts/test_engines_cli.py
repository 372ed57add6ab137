"""inferd.artifacts.engines_cli: `inferd engines verify | keygen | sign`, through the real CLI parser."""
from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.__main__ import main as inferd_main
from inferd.artifacts import fingerprint, load_private_key, load_public_key
from inferd.artifacts.engines_cli import verify_main


@pytest.fixture
def engines_root(tiny_artifact: Path, tmp_path: Path) -> Path:
    """A private copy of the session's engines tree, free to tamper with."""
    root = tmp_path / "engines"
    shutil.copytree(tiny_artifact.parent, root / "tiny")
    return root


@pytest.fixture
def artifact(engines_root: Path, tiny_artifact: Path) -> Path:
    return engines_root / "tiny" / tiny_artifact.name


@pytest.fixture
def keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """A fresh key pair from `inferd engines keygen` (private, public)."""
    assert inferd_main(["engines", "keygen", "--out-dir", str(tmp_path), "--name", "release"]) == 0
    private, public = capsys.readouterr().out.split()
    return Path(private), Path(public)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# --- verify --------------------------------------------------------------------------------------

def test_verify_cli_accepts_a_tree_and_a_single_artifact(engines_root: Path, artifact: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert inferd_main(["engines", "verify", str(engines_root)]) == 0
    assert inferd_main(["engines", "verify", str(artifact)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"ok    tiny/{artifact.name}") for line in lines)
    assert all("  unsigned  " in line for line in lines)


def test_verify_cli_exits_nonzero_naming_the_tampered_file(engines_root: Path, artifact: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(artifact, engines_root / "copy" / artifact.name)
    flip_byte(artifact / "model.safetensors", 1000)
    assert verify_main(engines_root) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["ok", "FAIL"]
    assert "model.safetensors has changed" in out[1] and str(artifact) in out[1]


def test_verify_cli_reports_a_dangling_latest_and_empty_trees(engines_root: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (engines_root / "tiny" / "LATEST").write_text("deadbeef0000\n")
    assert verify_main(engines_root) == 1
    assert "LATEST points at 'deadbeef0000'" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert verify_main(tmp_path / "empty") == 1
    assert verify_main(tmp_path / "missing") == 2


def test_verify_cli_reports_unreadable_files_as_lines_not_tracebacks(engines_root: Path, artifact: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (engines_root / "tiny" / "LATEST").write_bytes(b"\xff\xfe not utf-8")
    (artifact / "manifest.toml").write_bytes(b"\xff" * 10)
    assert verify_main(engines_root) == 1
    out = capsys.readouterr().out.splitlines()
    assert all(line.startswith("FAIL  ") for line in out) and len(out) == 2
    assert "LATEST: unreadable" in out[1] and "manifest.toml: unreadable" in out[0]


def test_inferd_engines_verify_process_exit_codes(engines_root: Path, artifact: Path) -> None:
    command = [sys.executable, "-m", "inferd", "engines", "verify", str(engines_root)]
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    (artifact / "generation_config.json").unlink()
    failed = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1
    assert "generation_config.json is missing" in failed.stdout


def test_verify_names_the_signer_and_fails_a_signed_manifest_changed_afterwards(
        engines_root: Path, artifact: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    private, public = keys
    assert inferd_main(["engines", "sign", str(artifact), "--key", str(private)]) == 0
    signer = fingerprint(load_public_key(public))
    assert f"signed  {artifact}  by {signer}" in capsys.readouterr().out
    assert inferd_main(["engines", "verify", str(engines_root)]) == 0
    assert f"  signed by {signer}  {artifact}" in capsys.readouterr().out
    manifest = artifact / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('source = "synthetic:tiny"', 'source = "synthetic:tinY"'))
    assert inferd_main(["engines", "verify", str(engines_root)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL  ") and f"does not match its signature by {signer}" in out


def test_verify_with_a_trusted_key_fails_unsigned_and_other_signers(
        engines_root: Path, artifact: Path, keys: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    private, public = keys
    assert inferd_main(["engines", "verify", str(artifact), "--trusted-key", str(public)]) == 1
    assert "unsigned, and trusted_keys requires a signature" in capsys.readouterr().out
    assert inferd_main(["engines", "keygen", "--out-dir", str(tmp_path), "--name", "other"]) == 0
    other_private, _ = capsys.readouterr().out.split()
    assert inferd_main(["engines", "sign", str(engines_root), "--key", other_private]) == 0
    capsys.readouterr()
    assert inferd_main(["engines", "verify", str(artifact), "--trusted-key", str(public)]) == 1
    assert "which is not a trusted key" in capsys.readouterr().out
    assert inferd_main(["engines", "sign", str(artifact), "--key", str(private)]) == 0      # re-signed: replaced
    assert inferd_main(["engines", "verify", str(artifact), "--trusted-key", str(public)]) == 0
    assert inferd_main(["engines", "verify", str(artifact), "--trusted-key", str(private)]) == 2
    assert "this is a private key" in capsys.readouterr().err


# --- keygen and sign -------------------------------------------------------------------------------

def test_keygen_writes_a_key_pair_into_the_state_directory_not_the_checkout_and_prints_both_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)                          # no config.toml here: INFERD_STATE_DIR's
    monkeypatch.setenv("INFERD_STATE_DIR", str(tmp_path / "state"))
    assert inferd_main(["engines", "keygen"]) == 0
    signing = tmp_path / "state" / "signing"
    private, public = signing / "inferd-signing.key", signing / "inferd-signing.pub"
    assert capsys.readouterr().out.splitlines() == [str(private), str(public)]
    assert not list(tmp_path.glob("*.key"))
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(signing.stat().st_mode) == 0o700
    assert public.read_text().startswith("ssh-ed25519 AAAA") and public.read_text().endswith(" inferd-signing\n")
    assert fingerprint(load_private_key(private).public_key()) == fingerprint(load_public_key(public))


def test_keygen_beside_a_config_writes_into_that_configs_state_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.toml").write_text('[server]\nstate_dir = "var"\n')
    assert inferd_main(["engines", "keygen"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(tmp_path / "var" / "signing" / "inferd-signing.key")


def test_keygen_never_overwrites_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inferd-signing.pub").write_text("precious")
    assert inferd_main(["engines", "keygen", "--out-dir", str(tmp_path)]) == 1
    assert "inferd-signing.pub: already exists" in capsys.readouterr().err
    assert (tmp_path / "inferd-signing.pub").read_text() == "precious"
    assert not (tmp_path / "inferd-signing.key").exists()


def test_the_repository_ignores_private_keys() -> None:
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert "*.key" in ignored


def test_sign_refuses_a_tampered_artifact_and_a_key_that_is_not_one(
        artifact: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    private, public = keys
    assert inferd_main(["engines", "sign", str(artifact), "--key", str(public)]) == 2
    assert f"{public}: this is a public key" in capsys.readouterr().err
    flip_byte(artifact / "model.safetensors", 1000)
    assert inferd_main(["engines", "sign", str(artifact), "--key", str(private)]) == 1
    assert "model.safetensors has changed" in capsys.readouterr().out
    assert not (artifact / "manifest.sig").exists()
