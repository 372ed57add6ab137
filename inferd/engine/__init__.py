"""The Engine contract and its backends (reference NumPy, sim, TensorRT-LLM), with artifacts, tokenization, builders."""
from __future__ import annotations

from inferd.engine.adapters import (
    AdapterBusy,
    AdapterError,
    AdapterHost,
    AdapterInfo,
    AdapterLoadError,
    UnknownAdapter,
)
from inferd.engine.artifacts import (
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
    staging_dir,
    verify_artifact,
)
from inferd.engine.base import (
    Capacity,
    Engine,
    EngineError,
    EngineInfo,
    EngineStats,
    EngineUnavailable,
    InvalidRequest,
    blocks_for,
)
from inferd.engine.engines_cli import keygen_main, sign_main, verify_main
from inferd.engine.loading import run_load
from inferd.engine.signing import (
    SigningKeyError,
    fingerprint,
    load_private_key,
    load_public_key,
    load_trusted_keys,
    sign_artifact,
    verify_signed_artifact,
)
from inferd.engine.adapter_signing import AdapterSignatureError, check_adapter_signature, resolve_adapter_source
from inferd.engine.stream import RequestStream, StreamWrapper, merge_deltas
from inferd.engine.tokenization import HFTokenizer, IncrementalDetokenizer, StopMatcher, TokenizerLoadError
from inferd.engine.validation import failure_message, seed64, validate_request

__all__ = [
    "AdapterBusy", "AdapterError", "AdapterHost", "AdapterInfo", "AdapterLoadError", "AdapterSignatureError",
    "UnknownAdapter",
    "Architecture", "ArtifactError", "Capacity", "DefaultSampling", "EmbeddingSpec", "Engine", "EngineError",
    "EngineInfo",
    "EngineStats", "EngineUnavailable", "HFTokenizer", "IncrementalDetokenizer", "InvalidRequest", "MANIFEST_FILE",
    "Manifest", "Progress", "RequestStream", "StreamWrapper", "SIGNATURE_FILE", "SigningKeyError", "StopMatcher", "TokenizerLoadError",
    "blocks_for", "check_adapter_signature", "failure_message", "fingerprint", "keygen_main", "load_private_key",
    "load_public_key",
    "load_trusted_keys", "merge_deltas", "publish_artifact", "read_manifest", "resolve_adapter_source",
    "resolve_artifact", "run_load", "seed64",
    "sign_artifact", "sign_main", "staging_dir", "validate_request", "verify_artifact", "verify_main",
    "verify_signed_artifact",
]
