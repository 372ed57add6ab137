"""Tokenizer, chat template and streaming text: everything between text and token ids.

- `HFTokenizer` loads a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json
  [+ generation_config.json]) and renders chat templates the way transformers does.
- `IncrementalDetokenizer` turns generated ids into text one step at a time without ever
  emitting half of a multi-byte UTF-8 character (vLLM/TGI prefix-offset/read-offset technique).
- `StopMatcher` holds back text that may be the start of a stop string, so no part of a stop
  string is ever streamed.

All three are synchronous and CPU-bound; callers run long encodes off the event loop.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _RustTokenizer

__all__ = [
    "ChatTemplateError",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "StopMatcher",
    "TokenizerLoadError",
]

_REPLACEMENT_CHAR = "\ufffd"


class TokenizerLoadError(Exception):
    """A tokenizer directory is missing a file or has a malformed one (the message names it)."""


class ChatTemplateError(ValueError):
    """Messages could not be rendered: no template, malformed messages, or the template refused them.

    `param` names the offending request field for the OpenAI error envelope.
    """

    def __init__(self, message: str, param: str | None = "messages") -> None:
        super().__init__(message)
        self.param = param


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or as an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path}: expected a JSON object")
    return data


def _select_chat_template(raw: Any) -> str | None:
    """HF allows one template string or a list of named templates; we serve the 'default' one."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        template = named.get("default") or next(iter(named.values()), None)
        return template if isinstance(template, str) else None
    return None


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes; HF templates expect plain JSON (transformers overrides it too).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _template_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer plus the bits of tokenizer_config.json we need."""

    def __init__(self, tokenizer: _RustTokenizer, *, bos_token: str | None = None, eos_token: str | None = None,
                 extra_eos_token_ids: Iterable[int] = (), chat_template: str | None = None,
                 add_bos_token: bool | None = None) -> None:
        self._tok = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id: int | None = tokenizer.token_to_id(bos_token) if bos_token else None
        eos_ids: list[int] = []
        eos_id = tokenizer.token_to_id(eos_token) if eos_token else None
        for tid in ([eos_id] if eos_id is not None else []) + list(extra_eos_token_ids):
            if tid not in eos_ids:
                eos_ids.append(int(tid))
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        self.chat_template = chat_template
        # add_bos_token=True asks us to add BOS when tokenizer.json's post-processor does not.
        self._add_bos_token = bool(add_bos_token)

    @classmethod
    def from_dir(cls, path: Path) -> HFTokenizer:
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerLoadError(f"{tokenizer_file}: missing (only fast tokenizers are supported)")
        try:
            tokenizer = _RustTokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust side raises plain Exception on malformed files
            raise TokenizerLoadError(f"{tokenizer_file}: {exc}") from exc
        config_file = path / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        chat_template = _select_chat_template(config.get("chat_template"))
        template_file = path / "chat_template.jinja"  # newer transformers store the template separately
        if chat_template is None and template_file.is_file():
            chat_template = template_file.read_text(encoding="utf-8")
        extra_eos: list[int] = []
        generation_file = path / "generation_config.json"
        if generation_file.is_file():
            eos = _read_json(generation_file).get("eos_token_id")
            extra_eos = [eos] if isinstance(eos, int) else [e for e in (eos or []) if isinstance(e, int)]
        return cls(tokenizer, bos_token=_token_content(config.get("bos_token")),
                   eos_token=_token_content(config.get("eos_token")), extra_eos_token_ids=extra_eos,
                   chat_template=chat_template, add_bos_token=config.get("add_bos_token"))

    @property
    def backend_tokenizer(self) -> _RustTokenizer:
        """The `tokenizers.Tokenizer` underneath (as transformers names it): xgrammar reads its vocabulary."""
        return self._tok

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the GIL while it works and encode does not: a long prompt tokenized on a
        # worker thread would otherwise stall the event loop for the whole encode.
        ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        bos = self.bos_token_id
        if add_special_tokens and bos is not None:
            if self._add_bos_token and (not ids or ids[0] != bos):
                ids.insert(0, bos)
            # A chat template that already starts with BOS plus a post-processor that adds one
            # would give two; models are trained on one, so we keep one.
            if len(ids) >= 2 and ids[0] == bos and ids[1] == bos and text.startswith(self.bos_token or "\0"):
                del ids[0]
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template; use the completions endpoint")
        try:
            return _template_environment().from_string(self.chat_template)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}", None) from exc

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render `messages` (role/content dicts) with the model's template, as transformers does."""
        if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
            raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise ChatTemplateError(f"messages[{i}] must be an object", f"messages[{i}]")
            if not isinstance(message.get("role"), str):
                raise ChatTemplateError(f"messages[{i}].role must be a string", f"messages[{i}].role")
        template = self._compiled_template
        try:
            return template.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template rejected the messages: {exc}") from exc
        except (TypeError, ValueError, KeyError) as exc:  # e.g. content that is not a string
            raise ChatTemplateError(f"messages do not fit the chat template: {exc}") from exc


