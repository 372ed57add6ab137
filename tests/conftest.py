"""Shared fixtures: tiny synthetic artifacts (built once per session): a generative one with its tokenizer,
and an embedding one; LoRA adapters for the tiny one.

The artifact is read-only for tests: copy it (shutil.copytree) before altering anything.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferd.artifacts.build.copying import build_copying
from inferd.artifacts.build.lora import build_synthetic_adapter, synthetic_adapter_tensors, write_peft_adapter
from inferd.artifacts.build.reference import build_synthetic, read_json_object
from inferd.config import root as config_root
from inferd.engine.tokenization import HFTokenizer


def front_processes_for_tests() -> int:
    """INFERD_TEST_FRONT_PROCESSES=N: servers the tests start hand their streams to N SSE writer processes
    unless a test's config says otherwise (unset: 0, so the suite runs alike on machines of any CPU count,
    where the product default, "auto", would differ)."""
    return int(os.environ.get("INFERD_TEST_FRONT_PROCESSES", "0") or 0)


def _parse_config_with_writers(parse):
    """Config files the daemon tests load (load_config -> parse_config) get front_processes unless they set it."""
    def parse_config(raw, **kwargs):
        if isinstance(raw, dict) and isinstance(raw.get("server", {}), dict):
            server = raw.get("server", {})
            if "front_processes" not in server:
                raw = {**raw, "server": {**server, "front_processes": front_processes_for_tests()}}
        return parse(raw, **kwargs)
    return parse_config


config_root.parse_config = _parse_config_with_writers(config_root.parse_config)


@pytest.fixture(scope="session")
def tiny_engines_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An engines/ tree holding the tiny artifact (resolve_artifact(root, "tiny") finds it), and
    tiny-embed once the tiny_embed_artifact fixture has built it."""
    root = tmp_path_factory.mktemp("engines")
    build_synthetic("tiny", root, progress=lambda message: None)
    return root


@pytest.fixture(scope="session")
def tiny_artifact(tiny_engines_root: Path) -> Path:
    """engines/tiny/<version>: 2-layer Llama, vocab 512, byte-level BPE tokenizer, ChatML template."""
    (version,) = [p for p in (tiny_engines_root / "tiny").iterdir() if p.is_dir()]
    return version


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_artifact: Path) -> HFTokenizer:
    return HFTokenizer.from_dir(tiny_artifact)


@pytest.fixture(scope="session")
def tiny_embed_artifact(tiny_engines_root: Path) -> Path:
    """engines/tiny-embed/<version>: shaped like tiny, an embedding model (last-token pooling, normalized,
    Matryoshka down to 16 of its 64 dimensions) whose tokenizer appends EOS."""
    return build_synthetic("tiny-embed", tiny_engines_root, progress=lambda message: None)


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


@pytest.fixture(scope="session")
def copying_model(tmp_path_factory: pytest.TempPathFactory):
    """(artifact, successor): tiny's shapes, continuing each token with successor[token] (greedy), so its output
    copies spans of its prompt (inferd.artifacts.build.copying): what speculative decoding's tests need."""
    return build_copying("tiny", tmp_path_factory.mktemp("copying"))


@pytest.fixture(scope="session")
def int8_artifact(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny artifact's int8 weight-only version (build_engines.py --quantize int8), in its own engines tree."""
    import shutil

    from inferd.engine.reference import quantize_artifact

    root = tmp_path_factory.mktemp("int8")
    shutil.copytree(tiny_artifact.parent, root / "tiny")
    return quantize_artifact(root / "tiny" / tiny_artifact.name, root)
