"""inferd.artifacts.signing: ed25519 signatures over artifact manifests, keys, trust."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inferd.artifacts import ArtifactError, SigningKeyError, verify_artifact
from inferd.artifacts.signing import (
    fingerprint,
    generate_key_pair,
    load_private_key,
    load_public_key,
    load_trusted_keys,
    read_signature,
    sign_artifact,
    verify_signed_artifact,
)


@pytest.fixture
def artifact(tiny_artifact: Path, tmp_path: Path) -> Path:
    """A private copy of the session's tiny artifact, free to tamper with."""
    return Path(shutil.copytree(tiny_artifact, tmp_path / "engines" / "tiny" / tiny_artifact.name))


@pytest.fixture
def key_pair(tmp_path: Path) -> tuple[Path, Path]:
    return generate_key_pair(tmp_path, "release")


@pytest.fixture
def trusted(key_pair: tuple[Path, Path]) -> dict[str, str]:
    return load_trusted_keys([str(key_pair[1])])


def signed(artifact: Path, key_path: Path) -> str:
    return sign_artifact(artifact, load_private_key(key_path))


def test_a_signed_artifact_verifies_naming_its_signer(artifact: Path, key_pair, trusted) -> None:
    signer = signed(artifact, key_pair[0])
    assert signer == fingerprint(load_public_key(key_pair[1])) and signer.startswith("SHA256:")
    manifest, by = verify_signed_artifact(artifact, trusted)
    assert by == signer and manifest.version == artifact.name
    assert verify_signed_artifact(artifact)[1] == signer          # no trust list: still checked and named
    assert verify_artifact(artifact).version == artifact.name     # the signature is not an unexpected file


def test_a_manifest_changed_after_signing_fails_even_with_no_trust_list(artifact: Path, key_pair) -> None:
    signer = signed(artifact, key_pair[0])
    manifest = artifact / "manifest.toml"
    manifest.write_text(manifest.read_text() + "\n")            # one byte: nothing a parser would notice
    with pytest.raises(ArtifactError, match=re.escape(f"does not match its signature by {signer}")) as info:
        verify_signed_artifact(artifact)
    assert info.value.file == "manifest.toml"


def test_a_file_changed_after_signing_fails_on_its_hash(artifact: Path, key_pair, trusted) -> None:
    signed(artifact, key_pair[0])
    weights = artifact / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="model.safetensors has changed") as info:
        verify_signed_artifact(artifact, trusted)
    assert info.value.file == "model.safetensors"
    assert verify_signed_artifact(artifact, trusted, check_files=False)[1] is not None   # the signature itself holds


def test_an_unknown_signer_is_refused_naming_it_and_the_trusted_keys(artifact: Path, key_pair, trusted,
                                                                     tmp_path: Path) -> None:
    other_private, _ = generate_key_pair(tmp_path, "other")
    other = signed(artifact, other_private)
    with pytest.raises(ArtifactError, match=re.escape(f"signed by {other}, which is not a trusted key")) as info:
        verify_signed_artifact(artifact, trusted)
    assert str(key_pair[1]) in str(info.value) and info.value.file == "manifest.sig"


def test_unsigned_is_refused_only_when_keys_are_trusted(artifact: Path, trusted) -> None:
    assert verify_signed_artifact(artifact)[1] is None
    assert verify_signed_artifact(artifact, {})[1] is None
    with pytest.raises(ArtifactError, match="unsigned, and trusted_keys requires a signature by one of: SHA256:"):
        verify_signed_artifact(artifact, trusted)


@pytest.mark.parametrize("text, match", [
    ("signer = [", "unreadable signature"),
    ('format = 1\nalgorithm = "ed25519"\n', "not a signature file"),
    ('format = 2\nalgorithm = "ed25519"\nsigner = "x"\npublic_key = "x"\nsignature = "x"\n', "not supported"),
    ('format = 1\nalgorithm = "ed25519"\nsigner = "x"\npublic_key = "ssh-rsa AAAA"\nsignature = "AA=="\n',
     "not an OpenSSH ed25519 public key"),
])
def test_a_signature_file_that_does_not_parse_is_named(artifact: Path, text: str, match: str) -> None:
    (artifact / "manifest.sig").write_text(text)
    with pytest.raises(ArtifactError, match=match) as info:
        verify_signed_artifact(artifact)
    assert info.value.file == "manifest.sig" and "manifest.sig" in str(info.value)


def test_a_signer_field_that_lies_about_its_key_is_refused(artifact: Path, key_pair) -> None:
    signed(artifact, key_pair[0])
    sig = artifact / "manifest.sig"
    real = read_signature(artifact).signer
    sig.write_text(sig.read_text().replace(real, "SHA256:somebody-else"))
    with pytest.raises(ArtifactError, match="is not the fingerprint of its public key"):
        verify_signed_artifact(artifact)


def test_a_signed_embedding_artifact_verifies_with_its_embedding_table_and_an_edit_to_it_is_caught(
        tiny_embed_artifact: Path, tmp_path: Path, key_pair, trusted) -> None:
    artifact = Path(shutil.copytree(tiny_embed_artifact, tmp_path / "copy"))
    signed(artifact, key_pair[0])
    manifest, _ = verify_signed_artifact(artifact, trusted)
    assert (manifest.embedding.pooling, manifest.embedding.matryoshka_min_dimensions) == ("last", 16)
    text = (artifact / "manifest.toml").read_text()
    (artifact / "manifest.toml").write_text(text.replace('pooling = "last"', 'pooling = "mean"'))
    with pytest.raises(ArtifactError, match="does not match its signature"):
        verify_signed_artifact(artifact, trusted)


def test_signing_changes_neither_the_version_nor_the_files(artifact: Path, key_pair) -> None:
    before = {p.name: p.read_bytes() for p in artifact.iterdir()}
    signed(artifact, key_pair[0])
    after = {p.name: p.read_bytes() for p in artifact.iterdir()}
    assert after.keys() - before.keys() == {"manifest.sig"}
    assert all(after[name] == data for name, data in before.items())


def test_an_openssh_private_key_signs_and_an_encrypted_one_is_refused(artifact: Path, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    plain, locked = tmp_path / "id_ed25519", tmp_path / "locked.pem"
    plain.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption()))
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"pw")))
    assert signed(artifact, plain) == fingerprint(key.public_key())
    with pytest.raises(SigningKeyError, match="locked.pem: the private key is encrypted"):
        load_private_key(locked)


@pytest.mark.parametrize("text, match", [
    (None, "cannot read the public key"),
    ("", "expected one `ssh-ed25519 AAAA...` line, found 0"),
    ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ x\n", "not an OpenSSH ed25519 public key"),
    ("ssh-ed25519 AAAA-not-base64 x\n", "not a valid ssh-ed25519 public key"),
    ("-----BEGIN PRIVATE KEY-----\nMC4\n-----END PRIVATE KEY-----\n", "this is a private key"),
])
def test_a_public_key_that_does_not_load_is_named(tmp_path: Path, text: str | None, match: str) -> None:
    path = tmp_path / "k.pub"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SigningKeyError, match=match) as info:
        load_trusted_keys([str(path)])
    assert info.value.path == str(path) and str(path) in str(info.value)


def test_generate_key_pair_never_overwrites(tmp_path: Path) -> None:
    private, public = generate_key_pair(tmp_path, "k")
    before = private.read_bytes()
    with pytest.raises(SigningKeyError, match="already exists"):
        generate_key_pair(tmp_path, "k")
    assert private.read_bytes() == before and public.is_file()
