"""LoRA adapters for the tiny synthetic model (built once per session; read-only, copy before altering)."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.engine.build.lora import build_synthetic_adapter, synthetic_adapter_tensors, write_peft_adapter
from inferd.engine.build.reference import read_json_object


@pytest.fixture(scope="session")
def tiny_adapters(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> source for the tiny model: "all" (every projection, r 4, a published artifact: its name
    directory in an engines/ tree), "qvd" (q/v/down_proj, r 2, a plain PEFT directory, no manifest)."""
    root = tmp_path_factory.mktemp("adapters")
    build_synthetic_adapter(tiny_artifact, "all", root, rank=4, alpha=8.0, seed=1)
    targets = ("q_proj", "v_proj", "down_proj")
    tensors = synthetic_adapter_tensors(read_json_object(tiny_artifact / "config.json"), rank=2, targets=targets,
                                        seed=2, b_std=0.1)
    write_peft_adapter(root / "qvd", tensors, rank=2, alpha=4.0, targets=targets)
    return {"all": root / "all", "qvd": root / "qvd"}
