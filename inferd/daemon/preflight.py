"""What `inferd serve` would refuse that the config's own checks cannot see: each model version's
artifact on disk (with the command that builds it), the API keys file, and the tracing extra when
`[tracing]` is configured. `inferd check-config` runs
these after the config validates, so it reports everything a start would stumble on, at once."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from inferd.config import Config, artifact_name
from inferd.engine import ArtifactError, resolve_artifact
from inferd.models import SYNTHETIC_KINDS, missing_synthetic, uses_artifact, version_specs
from inferd.tenancy import KeyFileError, load_authenticator


def preflight_errors(cfg: Config) -> list[str]:
    """`path: problem` lines, empty when `serve` would find every artifact and read the keys file."""
    errors: list[str] = []
    root = Path(cfg.server.engines_root)
    for spec in version_specs(cfg):
        model = spec.config
        if not uses_artifact(model) or missing_synthetic(spec.model, model, cfg.server) is not None:
            continue                     # sim needs none; a missing tiny/small is built on the first serve
        name = artifact_name(spec.model, model)
        try:
            resolve_artifact(root, name, spec.requested)
        except (ArtifactError, OSError) as exc:
            errors.append(f"models.{spec.model}: {exc}; build it with: {_build_command(name, model.backend, root)}")
    if cfg.tracing is not None and not all(_importable(m) for m in TRACING_MODULES):
        errors.append("tracing: needs the OpenTelemetry SDK and OTLP exporter: pip install 'inferd[tracing]'")
    if cfg.auth.mode == "api_key":
        try:
            load_authenticator(cfg.auth, Path("."))     # paths are absolute once load_config resolved them
        except (KeyFileError, OSError) as exc:
            errors.append(f"auth.keys_file: {exc}")
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
