"""Shared fixtures: a tiny synthetic tokenizer (and, below, artifacts) built once per session."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferd.build.tokenizer_train import EOS_TOKEN, IM_END, train_byte_level_bpe, write_tokenizer_files
from inferd.tokenization import HFTokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    tokenizer = train_byte_level_bpe(512, num_lines=2000)
    write_tokenizer_files(directory, tokenizer, model_max_length=256)
    eos = [tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(IM_END)]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path) -> HFTokenizer:
    return HFTokenizer.from_dir(tiny_tokenizer_dir)
