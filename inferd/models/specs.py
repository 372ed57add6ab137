"""What the config asks to keep loaded: one VersionSpec per configured version, and the routes over them."""
from __future__ import annotations

from collections.abc import Mapping

import msgspec

from inferd.config import Config, ModelConfig, Split, split_from_config


class VersionSpec(msgspec.Struct, frozen=True):
    """One version the config asks to keep loaded: `requested` is "latest" or a version id."""

    model: str
    requested: str
    config: ModelConfig

    @property
    def label(self) -> str:
        return f"{self.model}@{self.requested}"


def version_specs(cfg: Config) -> list[VersionSpec]:
    """Every version the config lists: each model's default first, then its `versions`. A spec's
    `trusted_keys` are the ones its artifact must be signed by: the model's own, else `[server]`'s."""
    out = []
    for name, model in cfg.models.items():
        if not model.trusted_keys and cfg.server.trusted_keys:
            model = msgspec.structs.replace(model, trusted_keys=cfg.server.trusted_keys)
        out.append(VersionSpec(name, model.version, model))
        out.extend(VersionSpec(name, v, model) for v in model.versions)
    return out


def uses_artifact(model: ModelConfig) -> bool:
    """The model's engine loads an artifact from engines_root (a trtllm engine_dir is its own)."""
    if model.backend == "trtllm":
        return not (model.trtllm and model.trtllm.engine_dir)
    return model.backend in ("reference", "torch")


def routes_from_config(cfg: Config, defaults: Mapping[str, str]) -> dict[str, Split]:
    return {name: split_from_config(alias, defaults) for name, alias in cfg.aliases.items()}
