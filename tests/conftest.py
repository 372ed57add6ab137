"""Shared fixtures: a tiny synthetic artifact (built once per session) and its tokenizer.

The artifact is read-only for tests: copy it (shutil.copytree) before altering anything.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.engine.build.reference import build_synthetic
from inferd.engine.tokenization import HFTokenizer


@pytest.fixture(scope="session")
def tiny_engines_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An engines/ tree holding the tiny artifact (resolve_artifact(root, "tiny") finds it)."""
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
