"""Signed LoRA adapters: with trusted keys, an adapter's artifact must be signed by one of them.

Every backend that reads adapter files calls `check_adapter_signature` when an adapter loads (the
reference engine's registry, lazily or for POST /admin/adapters; trtllm's load_adapter), and
`inferd check-config` calls it for each configured adapter. The check is the artifacts' own
(signing.verify_signed_artifact over the adapter's `manifest.toml`); a plain PEFT directory has no
manifest to sign, so with trusted keys it is refused as unsigned. Without trusted keys nothing here
runs and adapters load as before.

`adapter_version` is the manifest check every backend that reads adapter files makes after the signature.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from inferd.artifacts import (
    LATEST_FILE,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ArtifactError,
    read_manifest,
    read_signature,
    resolve_artifact,
    trusted_list,
    verify_artifact,
    verify_signed_artifact,
)
from inferd.engine.adapters import AdapterLoadError


ADAPTER_TARGET = "lora"       # the manifest target of an adapter artifact


class AdapterSignatureError(AdapterLoadError):
    """Trusted keys are set and the adapter is unsigned, signed by an unknown key, or its signature does
    not check. `signer` is the fingerprint that signed it (None: unsigned); `file` the file at fault."""

    def __init__(self, message: str, adapter: str, file: str | None, signer: str | None) -> None:
        super().__init__(message, adapter, file)
        self.signer = signer


def resolve_adapter_source(path: str | Path) -> Path:
    """The directory holding an adapter's files: `path`, or the version its artifact's LATEST names."""
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file() and (path / LATEST_FILE).is_file():
        return resolve_artifact(path.parent, path.name)
    return path


def _claimed_signer(directory: Path) -> str | None:
    try:
        sig = read_signature(directory)
    except ArtifactError:
        return None
    return sig.signer if sig is not None else None


def check_adapter_signature(name: str, directory: str | Path, trusted: Mapping[str, str], *,
                            check_files: bool = True) -> str | None:
    """The signer's fingerprint of adapter `name`'s files in `directory` (already resolved), when
    `trusted` (fingerprint -> .pub path) is non-empty; None (nothing checked) when it is empty.
    Raises AdapterSignatureError naming the adapter, the file and the signer."""
    if not trusted:
        return None
    directory = Path(directory)
    keys = trusted_list(trusted)
    if not (directory / MANIFEST_FILE).is_file():
        raise AdapterSignatureError(
            f"LoRA adapter {name!r}: {directory} is unsigned (signer: none): it has no {MANIFEST_FILE}, and "
            f"trusted_keys requires an adapter artifact signed by one of: {keys} (pack it as an artifact with "
            f"inferd.artifacts.build.lora.pack_peft, then `inferd engines sign DIR --key KEY`)",
            name, str(directory / SIGNATURE_FILE), None)
    try:
        _, signer = verify_signed_artifact(directory, trusted, check_files=check_files)
    except (ArtifactError, OSError) as exc:
        signer = _claimed_signer(directory)
        file = getattr(exc, "file", None)
        raise AdapterSignatureError(f"LoRA adapter {name!r}: {exc} (signer: {signer or 'none'})", name,
                                    str(directory / file) if file else str(directory), signer) from None
    return signer


def adapter_version(directory: Path, *, verify: bool) -> str | None:
    """The artifact version of the adapter in `directory`; None for a plain PEFT directory (no manifest).
    With `verify`, every file is checked against the manifest (sha256). Raises ArtifactError when a file
    is altered or the manifest is not an adapter's (its target must be "lora")."""
    if not (directory / MANIFEST_FILE).is_file():
        return None
    manifest = verify_artifact(directory) if verify else read_manifest(directory)
    if manifest.target != ADAPTER_TARGET:
        raise ArtifactError(f"{directory}: manifest target is {manifest.target!r}, not "
                            f"{ADAPTER_TARGET!r} (not an adapter artifact)", MANIFEST_FILE)
    return manifest.version
