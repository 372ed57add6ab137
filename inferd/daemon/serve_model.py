"""`inferd serve --model X`: a Config from command-line flags alone, as `vllm serve X` takes them.

X is a Hugging Face checkpoint directory (packed into an artifact first), an artifact directory
(engines/<name> or engines/<name>/<version>), the name of an artifact already in the state
directory's engines (what `inferd pull` wrote), or a hub id (pulled, then packed). The flags vLLM
has keep its names: --host, --port, --api-key, --max-model-len, --served-model-name, and for the torch
engine (--backend torch) --device, --dtype, --gpu-memory-utilization, --enforce-eager, --load-format.

The Config is built as a TOML file would be (a dict through inferd.config.parse_config), so every
default and check of the file applies, and bad flags are reported as bad keys are. Runtime state
(keys, audit log, usage store, engines) lives in inferd.config.default_state_dir().
"""
from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
from typing import Any

from inferd.artifacts import LATEST_FILE, MANIFEST_FILE, ArtifactError, HubError, looks_like_hub_id, pull, read_manifest
from inferd.config import ROUTE_NAME_RE, Config, ConfigError, default_state_dir, parse_config
from inferd.observability import get_logger

log = get_logger("inferd.daemon")

SERVE_DEFAULT_MAX_TOKENS = 512


def model_config(args: argparse.Namespace) -> Config:
    """The Config `serve --model` runs; ConfigError (source "command line") names what is wrong."""
    state = default_state_dir()
    name = args.served_model_name
    if name is not None and not ROUTE_NAME_RE.match(name):      # before a pull that may take minutes
        raise ConfigError([f"--served-model-name {name!r}: must match {ROUTE_NAME_RE.pattern} (it is used in URLs "
                           "and metric labels)"], "command line")
    engine = _engine_table(args)                        # before a pull too
    try:
        engines_root, artifact, version = resolve_model(args.model, state / "engines")
        _check_max_model_len(engines_root / artifact, version, args.max_model_len)
    except (ArtifactError, OSError) as exc:            # OSError: a full disk, an unreadable directory
        raise ConfigError([f"--model {args.model}: {exc}"], "command line") from None
    served = args.served_model_name or artifact
    # A chat without max_tokens gets SERVE_DEFAULT_MAX_TOKENS, not the rest of the context (minutes on a CPU)
    model: dict[str, Any] = {"artifact": artifact, "version": version,
                             "default_max_tokens": SERVE_DEFAULT_MAX_TOKENS}
    if args.max_model_len is not None:
        model["max_model_len"] = args.max_model_len
    model.update(engine)
    raw: dict[str, Any] = {
        "server": {"host": args.host or "127.0.0.1", "port": 8000 if args.port is None else args.port,
                   "state_dir": str(state), "engines_root": str(engines_root)},
        "models": {served: model},
    }
    # $INFERD_API_KEY as vLLM reads $VLLM_API_KEY: a key in the environment is not in `ps` output
    api_key = args.api_key if args.api_key is not None else os.environ.get("INFERD_API_KEY") or None
    if api_key is not None:
        # Only its hash is held, as for keys in the keys file; requests bearing it are the `local` tenant
        raw["auth"] = {"mode": "api_key", "static_key_sha256": hashlib.sha256(api_key.encode()).hexdigest()}
    config = parse_config(raw, base_dir=state, source="command line")
    log.info("serve_model", model=args.model, served_as=served, artifact=str(engines_root / artifact),
             version=version, state_dir=str(state))
    return config


# --flag -> [models.X.torch] key, as vLLM names them
TORCH_FLAGS = {"device": "device", "dtype": "dtype", "gpu_memory_utilization": "gpu_memory_utilization",
               "load_format": "load_format"}


def _engine_table(args: argparse.Namespace) -> dict[str, Any]:
    """The model table's backend (and [torch] table) from --backend and the torch engine's flags, checked
    as the file's keys are."""
    torch_flags = {key: getattr(args, flag) for flag, key in TORCH_FLAGS.items()
                   if getattr(args, flag, None) is not None}
    if getattr(args, "enforce_eager", None):
        torch_flags["cuda_graphs"] = False
    if torch_flags.get("dtype") == "auto":      # vLLM's auto: the checkpoint's; ours serves bf16 on a GPU
        del torch_flags["dtype"]
    backend = getattr(args, "backend", None) or "reference"
    if torch_flags and backend != "torch":
        flags = ", ".join("--" + f.replace("_", "-") for f in (*TORCH_FLAGS, "enforce_eager")
                          if getattr(args, f, None) is not None)
        raise ConfigError([f"{flags}: only with --backend torch (the reference engine runs float32 on the CPU)"],
                          "command line")
    return {"backend": backend, "torch": torch_flags} if backend == "torch" else {"backend": backend}


def resolve_model(model: str, engines_root: Path) -> tuple[Path, str, str]:
    """(engines root, artifact name, version) serving `model`; packs or pulls it first when need be. The
    artifact is named after the checkout or repo (not the served name: one artifact, any names)."""
    path = Path(model).expanduser()
    if (path / MANIFEST_FILE).is_file():                # engines/<name>/<version>
        return path.resolve().parent.parent, path.resolve().parent.name, path.resolve().name
    if (path / LATEST_FILE).is_file():                  # engines/<name>
        return path.resolve().parent, path.resolve().name, "latest"
    if (engines_root / model / LATEST_FILE).is_file() and "/" not in model:
        return engines_root, model, "latest"            # pulled before, by name
    if path.is_dir() or looks_like_hub_id(model):
        engines_root.mkdir(parents=True, exist_ok=True)
        try:
            artifact_dir = pull(model, engines_root)
        except HubError as exc:
            raise ArtifactError(str(exc)) from None
        return engines_root, artifact_dir.parent.name, artifact_dir.name
    raise ArtifactError(f"not a checkpoint or artifact directory, not an artifact in {engines_root}, and not a "
                        "Hugging Face model id (org/name)")


def _check_max_model_len(artifact: Path, version: str, max_model_len: int | None) -> None:
    """vLLM refuses a --max-model-len past the model's context; so does this, before loading anything."""
    if max_model_len is None:
        return
    if version == "latest":
        version = (artifact / LATEST_FILE).read_text(encoding="utf-8").strip()
    limit = read_manifest(artifact / version).architecture.max_position_embeddings
    if not 0 < max_model_len <= limit:
        raise ArtifactError(f"--max-model-len {max_model_len}: this model's context is 1..{limit} tokens "
                            "(max_position_embeddings)")
