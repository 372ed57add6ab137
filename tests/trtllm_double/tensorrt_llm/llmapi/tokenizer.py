"""The tokenizer the LLM loads from `tokenizer=` (real: TransformersTokenizer over AutoTokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer


class TransformersTokenizer:
    def __init__(self, path: Path) -> None:
        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}

        def token_id(name: str):
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            return self._tok.token_to_id(value) if isinstance(value, str) else None

        self.eos_token_id = token_id("eos_token")
        self.pad_token_id = token_id("pad_token")
        self.special_ids = set(self._tok.get_added_tokens_decoder())

    @classmethod
    def from_pretrained(cls, path) -> "TransformersTokenizer":
        return cls(Path(path))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tok

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def ordinary_token_ids(self) -> list[int]:
        return sorted(set(self._tok.get_vocab().values()) - self.special_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = True, **kwargs) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(path) -> TransformersTokenizer | None:
    path = Path(path)
    return TransformersTokenizer(path) if (path / "tokenizer.json").is_file() else None
