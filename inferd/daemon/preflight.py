"""What `inferd serve` would refuse that the config's own checks cannot see: each model version's
artifact on disk (with the command that builds it), the trusted keys and, where a model has them, its
artifacts' signatures (not the files' hashes: that is the load's, and slow), each LoRA adapter (its
directory exists; with trusted keys, it is signed by one of them; a reference model's adapter loads for each
base version: shapes, config), the API keys
file, and the tracing extra when `[tracing]` is configured. `inferd check-config` runs
these after the config validates, so it reports everything a start would stumble on, at once."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from inferd.config import Config, ModelConfig, artifact_name, served_adapters
from inferd.artifacts import (
    ArtifactError,
    SigningKeyError,
    fingerprint,
    load_public_key,
    resolve_artifact,
    verify_signed_artifact,
)
from inferd.engine import AdapterLoadError, AdapterSignatureError, check_adapter_signature, resolve_adapter_source
from inferd.models import SYNTHETIC_KINDS, missing_synthetic, uses_artifact, version_specs
from inferd.tenancy import KeyFileError, load_authenticator


def preflight_errors(cfg: Config) -> list[str]:
    """`path: problem` lines, empty when `serve` would find every artifact and read the keys file."""
    errors, fingerprints = _trusted_key_errors(cfg)
    root = Path(cfg.server.engines_root)
    bases: dict[str, list[Path]] = {}          # model -> its versions' artifacts, for its adapters' checks
    for spec in version_specs(cfg):
        model = spec.config
        if not uses_artifact(model):     # sim needs none; a trtllm engine_dir is its own artifact
            if model.trusted_keys and model.trtllm is not None and model.trtllm.engine_dir:
                errors += _signature_errors(spec.model, Path(model.trtllm.engine_dir), model.trusted_keys, fingerprints)
            continue
        name = artifact_name(spec.model, model)
        if missing_synthetic(spec.model, model, cfg.server) is not None:   # built on the first serve
            if model.trusted_keys:
                errors.append(f"models.{spec.model}: trusted_keys is set, but serve would build the missing {name} "
                              f"artifact unsigned and refuse it; build and sign it first: "
                              f"{_build_command(name, model.backend, root)} --sign PRIVATE_KEY_FILE")
            continue
        try:
            path = resolve_artifact(root, name, spec.requested)
        except (ArtifactError, OSError) as exc:
            errors.append(f"models.{spec.model}: {exc}; build it with: {_build_command(name, model.backend, root)}")
            continue
        bases.setdefault(spec.model, []).append(path)
        errors += _signature_errors(spec.model, path, model.trusted_keys, fingerprints)
    for name, model in cfg.models.items():
        trusted = _trusted(model.trusted_keys or cfg.server.trusted_keys, fingerprints)
        errors += list(dict.fromkeys(e for base in bases.get(name, [None])
                                     for e in _adapter_errors(name, model, base, trusted)))
    if cfg.tracing is not None and not all(_importable(m) for m in TRACING_MODULES):
        errors.append("tracing: needs the OpenTelemetry SDK and OTLP exporter: pip install 'inferd[tracing]'")
    if cfg.auth.mode == "api_key":
        try:
            load_authenticator(cfg.auth, Path("."))     # paths are absolute once load_config resolved them
        except (KeyFileError, OSError) as exc:
            errors.append(f"auth.keys_file: {exc}")
    return errors


def _trusted_key_errors(cfg: Config) -> tuple[list[str], dict[str, str | None]]:
    """A line for every trusted_keys entry that is not an ed25519 .pub file (once per file), and
    every entry's path -> its key's fingerprint (None: did not load)."""
    errors: list[str] = []
    fingerprints: dict[str, str | None] = {}
    lists = [("server.trusted_keys", cfg.server.trusted_keys)]
    lists += [(f"models.{name}.trusted_keys", m.trusted_keys) for name, m in cfg.models.items()]
    for where, paths in lists:
        for i, path in enumerate(paths):
            if path in fingerprints:
                continue
            try:
                fingerprints[path] = fingerprint(load_public_key(path))
            except SigningKeyError as exc:
                fingerprints[path] = None
                errors.append(f"{where}[{i}]: {exc}")
    return errors, fingerprints


def _signature_errors(model: str, path: Path, keys: tuple[str, ...], fingerprints: dict[str, str | None]) -> list[str]:
    """The artifact's signature against the model's trusted keys (when it has some and they all loaded:
    a key that did not is named already); the files' hashes are left to the load, being slow."""
    if not keys or not all(fingerprints.get(k) for k in keys):
        return []
    try:
        verify_signed_artifact(path, {fingerprints[k]: k for k in keys}, check_files=False)
    except (ArtifactError, OSError) as exc:
        return [f"models.{model}: {exc}"]
    return []


def _trusted(keys: tuple[str, ...], fingerprints: dict[str, str | None]) -> dict[str, str] | None:
    """Fingerprint -> path of `keys`; None when one did not load (it is named already: nothing to check against)."""
    if not all(fingerprints.get(k) for k in keys):
        return None
    return {fingerprints[k]: k for k in keys}       # type: ignore[misc]


def _adapter_errors(model: str, config: ModelConfig, base: Path | None, trusted: dict[str, str] | None) -> list[str]:
    """Each adapter directory of a reference or trtllm model exists and, with `trusted` keys, is an artifact
    signed by one of them (what its load would refuse); a trtllm model's is an HF/PEFT LoRA directory; a
    reference model's also loads for the base artifact `base` (when found): every tensor's shape fits it, its
    adapter_config.json is one the engine applies.
    Lines name the key (`models.<model>.lora_adapters.<adapter>`) and the file."""
    if config.backend == "sim":                 # the sim reads no adapter files
        return []
    key = f"models.{model}.lora_adapters" if config.lora_adapters else f"models.{model}.trtllm.lora_adapters"
    errors = []
    for adapter, source in served_adapters(config).items():
        if not Path(source).exists():
            errors.append(f"{key}.{adapter}: {source} does not exist")
            continue
        if trusted:
            try:
                check_adapter_signature(adapter, resolve_adapter_source(source), trusted)
            except AdapterSignatureError as exc:
                errors.append(f"{key}.{adapter}: {exc} (file {exc.file})")
                continue
            except (ArtifactError, OSError) as exc:         # a LATEST naming no version
                errors.append(f"{key}.{adapter}: {exc}")
                continue
        try:
            if config.backend == "trtllm":
                from inferd.engine.trtllm import check_trtllm_adapter

                check_trtllm_adapter(adapter, source)
            elif config.backend in ("reference", "torch") and base is not None:   # torch takes the same adapters
                from inferd.engine.reference import check_adapter    # numpy and the model: only when asked

                check_adapter(adapter, source, base)
        except AdapterLoadError as exc:
            errors.append(f"{key}.{adapter}: {exc}" + (f" (file {exc.file})" if exc.file else ""))
    return errors


TRACING_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:          # a parent package is missing
        return False


def _build_command(name: str, backend: str, root: Path) -> str:
    source = f"--synthetic {name}" if name in SYNTHETIC_KINDS else f"--hf-dir /path/to/checkpoint --name {name}"
    return f"python build_engines.py --target {backend} {source} --engines-root {root}"