class IncrementalDetokenizer:
    """Detokenize one step at a time, cheaply, never emitting a broken UTF-8 character.

    We decode only a small window `ids[prefix:]` and compare it with the text of
    `ids[prefix:read]` (already emitted). The difference is new text, released only when it does
    not end in U+FFFD (an incomplete byte sequence). Decoding with some left context keeps
    tokenizers that depend on it (sentencepiece's leading-space handling) correct.
    """

    # Left context from the prompt (as vLLM). A UTF-8 character spans at most 4 byte tokens, so a
    # window still ending in U+FFFD after this many pending tokens holds genuinely invalid bytes.
    _INITIAL_CONTEXT = 5
    _MAX_PENDING = 8

    def __init__(self, tokenizer: HFTokenizer, prompt_token_ids: Sequence[int], *,
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-self._INITIAL_CONTEXT:])
        self._read = len(self._ids)            # ids[:read] have been emitted (or are prompt)
        self._prefix_text = self._decode(self._ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _advance(self, upto: int, text: str) -> str:
        """Mark ids[:upto] as emitted, `text` being decode(ids[:upto]); returns the new part."""
        new = text[len(self._prefix_text):]
        # The emitted tokens become the next window's left context; older ones are dropped.
        del self._ids[:self._read]
        self._read = upto - self._read
        self._prefix_text = self._decode(self._ids[:self._read])
        return new

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated ids; return the text that is now final (possibly "")."""
        self._ids.extend(token_ids)
        text = self._decode(self._ids)
        if len(text) > len(self._prefix_text) and not text.endswith(_REPLACEMENT_CHAR):
            return self._advance(len(self._ids), text)
        if len(self._ids) - self._read > self._MAX_PENDING:
            # Invalid bytes will never complete: release the longest clean prefix of the window
            # so the window (and the cost of each push) stays bounded.
            for upto in range(len(self._ids) - 1, self._read, -1):
                text = self._decode(self._ids[:upto])
                if len(text) > len(self._prefix_text) and not text.endswith(_REPLACEMENT_CHAR):
                    return self._advance(upto, text)
            return self._advance(len(self._ids), self._decode(self._ids))
        return ""

    def flush(self) -> str:
        """Generation ended: release whatever is pending, even an incomplete character."""
        if len(self._ids) == self._read:
            return ""
        text = self._decode(self._ids)
        return self._advance(len(self._ids), text) if len(text) > len(self._prefix_text) else ""


class StopMatcher:
    """Cut the stream at the first stop string; hold back text that may begin one."""

    def __init__(self, stops: Sequence[str]) -> None:
        for i, stop in enumerate(stops):
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop[{i}] must be a non-empty string")
        self._stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self.stopped = False

    def _held_back_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def push(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, stopped). After a stop, everything else is dropped."""
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buffer = self._held + text
        cut = min((i for i in (buffer.find(stop) for stop in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buffer[:cut], True
        hold = self._held_back_length(buffer)
        self._held = buffer[len(buffer) - hold:] if hold else ""
        return buffer[:len(buffer) - hold], False

    def flush(self) -> str:
        """Generation ended without a stop string: release what was held back."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
