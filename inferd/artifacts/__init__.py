"""Engine artifacts: manifests, hashing, signing, the `inferd engines` CLI, pulls from a hub; builders in `build`.

`build` (reference checkpoints, LoRA adapters, TensorRT-LLM engines) is imported on its own: it needs
numpy and tokenizers, which reading or verifying an artifact does not.
"""
from __future__ import annotations

from inferd.artifacts.engines_cli import keygen_main, sign_main, verify_main
from inferd.artifacts.hub import HubError, artifact_name_for, looks_like_hub_id, pull
from inferd.artifacts.manifest import (
    LATEST_FILE,
    MANIFEST_FILE,
    SIGNATURE_FILE,
    Architecture,
    ArtifactError,
    DefaultSampling,
    EmbeddingSpec,
    Manifest,
    Progress,
    publish_artifact,
    read_manifest,
    resolve_artifact,
    sha256_file,
    staging_dir,
    template_tool_call_format,
    verify_artifact,
)
from inferd.artifacts.pull_cli import add_pull_parser, pull_main
from inferd.artifacts.signing import (
    SigningKeyError,
    fingerprint,
    generate_key_pair,
    load_private_key,
    load_public_key,
    load_trusted_keys,
    read_signature,
    sign_artifact,
    trusted_list,
    verify_signed_artifact,
)

__all__ = [
    "HubError", "add_pull_parser", "artifact_name_for", "looks_like_hub_id", "pull", "pull_main",
    "LATEST_FILE", "MANIFEST_FILE", "SIGNATURE_FILE", "Architecture", "ArtifactError", "DefaultSampling",
    "EmbeddingSpec", "Manifest", "Progress", "SigningKeyError", "fingerprint", "generate_key_pair", "keygen_main",
    "load_private_key", "load_public_key", "load_trusted_keys", "publish_artifact", "read_manifest", "template_tool_call_format",
    "read_signature", "resolve_artifact", "sha256_file", "sign_artifact", "sign_main", "staging_dir",
    "trusted_list", "verify_artifact", "verify_main", "verify_signed_artifact",
]
