"""Shared fixtures: tiny synthetic artifacts (built once per session): a generative one with its tokenizer,
and an embedding one.

The artifact is read-only for tests: copy it (shutil.copytree) before altering anything.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.engine.build.reference import build_synthetic
from inferd.engine.tokenization import HFTokenizer


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
